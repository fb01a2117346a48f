"""`serve(settings)`: run the sidecar with uvicorn (default 0.0.0.0:8000).

uvicorn's access log is off: an approval link carries its signature in the query string, and
the sidecar logs its own refusals without it.
"""

from __future__ import annotations

import logging

import uvicorn

from ..redact import install as install_redaction
from .app import create_app
from .settings import SidecarSettings

DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 8000


def serve(
    settings: SidecarSettings,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    log_level: str = "info",
) -> None:
    """Serve until SIGTERM/SIGINT."""
    install_redaction()  # URLs, tokens and the webhook secret out of every log line
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per call to Restate
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        server_header=False,
        proxy_headers=False,
        lifespan="on",
    )

"""`tether-operator`: run the handlers with kopf, configured from the environment.

Equivalent to `kopf run -m tether_operator --standalone --liveness=<url> -n <ns>...` (or `-A`),
with the namespaces from `TETHER_NAMESPACES` and the liveness endpoint from
`TETHER_LIVENESS_URL` (default http://0.0.0.0:8080/healthz); with `TETHER_PEERING` set, not
standalone: the replicas share kopf's peering object of that name, one acts (`peering.py`).
"""

from __future__ import annotations

import os
import sys

import kopf

from tether.errors import ConfigError
from tether.programs.redact import install as install_redaction

from .settings import settings_from_env


def main(argv: list[str] | None = None) -> None:
    try:
        settings = settings_from_env()
    except ConfigError as error:  # a setting, or Restate's key
        print(f"tether-operator: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    install_redaction()  # URLs, tokens and secrets of the environment out of every log line
    verbose = "--verbose" in (argv if argv is not None else sys.argv[1:])
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.PLAIN)
    from . import handlers  # noqa: F401  (registers the handlers)

    kopf.run(
        standalone=settings.peering is None,
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        liveness_endpoint=os.environ.get("TETHER_LIVENESS_URL", "http://0.0.0.0:8080/healthz"),
    )


if __name__ == "__main__":  # pragma: no cover
    main()

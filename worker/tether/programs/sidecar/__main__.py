"""`python -m tether.programs.sidecar [--host H] [--port P]`: the sidecar, configured from the
environment (see `tether.programs.sidecar.settings`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..hardening import make_undumpable
from .server import DEFAULT_HOST, DEFAULT_PORT, serve
from .settings import SidecarConfigError, settings_from_env


def main(argv: Sequence[str] | None = None) -> int:
    make_undumpable()  # it holds the webhook secret: out of reach of a `shell` tool's /proc reads
    parser = argparse.ArgumentParser(prog="tether sidecar", description=__doc__)
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST}")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    args = parser.parse_args(argv)
    try:
        settings = settings_from_env()
    except SidecarConfigError as error:
        print(f"tether sidecar: {error}", file=sys.stderr)
        return 2
    serve(settings, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The `tether` command line."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .durable.errors import DurableControlError
from .spec import SpecError

USER_ERRORS = (SpecError, DurableControlError)


def _run_parser(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="run an agent from a DurableAgent manifest on the embedded SQLite runtime",
        description="Run (or resume) an agent run journaled in a local SQLite file. Running the "
        "same --run-id again after a crash replays the journaled steps and continues live.",
    )
    run.add_argument("spec", help="DurableAgent manifest (YAML)")
    run.add_argument("--run-id", required=True, help="run id; reuse it to resume the run")
    run.add_argument("--prompt", help="the task (required on the first start of a run)")
    run.add_argument("--session", help="session id (default: the run id)")
    run.add_argument("--db", default=".tether/runs.db", help="SQLite file (default: %(default)s)")
    run.add_argument("--workspace", default=".", help="directory the file tools may use")
    run.add_argument("--script", help="scripted model file used when no API key is set")
    run.add_argument("--json", action="store_true", help="print the final stats as JSON")
    run.add_argument("--quiet", action="store_true", help="no progress output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tether", description="Durable AI agents.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _run_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            from .run_command import run_command

            code = run_command(args, dict(os.environ))
        else:  # pragma: no cover - argparse rejects unknown commands
            code = 2
    except USER_ERRORS as error:
        print(f"tether: {error}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)

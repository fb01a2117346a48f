"""The `tether` command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
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


def _worker_parser(commands: Any) -> None:
    worker = commands.add_parser(
        "worker",
        help="serve a DurableAgent on Restate (hypercorn, HTTP/2 cleartext)",
        description="Serve the agent of a DurableAgent manifest as a Restate virtual object "
        "named after the agent (key = session id). API keys and the webhook secret come from "
        "the environment (the operator maps them in from Secrets).",
    )
    worker.add_argument("--spec", required=True, help="DurableAgent manifest (YAML)")
    worker.add_argument("--host", default="0.0.0.0", help="bind address (default: %(default)s)")
    worker.add_argument("--port", type=int, default=9080, help="port (default: %(default)s)")
    worker.add_argument("--processes", type=int, default=1, help="hypercorn worker processes")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tether", description="Durable AI agents.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _run_parser(commands)
    _worker_parser(commands)
    return parser


def worker_command(args: argparse.Namespace) -> int:
    """Check the manifest and settings here (clear errors), then become the hypercorn CLI."""
    from .worker.agent_object import build_provider
    from .worker.settings import settings_from_env

    env = {
        **os.environ,
        "TETHER_SPEC": str(Path(args.spec).resolve()),
        "TETHER_WORKER_BIND": f"{args.host}:{args.port}",
        "TETHER_WORKER_PROCESSES": str(args.processes),
    }
    build_provider(settings_from_env(env))
    command = [sys.executable, "-m", "hypercorn", "--config"]
    command += ["python:tether.worker.hypercorn_config", "tether.worker.asgi:app"]
    os.execvpe(sys.executable, command, env)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            from .run_command import run_command

            code = run_command(args, dict(os.environ))
        elif args.command == "worker":
            code = worker_command(args)
        else:  # pragma: no cover - argparse rejects unknown commands
            code = 2
    except USER_ERRORS as error:
        print(f"tether: {error}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)

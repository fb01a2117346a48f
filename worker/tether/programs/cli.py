"""The `tether` command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from .._optional import MissingExtraError, require_extra
from ..durable.errors import DurableControlError
from ..errors import ConfigError
from .hardening import make_undumpable, state_dir

# A missing extra too: `tether worker` without `tether[restate]` says which extra to install.
USER_ERRORS = (ConfigError, DurableControlError, MissingExtraError)
"""Said in one line, without a traceback: a spec, a setting or an extra that cannot work."""


def _runs_db() -> str:
    """The runs' SQLite file by default: in Tether's state directory, outside any workspace."""
    return str(state_dir() / "runs.db")


def _dev_dir() -> str:
    """`tether dev`'s secret, logs and metrics by default: outside any workspace."""
    return str(state_dir() / "dev")


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
    run.add_argument(
        "--fork",
        metavar="SESSION[:TURNS]",
        help="start --session as a fork of SESSION: its first TURNS turns (default: all), "
        "ending with an answer; SESSION stays as it is",
    )
    run.add_argument(
        "--db",
        default=_runs_db(),
        help="SQLite file, outside --workspace (default: %(default)s)",
    )
    run.add_argument("--workspace", default=".", help="directory the file tools may use")
    run.add_argument("--script", help="scripted model file used when no API key is set")
    run.add_argument(
        "--script-delay",
        type=float,
        metavar="SECONDS",
        help="how long each call of the scripted model file takes (default: its `delay`)",
    )
    run.add_argument("--json", action="store_true", help="print the final stats as JSON")
    run.add_argument("--quiet", action="store_true", help="no progress output")


def _crashtest_parser(commands: Any) -> None:
    crashtest = commands.add_parser(
        "crashtest",
        help="kill an agent's run at every journal boundary and inside every tool call, resume "
        "it, and check that nothing was lost or done twice",
        description="Runs the agent twice without a crash (the runs must agree), then once per "
        "kill point: SIGKILLed after each commit of its SQLite journal and inside each tool call "
        "(its body done, its result not journaled), then resumed. Each resumed run must end as "
        "the clean one did, with no model call paid twice, no `replay: unsafe` tool body run "
        "twice, every call answered once, and the clean run's transcript and files, but for "
        "calls reported to the model as interrupted. The model is the scripted one (API keys "
        "are dropped); the tools run for real, once per kill, in copies of --workspace. "
        "Exits 1 if a kill point fails.",
    )
    crashtest.add_argument("spec", help="DurableAgent manifest (YAML)")
    crashtest.add_argument("--prompt", required=True, help="the task")
    crashtest.add_argument(
        "--workspace", default=".", help="directory copied for every run (default: %(default)s)"
    )
    crashtest.add_argument("--script", help="scripted model file (default: SPEC's .script.yaml)")
    crashtest.add_argument(
        "--approve",
        action="store_true",
        help="approve every call that waits for approval (and every request for more budget), "
        "then resume the run (default: a parked run ends the run, to be compared parked)",
    )
    crashtest.add_argument(
        "--human-answer", metavar="JSON", help="answer every ask_human call with JSON, then resume"
    )
    crashtest.add_argument(
        "--max-kills",
        type=int,
        metavar="N",
        help="at most N kill points after commits, spread evenly (those inside calls: all)",
    )
    crashtest.add_argument(
        "--twice",
        action="store_true",
        help="also try each kill point with a second kill, after the next step journaled "
        "after it (twice the runs)",
    )
    crashtest.add_argument("--jobs", type=int, help="runs at once (default: the CPUs)")
    crashtest.add_argument("--keep", metavar="DIR", help="keep every run's files in DIR")
    crashtest.add_argument("--json", action="store_true", help="print the trials as JSON only")


def _answer_parser(commands: Any) -> None:
    answer = commands.add_parser(
        "answer",
        help="answer a call that `tether run` parked for a person (embedded runtime)",
        description="Record the answer in the run's SQLite file; then run the same `tether run` "
        "command again to resume. Without --call, the run's only waiting call is answered.",
    )
    answer.add_argument("run_id", help="the run's id")
    decision = answer.add_mutually_exclusive_group(required=True)
    decision.add_argument("--approve", action="store_true", help="approve the call")
    decision.add_argument("--deny", action="store_true", help="deny the call")
    decision.add_argument("--value", help="JSON answer (an ask_human answer, for instance)")
    answer.add_argument("--reason", help="why (sent to the model with --approve or --deny)")
    answer.add_argument("--call", help="the waiting call's id, when the run has several")
    answer.add_argument("--approver", help="who decides (kept with the decision in the session)")
    answer.add_argument("--db", default=_runs_db(), help="SQLite file (default: %(default)s)")


def _waiting_parser(commands: Any) -> None:
    waiting = commands.add_parser(
        "waiting",
        help="list the calls of `tether run` runs that wait for a person (embedded runtime)",
        description="One line per waiting call, oldest first: run, call, kind, tool and input.",
    )
    waiting.add_argument(
        "--db", default=_runs_db(), help="the runs' SQLite file (default: %(default)s)"
    )


WORKER_SERVES = ("all", "agent", "index")
"""`tether worker --serve` (`tether.programs.worker.settings.Serves`; not imported here, the
parser is built for every command)."""


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)")
    return int(text)


def _worker_parser(commands: Any) -> None:
    worker = commands.add_parser(
        "worker",
        help="serve a DurableAgent on Restate (hypercorn, HTTP/2 cleartext)",
        description="Serve the agent of a DurableAgent manifest as a Restate virtual object "
        "named after the agent (key = session id), with its index of parked calls and its live "
        "events (--serve). API keys and the webhook secret come from the environment (the "
        "operator maps them in from Secrets).",
    )
    worker.add_argument("--spec", required=True, help="DurableAgent manifest (YAML)")
    worker.add_argument("--host", default="0.0.0.0", help="bind address (default: %(default)s)")
    worker.add_argument("--port", type=_port, default=9080, help="port (default: %(default)s)")
    worker.add_argument("--processes", type=int, default=1, help="hypercorn worker processes")
    worker.add_argument(
        "--serve",
        choices=WORKER_SERVES,
        help="all: everything below (the default; or TETHER_WORKER_SERVES); agent: the agent's "
        "object, inbox and budget ledger (the runs); index: its index of parked calls and its "
        "live events, for the sidecars (needs only the webhook secret: no model key)",
    )
    worker.add_argument(
        "--metrics-port",
        type=_port,
        help="serve the worker's own GET /metrics on this port, and nothing else there (or "
        "TETHER_WORKER_METRICS_PORT; default: none); merged over PROMETHEUS_MULTIPROC_DIR",
    )


def _sidecar_parser(commands: Any) -> None:
    sidecar = commands.add_parser(
        "sidecar",
        help="serve the webhooks, approvals and metrics of a worker pod (FastAPI, uvicorn)",
        description="Settings come from the environment: RESTATE_INGRESS_URL, "
        "TETHER_AGENT, TETHER_WEBHOOK_SECRET, PROMETHEUS_MULTIPROC_DIR.",
    )
    sidecar.add_argument("--host", default="0.0.0.0", help="bind address (default: %(default)s)")
    sidecar.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")


def _dev_parser(commands: Any) -> None:
    dev = commands.add_parser(
        "dev",
        help="run an agent on a local stack: restate-server, worker and sidecar",
        description="Start a real restate-server (installed from npm if missing), the worker and "
        "the sidecar for a manifest, register the worker, print the URLs; Ctrl-C stops it all.",
    )
    dev.add_argument("--spec", required=True, help="DurableAgent manifest (YAML)")
    dev.add_argument(
        "--data-dir",
        default=_dev_dir(),
        help="logs, secret and metrics, outside the workspace (default: %(default)s)",
    )
    dev.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="restate-server nodes: 1 (default), or 3 and more for a replicated cluster "
        "(replication 2; the worker and the sidecar fail over to a live node)",
    )


def _resolve_parser(commands: Any) -> None:
    resolve = commands.add_parser(
        "resolve",
        help="resolve (or reject) a parked call through the sidecar, signed",
        description="Signs with TETHER_WEBHOOK_SECRET (or the secret `tether dev` keeps in its "
        "data dir) and posts to the sidecar.",
    )
    resolve.add_argument("awakeable_id", help="the parked call's awakeable id")
    resolve.add_argument("--value", default='{"approved": true}', help="JSON value to resolve with")
    resolve.add_argument("--reject", action="store_true", help="reject instead of resolving")
    resolve.add_argument("--reason", default="rejected", help="reason given with --reject")
    resolve.add_argument(
        "--retry-for",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="send again, newly signed, while the sidecar answers 503 (Restate between "
        "leaders, a node lost) for up to this long (default: %(default)s; 0: once)",
    )
    _sidecar_client_arguments(resolve)


def _approvals_parser(commands: Any) -> None:
    approvals = commands.add_parser(
        "approvals",
        help="list the calls parked for a person, through the sidecar (signed)",
        description="Signs with TETHER_WEBHOOK_SECRET (or the secret `tether dev` keeps in its "
        "data dir) and reads the sidecar's /v1/approvals: one line per parked call, oldest first.",
    )
    approvals.add_argument("--json", action="store_true", help="print the sidecar's JSON answer")
    _sidecar_client_arguments(approvals)


def _watch_parsers(commands: Any) -> None:
    watch = commands.add_parser(
        "watch",
        help="follow a session's runs as they happen (the sidecar's event stream)",
        description="Mints a read token with TETHER_WEBHOOK_SECRET (or `tether dev`'s secret) "
        "and follows GET /v1/sessions/<session>/events, reconnecting where it left off.",
    )
    url = commands.add_parser(
        "events-url",
        help="print a session's event-stream URL with a read token (for a browser or curl)",
        description="The URL of GET /v1/sessions/<session>/events with a token minted with "
        "TETHER_WEBHOOK_SECRET (or `tether dev`'s secret), valid for --ttl seconds.",
    )
    for parser in (watch, url):
        parser.add_argument("session", help="the session id")
        parser.add_argument("--agent", required=True, help="the agent (its Restate service)")
        _sidecar_client_arguments(parser)
    watch.add_argument("--after", help="start after this event id (default: the beginning)")
    watch.add_argument("--json", action="store_true", help="one JSON event per line")
    watch.add_argument("--until-end", action="store_true", help="stop when a run ends")
    url.add_argument("--ttl", type=int, default=3600, help="seconds the token works (3600)")


def _sidecar_client_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sidecar", default="http://127.0.0.1:8000", help="sidecar base URL")
    parser.add_argument(
        "--data-dir",
        default=_dev_dir(),
        help="where `tether dev` keeps its secret (default: %(default)s)",
    )


def _crd_parser(commands: Any) -> None:
    commands.add_parser(
        "crd",
        help="print the DurableAgent CustomResourceDefinition (generated from the spec model)",
        description="The CRD that crds/durableagent.yaml holds, generated from tether.spec.",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tether", description="Durable AI agents.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _run_parser(commands)
    _crashtest_parser(commands)
    _answer_parser(commands)
    _waiting_parser(commands)
    _worker_parser(commands)
    _sidecar_parser(commands)
    _dev_parser(commands)
    _resolve_parser(commands)
    _approvals_parser(commands)
    _watch_parsers(commands)
    _crd_parser(commands)
    return parser


def sidecar_command(args: argparse.Namespace) -> int:
    from .sidecar import SidecarConfigError, serve, settings_from_env

    try:
        settings = settings_from_env()
    except SidecarConfigError as error:
        print(f"tether: {error}", file=sys.stderr)
        return 2
    serve(settings, host=args.host, port=args.port)
    return 0


def dev_command(args: argparse.Namespace) -> int:
    import signal
    import threading

    from .dev import DevStack

    # Its worker and sidecar are processes of their own: say what they lack before starting them.
    require_extra("tether dev", "restate")
    require_extra("tether dev", "sidecar")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with DevStack(args.spec, args.data_dir, nodes=args.nodes) as stack:
        print(stack.describe(), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stopped.wait()
        print("stopping the stack...", flush=True)
    return 0


def waiting_command(args: argparse.Namespace) -> int:
    import time

    from .._sqlite import Database
    from ..durable.answers import AnswerBook

    if not Path(args.db).exists():
        print(f"tether: {args.db} does not exist (pass the runs' --db)", file=sys.stderr)
        return 2
    db = Database(args.db)
    try:
        calls = AnswerBook(db).waiting()
    finally:
        db.close()
    for call in calls:
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(call.parked_at))
        print(
            f"{call.run_id}  {call.call_id}  {call.kind}  {call.tool}({call.input_summary})  "
            f"since {since}"
        )
    return 0


def answer_command(args: argparse.Namespace) -> int:
    import json
    import time

    from .._sqlite import Database
    from ..durable.answers import AnswerBook, AnswerError

    if args.value is not None:
        try:
            value = json.loads(args.value)
        except ValueError:
            print(f"tether: --value is not JSON: {args.value!r}", file=sys.stderr)
            return 2
    else:
        value = {"approved": bool(args.approve)}
        if args.reason:
            value["reason"] = args.reason
    if isinstance(value, dict):  # who decided, how and when: the session's audit trail
        value.setdefault("by", "cli")
        value.setdefault("decided_at", int(time.time() * 1000))
        if args.approver:
            value["approver"] = args.approver
    if not Path(args.db).exists():
        print(f"tether: {args.db} does not exist (pass the run's --db)", file=sys.stderr)
        return 2
    db = Database(args.db)
    try:
        call = AnswerBook(db).answer(args.run_id, args.call, value)
    except AnswerError as error:
        print(f"tether: {error}", file=sys.stderr)
        return 2
    finally:
        db.close()
    print(f"answered {call.tool} [{call.call_id}] of run {args.run_id}; resume it with tether run")
    return 0


def _signed_call(args: argparse.Namespace, method: str, path: str, body: bytes) -> Any:
    """A request to the sidecar, signed with the webhook secret (an `httpx2.Response`)."""
    import httpx2

    from .dev import webhook_secret
    from .webhooks import sign_request

    headers = sign_request(webhook_secret(Path(args.data_dir)).encode(), body, path=path)
    if body:
        headers["content-type"] = "application/json"
    url = f"{args.sidecar.rstrip('/')}{path}"
    return httpx2.request(method, url, content=body, headers=headers, timeout=30)


def resolve_command(args: argparse.Namespace) -> int:
    import json
    import time

    if args.reject:
        action, value = "reject", {"reason": args.reason}
    else:
        action, value = "resolve", json.loads(args.value)
    path = f"/v1/awakeables/{args.awakeable_id}/{action}"
    body = json.dumps(value).encode()
    deadline = time.monotonic() + args.retry_for
    response = _signed_call(args, "POST", path, body)
    # Safe to send again: every answer to one call goes to Restate under one idempotency key.
    while response.status_code == 503 and time.monotonic() < deadline:
        print(f"503 {response.text}: sending again", file=sys.stderr)
        after = response.headers.get("retry-after", "")
        wait = min(
            float(after) if after.isascii() and after.isdigit() else 1.0,
            deadline - time.monotonic(),
        )
        # Into the next second at least: a signature is of its second, and one seen is a replay.
        time.sleep(max(wait, 1.001 - time.time() % 1))
        response = _signed_call(args, "POST", path, body)
    # A refusal goes to stderr, like every other command's, so a script sees why it failed.
    out = sys.stdout if response.is_success else sys.stderr
    print(f"{response.status_code} {response.text}".strip(), file=out)
    return 0 if response.is_success else 1


def watch_command(args: argparse.Namespace) -> int:
    from .dev import webhook_secret
    from .watch import events_url, watch

    secret = webhook_secret(Path(args.data_dir)).encode()
    ttl = getattr(args, "ttl", 3600)
    url = events_url(args.sidecar, args.agent, args.session, secret, ttl)
    if args.command == "events-url":
        print(url)
        return 0
    return watch(url, after=args.after, as_json=args.json, until_end=args.until_end)


def approvals_command(args: argparse.Namespace) -> int:
    import json

    response = _signed_call(args, "GET", "/v1/approvals", b"")
    if not response.is_success:
        print(f"{response.status_code} {response.text}".strip(), file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(response.json(), indent=2))
        return 0
    for call in response.json()["parked"]:
        print(
            f"{call['awakeable_id']}  {call['kind']}  session={call['session']}  "
            f"tool={call['tool']}  input={call['input_summary']}"
        )
    return 0


def worker_command(args: argparse.Namespace) -> int:
    """Check the manifest and settings here (clear errors), then become the small process that
    runs the hypercorn CLI under a hard deadline after SIGTERM
    (`tether.programs.worker.deadline`)."""
    from ..spec.stopping import GRACEFUL_TIMEOUT_ENV, stop_grace_seconds
    from .worker import deadline
    from .worker.hypercorn_config import graceful_timeout
    from .worker.settings import (
        METRICS_PORT_ENV,
        SERVES_ENV,
        metrics_port_from_env,
        serves_from_env,
        settings_from_env,
        without_agent_secrets,
    )

    # A flag wins over its variable; a variable that is not used is not checked either.
    serves = args.serve or serves_from_env(os.environ)
    metrics_port = args.metrics_port
    if metrics_port is None:
        metrics_port = metrics_port_from_env(os.environ)
    if metrics_port == args.port:
        raise ConfigError(f"the metrics port {metrics_port} is --port: give it a port of its own")
    env = {
        **os.environ,
        "TETHER_SPEC": str(Path(args.spec).resolve()),
        "TETHER_WORKER_BIND": f"{args.host}:{args.port}",
        "TETHER_WORKER_PROCESSES": str(args.processes),
        SERVES_ENV: serves,
    }
    env.pop(METRICS_PORT_ENV, None)
    if metrics_port is not None:
        env[METRICS_PORT_ENV] = str(metrics_port)
    # What the worker would refuse at start-up, said here without a traceback (and without
    # importing the worker itself: its process imports it once, and starts sooner).
    settings = settings_from_env(env)
    if settings.serves_agent:
        _check_agent(settings.manifest.spec, env)
        # The operator sets it with the pod's grace period; run by hand, the spec says.
        env.setdefault(GRACEFUL_TIMEOUT_ENV, f"{stop_grace_seconds(settings.manifest.spec):g}")
    else:
        env = without_agent_secrets(settings)  # an index has no use for them
    if metrics_port is not None and args.processes > 1 and not env.get("PROMETHEUS_MULTIPROC_DIR"):
        print(
            "tether: warning: without PROMETHEUS_MULTIPROC_DIR each of the worker's processes "
            "answers /metrics with its own values only",
            file=sys.stderr,
        )
    command = [sys.executable, "-m", "hypercorn", "--config"]
    command += ["python:tether.programs.worker.hypercorn_config", "tether.programs.worker.asgi:app"]
    # Run as a script, not as `tether.programs.worker.deadline`: nothing of tether stays in memory.
    graceful = env.get(GRACEFUL_TIMEOUT_ENV, str(graceful_timeout))
    script = [sys.executable, "-I", deadline.__file__, graceful, *command]
    os.execve(sys.executable, script, env)


def _check_agent(spec: Any, env: dict[str, str]) -> None:
    """What the agent's runs need: the model's key and SDK, sub-agent settings that work."""
    from ..spec.assemble import check_subagents, require_api_key

    require_api_key(spec, env)
    if spec.model.provider in ("anthropic", "openai"):
        provider = spec.model.provider
        require_extra(f"tether.providers.{provider}", provider)
    check_subagents(spec)


def main(argv: list[str] | None = None) -> None:
    # `run`, `worker` (until it execs `tether.programs.worker.deadline`, which does the same),
    # `sidecar` and `dev` hold the webhook secret or the model keys: out of reach of the agent's
    # `shell`.
    make_undumpable()
    args = build_parser().parse_args(argv)
    from .redact import install as install_redaction

    install_redaction()  # URLs, tokens and secrets of the environment out of every log line
    try:
        if args.command == "run":
            from .run import run_command

            code = run_command(args, dict(os.environ))
        elif args.command == "crashtest":
            from .crashtest import crashtest_command

            code = crashtest_command(args)
        elif args.command == "answer":
            code = answer_command(args)
        elif args.command == "waiting":
            code = waiting_command(args)
        elif args.command == "worker":
            code = worker_command(args)
        elif args.command == "sidecar":
            code = sidecar_command(args)
        elif args.command == "dev":
            code = dev_command(args)
        elif args.command == "resolve":
            code = resolve_command(args)
        elif args.command == "approvals":
            code = approvals_command(args)
        elif args.command in ("watch", "events-url"):
            code = watch_command(args)
        elif args.command == "crd":
            from ..spec.crd import durableagent_crd_yaml

            sys.stdout.write(durableagent_crd_yaml())
            code = 0
        else:  # pragma: no cover - argparse rejects unknown commands
            code = 2
    except USER_ERRORS as error:
        print(f"tether: {error}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)

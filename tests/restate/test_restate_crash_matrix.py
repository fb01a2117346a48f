"""The crash matrix of `tests/test_sqlite_crash_matrix.py` on the real restate-server.

The scripted agent of `services/agent_service.py` (8 model turns, 10 tool calls: unsafe
`charge`/`notify`, safe `lookup`) runs on `restate_runtime` in real hypercorn worker processes.
A worker is SIGKILLed at every live step boundary and inside every tool body; a fresh worker on
the same port (the same registered deployment) then finishes the run from the journal. The server
itself is restarted mid-run, SIGKILLed and gracefully. After every crash:

- the run completes;
- no unsafe tool body ran twice (the effects file), every safe lookup ran at least once;
- the transcript has exactly one result per tool call, in call order;
- the model was called exactly once per turn across all worker processes (a `turn:after` hook,
  which fires only for live model steps, appends `model <turn>` to a file);
- the fresh worker replayed what the killed one journaled: replayed + live steps = a clean run.

One server serves the whole worker-crash matrix (unique object keys per case); the server
restarts use private servers. Every wait is a poll with a deadline.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import (
    FAST_RETRY_ENV,
    HypercornWorker,
    ServedApp,
    free_port,
    http,
    read_lines,
    service_app,
    wait_until,
)

from tether.restate_server import RestateServer
from tether.session.session import INTERRUPTED_RESULT

SERVICE = "CrashAgent"
UNSAFE = {"charge", "notify"}
TURNS = [1, 1, 3, 1, 2, 1, 1]
ALL_CALLS = [f"call_{t}_{i}" for t, n in enumerate(TURNS) for i in range(n)]
CALL_TOOLS = {
    "call_0_0": "charge",
    "call_1_0": "lookup",
    "call_2_0": "lookup",
    "call_2_1": "lookup",
    "call_2_2": "notify",
    "call_3_0": "charge",
    "call_4_0": "notify",
    "call_4_1": "notify",
    "call_5_0": "lookup",
    "call_6_0": "charge",
}
#: The calls that run together (one concurrent group each; the others run alone).
GROUPS = [["call_2_0", "call_2_1", "call_2_2"], ["call_4_0", "call_4_1"]]
MODEL_TURNS = 8
#: Generous: another suite may run Restate tests on the same 2 cores at the same time.
DEADLINE = 180.0


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """The files and the object key of one crashed run."""

    key: str
    effects: Path
    models: Path

    @classmethod
    def new(cls, directory: Path, prefix: str) -> Case:
        directory.mkdir(parents=True, exist_ok=True)
        return cls(
            key=f"{prefix}-{uuid.uuid4().hex[:8]}",
            effects=directory / "effects",
            models=directory / "models",
        )

    def request(self, **extra: Any) -> dict[str, Any]:
        return {"effects": str(self.effects), "models": str(self.models), **extra}


def send(server: RestateServer, case: Case, **extra: Any) -> str:
    """Start `CrashAgent/<key>/run` through the ingress without waiting; the invocation id."""
    url = f"{server.ingress_url}/{SERVICE}/{case.key}/run/send"
    resp = http("POST", url, case.request(**extra))
    assert resp.status == 202, resp.text
    invocation_id: str = resp.json()["invocationId"]
    return invocation_id


def attach(server: RestateServer, invocation_id: str) -> dict[str, Any]:
    url = f"{server.ingress_url}/restate/invocation/{invocation_id}/attach"
    resp = http("GET", url, timeout=DEADLINE)
    assert resp.status == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


def transcript(server: RestateServer, key: str) -> list[dict[str, Any]]:
    resp = http("POST", f"{server.ingress_url}/{SERVICE}/{key}/transcript", timeout=DEADLINE)
    assert resp.status == 200, resp.text
    turns: list[dict[str, Any]] = resp.json()
    return turns


def invocation_status(server: RestateServer, invocation_id: str) -> str | None:
    rows = server.query(f"SELECT status FROM sys_invocation WHERE id = '{invocation_id}'")
    return str(rows[0]["status"]) if rows else None


def tool_results(turns: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every tool call's result block, checked to be exactly one per call and in call order."""
    results: dict[str, dict[str, Any]] = {}
    seen: list[str] = []
    for i, turn in enumerate(turns):
        uses = [b["id"] for b in turn["content"] if b["type"] == "tool_use"]
        if not uses:
            continue
        assert i + 1 < len(turns), f"no results turn after the calls {uses}"
        blocks = [b for b in turns[i + 1]["content"] if b["type"] == "tool_result"]
        assert [b["tool_use_id"] for b in blocks] == uses, (uses, blocks)
        results.update((b["tool_use_id"], b) for b in blocks)
        seen += uses
    assert seen == ALL_CALLS, seen
    return results


def check_outcome(
    server: RestateServer, case: Case, result: dict[str, Any], clean_steps: int
) -> dict[str, dict[str, Any]]:
    """The checks every crashed run must pass; returns the tool results by call id."""
    assert result["status"] == "completed", result
    assert result["turns"] == MODEL_TURNS and result["tool_calls"] == len(ALL_CALLS), result
    steps = sum(result["live"].values()) + sum(result["replayed"].values())
    assert steps == clean_steps, f"live + replayed steps {result} != clean run {clean_steps}"

    lines = read_lines(case.effects)
    runs = Counter(line.split()[1] for line in lines)
    assert {line.split()[1]: line.split()[0] for line in lines}.items() <= CALL_TOOLS.items()
    for call, tool in CALL_TOOLS.items():
        if tool in UNSAFE:
            assert runs[call] <= 1, f"unsafe {tool} {call} ran {runs[call]} times: {lines}"
        else:
            assert runs[call] >= 1, f"safe lookup {call} never ran: {lines}"

    models = Counter(read_lines(case.models))
    assert models == Counter(f"model {t}" for t in range(MODEL_TURNS)), (
        f"model calls across workers: {sorted(models.elements())}"
    )
    return tool_results(transcript(server, case.key))


def check_every_call_ran_once(case: Case) -> None:
    """No crash cut a tool body off: every call ran exactly once."""
    runs = Counter(line.split()[1] for line in read_lines(case.effects))
    assert runs == Counter(ALL_CALLS), read_lines(case.effects)


@contextlib.contextmanager
def dump_logs(server: RestateServer, log_path: Path) -> Iterator[None]:
    """On a failure, print the worker and server log tails (pytest shows them with the test)."""
    try:
        yield
    except BaseException:
        worker_log = log_path.read_text(errors="replace")[-6000:] if log_path.exists() else ""
        sys.stderr.write(f"\n----- worker log ({log_path}) -----\n{worker_log}\n")
        sys.stderr.write(f"\n----- restate-server log -----\n{server.log_tail(6000)}\n")
        raise


# --------------------------------------------------------------------------------------------
# The shared server and worker port
# --------------------------------------------------------------------------------------------


@dataclass
class Matrix:
    """One server and one registered worker address; workers come and go on that port."""

    server: RestateServer
    port: int
    log_dir: Path
    clean_steps: int = 0

    def worker(self, env: Mapping[str, str] | None = None) -> HypercornWorker:
        return HypercornWorker(
            service_app("agent_service"), port=self.port, env=env, log_dir=self.log_dir
        )

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"hypercorn-{self.port}.log"


@pytest.fixture(scope="module")
def matrix(restate_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    log_dir = tmp_path_factory.mktemp("matrix-workers")
    with RestateServer(restate_binary, extra_env=FAST_RETRY_ENV) as server:
        m = Matrix(server=server, port=free_port(), log_dir=log_dir)
        with m.worker() as worker:
            server.register(worker.url)
            # A clean run counts the live steps: the boundaries of the matrix.
            case = Case.new(log_dir / "clean", "clean")
            with dump_logs(server, m.log_path):
                result = attach(server, send(server, case))
                assert result["status"] == "completed", result
                assert not result["replayed"], result
                m.clean_steps = sum(result["live"].values())
                check_outcome(server, case, result, m.clean_steps)
                check_every_call_ran_once(case)
        yield m


def crash_and_resume(
    matrix: Matrix, case: Case, env: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Run `case` on a worker with the kill variables `env`, wait for the worker to die, finish
    the run on a fresh worker (same port, no re-registration) and check the outcome."""
    server = matrix.server
    with dump_logs(server, matrix.log_path):
        killer = matrix.worker(env)
        try:
            killer.start()
            invocation_id = send(server, case)
            wait_until(
                lambda: killer.returncode() is not None,
                timeout=DEADLINE,
                interval=0.02,
                what=f"the worker to kill itself ({dict(env)})",
            )
        finally:
            killer.kill()  # reaps the exited parent; SIGKILLs anything left of its group
        assert invocation_status(server, invocation_id) != "completed", "killed after the end"

        with matrix.worker() as fresh:
            result = attach(server, invocation_id)
            results = check_outcome(server, case, result, matrix.clean_steps)
            fresh.kill()  # SIGKILL is enough once the run is over; faster than a graceful stop
        return result, results


# --------------------------------------------------------------------------------------------
# Worker crashes
# --------------------------------------------------------------------------------------------


def test_clean_run_has_the_expected_steps(matrix: Matrix) -> None:
    # 8 decisions + run:end, 8 model steps, 10 tool bodies + 5 intents of unsafe groups.
    assert matrix.clean_steps == 32
    assert list(CALL_TOOLS) == ALL_CALLS


def test_kill_at_every_live_step_boundary(matrix: Matrix, tmp_path: Path) -> None:
    """A SIGKILL right after the N-th live step was journaled, for every N of a clean run."""
    assert matrix.clean_steps >= 30
    for n in range(1, matrix.clean_steps + 1):
        case = Case.new(tmp_path / f"b{n}", f"b{n}")
        env = {"TETHER_KILL_AFTER_LIVE_STEPS": str(n)}
        result, results = crash_and_resume(matrix, case, env)
        # The killed worker journaled at least n steps; the fresh one replayed them all.
        assert sum(result["replayed"].values()) >= n, (n, result)
        # A kill between steps cuts no body off, not even right after a journaled intent: the
        # bodies had not started, so they run now instead of being reported interrupted.
        check_every_call_ran_once(case)
        errors = {c: b for c, b in results.items() if b.get("is_error")}
        assert not errors, (n, errors)


@pytest.mark.parametrize("call", ALL_CALLS)
def test_kill_inside_a_tool_body(matrix: Matrix, tmp_path: Path, call: str) -> None:
    """Killed inside a body: an unsafe call is reported interrupted, a safe one runs again."""
    case = Case.new(tmp_path, f"t-{call}")
    _, results = crash_and_resume(matrix, case, {"TETHER_KILL_IN_CALL": call})
    tool = CALL_TOOLS[call]
    lines = read_lines(case.effects)
    runs = Counter(line.split()[1] for line in lines)
    assert runs[call] == (2 if tool == "lookup" else 1), lines
    # The calls of other groups ran once. Those of the same group ran concurrently with the
    # killed one: the outcome checks already hold them to at most once (unsafe) and at least
    # once (safe).
    group = next((g for g in GROUPS if call in g), [call])
    assert all(runs[c] == 1 for c in ALL_CALLS if c not in group), lines
    block = results[call]
    assert bool(block.get("is_error")) == (tool in UNSAFE), block
    if tool in UNSAFE:
        assert block["content"] == INTERRUPTED_RESULT, block


# --------------------------------------------------------------------------------------------
# Server crashes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "sigkill"])
def test_server_restart_mid_run(
    new_restate_server: Callable[..., RestateServer],
    serve_app: Callable[..., ServedApp],
    graceful: bool,
    tmp_path: Path,
) -> None:
    server = new_restate_server()
    served: ServedApp = serve_app("agent_service", server=server)
    case = Case.new(tmp_path, "srv")
    with dump_logs(server, served.worker.log_path):
        # Every tool body sleeps, so the run is still going when the server goes down.
        invocation_id = send(server, case, tool_seconds=0.3)
        wait_until(
            lambda: len(read_lines(case.effects)) >= 3,
            timeout=DEADLINE,
            what="3 tool bodies to run",
        )
        server.restart(graceful=graceful)
        result = attach(server, invocation_id)
        assert sum(result["replayed"].values()) > 0, "the run finished before the restart"
        clean_steps = sum(result["live"].values()) + sum(result["replayed"].values())
        assert clean_steps == 32
        check_outcome(server, case, result, clean_steps)

"""The crash matrix of `tests/test_sqlite_crash_matrix.py` on the real restate-server.

The scripted agent of `services/agent_service.py` in its matrix form (`"matrix": true`: 8 model
turns, 12 tool calls: unsafe `charge`/`notify`, safe `lookup`, two parallel groups, an awakeable
`approve` and a `spawn` whose child runs 3 model turns and 3 tool calls of its own as a separate
invocation) runs on `restate_runtime` in real hypercorn worker processes: 48 journaled steps,
36 of the parent and 12 of the child. A harness thread resolves every awakeable id the run
publishes through the ingress. A worker is SIGKILLed at every live step boundary (of the parent
or the child, whichever the worker runs at that point) and inside every tool body (parent and
child, the awakeable's notify, the spawn's dispatch and merge); a fresh worker on the same port
(the same registered deployment) then finishes the run from the journal. The server itself is
restarted mid-run, SIGKILLed and gracefully, while tool bodies run and while the run is parked
on its awakeable. After every crash:

- the run completes;
- no unsafe tool body ran twice, in the parent or the child (the effects file); every safe lookup
  ran at least once;
- the awakeable's notify step was journaled live exactly once; its body ran exactly once, or
  exactly twice (publishing the same id both times) when the kill was inside it, before its
  step was journaled (a server restart while tool bodies run may cut it off too: there only the
  journaled-once rule is asserted); the resolver's payload is the tool result;
- the parent's transcript has exactly one result per tool call, in call order, and so does the
  child's (handed back to the parent);
- the model was called exactly once per turn across all worker processes, parent and child (a
  `turn:after` hook in the parent and the child's provider, which run only inside live model
  steps, append `model <turn>` / `model child:<turn>` to a file);
- the fresh worker replayed what the killed one journaled: per invocation, the final attempt's
  replayed + live steps are the steps of a clean run, in the same journal order.

One server serves the whole worker-crash matrix (unique object keys per case); the server
restarts use private servers. Every wait is a poll with a deadline.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest

from tests.restate.support import (
    FAST_RETRY_ENV,
    HypercornWorker,
    ServedApp,
    free_port,
    http,
    read_lines,
    service_app,
    wait_until,
)
from tether.programs.restate_server import RestateServer
from tether.session.session import INTERRUPTED_RESULT

SERVICE = "CrashAgent"
UNSAFE = {"charge", "notify"}
TURNS = [1, 1, 3, 2, 2, 2, 1]
ALL_CALLS = [f"call_{t}_{i}" for t, n in enumerate(TURNS) for i in range(n)]
CALL_TOOLS = {
    "call_0_0": "charge",
    "call_1_0": "lookup",
    "call_2_0": "lookup",
    "call_2_1": "lookup",
    "call_2_2": "notify",
    "call_3_0": "approve",
    "call_3_1": "charge",
    "call_4_0": "notify",
    "call_4_1": "notify",
    "call_5_0": "lookup",
    "call_5_1": "spawn",
    "call_6_0": "charge",
}
APPROVE = "call_3_0"
SPAWN = "call_5_1"
#: The spawned child's calls, as its effect lines name them.
CHILD_CALL_TOOLS = {
    "child:call_0_0": "charge",
    "child:call_1_0": "lookup",
    "child:call_1_1": "notify",
}
CHILD_CALLS = list(CHILD_CALL_TOOLS)
#: The calls whose bodies append `<tool> <call id>` to the effects file (approve appends
#: `awakeable <call id> <awakeable id>`; spawn's effects are its child's).
BODY_TOOLS = {
    **{c: t for c, t in CALL_TOOLS.items() if t in ("charge", "notify", "lookup")},
    **CHILD_CALL_TOOLS,
}
#: The calls that run together (one concurrent group each; the others run alone).
GROUPS = [
    ["call_2_0", "call_2_1", "call_2_2"],
    ["call_4_0", "call_4_1"],
    ["child:call_1_0", "child:call_1_1"],
]
#: Inside every tool body: the plain bodies, the awakeable's notify, the spawn's dispatch
#: (before the child call) and its `on_child_merged` (child result journaled, the parent's
#: `spawn:complete` step not yet).
KILL_POINTS = [*BODY_TOOLS, APPROVE, SPAWN, f"{SPAWN}:merged"]
MODEL_TURNS = 8
CHILD_TURNS = 3
#: Journaled steps of a clean run. Parent: 8 model steps (each decides first whether its turn
#: happens; the last one's time is the run's end), 10 tool bodies, 5 intents of unsafe groups, 2
#: self-journaled tool checks, the awakeable's notify and the spawn's `spawn:complete`. Child: 3
#: model steps, 3 bodies, 2 intents.
PARENT_STEPS = 27
CHILD_STEPS = 8
APPROVAL = "approved by ops"
CHILD_TEXT = "invoices settled"
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
    steps: Path

    @classmethod
    def new(cls, directory: Path, prefix: str) -> Case:
        directory.mkdir(parents=True, exist_ok=True)
        return cls(
            key=f"{prefix}-{uuid.uuid4().hex[:8]}",
            effects=directory / "effects",
            models=directory / "models",
            steps=directory / "steps",
        )

    def request(self, **extra: Any) -> dict[str, Any]:
        files = {"effects": str(self.effects), "models": str(self.models)}
        return {**files, "steps": str(self.steps), "matrix": True, **extra}


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


def tool_results(turns: list[dict[str, Any]], calls: list[str]) -> dict[str, dict[str, Any]]:
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
    assert seen == calls, seen
    return results


# The steps file: `<label> enter` at each attempt, `<label> start <kind> <entry>` when a step's
# body starts, `<label> live|replayed <kind> <entry>` when its result is journaled ------------

Step = tuple[str, str]
"""(label, entry): one journaled step of the parent or the child."""

JOURNALED = ("live", "replayed")


def live_steps(lines: list[str]) -> list[str]:
    return [x for x in lines if x.split()[1] == "live"]


def final_attempt(lines: list[str], label: str) -> list[str]:
    """The journaled steps of `label`'s last attempt (after its last `enter`), as
    `live|replayed kind entry`."""
    mine = [x.split(" ", 1)[1] for x in lines if x.split()[0] == label]
    last = max(i for i, x in enumerate(mine) if x == "enter")
    return [x for x in mine[last + 1 :] if x.split()[0] in JOURNALED]


def journal_order(steps: list[str]) -> list[str]:
    """`kind entry` of each step: what a replay must reproduce in the same order."""
    return [x.split(" ", 1)[1] for x in steps]


def clean_order(lines: list[str]) -> dict[str, list[str]]:
    return {label: journal_order(final_attempt(lines, label)) for label in ("parent", "child")}


def step_of(call: str) -> Step:
    """The journaled step of a tool call's body."""
    if call.startswith("child:"):
        return "child", f"tool:{call.removeprefix('child:')}"
    return "parent", f"tool:{call}"


NOTIFY_STEP: Step = ("parent", f"approve-notify:{APPROVE}")


def cut_by(point: str) -> set[Step]:
    """The steps a kill inside `point`'s body may cut off: the call's own and those of its
    concurrent group (their bodies run together), or the awakeable's notify step. A kill in
    the spawn's dispatch or merge is inside no step."""
    if point == APPROVE:
        return {NOTIFY_STEP}
    if point not in BODY_TOOLS:
        return set()
    group = next((g for g in GROUPS if point in g), [point])
    return {step_of(c) for c in group}


def check_step_bodies(
    steps: list[str], clean: Mapping[str, list[str]], cut: Collection[Step] | None
) -> Counter[Step]:
    """How often each step's body started, checked: no body started after its step's result
    was journaled (a replay never runs a journaled step again), and every step of a clean run
    started. With `cut` known (the steps a kill may have cut off inside their bodies), every
    other step started exactly once, and those of `cut` once or twice."""
    journaled: set[Step] = set()
    starts: Counter[Step] = Counter()
    for line in steps:
        label, status, *rest = line.split()
        if status == "enter":
            continue
        step = (label, rest[1])
        if status == "start":
            assert step not in journaled, f"{step} started after it was journaled: {steps}"
            starts[step] += 1
        else:
            journaled.add(step)
    expected = {(label, x.split()[1]) for label, order in clean.items() for x in order}
    assert set(starts) == expected, (set(starts) ^ expected, steps)
    if cut is not None:
        again = {step: n for step, n in starts.items() if n != 1}
        assert again.keys() <= set(cut) and max(again.values(), default=1) <= 2, (again, steps)
    return starts


# The awakeable ----------------------------------------------------------------------------------


def awakeable_lines(effects: Path) -> list[str]:
    return [x for x in read_lines(effects) if x.startswith("awakeable ")]


@dataclass
class Resolver:
    """A thread that resolves every awakeable the run publishes: each new `awakeable <call>
    <id>` line of the effects file (a replay that runs notify again publishes the same id again
    and is resolved again) gets `POST /restate/awakeables/<id>/resolve` with `{"answer", "id"}`.
    A failed request (the server restarting) is retried at the next poll. `hold` defers
    resolving until `release()`; `once_per_id` resolves each id only at its first publication.
    """

    server: RestateServer
    effects: Path
    hold: bool = False
    once_per_id: bool = False
    resolved: list[tuple[str, int]] = field(default_factory=list)
    """(id, HTTP status) of each resolution, in order."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def release(self) -> None:
        self.hold = False

    def _resolve(self, awakeable_id: str) -> int | None:
        url = f"{self.server.ingress_url}/restate/awakeables/{awakeable_id}/resolve"
        try:
            resp = http("POST", url, {"answer": APPROVAL, "id": awakeable_id}, timeout=10.0)
        except OSError:
            return None
        return None if resp.status >= 500 else resp.status

    def _loop(self) -> None:
        try:
            while not self._stop.wait(0.02):
                if self.hold:
                    continue
                published = [x.split()[2] for x in awakeable_lines(self.effects)]
                if self.once_per_id:
                    published = list(dict.fromkeys(published))
                for awakeable_id in published[len(self.resolved) :]:
                    status = self._resolve(awakeable_id)
                    if status is None:
                        break
                    self.resolved.append((awakeable_id, status))
        except BaseException as error:
            self._error = error

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._loop, name="awakeable-resolver", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)
            assert not self._thread.is_alive(), "the resolver thread did not stop"
        if self._error is not None and exc is None:
            raise self._error


# The checks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    result: dict[str, Any]
    results: dict[str, dict[str, Any]]
    """The parent's tool results by call id."""
    child_results: dict[str, dict[str, Any]]
    """The child's tool results by `child:<call id>`."""
    awakeable_id: str
    starts: Counter[Step]
    """How often each step's body started, across attempts."""


def check_outcome(
    server: RestateServer,
    case: Case,
    result: dict[str, Any],
    clean: Mapping[str, list[str]],
    resolver: Resolver,
    *,
    cut: Collection[Step] | None = (),
) -> Outcome:
    """The checks every crashed run must pass. `clean` is the journal order of a clean run per
    invocation; `cut` the steps whose bodies the crash may have cut off (None: unknown, as for
    a server restart while bodies run)."""
    assert result["status"] == "completed", result
    assert result["turns"] == MODEL_TURNS and result["tool_calls"] == len(ALL_CALLS), result

    # Replays reproduce the journal: per invocation, the final attempt's replayed + live steps
    # are the clean run's, in its order. The runtime's own counters agree (they do not count
    # the awakeable's notify, which the tool journals on the context itself).
    steps = read_lines(case.steps)
    for label, count in (("parent", PARENT_STEPS), ("child", CHILD_STEPS)):
        order = journal_order(final_attempt(steps, label))
        assert len(order) == count and order == clean[label], (label, order, clean[label])
    counted = sum(result["live"].values()) + sum(result["replayed"].values())
    assert counted == PARENT_STEPS - 1, result
    starts = check_step_bodies(steps, clean, cut)

    lines = read_lines(case.effects)
    bodies = [x for x in lines if not x.startswith("awakeable ")]
    runs = Counter(line.split()[1] for line in bodies)
    assert {x.split()[1]: x.split()[0] for x in bodies}.items() <= BODY_TOOLS.items(), bodies
    for call, tool in BODY_TOOLS.items():
        if tool in UNSAFE:
            assert runs[call] <= 1, f"unsafe {tool} {call} ran {runs[call]} times: {lines}"
        else:
            assert runs[call] >= 1, f"safe lookup {call} never ran: {lines}"

    # The awakeable: notify ran once per start of its step (so, by `check_step_bodies`, more
    # than once only when cut off before its step was journaled, never after), always with the
    # same id, and its resolution (the harness resolves each publication) is the tool result.
    published = awakeable_lines(case.effects)
    assert len(published) == starts[NOTIFY_STEP], (published, steps)
    assert {x.split()[1] for x in published} == {APPROVE}, published
    [awakeable_id] = {x.split()[2] for x in published}
    wait_until(lambda: resolver.resolved, timeout=DEADLINE, what="the resolver's bookkeeping")
    assert {i for i, _ in resolver.resolved} == {awakeable_id}, resolver.resolved
    assert resolver.resolved[0][1] == 202, resolver.resolved

    models = Counter(read_lines(case.models))
    expected = [f"model {t}" for t in range(MODEL_TURNS)]
    expected += [f"model child:{t}" for t in range(CHILD_TURNS)]
    assert models == Counter(expected), f"model calls across workers: {sorted(models.elements())}"

    results = tool_results(transcript(server, case.key), ALL_CALLS)
    approval = results[APPROVE]
    assert not approval.get("is_error"), approval
    assert approval["content"] == f"release v3: {APPROVAL} ({awakeable_id})", approval
    spawned = results[SPAWN]
    assert not spawned.get("is_error") and spawned["content"] == CHILD_TEXT, spawned

    [child] = result["children"]
    assert child["label"] == "child-1" and child["status"] == "completed", child
    child_calls = [c.removeprefix("child:") for c in CHILD_CALLS]
    by_id = tool_results(child["turns"], child_calls)
    child_results = {f"child:{c}": b for c, b in by_id.items()}
    return Outcome(result, results, child_results, awakeable_id, starts)


def check_every_call_ran_once(case: Case, never: Collection[str] = ()) -> None:
    """No crash cut a tool body off: every body (parent and child) and the awakeable's notify
    ran exactly once, but those in `never`."""
    lines = read_lines(case.effects)
    runs = Counter(line.split()[1] for line in lines)
    assert runs == Counter([c for c in [*BODY_TOOLS, APPROVE] if c not in never]), lines


def interrupted_by(boundary: str) -> set[str]:
    """The unsafe calls a kill right after the live step `boundary` leaves interrupted: those
    of the group whose intent it journaled."""
    label, _, _, entry = boundary.split()
    if not entry.startswith("tool-start:"):
        return set()
    prefix = "child:" if label == "child" else ""
    first = prefix + entry.removeprefix("tool-start:")
    group = next((g for g in GROUPS if first in g), [first])
    return {c for c in group if BODY_TOOLS.get(c) in UNSAFE}


def errors(outcome: Outcome) -> dict[str, dict[str, Any]]:
    every = {**outcome.results, **outcome.child_results}
    return {c: b for c, b in every.items() if b.get("is_error")}


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
    clean: dict[str, list[str]] = field(default_factory=dict)
    """The journal order of a clean run, per invocation (`parent`, `child`)."""
    boundaries: list[str] = field(default_factory=list)
    """The live steps of a clean run in the order one worker journals them: the kill points
    of `TETHER_KILL_AFTER_LIVE_STEPS`."""

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
            # A clean run gives the boundaries of the matrix and the journal order.
            case = Case.new(log_dir / "clean", "clean")
            with dump_logs(server, m.log_path), Resolver(server, case.effects) as resolver:
                result = attach(server, send(server, case))
                assert result["status"] == "completed", result
                assert not result["replayed"], result
                steps = read_lines(case.steps)
                assert not [x for x in steps if x.split()[1] == "replayed"], steps
                m.boundaries = live_steps(steps)
                m.clean = clean_order(steps)
                check_outcome(server, case, result, m.clean, resolver)
                check_every_call_ran_once(case)
                assert len(resolver.resolved) == 1, resolver.resolved
        yield m


def crash_and_resume(
    matrix: Matrix,
    case: Case,
    env: Mapping[str, str],
    *,
    cut: Collection[Step] = (),
    resolve_while_down: bool = False,
) -> tuple[Outcome, list[str], Resolver]:
    """Run `case` on a worker with the kill variables `env` (the harness resolving its
    awakeable throughout), wait for the worker to die, finish the run on a fresh worker (same
    port, no re-registration) and check the outcome (`cut`: the steps the kill may cut off).
    Also returns the lines the killed worker wrote to the steps file.

    `resolve_while_down`: the harness resolves each awakeable id once, and not before the
    killed worker is gone: a publication by the killed worker is resolved while no worker
    runs, before the fresh one starts."""
    server = matrix.server
    resolver = Resolver(
        server, case.effects, hold=resolve_while_down, once_per_id=resolve_while_down
    )
    with dump_logs(server, matrix.log_path), resolver:
        killer = matrix.worker(env)
        try:
            killer.start()
            invocation_id = send(server, case)
            wait_until(
                lambda: killer.returncode() is not None,
                timeout=DEADLINE,
                what=f"the worker to kill itself ({dict(env)})",
            )
        finally:
            killer.kill()  # reaps the exited parent; SIGKILLs anything left of its group
        killed = read_lines(case.steps)
        assert invocation_status(server, invocation_id) != "completed", "killed after the end"
        if resolve_while_down:
            resolver.release()
            wait_until(
                lambda: len(resolver.resolved) == len(set(awakeable_lines(case.effects))),
                timeout=DEADLINE,
                what="the harness to resolve what the killed worker published",
            )

        with matrix.worker() as fresh:
            result = attach(server, invocation_id)
            outcome = check_outcome(server, case, result, matrix.clean, resolver, cut=cut)
            fresh.kill()  # SIGKILL is enough once the run is over; faster than a graceful stop
        return outcome, killed, resolver


# --------------------------------------------------------------------------------------------
# Worker crashes
# --------------------------------------------------------------------------------------------


def test_clean_run_has_the_expected_steps(matrix: Matrix) -> None:
    assert len(matrix.clean["parent"]) == PARENT_STEPS
    assert len(matrix.clean["child"]) == CHILD_STEPS
    assert len(matrix.boundaries) == PARENT_STEPS + CHILD_STEPS
    assert list(CALL_TOOLS) == ALL_CALLS
    kinds = Counter(x.split()[2] for x in matrix.boundaries)
    assert kinds == {"decision": 3, "model": 11, "tool": 20, "run": 1}, kinds
    # The child's steps are journaled while the parent waits on the spawn call.
    labels = [x.split()[0] for x in matrix.boundaries]
    first, last = labels.index("child"), len(labels) - labels[::-1].index("child")
    assert labels[first:last] == ["child"] * CHILD_STEPS, labels
    assert matrix.boundaries[first - 1] == f"parent live decision tool-check:{SPAWN}"
    assert matrix.boundaries[last] == f"parent live decision /tool:{SPAWN}/spawn:complete"
    assert f"parent live run approve-notify:{APPROVE}" in matrix.boundaries


def test_kill_at_every_live_step_boundary(matrix: Matrix, tmp_path: Path) -> None:
    """A SIGKILL right after the N-th live step was journaled, for every N of a clean run: the
    parent's steps, the awakeable's notify, and the child's steps (both invocations die)."""
    assert len(matrix.boundaries) == PARENT_STEPS + CHILD_STEPS  # every live step, in order
    child_steps = [i for i, x in enumerate(matrix.boundaries, start=1) if x.startswith("child ")]
    child_done = child_steps[-1]  # its last step: the child returns right after it
    for n, step in enumerate(matrix.boundaries, start=1):
        case = Case.new(tmp_path / f"b{n}", f"b{n}")
        env = {"TETHER_KILL_AFTER_LIVE_STEPS": str(n)}
        outcome, killed, _ = crash_and_resume(matrix, case, env)
        # The worker died right after the N-th live step, the one of the clean run.
        live = live_steps(killed)
        assert len(live) == n and live[-1] == step, (n, step, live)
        # The fresh worker replayed what the killed one journaled, in each invocation it
        # resumed: the parent always, the child unless it had returned before the kill.
        fresh = read_lines(case.steps)[len(killed) :]
        for label in ("parent", "child"):
            if f"{label} enter" not in fresh:
                assert label == "child" and child_done <= n, (n, step, fresh)
                continue
            journaled = sum(1 for x in live if x.split()[0] == label)
            replayed = [x for x in final_attempt(fresh, label) if x.startswith("replayed ")]
            assert len(replayed) >= journaled, (n, step, label, journaled, replayed)
        # A kill between steps cuts no body off (`crash_and_resume` checked that every step's
        # body, model calls included, started exactly once), but right after a journaled
        # intent nothing can tell that its bodies had not started: a server crash after they
        # started leaves the same journal. Its unsafe calls are reported interrupted and never
        # run; its safe calls run.
        unsafe = interrupted_by(step)
        check_every_call_ran_once(case, unsafe)
        assert errors(outcome).keys() == unsafe, (n, step, errors(outcome))
        for call in unsafe:
            assert errors(outcome)[call]["content"] == INTERRUPTED_RESULT, (n, step, call)


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_inside_a_tool_body(matrix: Matrix, tmp_path: Path, point: str) -> None:
    """Killed inside a body: an unsafe call is reported interrupted, a safe one runs again, the
    awakeable notifies again (same id) and parks on it, a spawn dispatches its child once."""
    case = Case.new(tmp_path, f"t-{point.replace(':', '-')}")
    cut = cut_by(point)
    outcome, _, _ = crash_and_resume(matrix, case, {"TETHER_KILL_IN_CALL": point}, cut=cut)
    lines = read_lines(case.effects)
    runs = Counter(line.split()[1] for line in lines)
    tool = BODY_TOOLS.get(point)
    if tool is None:
        # approve: its notify step was not journaled, so notify runs again, publishing the same
        # id (resolved again). spawn (its dispatch, before the child call) and spawn:merged
        # (after the journaled child result): no step was cut, the child ran once.
        notify_runs = 2 if point == APPROVE else 1
        assert outcome.starts[NOTIFY_STEP] == notify_runs, outcome.starts
        assert runs == Counter({**Counter([*BODY_TOOLS, APPROVE]), APPROVE: notify_runs}), lines
        assert not errors(outcome), errors(outcome)
        return
    # The killed body's step started twice: the killed body, then the body again (safe) or
    # the interrupted result (unsafe).
    assert outcome.starts[step_of(point)] == 2, outcome.starts
    assert runs[point] == (2 if tool == "lookup" else 1), lines
    # The calls of other groups ran once. Those of the same group ran concurrently with the
    # killed one: the outcome checks already hold them to at most once (unsafe) and at least
    # once (safe).
    group = next((g for g in GROUPS if point in g), [point])
    assert all(runs[c] == 1 for c in [*BODY_TOOLS, APPROVE] if c not in group), lines
    block = {**outcome.results, **outcome.child_results}[point]
    assert bool(block.get("is_error")) == (tool in UNSAFE), block
    if tool in UNSAFE:
        assert block["content"] == INTERRUPTED_RESULT, block


def test_a_resolution_sent_while_no_worker_runs_reaches_the_replay(
    matrix: Matrix, tmp_path: Path
) -> None:
    """Killed inside notify: its step is not journaled, but the id it published is resolved
    while no worker runs. The fresh worker notifies again, publishing the SAME id, and parks
    on it: the earlier resolution releases it; nobody resolves it a second time."""
    case = Case.new(tmp_path, "down")
    env = {"TETHER_KILL_IN_CALL": APPROVE}
    outcome, killed, resolver = crash_and_resume(
        matrix, case, env, cut={NOTIFY_STEP}, resolve_while_down=True
    )
    assert f"parent live run approve-notify:{APPROVE}" not in killed, killed
    assert outcome.starts[NOTIFY_STEP] == 2, outcome.starts
    assert resolver.resolved == [(outcome.awakeable_id, 202)], resolver.resolved
    assert not errors(outcome), errors(outcome)


def test_every_await_suspending_gives_the_same_run(
    matrix: Matrix,
    serve_app: Callable[..., ServedApp],
    restate_server_always_suspend: RestateServer,
    tmp_path: Path,
) -> None:
    """The determinism check on the matrix script: every await suspends (the parent's park on
    the awakeable and on its child included) and each attempt replays the journal from the top.
    Every step's body ran once and the final attempts reproduce the clean run's journal order."""
    server = restate_server_always_suspend
    served: ServedApp = serve_app("agent_service", server=server)
    case = Case.new(tmp_path, "suspend")
    with dump_logs(server, served.worker.log_path), Resolver(server, case.effects) as resolver:
        result = attach(server, send(server, case))
        check_outcome(server, case, result, matrix.clean, resolver)
    check_every_call_ran_once(case)
    steps = read_lines(case.steps)
    attempts = Counter(x.split()[0] for x in steps if x.endswith(" enter"))
    assert attempts["parent"] > 10 and attempts["child"] > 5, attempts


# --------------------------------------------------------------------------------------------
# Server crashes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "sigkill"])
@pytest.mark.parametrize("point", ["tool-bodies", "parked"])
def test_server_restart_mid_run(
    matrix: Matrix,
    new_restate_server: Callable[..., RestateServer],
    serve_app: Callable[..., ServedApp],
    graceful: bool,
    point: str,
    tmp_path: Path,
) -> None:
    """The server restarts while the parent's tool bodies run (each sleeps 0.3 s), or while the
    run is parked on its awakeable (resolved only after the restart). The run completes."""
    server = new_restate_server()
    served: ServedApp = serve_app("agent_service", server=server)
    case = Case.new(tmp_path, "srv")
    parked = point == "parked"
    with (
        dump_logs(server, served.worker.log_path),
        Resolver(server, case.effects, hold=parked) as resolver,
    ):
        if parked:
            invocation_id = send(server, case)
            notified = f"parent live run approve-notify:{APPROVE}"
            wait_until(
                lambda: notified in read_lines(case.steps),
                timeout=DEADLINE,
                what="the awakeable's notify step to be journaled",
            )
        else:
            invocation_id = send(server, case, tool_seconds=0.3)
            wait_until(
                lambda: len(read_lines(case.effects)) >= 3,
                timeout=DEADLINE,
                what="3 tool bodies to run",
            )
        server.restart(graceful=graceful)
        resolver.release()
        result = attach(server, invocation_id)
        assert sum(result["replayed"].values()) > 0, "the run finished before the restart"
        # Parked, nothing runs when the server goes down: every step's body ran once. While
        # tool bodies run, the restart may cut some off (which ones depends on timing): only
        # the rule that no body ran after its step was journaled holds them.
        check_outcome(server, case, result, matrix.clean, resolver, cut=set() if parked else None)


@pytest.mark.parametrize(
    "held",
    [["call_0_0"], ["call_2_0", "call_2_1", "call_2_2"]],
    ids=["unsafe-alone", "safe-and-unsafe-together"],
)
def test_server_killed_while_bodies_run_keeps_their_results_and_runs_none_again(
    new_restate_server: Callable[..., RestateServer],
    serve_app: Callable[..., ServedApp],
    held: list[str],
    tmp_path: Path,
) -> None:
    """The restate-server dies with the bodies' own journal entries unread (stopped before
    they are sent, killed as the bodies start; the intent's entry was acknowledged before).
    The bodies run on in the worker, whose attempt ended; the server's next attempt, served by
    the same worker, journals their results: none runs again, none is reported interrupted.
    (Without the worker's record of them, the unsafe ones would be reported interrupted and the
    safe ones run again: `test_kill_inside_a_tool_body` above.)"""
    server = new_restate_server()
    served: ServedApp = serve_app("agent_service", server=server)
    effects, steps, gate = tmp_path / "effects", tmp_path / "steps", tmp_path / "gate"
    key = f"held-{uuid.uuid4().hex[:8]}"
    hold = {"path": str(gate), "calls": held, "kill": server.pid}
    request = {"effects": str(effects), "steps": str(steps), "tool_gate": hold}
    resp = http("POST", f"{server.ingress_url}/{SERVICE}/{key}/run/send", request)
    assert resp.status == 202, resp.text
    invocation_id = resp.json()["invocationId"]

    def ran(call: str) -> int:
        return sum(1 for line in read_lines(effects) if line.split()[1:] == [call])

    def attempts() -> int:
        return read_lines(steps).count("parent enter")

    with dump_logs(server, served.worker.log_path):
        wait_until(lambda: all(ran(c) for c in held), timeout=DEADLINE, what="the held bodies")
        wait_until(lambda: not server.is_running(), timeout=DEADLINE, what="the server's death")
        assert attempts() == 1
        server.restart(graceful=False)
        wait_until(lambda: attempts() >= 2, timeout=DEADLINE, what="the next attempt")
        gate.touch()
        result = attach(server, invocation_id)
    assert result["status"] == "completed", result
    turns = transcript(server, key)
    blocks = {
        b["tool_use_id"]: b for t in turns for b in t["content"] if b["type"] == "tool_result"
    }
    for call in held:
        assert ran(call) == 1, (call, read_lines(effects))
        assert not blocks[call].get("is_error"), blocks[call]

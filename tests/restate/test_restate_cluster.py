"""Tether's runs on a replicated 3-node Restate cluster on loopback, losing one node at a time.

Three `restate-server` nodes (`RestateCluster`: replication 2, 4 partitions, replicated
metadata) and one real hypercorn worker serving the scripted agent of
`services/agent_service.py` (`CrashAgent` on `restate_runtime`; registered through one node).
Every run is started through one node's ingress and followed (attached) through it, and
through another when that node dies.
Runs of three kinds are in the cluster when a node is lost:

- held: its third turn's concurrent group runs, with a safe `lookup` (`call_2_0`) and an unsafe
  `notify` (`call_2_2`) held running until the phase's gate file appears (`tool_gate`);
- parked: parked on an approval (`approve`, an awakeable), one started through each node;
- ticking: tool bodies of 0.3 s each, so it journals steps right through the loss.

Loss 1 SIGKILLs the node that leads the partition of a held run while its bodies run (it is also
the ingress of a parked run's client and of a ticking run's). Loss 2 SIGKILLs another node, the
ingress through which a second batch was started and followed; while it is down, every parked
run's approval is sent through a live node and must reach its call before the node comes back.
Each node starts again on its data directory before the next loss, and each loss waits for
the leaders to stay put for a while first.

Restate moves a partition's leadership when its leader dies (and again when a node rejoins, as
its scheduler rebalances), and every move starts the invocation again from the journal, while
the `ctx.run` bodies that were in flight still run in the worker. So: the held bodies a loss cut
off run on, and the new leader's attempt, served by the same worker, journals their results
(`restate/intents.py`): neither runs again nor is reported interrupted; every run completes
with exactly one result per tool call; no unsafe body (parent or spawned child) ran twice; every
approval reached its call; every client whose ingress died got its result through another node.
The pause each loss causes is printed and bounded: from the SIGKILL to the new leader's attempt
(the runs it cut), and to the next journal entry of the ticking run (`sys_journal.appended_at`).
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.client import HTTPException
from pathlib import Path
from typing import Any

import pytest

from tests.restate.support import (
    FAST_RETRY_ENV,
    HypercornWorker,
    http,
    read_lines,
    service_app,
    wait_until,
)
from tether.programs.restate_cluster import RestateCluster, RestateServerError, partition_key_of
from tether.programs.restate_server import RestateServer
from tether.session.session import INTERRUPTED_RESULT
from tether.testing import dump_logs_if_failed

SERVICE = "CrashAgent"
UNSAFE = {"charge", "notify"}
HELD_SAFE, HELD_UNSAFE = "call_2_0", "call_2_2"
"""The bodies a held run holds running: a lookup and a notify of one concurrent group."""
APPROVE = "call_3_0"
APPROVAL = "approved by ops"
TICK = 0.3
"""Seconds each tool body of a ticking run takes."""
AFTER_APPROVAL = "model model:4:0"
"""The step a parked run reaches once its approval's turn is over."""
STEADY = 3.0
"""Seconds without a leadership move before a kill (the scheduler moves leaders for a few
seconds after a node rejoins): the moves a kill is followed by are its own."""
#: Generous: other suites may run Restate tests on the same 2 cores at the same time.
DEADLINE = 120.0
ATTACH_TIMEOUT = 20.0
"""An attach without an answer by then is made again: a parked run's client waits across both
losses, longer than one connection should be trusted."""
PAUSE_BOUND = 30.0


# --------------------------------------------------------------------------------------------
# Runs and their clients
# --------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One `CrashAgent/<key>/run` invocation, its files, and its client."""

    name: str
    directory: Path
    ingress: int
    """The node whose ingress the client starts the run through (and first attaches to)."""
    matrix: bool = False
    gate: Path | None = None
    tool_seconds: float = 0.0
    key: str = ""
    invocation_id: str = ""
    partition: int = -1
    through: int = -1
    """The node the client is attached through now."""
    attaches: list[tuple[int, str]] = field(default_factory=list)
    """(node, outcome) of every attach the client made, in order."""
    result: dict[str, Any] | None = None
    error: BaseException | None = None
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)
    """Set by `finish`: the client stops attaching."""

    @property
    def effects(self) -> Path:
        return self.directory / "effects"

    @property
    def steps(self) -> Path:
        return self.directory / "steps"

    def request(self) -> dict[str, Any]:
        req: dict[str, Any] = {"effects": str(self.effects), "steps": str(self.steps)}
        if self.matrix:
            req["matrix"] = True
        if self.gate is not None:
            req["tool_gate"] = {"path": str(self.gate), "calls": [HELD_SAFE, HELD_UNSAFE]}
        if self.tool_seconds:
            req["tool_seconds"] = self.tool_seconds
        return req

    def ran(self, call: str) -> int:
        """How often the body of `call` started (its effect lines)."""
        return sum(1 for x in read_lines(self.effects) if x.split()[1] == call)

    def step_seen(self, step: str) -> bool:
        return any(x.endswith(f" {step}") for x in read_lines(self.steps))

    def awakeable_id(self) -> str | None:
        ids = {x.split()[2] for x in read_lines(self.effects) if x.startswith("awakeable ")}
        assert len(ids) <= 1, f"{self.name} published several awakeable ids: {ids}"
        return next(iter(ids), None)


def next_live(cluster: RestateCluster, after: int) -> int:
    live = cluster.live()
    return next((n for n in live if n > after), live[0])


def follow(cluster: RestateCluster, run: Run) -> None:
    """The client: attach through its node's ingress until the result comes (again after
    `ATTACH_TIMEOUT` without an answer); when the node is down or the attach fails, attach again
    through the next live node."""
    node = run.ingress
    try:
        while not run.done.is_set():
            if not cluster.is_running(node):
                node = next_live(cluster, node)
            run.through = node
            url = f"{cluster.ingress_url(node)}/restate/invocation/{run.invocation_id}/attach"
            try:
                resp = http("GET", url, timeout=ATTACH_TIMEOUT)
            except TimeoutError:
                continue  # no answer yet (a parked run): attach again through the same node
            except (OSError, HTTPException) as err:
                run.attaches.append((node, type(err).__name__))
            else:
                if resp.status == 200:
                    run.attaches.append((node, "ok"))
                    run.result = resp.json()
                    return
                run.attaches.append((node, f"HTTP {resp.status}"))
            time.sleep(0.2)
            node = next_live(cluster, node)
    except BaseException as err:
        run.error = err


def start(cluster: RestateCluster, run: Run) -> Run:
    """Send the run through its node's ingress and start its client."""
    run.directory.mkdir(parents=True, exist_ok=True)
    run.key = f"{run.name}-{uuid.uuid4().hex[:8]}"
    url = f"{cluster.ingress_url(run.ingress)}/{SERVICE}/{run.key}/run/send"
    resp = http("POST", url, run.request())
    assert resp.status == 202, resp.text
    run.invocation_id = resp.json()["invocationId"]
    run.partition = cluster.partition_of_invocation(run.invocation_id)
    run.thread = threading.Thread(target=follow, args=(cluster, run), name=run.name, daemon=True)
    run.thread.start()
    return run


def finish(run: Run) -> dict[str, Any]:
    assert run.thread is not None
    run.thread.join(timeout=DEADLINE)
    run.done.set()
    assert not run.thread.is_alive(), f"{run.name}'s client still waits: {run.attaches}"
    if run.error is not None:
        raise run.error
    assert run.result is not None, f"{run.name} got no result: {run.attaches}"
    return run.result


def transcript(cluster: RestateCluster, run: Run) -> list[dict[str, Any]]:
    node = cluster.live()[0]
    url = f"{cluster.ingress_url(node)}/{SERVICE}/{run.key}/transcript"
    resp = http("POST", url, timeout=DEADLINE)
    assert resp.status == 200, resp.text
    turns: list[dict[str, Any]] = resp.json()
    return turns


def tool_results(turns: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(call id, tool, result block) of every tool call, checked to be exactly one result per
    call, in call order, in the turn after the calls."""
    calls: list[tuple[str, str, dict[str, Any]]] = []
    for i, turn in enumerate(turns):
        uses = [(b["id"], b["name"]) for b in turn["content"] if b["type"] == "tool_use"]
        if not uses:
            continue
        assert i + 1 < len(turns), f"no results turn after the calls {uses}"
        blocks = [b for b in turns[i + 1]["content"] if b["type"] == "tool_result"]
        assert [b["tool_use_id"] for b in blocks] == [c for c, _ in uses], (uses, blocks)
        calls += [(c, tool, b) for (c, tool), b in zip(uses, blocks, strict=True)]
    return calls


# --------------------------------------------------------------------------------------------
# The checks every run passes
# --------------------------------------------------------------------------------------------


def check_calls(
    name: str, calls: list[tuple[str, str, dict[str, Any]]], runs: Counter[str], prefix: str = ""
) -> set[str]:
    """No unsafe body ran twice, every safe one ran, and a call reported interrupted is an
    unsafe one whose body ran at most once; the calls reported interrupted."""
    interrupted: set[str] = set()
    for call, tool, block in calls:
        ran = runs[prefix + call]
        if tool in UNSAFE:
            assert ran <= 1, f"{name}: unsafe {tool} {prefix}{call} ran {ran} times"
        elif tool == "lookup":
            assert ran >= 1, f"{name}: safe lookup {prefix}{call} never ran"
        if block.get("is_error"):
            assert tool in UNSAFE and block["content"] == INTERRUPTED_RESULT, (name, call, block)
            interrupted.add(prefix + call)
        elif tool in UNSAFE:
            assert ran == 1, f"{name}: {tool} {prefix}{call} has a result but ran {ran} times"
    return interrupted


def check_run(cluster: RestateCluster, run: Run) -> set[str]:
    """The run completed with one result per tool call, no unsafe body (of the run or of its
    spawned child) ran twice, and its approval (parked runs) reached its call; the calls
    reported interrupted."""
    result = finish(run)
    assert result["status"] == "completed", (run.name, result)
    assert result["turns"] == 8, (run.name, result)
    lines = [x for x in read_lines(run.effects) if not x.startswith("awakeable ")]
    runs = Counter(x.split()[1] for x in lines)
    calls = tool_results(transcript(cluster, run))
    assert len(calls) == result["tool_calls"] == (12 if run.matrix else 10), (run.name, calls)
    interrupted = check_calls(run.name, calls, runs)
    if run.matrix:
        [child] = result["children"]
        assert child["status"] == "completed", (run.name, child)
        child_calls = tool_results(child["turns"])
        assert len(child_calls) == 3, (run.name, child_calls)
        interrupted |= check_calls(run.name, child_calls, runs, prefix="child:")
        awakeable_id = run.awakeable_id()
        approval = next(b for c, _, b in calls if c == APPROVE)
        assert not approval.get("is_error"), (run.name, approval)
        assert approval["content"] == f"release v3: {APPROVAL} ({awakeable_id})", approval
    return interrupted


# --------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------


def appended(cluster: RestateCluster, runs: list[Run]) -> dict[str, list[float]]:
    """Invocation id -> when each of its journal entries was appended (seconds since the
    epoch, as `time.time()`)."""
    ids = ", ".join(f"'{r.invocation_id}'" for r in runs)
    rows = cluster.query(f"SELECT id, appended_at FROM sys_journal WHERE id IN ({ids})")
    times: dict[str, list[float]] = {}
    for row in rows:
        times.setdefault(row["id"], []).append(
            datetime.fromisoformat(row["appended_at"]).timestamp()
        )
    return times


def state(cluster: RestateCluster, run: Run) -> dict[str, Any]:
    """The run's invocation as `sys_invocation` shows it (for failure messages)."""
    sql = (
        "SELECT status, retry_count, last_failure, journal_size FROM sys_invocation "
        f"WHERE id = '{run.invocation_id}'"
    )
    rows = cluster.query(sql)
    return rows[0] if rows else {}


def names(runs: list[Run]) -> list[str]:
    return [r.name for r in runs]


def attempts(run: Run, since: int = 0) -> int:
    """How many attempts of the run started (after the first `since` lines of its steps)."""
    return sum(1 for x in read_lines(run.steps)[since:] if x == "parent enter")


def _node(index: int | None) -> str:
    return "none" if index is None else f"n{index + 1}"


def describe(attaches: list[tuple[int, str]]) -> str:
    return ", ".join(f"n{n + 1} {outcome}" for n, outcome in attaches)


@dataclass
class Loss:
    """One node SIGKILLed: what it was to the runs, and what that cost them."""

    node: int
    leaders: dict[int, int]
    """Partition -> leader node, just before the kill."""
    killed_at: float
    """`time.time()` of the kill, to compare with `sys_journal.appended_at`."""
    in_flight: list[Run]
    clients: list[Run]
    """The runs whose client was attached through the node when it died."""
    steps_at_kill: dict[str, int]
    pauses: dict[str, float] = field(default_factory=dict)
    """Run -> seconds from the kill to its next step, the node still down: the new leader's
    attempt (a run the loss cut), or its next journal entry (a ticking run)."""
    approvals: dict[str, str] = field(default_factory=dict)
    leaders_while_down: dict[int, int] = field(default_factory=dict)
    attempts_while_down: dict[str, int] = field(default_factory=dict)
    down_for: float = 0.0

    def led(self, run: Run) -> bool:
        return self.leaders.get(run.partition) == self.node

    @property
    def cut(self) -> list[Run]:
        """The held runs in flight whose partition the node led."""
        return [r for r in self.in_flight if r.gate is not None and self.led(r)]

    def report(self) -> list[str]:
        led = sorted(p for p, n in self.leaders.items() if n == self.node)
        down = {p: f"n{n + 1}" for p, n in sorted(self.leaders_while_down.items())}
        lines = [
            f"SIGKILL n{self.node + 1}: leader of partitions {led}, ingress of the clients of "
            f"{names(self.clients)}; down {self.down_for:.1f} s; leaders while down {down}"
        ]
        for run in self.in_flight:
            leader = "the node" if self.led(run) else f"n{self.leaders[run.partition] + 1}"
            pause = self.pauses.get(run.name)
            if pause is None:
                shown = "held on"
            elif run.gate is not None:
                shown = f"the new leader's attempt {pause:.2f} s after the kill"
            else:
                shown = f"next journal entry {pause:.2f} s after the kill"
            lines.append(
                f"  {run.name} (partition {run.partition}, led by {leader}): {shown}; "
                f"{self.attempts_while_down[run.name]} new attempt(s) while down"
            )
        lines += [f"  {line}" for line in self.approvals.values()]
        lines += [f"  {r.name}'s client attached: {describe(r.attaches)}" for r in self.clients]
        return lines


def kill(cluster: RestateCluster, node: int, in_flight: list[Run], every: list[Run]) -> Loss:
    leaders = cluster.leaders()
    assert len(leaders) == cluster.partitions, leaders
    clients = [r for r in every if r.result is None and r.through == node]
    steps = {r.name: len(read_lines(r.steps)) for r in in_flight}
    killed_at = time.time()
    cluster.kill(node)
    return Loss(node, leaders, killed_at, in_flight, clients, steps)


def wait_progress(cluster: RestateCluster, loss: Loss, runs: list[Run]) -> None:
    """Wait, the node still down, until each (ticking) run journaled an entry after the kill:
    the pause the loss caused it (`loss.pauses`)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            times = appended(cluster, runs)
        except RestateServerError:  # a partition without a leader yet
            times = {}
        for run in runs:
            after = [t for t in times.get(run.invocation_id, []) if t > loss.killed_at]
            if after:
                loss.pauses[run.name] = min(after) - loss.killed_at
        if all(r.name in loss.pauses for r in runs):
            return
        assert time.monotonic() < deadline, (
            f"{[r.name for r in runs if r.name not in loss.pauses]} journaled nothing in "
            f"{DEADLINE:.0f} s after n{loss.node + 1} died: {[state(cluster, r) for r in runs]}"
        )
        time.sleep(0.2)


def restart(cluster: RestateCluster, loss: Loss) -> None:
    loss.leaders_while_down = cluster.leaders()
    for run in loss.in_flight:
        loss.attempts_while_down[run.name] = attempts(run, loss.steps_at_kill[run.name])
    loss.down_for = time.time() - loss.killed_at
    cluster.start(loss.node)


def wait_held(runs: list[Run]) -> None:
    wait_until(
        lambda: all(r.ran(HELD_SAFE) and r.ran(HELD_UNSAFE) for r in runs),
        timeout=DEADLINE,
        what="the held bodies to run",
    )


def wait_cut(loss: Loss) -> None:
    """Wait, the node still down, until the new leader of each run the loss cut started an
    attempt of it: the pause the loss caused it (`loss.pauses`). (Its next journal entry would
    not do: the attempt awaits the held bodies, which run until their gate opens.)"""
    deadline = time.monotonic() + DEADLINE
    while True:
        for run in loss.cut:
            if run.name not in loss.pauses and attempts(run, loss.steps_at_kill[run.name]):
                loss.pauses[run.name] = time.time() - loss.killed_at
        if all(r.name in loss.pauses for r in loss.cut):
            return
        assert time.monotonic() < deadline, f"{names(loss.cut)} did not run again: {loss.pauses}"
        time.sleep(0.02)


def resolve(cluster: RestateCluster, awakeable_id: str) -> int:
    """Send the approval through a live node's ingress (the next one if it fails); the node
    that took it."""
    deadline = time.monotonic() + DEADLINE
    node = cluster.live()[0]
    while True:
        url = f"{cluster.ingress_url(node)}/restate/awakeables/{awakeable_id}/resolve"
        try:
            resp = http("POST", url, {"answer": APPROVAL, "id": awakeable_id}, timeout=30.0)
            if resp.status == 202:
                return node
            problem = f"HTTP {resp.status}: {resp.text}"
        except (OSError, HTTPException) as err:
            problem = repr(err)
        assert time.monotonic() < deadline, f"resolving {awakeable_id}: {problem}"
        time.sleep(0.2)
        node = next_live(cluster, node)


# --------------------------------------------------------------------------------------------
# The cluster and the worker
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(restate_binary: Path) -> Iterator[RestateCluster]:
    with RestateCluster(restate_binary, extra_env=FAST_RETRY_ENV) as running:
        yield running


@pytest.fixture(scope="module")
def worker(
    cluster: RestateCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HypercornWorker]:
    log_dir = tmp_path_factory.mktemp("cluster-worker")
    with HypercornWorker(service_app("agent_service"), log_dir=log_dir) as running:
        cluster.register(running.url)
        yield running


@pytest.fixture(autouse=True)
def logs_on_failure(
    request: pytest.FixtureRequest, cluster: RestateCluster, worker: HypercornWorker
) -> Iterator[None]:
    yield
    logs: dict[str, Callable[[], str]] = {"worker log": functools.partial(worker.log_tail, 8000)}
    for i, server in enumerate(cluster.nodes):
        logs[f"restate-server n{i + 1} log"] = functools.partial(server.log_tail, 6000)
    dump_logs_if_failed(request, logs)


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def test_the_nodes_form_one_cluster(
    cluster: RestateCluster, worker: HypercornWorker, tmp_path: Path
) -> None:
    """Every partition has a leader on a live node; the deployment registered through one node
    is known to every node; a run started through one node's ingress is followed through
    another's; every node's admin API shows its row, under the partition key its id carries."""
    leaders = cluster.wait_for_leaders()
    assert sorted(leaders) == list(range(cluster.partitions)), leaders
    assert set(leaders.values()) <= set(cluster.live()), leaders

    def knows_the_worker(server: RestateServer) -> bool:
        return worker.url in {d["uri"].rstrip("/") for d in server.deployments()}

    for server in cluster.nodes:
        # The registration reaches the other nodes' metadata a moment later: poll.
        wait_until(
            functools.partial(knows_the_worker, server), timeout=DEADLINE, what=server.admin_url
        )
    run = start(cluster, Run("formed", tmp_path / "formed", ingress=0))
    url = f"{cluster.ingress_url(2)}/restate/invocation/{run.invocation_id}/attach"
    resp = http("GET", url, timeout=DEADLINE)
    assert resp.status == 200 and resp.json()["status"] == "completed", resp.text
    assert not check_run(cluster, run)
    sql = (
        "SELECT id, status, partition_key FROM sys_invocation_status "
        f"WHERE id = '{run.invocation_id}'"
    )
    row = {"id": run.invocation_id, "status": "completed"}
    row["partition_key"] = partition_key_of(run.invocation_id)

    def shows_the_row(server: RestateServer) -> bool:
        return server.query(sql) == [row]

    for server in cluster.nodes:
        # A node answers without the rows of a partition it is handing over: poll.
        wait_until(
            functools.partial(shows_the_row, server), timeout=DEADLINE, what=server.admin_url
        )


def test_runs_survive_losing_one_node_at_a_time(
    cluster: RestateCluster, worker: HypercornWorker, tmp_path: Path
) -> None:
    """The two losses of the module's docstring, with held, parked and ticking runs."""
    cluster.wait_for_leaders()
    every: list[Run] = []

    def begin(name: str, ingress: int, **options: Any) -> Run:
        run = start(cluster, Run(name, tmp_path / name, ingress, **options))
        every.append(run)
        return run

    def ticking(name: str, ingress: int) -> Run:
        """A run journaling steps right through the next loss (2 of its 10 bodies done)."""
        run = begin(name, ingress, tool_seconds=TICK)
        wait_until(lambda: len(read_lines(run.effects)) >= 2, timeout=DEADLINE, what="ticks")
        return run

    # Parked runs, one started (and followed) through each node.
    parked = [begin(f"parked{i}", i, matrix=True) for i in range(cluster.size)]
    gate1 = tmp_path / "gate1"
    held1 = [begin(f"held1-{i}", i, gate=gate1) for i in range(2)]
    wait_until(
        lambda: all(r.step_seen(f"live run approve-notify:{APPROVE}") for r in parked),
        timeout=DEADLINE,
        what="the parked runs to announce their approvals",
    )
    wait_held(held1)
    cluster.wait_for_leaders(steady=STEADY)

    # Loss 1: the leader of a held run's partition, while its bodies run.
    ticking1 = ticking("ticking1", cluster.leader_of(held1[0].partition) or 0)
    victim = cluster.leader_of(held1[0].partition)  # the scheduler may have moved it meanwhile
    assert victim is not None
    loss1 = kill(cluster, victim, [*held1, ticking1], every)
    assert held1[0].name in names(loss1.cut), (names(loss1.cut), loss1.leaders)
    assert parked[victim].name in names(loss1.clients), names(loss1.clients)
    wait_cut(loss1)
    wait_progress(cluster, loss1, [ticking1])
    restart(cluster, loss1)
    gate1.touch()

    # Loss 2: another node, the ingress of a second batch. The approvals are sent meanwhile,
    # through the live nodes, and reach their calls before the node is back.
    ingress = (victim + 1) % cluster.size
    gate2 = tmp_path / "gate2"
    held2 = [begin(f"held2-{i}", ingress, gate=gate2) for i in range(2)]
    wait_held(held2)
    cluster.wait_for_leaders(steady=STEADY)
    ticking2 = ticking("ticking2", ingress)
    loss2 = kill(cluster, ingress, [*held2, ticking2], every)
    assert {parked[ingress].name, *names(held2)} <= set(names(loss2.clients)), loss2.clients
    for run in parked:
        awakeable_id = run.awakeable_id()
        assert awakeable_id is not None
        leader = cluster.leader_of(run.partition)
        sent = time.time()
        node = resolve(cluster, awakeable_id)
        try:
            wait_until(
                functools.partial(run.step_seen, AFTER_APPROVAL),
                timeout=DEADLINE,
                what=f"{run.name}'s approval to reach its call while n{ingress + 1} is down",
            )
        except TimeoutError as err:
            raise AssertionError(f"{err}; sent through n{node + 1}; {state(cluster, run)}") from err
        loss2.approvals[run.name] = (
            f"approval of {run.name} (partition {run.partition}, led by {_node(leader)}) "
            f"sent {sent - loss2.killed_at:.2f} s after the kill through n{node + 1}: reached its "
            f"call {time.time() - sent:.2f} s later"
        )
    wait_cut(loss2)
    wait_progress(cluster, loss2, [ticking2])
    assert not cluster.is_running(ingress)
    restart(cluster, loss2)
    gate2.touch()

    report = [*loss1.report(), *loss2.report()]
    print("\n" + "\n".join(report))
    # Every run completes, and passes `check_run`.
    interrupted = {run.name: check_run(cluster, run) for run in every}
    print(f"interrupted: { {k: sorted(v) for k, v in interrupted.items() if v} }")
    # The held bodies each loss cut off ran once, and their results were journaled.
    for loss in (loss1, loss2):
        for run in loss.cut:
            assert loss.attempts_while_down[run.name] >= 1, (run.name, read_lines(run.steps))
    for run in [*loss1.cut, *loss2.cut]:
        assert HELD_UNSAFE not in interrupted[run.name], (run.name, interrupted, report)
        assert run.ran(HELD_UNSAFE) == run.ran(HELD_SAFE) == 1, (run.name, read_lines(run.effects))
    # Every client whose ingress died got its result through another node.
    for loss in (loss1, loss2):
        assert loss.clients, f"no client used n{loss.node + 1}'s ingress"
        for run in loss.clients:
            cut_off = [n for n, outcome in run.attaches if outcome != "ok"]
            assert loss.node in cut_off and run.attaches[-1][1] == "ok", (run.name, run.attaches)
        # The pause each run it cut, and the run ticking through it, saw.
        for name, pause in loss.pauses.items():
            assert 0 < pause < PAUSE_BOUND, (name, pause, report)

"""The chaos scenario, on any platform: N concurrent runs of a scripted agent whose tools write a
side-effect ledger, some parked on approvals, some fanning out to sub-agents, one budget per
run tree; a seeded killer during a bounded window; then the checks that nothing was lost or
doubled.

The platform (`Platform`) starts nothing by itself here: it hands over the ingress, the
sidecar, the webhook secret, the ledger and the kinds of kill it knows (`tests.chaos.local` on
loopback; a cluster's would kill pods).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from tether.programs.webhooks import sign_request
from tether.session.session import INTERRUPTED_RESULT

T = TypeVar("T")

AGENT = "chaos-clerk"
LEDGER = "chaos-ledger.txt"
"""In the workspace: one line `<session id> <call id> <run id>` per execution of a tool body."""
BUDGET_USD = 0.5
MAX_TOKENS = 1000
PRICE = 100.0
"""USD per million output tokens (input is free): each call reserves $0.10, spends what it used."""
SMALL = {"input": 10, "output": 10}
BIG = {"input": 10, "output": MAX_TOKENS}

TOOLS = '''
"""The chaos agent's tools: each execution appends `<session> <call id> <run>` to the ledger."""

import asyncio
import os
from pathlib import Path

from tether import ToolContext, tool

SECONDS = @SECONDS@
"""Before and after the ledger write: a kill often lands in a tool body."""


async def _write(ctx: ToolContext) -> None:
    """One line, in one write to a file opened for appending; between two sleeps."""
    await asyncio.sleep(SECONDS)
    path = Path(os.environ["TETHER_WORKSPACE"]) / "@LEDGER@"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.session_id} {ctx.call_id} {ctx.run_id}\\n".encode())
    finally:
        os.close(fd)
    await asyncio.sleep(SECONDS)


@tool
async def record(note: str, ctx: ToolContext) -> str:
    """Record a note in the ledger."""
    await _write(ctx)
    return f"recorded {note}"


@tool
async def guarded(note: str, ctx: ToolContext) -> str:
    """Record a note in the ledger, once a person approved it."""
    await _write(ctx)
    return f"guarded {note}"
'''

LEDGER_TOOLS = {"record", "guarded"}


def _call(name: str, note: str) -> dict[str, Any]:
    return {"name": name, "input": {"note": note}}


def _turn(*calls: dict[str, Any], usage: dict[str, int] = SMALL) -> dict[str, Any]:
    return {"tool_calls": list(calls), "usage": usage}


DONE = {"text": "done", "usage": SMALL}
CHILD_TASKS = ["chaos child one", "chaos child two"]
OVER_BUDGET_TURNS = 12
TOOL_SECONDS = 0.5


def script(turns: int) -> dict[str, list[dict[str, Any]]]:
    """The responses by prompt (the run's kind, or a child's task); `turns` tool turns for a
    plain run, a parallel one (two calls a turn) and a child."""

    def tools(*names: str) -> list[dict[str, Any]]:
        return [_turn(*(_call("record", f"{n}{i}") for n in names)) for i in range(turns)]

    return {
        "plain": [*tools("p"), DONE],
        "approval": [_turn(_call("guarded", "g")), _turn(_call("record", "after")), DONE],
        "spawn": [_turn({"name": "spawn", "input": {"tasks": CHILD_TASKS}}), DONE],
        "parallel": [*tools("a", "b"), DONE],
        "overbudget": [
            *(_turn(_call("record", f"o{n}"), usage=BIG) for n in range(OVER_BUDGET_TURNS)),
            DONE,
        ],
        **{task: [*tools("c"), DONE] for task in CHILD_TASKS},
    }


KINDS = ["plain", "approval", "spawn", "parallel", "overbudget"]
EXPECTED = {kind: "budget_exceeded" if kind == "overbudget" else "completed" for kind in KINDS}


def manifest(turns: int) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": AGENT},
        "spec": {
            "model": {
                "provider": "scripted",
                "name": "s",
                "maxTokens": MAX_TOKENS,
                "pricing": {"inputPerMTok": 0, "outputPerMTok": PRICE},
                "script": script(turns),
            },
            "tools": [
                {"name": "record", "python": "chaos_tools:record"},
                {"name": "guarded", "python": "chaos_tools:guarded", "requireApproval": True},
            ],
            "subagents": {"maxDepth": 1, "maxConcurrent": 2},
            "limits": {"maxCostUsd": BUDGET_USD, "maxTurns": max(turns, OVER_BUDGET_TURNS) + 5},
        },
    }


def tools_module(tool_seconds: float = TOOL_SECONDS) -> str:
    """The source of `chaos_tools`: each tool body sleeps `tool_seconds` before its ledger write
    and after it."""
    return TOOLS.replace("@SECONDS@", repr(tool_seconds)).replace("@LEDGER@", LEDGER)


def write_agent(directory: Path, turns: int, tool_seconds: float = TOOL_SECONDS) -> Path:
    """The manifest and its tools' module, side by side (the worker imports it from there)."""
    import yaml

    (directory / "chaos_tools.py").write_text(tools_module(tool_seconds))
    path = directory / f"{AGENT}.yaml"
    path.write_text(yaml.safe_dump(manifest(turns)))
    return path


class Platform(Protocol):
    """Where the scenario runs: a local stack, or a cluster."""

    secret: bytes
    kill_kinds: tuple[str, ...]
    exact_metrics: bool
    """Whether `metrics_urls` hold every count made (False where the counts of a killed pod go
    with it: its metrics are then checked as drift only)."""

    @property
    def ingress_url(self) -> str: ...

    @property
    def sidecar_url(self) -> str: ...

    def metrics_urls(self) -> list[str]:
        """Where its `/metrics` are (the sidecar's, the workers'): their samples are summed."""
        ...

    def kill(self, kind: str) -> str:
        """Kill one of `kill_kinds` and bring it back (or let it come back); what was done."""
        ...

    def ledger(self) -> list[str]:
        """The ledger's lines."""
        ...


# Talking to the platform, retrying through kills ---------------------------------------------


def _retry(what: str, fn: Callable[[], T], deadline: float) -> T:
    delay = 0.2
    while True:
        try:
            return fn()
        except (httpx2.HTTPError, AssertionError) as err:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {err}") from err
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _ok(response: httpx2.Response, *codes: int) -> Any:
    assert response.status_code in codes, f"HTTP {response.status_code}: {response.text[:300]}"
    return response.json() if response.content else None


# Each attempt asks the platform for its URLs again: a cluster's forward may have moved.


def start_run(platform: Platform, session: str, prompt: str, deadline: float) -> str:
    path = f"/{AGENT}/{quote(session, safe='')}/run/send"
    # Keyed: a send retried after a lost answer starts the run once.
    headers = {"idempotency-key": f"chaos-{session}"}

    def send() -> str:
        url = platform.ingress_url + path
        response = httpx2.post(url, json={"prompt": prompt}, headers=headers, timeout=30)
        invocation: str = _ok(response, 200, 202)["invocationId"]
        return invocation

    return _retry(f"starting {session}", send, deadline)


def result_of(platform: Platform, invocation: str, deadline: float) -> Any:
    path = f"/restate/invocation/{invocation}/attach"

    def attach() -> Any:
        # a bounded wait, so that an attempt cut off with the connection is noticed
        timeout = min(max(deadline - time.monotonic(), 5), 60)
        return _ok(httpx2.get(platform.ingress_url + path, timeout=timeout), 200)

    return _retry(f"the result of {invocation}", attach, deadline)


def _post(platform: Platform, path: str, what: str, deadline: float) -> Any:
    return _retry(
        what, lambda: _ok(httpx2.post(platform.ingress_url + path, timeout=30), 200), deadline
    )


def session_of(platform: Platform, session: str, deadline: float) -> Any:
    path = f"/{AGENT}/{quote(session, safe='')}/session"
    return _post(platform, path, f"session {session}", deadline)


def budget_of(platform: Platform, root: str, deadline: float) -> Any:
    return _post(platform, f"/{AGENT}-budget/{root}/status", f"budget {root}", deadline)


def _signed(platform: Platform, method: str, path: str, payload: Any = None) -> Any:
    body = b"" if payload is None else json.dumps(payload).encode()
    headers = sign_request(platform.secret, body, path=path)
    if payload is not None:
        headers["content-type"] = "application/json"
    response = httpx2.request(
        method, f"{platform.sidecar_url}{path}", content=body or None, headers=headers, timeout=30
    )
    return _ok(response, 200, 202)


def parked(platform: Platform) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = _signed(platform, "GET", "/v1/approvals")["parked"]
    return calls


def scrape(platform: Platform, deadline: float) -> dict[tuple[str, frozenset[Any]], float]:
    def get() -> dict[tuple[str, frozenset[Any]], float]:
        samples: dict[tuple[str, frozenset[Any]], float] = {}
        for url in platform.metrics_urls():
            response = httpx2.get(url, timeout=30)
            assert response.status_code == 200, response.text
            for family in text_string_to_metric_families(response.text):
                for sample in family.samples:
                    key = (sample.name, frozenset(sample.labels.items()))
                    samples[key] = samples.get(key, 0.0) + sample.value
        return samples

    return _retry("scraping /metrics", get, deadline)


# The scenario --------------------------------------------------------------------------------


@dataclass
class Report:
    runs: int
    seed: int
    chaos_seconds: float
    kills: Counter[str] = field(default_factory=Counter)
    actions: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    tool_bodies: int = 0
    interrupted: int = 0
    interrupted_after_write: int = 0
    succeeded: int = 0
    interrupted_approved: int = 0
    """Of the interrupted calls, approved ones (their result is a tool error quoting it)."""
    spent_usd: float = 0.0
    """What the run trees' budget ledgers say they spent."""
    """Ledger tools' calls with their result in a root session."""
    approvals: int = 0
    children: int = 0
    metrics: dict[str, tuple[float, float]] = field(default_factory=dict)
    """By series: what `/metrics` says, and what the sessions and the ledger say."""
    violations: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    """Metrics that kills may put off either way (`check_metrics`): shown, not violations."""
    wall_seconds: float = 0.0

    def summary(self) -> str:
        kills = ", ".join(f"{k} {n}" for k, n in sorted(self.kills.items())) or "none"
        statuses = ", ".join(f"{s} {n}" for s, n in sorted(self.statuses.items()))
        lines = [
            f"chaos: {self.runs} runs, seed {self.seed}, {self.chaos_seconds:g} s of chaos, "
            f"wall {self.wall_seconds:.1f} s",
            f"  kills: {sum(self.kills.values())} ({kills})",
            f"  root runs: {statuses}; sub-agent runs {self.children}",
            f"  tool bodies run: {self.tool_bodies}; calls of root runs done {self.succeeded}, "
            f"interrupted {self.interrupted} "
            f"({self.interrupted_after_write} of them after their ledger write)",
            f"  approvals answered: {self.approvals}",
            "  metrics (scraped / from the sessions and the ledger): "
            + ", ".join(f"{k} {v:g}/{w:g}" for k, (v, w) in sorted(self.metrics.items())),
            *(f"  metric drift: {d}" for d in self.drift),
            f"  violations: {len(self.violations)}",
            *(f"    - {v}" for v in self.violations),
        ]
        return "\n".join(lines)


class Approver(threading.Thread):
    """Approves every parked call through the sidecar's signed webhook, through its kills."""

    def __init__(self, platform: Platform, log: Callable[[str], None]) -> None:
        super().__init__(daemon=True)
        self.platform = platform
        self.log = log
        self.stopping = threading.Event()
        self.answered: dict[str, dict[str, Any]] = {}
        """By awakeable id: the parked call, once the sidecar took the approval."""

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            try:
                calls = parked(self.platform)
            except (httpx2.HTTPError, AssertionError):
                continue  # the sidecar (or Restate behind it) is down: next time
            for call in calls:
                awakeable = call["awakeable_id"]
                if awakeable in self.answered:
                    continue
                try:
                    path = f"/v1/awakeables/{awakeable}/resolve"
                    _signed(self.platform, "POST", path, {"approved": True, "approver": "chaos"})
                except (httpx2.HTTPError, AssertionError):
                    continue
                self.answered[awakeable] = call


class Killer(threading.Thread):
    """Seeded kills at random intervals until the window closes; every action logged."""

    def __init__(
        self,
        platform: Platform,
        rng: random.Random,
        seconds: float,
        report: Report,
        log: Callable[[str], None],
    ) -> None:
        super().__init__(daemon=True)
        self.platform, self.rng, self.seconds, self.report, self.log = (
            platform,
            rng,
            seconds,
            report,
            log,
        )
        self.error: BaseException | None = None

    def run(self) -> None:
        end = time.monotonic() + self.seconds
        weights = {"worker": 3, "restate": 1, "sidecar": 1}
        kinds = list(self.platform.kill_kinds)
        first = self.rng.sample(kinds, len(kinds))
        try:
            while True:
                pause = self.rng.uniform(1.0, 5.0)
                if time.monotonic() + pause > end:
                    break
                time.sleep(pause)
                if first:  # each kind once (in a seeded order), then at random
                    kind = first.pop()
                else:
                    kind = self.rng.choices(kinds, [weights.get(k, 1) for k in kinds])[0]
                self.log(f"kill {kind}")
                started = time.monotonic()
                what = self.platform.kill(kind)
                self.report.kills[kind] += 1
                self.log(f"  {what}; back in {time.monotonic() - started:.1f} s")
        except BaseException as err:
            self.error = err
            self.log(f"the killer failed: {err!r}")


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in _blocks(content))


def run_scenario(
    platform: Platform,
    *,
    runs: int,
    chaos_seconds: float,
    seed: int,
    timeout: float = 900.0,
    log: Callable[[str], None] = print,
) -> Report:
    began = time.monotonic()
    deadline = began + timeout
    report = Report(runs=runs, seed=seed, chaos_seconds=chaos_seconds)

    def say(message: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        line = f"[{stamp} +{time.monotonic() - began:6.1f}s] {message}"
        report.actions.append(line)
        log(line)

    sessions = {f"c{i:03d}": KINDS[i % len(KINDS)] for i in range(runs)}
    approver = Approver(platform, say)
    approver.start()
    rng = random.Random(seed)
    # Half the runs start at once, the others over the first half of the window.
    offsets = [0.0] * (runs - runs // 2)
    offsets += sorted(rng.uniform(0, chaos_seconds / 2) for _ in range(runs // 2))
    killer = Killer(platform, random.Random(rng.random()), chaos_seconds, report, say)
    say(f"starting {runs} runs; chaos for {chaos_seconds:g} s, seed {seed}")
    killer.start()
    invocations = {}
    for (session, kind), offset in zip(sessions.items(), offsets, strict=True):
        time.sleep(max(0.0, began + offset - time.monotonic()))
        invocations[session] = start_run(platform, session, kind, deadline)
    say(f"started {runs} runs")
    results: dict[str, Any] = {}
    for session, invocation in invocations.items():
        try:
            results[session] = result_of(platform, invocation, deadline)
        except TimeoutError as err:  # lost: checked with the rest, from what the stack has
            report.violations.append(f"{session} did not end within the timeout: {err}")
    say(f"{len(results)} of {runs} runs ended")
    killer.join()
    approver.stopping.set()
    approver.join()
    if killer.error is not None:
        report.violations.append(f"the killer failed: {killer.error!r}")
    report.approvals = len(approver.answered)
    verify(platform, sessions, results, approver.answered, report, time.monotonic() + 300)
    report.wall_seconds = time.monotonic() - began
    return report


def verify(
    platform: Platform,
    sessions: dict[str, str],
    results: dict[str, Any],
    answered: dict[str, dict[str, Any]],
    report: Report,
    deadline: float,
) -> None:
    bad = report.violations.append
    lines = [line.split() for line in platform.ledger() if line.strip()]
    ledger = Counter((session_id, call_id) for session_id, call_id, _ in lines)
    run_of = {(session_id, call_id): run for session_id, call_id, run in lines}
    report.tool_bodies = sum(ledger.values())
    for key, n in ledger.items():
        if n > 1:
            bad(f"tool body ran {n} times: {' '.join(key)}")
    seen: set[tuple[str, str]] = set()
    run_statuses: Counter[str] = Counter()
    child_runs: set[str] = set()
    for session, kind in sessions.items():
        result = results.get(session)
        if result is None:
            continue
        report.statuses[result["status"]] += 1
        if result["status"] != EXPECTED[kind]:
            bad(f"{session} ({kind}) ended {result['status']}, not {EXPECTED[kind]}: {result}")
        # Budgets held, and nothing is still held.
        state = budget_of(platform, result["run_id"], deadline)
        spent = state["spent"]["cost_usd"]
        report.spent_usd += spent
        if spent > BUDGET_USD + 1e-9:
            bad(f"{session} spent ${spent:.4f} of a ${BUDGET_USD} budget")
        if state["held"]:
            bad(f"{session}'s budget still holds {state['held']}")
        if abs(result["cost_usd"] - spent) > 1e-9:
            bad(f"{session} reports ${result['cost_usd']} spent, its ledger ${spent}")
        record = session_of(platform, session, deadline)
        children = [run for run in record["runs"] if run.get("parent_run_id")]
        for run in record["runs"]:
            run_statuses[run["status"]] += 1
        report.children += len(children)
        child_runs.update(run["id"] for run in children)
        if kind == "spawn" and [r["status"] for r in children] != ["completed"] * len(CHILD_TASKS):
            bad(f"{session}'s children: {[(r['prompt'], r['status']) for r in children]}")
        check_turns(session, record, ledger, seen, report)
    # A sub-agent's conversation is not kept (its run record is, in the parent's session): its
    # calls are checked at most once by the ledger, and tied to a child run of the scenario.
    for key in ledger:
        if key not in seen and run_of[key] not in child_runs:
            bad(f"a tool body ran for a call no session knows: {' '.join(key)}")
    # No approval lost: each answered one was seen by its run, which went on (its call has a
    # result, checked above); nothing is left parked.
    approval_runs = [s for s, k in sessions.items() if k == "approval"]
    approved_sessions = Counter(call["session"] for call in answered.values())
    for session in approval_runs:
        if approved_sessions[session] < 1:
            bad(f"{session}'s approval was never answered")
        decisions = [
            d for r in session_of(platform, session, deadline)["runs"] for d in r["decisions"]
        ]
        if not any(d.get("approved") is True for d in decisions):
            bad(f"{session}'s run recorded no approval: {decisions}")
    left = _retry("listing parked calls", lambda: parked(platform), deadline)
    if left:
        bad(f"{len(left)} calls still parked: {left}")
    check_metrics(platform, run_statuses, ledger, report, deadline)


def check_turns(
    session: str,
    record: dict[str, Any],
    ledger: Counter[tuple[str, str]],
    seen: set[tuple[str, str]],
    report: Report,
) -> None:
    bad = report.violations.append
    uses: dict[str, str] = {}
    results: dict[str, list[dict[str, Any]]] = {}
    for turn in record["turns"]:
        for block in _blocks(turn["content"]):
            if block.get("type") == "tool_use":
                if block["id"] in uses:
                    bad(f"{session}: tool call {block['id']} appears twice")
                uses[block["id"]] = block["name"]
            elif block.get("type") == "tool_result":
                results.setdefault(block["tool_use_id"], []).append(block)
    for call_id, name in uses.items():
        got = results.get(call_id, [])
        if len(got) != 1:
            bad(f"{session}: {name} call {call_id} has {len(got)} results")
            continue
        if name not in LEDGER_TOOLS:
            continue
        key = (record["id"], call_id)  # the tool writes the session record's id
        seen.add(key)
        text = _text(got[0].get("content"))
        # An approved call cut off is a tool error that quotes the interrupted result.
        interrupted = INTERRUPTED_RESULT in text
        ran = ledger.get(key, 0)
        if interrupted:
            report.interrupted += 1
            report.interrupted_after_write += ran
            if text != INTERRUPTED_RESULT:
                report.interrupted_approved += 1
        elif ran != 1:
            bad(f"{session}: {name} call {call_id} ran {ran} times, its result: {text[:200]}")
        elif got[0].get("is_error"):
            bad(f"{session}: {name} call {call_id} failed: {got[0]}")
        else:
            report.succeeded += 1
    for call_id in results:
        if call_id not in uses:
            bad(f"{session}: a result for unknown call {call_id}")


def _metric(samples: dict[tuple[str, frozenset[Any]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset({"agent": AGENT, **labels}.items())), 0.0)


def check_metrics(
    platform: Platform,
    run_statuses: Counter[str],
    ledger: Counter[tuple[str, str]],
    report: Report,
    deadline: float,
) -> None:
    """What `/metrics` must say after the kills, and what it may get wrong.

    Every process writes its values to a file of its own in the shared multiprocess directory
    (mmap'd, so a SIGKILLed worker's writes are kept by the kernel), and the sidecar sums them:
    a counter keeps the counts of the workers that were killed. A count is made when its step
    runs live, not in the same write as the journal: a kill between a count and its step's
    journal entry makes the next attempt count again, and a kill between a journal entry and a
    count made after it (the end of a run, a budget stop) loses the count, since the replay
    that follows is not live. So:
    - a tool's counts are made inside its step, before the journal: `ok` counts are at least
      the calls the sessions hold as done, and at most the bodies of the ledger; interrupted
      counts at least the calls the sessions hold as interrupted (asserted);
    - runs and budget stops are counted after their last step: they may drift either way by
      what was ending at a kill (shown, not asserted; `drift` in the report);
    - `tether_budget_held` goes up when a live call reserves and down when it settles live: an
      attempt cut off between the two (a worker or restate-server killed) never takes its part
      down, since the settle is replayed, not live; and it is a `livesum` gauge whose files
      prometheus_client drops only when told (`mark_process_dead`), which nothing does for a
      SIGKILLed worker. It is asserted zero only when neither was killed."""
    drift = report.drift.append
    bad = report.violations.append if platform.exact_metrics else drift
    samples = scrape(platform, deadline)
    for status, n in run_statuses.items():
        counted = _metric(samples, "tether_runs_total", status=status)
        report.metrics[f"runs_total{{{status}}}"] = (counted, n)
        if counted != n:
            drift(f"tether_runs_total{{status={status}}} is {counted:g}, the sessions hold {n}")
    ok = sum(
        _metric(samples, "tether_tool_calls_total", tool=t, outcome="ok") for t in LEDGER_TOOLS
    )
    # Each count is a body that ran (an unsafe body never runs again), and each call a root
    # session holds as done was counted (the sub-agents' calls are counted too).
    report.metrics["tool_calls_total{ok}"] = (ok, report.succeeded)
    if not report.succeeded <= ok <= report.tool_bodies:
        bad(
            f"tether_tool_calls_total{{outcome=ok}} is {ok:g}: not between the {report.succeeded}"
            f" calls done in the sessions and the {report.tool_bodies} bodies of the ledger"
        )
    interrupted = sum(
        _metric(samples, "tether_interrupted_tool_calls_total", tool=t) for t in LEDGER_TOOLS
    )
    # An approved call cut off fails with a tool error quoting the interrupted result: the
    # worker counts it as an error of its tool, not as interrupted.
    plain = report.interrupted - report.interrupted_approved
    report.metrics["interrupted_tool_calls_total"] = (interrupted, plain)
    if interrupted < plain:
        bad(f"tether_interrupted_tool_calls_total is {interrupted:g}, sessions {plain}")
    errors = _metric(samples, "tether_tool_calls_total", tool="guarded", outcome="error")
    report.metrics["tool_calls_total{guarded,error}"] = (errors, report.interrupted_approved)
    if errors < report.interrupted_approved:
        bad(
            f"tether_tool_calls_total{{guarded,error}} is {errors:g}: {report.interrupted_approved}"
        )
    denied = _metric(samples, "tether_budget_denied_total")
    held = _metric(samples, "tether_budget_held", unit="usd")
    report.metrics["budget_held{usd}"] = (held, 0)
    if abs(held) > 1e-9 and not (report.kills["worker"] or report.kills["restate"]):
        bad(f"tether_budget_held{{unit=usd}} is {held:g} with no run left")
    spent = _metric(samples, "tether_budget_spent_total", unit="usd")
    report.metrics["budget_spent_total{usd}"] = (round(spent, 6), round(report.spent_usd, 6))
    over = report.statuses["budget_exceeded"]
    report.metrics["budget_denied_total"] = (denied, over)
    if denied != over:
        drift(f"tether_budget_denied_total is {denied:g}, {over} runs stopped on their budget")

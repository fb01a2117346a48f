"""Tether's Prometheus metrics, shared by the worker and the sidecar of a pod.

The two are separate processes: both run with `PROMETHEUS_MULTIPROC_DIR` pointing at one shared
directory (an emptyDir), so prometheus_client's multiprocess mode writes every value to a file
there and the sidecar's `/metrics` merges them (`merged_files`); so does the worker's own
`/metrics` (`tether worker --metrics-port`) over its hypercorn processes' files. The variable must
be set before `prometheus_client` is first imported; without it the metrics simply live in memory.

`agent_hooks()` turns the agent's hooks into counts. Those hooks fire only when a step runs live,
so a replay never counts work twice; the few that also fire on a replay (the end of a run, and
`tool:after` of a self-journaled tool such as `spawn`, `ask_human` or an approval gate, whose
body runs outside any step) are counted only once the run has gone live (see `agent_hooks`).
How long calls stay parked is observed by the worker where a park ends (`observe_parked`, from
`tether.programs.worker.parking`), and the age of the oldest parked call is computed by the
sidecar at scrape time, like the count of parked calls.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

from .._optional import extra_imports

with extra_imports("tether.programs.metrics", "sidecar", "prometheus_client"):
    from prometheus_client import Counter, Gauge, Histogram, values
    from prometheus_client.metrics import MetricWrapperBase
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.registry import Collector

from ..agent.hooks import HookFn, HookPayload
from ..agent.stats import AgentStatus
from ..durable.protocol import DurableRuntime
from ..parked import ParkedKind
from ..providers.base import Provider
from ..providers.limit import Limited

PARKED_CALLS_NAME = "tether_parked_calls"
PARKED_CALLS_HELP = "Calls parked on an awakeable, waiting for a person."
PARKED_OLDEST_NAME = "tether_parked_oldest_seconds"
PARKED_OLDEST_HELP = "Age of the oldest call parked for a person, in seconds (0 when none waits)."
WEBHOOK_REQUESTS_NAME = "tether_webhook_requests"

#: Computed by the sidecar at scrape time from the records in Restate; nobody sets it.
PARKED_CALLS = Gauge(
    PARKED_CALLS_NAME,
    PARKED_CALLS_HELP,
    ["agent", "kind"],
    multiprocess_mode="livemax",
)
REPLAYS = Counter(
    "tether_replays_total", "Runs that replayed their journal and then went live.", ["agent"]
)
REPLAYED_STEPS = Counter(
    "tether_replayed_steps_total",
    "Steps answered from the journal instead of running again, by step kind.",
    ["agent", "kind"],
)
CHILD_FANOUT = Histogram(
    "tether_child_fanout",
    "Sub-agents started by one spawn call.",
    ["agent"],
    buckets=(1, 2, 3, 4, 5, 8, 12, 16, 32, 64),
)
CHILDREN = Counter(
    "tether_children_total", "Sub-agent runs that finished, by status.", ["agent", "status"]
)
RUNS = Counter("tether_runs_total", "Agent runs that finished, by status.", ["agent", "status"])
MODEL_CALLS = Counter(
    "tether_model_calls_total",
    "Model calls that ran live, those skipped while their model cooled down, and those the "
    "agent's spend caps refused.",
    ["agent", "provider", "model", "outcome"],
)
MODEL_CALL_OUTCOMES = ("ok", "error", "skipped", "capped")
MODEL_CALLS_WAITING = Gauge(
    "tether_model_calls_waiting",
    "Model calls waiting for a slot under their model's cap on calls in flight in a worker "
    "(spec.model.maxConcurrentCalls).",
    ["agent", "provider", "model"],
    multiprocess_mode="livesum",
)
MODEL_CALL_DURATION = Histogram(
    "tether_model_call_duration_seconds",
    "How long live model calls took (the provider's answer, streamed text included).",
    ["agent", "provider", "model"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300),
)
MODEL_TOKENS = Counter(
    "tether_model_tokens_total",
    "Model tokens by kind (input, output, cache_read, cache_write).",
    ["agent", "provider", "model", "kind"],
)
COST_USD = Counter(
    "tether_cost_usd_total", "Model cost in US dollars.", ["agent", "provider", "model"]
)
TOOL_CALLS = Counter(
    "tether_tool_calls_total", "Tool calls that ran live, by outcome.", ["agent", "tool", "outcome"]
)
TOOL_DURATION = Histogram(
    "tether_tool_duration_seconds",
    "How long tool bodies ran.",
    ["agent", "tool"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
INTERRUPTED_TOOL_CALLS = Counter(
    "tether_interrupted_tool_calls_total",
    "Tool calls cut off by a crash and reported to the model as interrupted.",
    ["agent", "tool"],
)
TOOL_BODIES_HANDED_OVER = Counter(
    "tether_tool_bodies_handed_over_total",
    "Unsafe tool bodies whose attempt ended while they ran, handed to another worker replica "
    "through Restate: sent (by the replica that ran one), received (journaled by another "
    "instead of reported interrupted), stale (the sender went quiet: reported interrupted).",
    ["agent", "way"],
)
RUNS_LEFT_STOPPING_WORKER = Counter(
    "tether_runs_left_stopping_worker_total",
    "Runs (sub-agents' too) that left a stopping worker replica before their next model step, "
    "to go on on another one (a scale-down, a drain, a rollout).",
    ["agent"],
)
MCP_CALLS = Counter(
    "tether_mcp_calls_total",
    "Calls to MCP servers' tools, by outcome (ok, error, timeout, unreachable).",
    ["agent", "server", "tool", "outcome"],
)
MCP_CALL_DURATION = Histogram(
    "tether_mcp_call_duration_seconds",
    "How long calls to MCP servers' tools took.",
    ["agent", "server", "tool"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
BUDGET_HELD = Gauge(
    "tether_budget_held",
    "What model calls in flight hold of their runs' budgets (worst cases), by unit (usd, tokens).",
    ["agent", "unit"],
    multiprocess_mode="livesum",
)
BUDGET_SPENT = Counter(
    "tether_budget_spent",
    "What settled model calls of budgeted runs (and their sub-agents) spent, by unit.",
    ["agent", "unit"],
)
BUDGET_DENIED = Counter(
    "tether_budget_denied_total",
    "Model calls that found no room in their run's budget and did not start.",
    ["agent"],
)
MINUTE, HOUR, DAY = 60, 3600, 86400
#: From seconds (an answer right away) to a week.
PARKED_DURATION_BUCKETS = (
    *(1, 5, 15, 30, MINUTE, 2 * MINUTE, 5 * MINUTE, 10 * MINUTE, 30 * MINUTE),
    *(HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR, DAY, 2 * DAY, 7 * DAY),
)
PARKED_DURATION = Histogram(
    "tether_parked_duration_seconds",
    "How long calls stayed parked: from the park to a person's answer, the timeout or a rejection.",
    ["agent", "kind"],
    buckets=PARKED_DURATION_BUCKETS,
)
WEBHOOK_REQUESTS = Counter(
    f"{WEBHOOK_REQUESTS_NAME}_total",
    "Requests to the sidecar's approval webhooks and links, by outcome.",
    ["outcome"],
)

TOKEN_KINDS = ("input", "output", "cache_read", "cache_write")


@functools.lru_cache(maxsize=4096)
def _series(metric: MetricWrapperBase, *labels: str) -> Any:
    """`metric.labels(*labels)`, looked up once: `labels()` checks the values and takes a lock on
    every call, and the hooks below run at every model and tool call (~0.7 us against ~0.1)."""
    return metric.labels(*labels)


def mcp_observer(agent: str) -> Callable[[str, str, str, float], None]:
    """Counts the live calls of the agent's MCP tools (a `tether.tools.mcp.CallObserver`)."""

    def observe(server: str, tool: str, outcome: str, seconds: float) -> None:
        _series(MCP_CALLS, agent, server, tool, outcome).inc()
        _series(MCP_CALL_DURATION, agent, server, tool).observe(seconds)

    return observe


def budget_observer(agent: str) -> Callable[[str, str, Any], None]:
    """Counts what the agent's budget ledgers do (a `tether.restate.budget.BudgetObserver`).
    A process releases only the holds it took: the holds of a killed worker leave the sum
    (`livesum`) with it, and its replacement must not take them off a second time. The series
    start at 0, so a first refusal shows as an increase."""
    held_here: set[str] = set()
    BUDGET_DENIED.labels(agent)
    for unit in ("usd", "tokens"):
        BUDGET_HELD.labels(agent, unit)
        BUDGET_SPENT.labels(agent, unit)

    def observe(what: str, key: str, amount: Any) -> None:
        if what == "denied":
            BUDGET_DENIED.labels(agent).inc()
            return
        if what == "held":
            if key in held_here:  # the handler ran again (its first run was not committed)
                return
            held_here.add(key)
        elif what == "released":
            if key not in held_here:
                return
            held_here.discard(key)
        for unit, value in (("usd", amount.cost_usd), ("tokens", amount.tokens)):
            if what == "held":
                BUDGET_HELD.labels(agent, unit).inc(value)
            elif what == "released":
                BUDGET_HELD.labels(agent, unit).dec(value)
            else:
                BUDGET_SPENT.labels(agent, unit).inc(value)

    return observe


def parked_seconds(parked: Mapping[str, Any], ended: Mapping[str, Any], now_ms: float) -> float:
    """How long a call stayed parked, from its record (a `tether.parked.ParkedCall`: epoch ms
    `created_at`, `expires_at`), how its park ended (`park:end`'s value) and the clock now:
    until its deadline when it timed out, until `decided_at` when the answer says when it was
    decided (the sidecar adds it; kept only if it falls within the park), otherwise until now
    (Restate resumes the run as soon as the answer arrives)."""
    created, end = float(parked["created_at"]), now_ms
    expires, decided = _epoch_ms(parked.get("expires_at")), _epoch_ms(ended.get("decided_at"))
    if ended.get("timed_out") and expires is not None:
        end = expires
    elif decided is not None and created <= decided <= now_ms:
        end = decided
    return max(0.0, (end - created) / 1000)


def _epoch_ms(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def observe_parked(agent: str, kind: str, seconds: float) -> None:
    """Count one park that ended (answered, timed out or rejected) and how long it lasted. The
    caller calls it once per park, where the park's end runs live (see `parking._ended`)."""
    PARKED_DURATION.labels(agent, kind).observe(seconds)


PARKED_KINDS: tuple[str, ...] = get_args(ParkedKind)
RUN_STATUSES: tuple[str, ...] = get_args(AgentStatus)


def agent_series_at_zero(agent: str, *, models: Sequence[tuple[str, str]]) -> None:
    """Give the agent's series whose labels are known before any work (runs by status, replays,
    parks by kind, its models' (provider, model) calls, latency, tokens and cost) a value of 0
    when the worker starts. A series that first appears with its first count shows Prometheus
    no increase, so `rate()`, `increase()` and `histogram_quantile()` would miss the first run,
    error or park of every new pod: for rare events (a park, an error), all of them."""
    for status in RUN_STATUSES:
        RUNS.labels(agent, status)
    REPLAYS.labels(agent)
    for kind in PARKED_KINDS:
        PARKED_DURATION.labels(agent, kind)
    for provider, model in models:
        for outcome in MODEL_CALL_OUTCOMES:
            MODEL_CALLS.labels(agent, provider, model, outcome)
        MODEL_CALL_DURATION.labels(agent, provider, model)
        for kind in ("input", "output"):
            MODEL_TOKENS.labels(agent, provider, model, kind)
        COST_USD.labels(agent, provider, model)
    for way in ("sent", "received", "stale"):
        TOOL_BODIES_HANDED_OVER.labels(agent, way)
    RUNS_LEFT_STOPPING_WORKER.labels(agent)


def watch_waiting_calls(agent: str, models: Sequence[Provider]) -> None:
    """Report the calls that wait under each capped model's limit (`Limited`), from 0."""
    for model in models:
        if isinstance(model, Limited):
            series = MODEL_CALLS_WAITING.labels(agent, model.name, model.model)
            series.set(model.waiting)
            model.on_waiting = series.set


def count_run_that_left(agent: str) -> None:
    """A run of `agent` left its stopping worker (`tether.restate.errors.WorkerStopping`)."""
    RUNS_LEFT_STOPPING_WORKER.labels(agent).inc()


def multiprocess_enabled() -> bool:
    """True when this process writes its metric values to `PROMETHEUS_MULTIPROC_DIR`."""
    return bool(getattr(values.ValueClass, "_multiprocess", False))


def multiprocess_dir(configured: Path | None = None) -> Path | None:
    """The directory of metric files to merge: `configured` (the sidecar's setting), else the
    `PROMETHEUS_MULTIPROC_DIR` this process writes to; none when it keeps its values in memory."""
    if configured is not None:
        return configured
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(directory) if directory and multiprocess_enabled() else None


def merged_files(directory: Path) -> Collector:
    """The values every process wrote to `directory`, merged: whichever process is scraped, it
    gives the same view of them all."""
    return MultiProcessCollector(None, path=str(directory))  # type: ignore[no-untyped-call]


def agent_hooks(
    agent: str,
    *,
    provider: str = "unknown",
    model: str = "unknown",
    durable: DurableRuntime | None = None,
) -> dict[str, HookFn]:
    """Hooks for `create_agent(hooks=...)` that count the agent's live work.

    `provider` and `model` label the model calls whose payloads do not name them. With
    `durable`, a replay also adds the runtime's replayed-step counts by kind.

    What counts, exactly once per piece of work (a crash inside a step body aside, which runs
    the body again):
    - model calls, their latency, tokens and cost from `turn:after`, and failed ones from
      `turn:error`, which fire inside the model step, live only, labelled with the model the
      call went to (a fallback's, when the one before failed);
    - a tool call from its `tool:after`. For an ordinary tool that fires inside the tool step.
      A self-journaled tool (`spawn`, `ask_human`, an approval gate) fires it outside any step,
      on a replay too, so with `durable` such a call counts only if the run is live when the
      call ends: it ended in this attempt (its last step, such as `spawn:complete` or the end
      of a park, ran live), not in an attempt before whose journal is being replayed;
    - a run from `agent:done`, likewise only when the run is live (with `durable`): an attempt
      that merely replays a finished journal does not count the run again;
    - children from `spawn:complete`, which fires inside one journaled step per spawn call;
      with a `fanout` in the payload (the Restate spawn tool) the call's fanout is observed
      there too. Without one (the in-process spawn tool, one child per call) the children of
      one turn are observed together at the next turn or the end of the run;
    - a replay from `replay:done`: once per attempt (invocation) that replayed steps from its
      journal and then ran a step live, with the steps it replayed by kind.
    """
    spawned_this_turn = 0

    def live() -> bool:
        return durable is None or not durable.is_replaying()

    def observe_fanout() -> None:
        nonlocal spawned_this_turn
        if spawned_this_turn:
            CHILD_FANOUT.labels(agent).observe(spawned_this_turn)
            spawned_this_turn = 0

    def turn_before(payload: HookPayload) -> None:
        observe_fanout()

    def called(payload: HookPayload) -> tuple[str, str]:
        # the model the call went to: a fallback's, when the one before failed
        return str(payload.get("provider") or provider), str(payload.get("model") or model)

    def turn_after(payload: HookPayload) -> None:
        which = called(payload)
        _series(MODEL_CALLS, agent, *which, "ok").inc()
        latency_ms = payload.get("latency_ms")
        if isinstance(latency_ms, int | float):
            _series(MODEL_CALL_DURATION, agent, *which).observe(max(0.0, latency_ms) / 1000)
        usage: Mapping[str, Any] = payload.get("usage") or {}
        for kind in TOKEN_KINDS:
            tokens = usage.get(kind) or 0
            if tokens > 0:
                _series(MODEL_TOKENS, agent, *which, kind).inc(tokens)
        cost = float(payload.get("cost") or 0.0)
        if cost > 0:
            _series(COST_USD, agent, *which).inc(cost)

    def turn_error(payload: HookPayload) -> None:
        outcome = "error"
        if payload.get("skipped") or payload.get("capped"):  # not made: not the model's fault
            outcome = "skipped" if payload.get("skipped") else "capped"
        _series(MODEL_CALLS, agent, *called(payload), outcome).inc()

    def tool_after(payload: HookPayload) -> None:
        if not live():
            return  # a self-journaled call that ended in an earlier attempt, replayed
        tool, outcome = str(payload.get("name")), str(payload.get("outcome", "ok"))
        _series(TOOL_CALLS, agent, tool, outcome).inc()
        if outcome == "interrupted":
            _series(INTERRUPTED_TOOL_CALLS, agent, tool).inc()
        else:
            _series(TOOL_DURATION, agent, tool).observe(float(payload.get("duration_s") or 0.0))

    def spawn_complete(payload: HookPayload) -> None:
        nonlocal spawned_this_turn
        fanout = payload.get("fanout")
        if isinstance(fanout, int):
            if payload.get("index", 0) == 0:
                CHILD_FANOUT.labels(agent).observe(fanout)
        else:
            spawned_this_turn += 1
        stats = payload.get("stats")
        CHILDREN.labels(agent, str(getattr(stats, "status", "unknown"))).inc()

    def agent_done(payload: HookPayload) -> None:
        observe_fanout()
        if not live():
            return  # the run's end was replayed: it was counted by the attempt that ran it
        stats = payload.get("stats")
        RUNS.labels(agent, str(getattr(stats, "status", "unknown"))).inc()

    def replay_done(payload: HookPayload) -> None:
        REPLAYS.labels(agent).inc()
        if durable is not None:
            for kind, steps in durable.counters.replayed.items():
                if steps:
                    REPLAYED_STEPS.labels(agent, kind).inc(steps)

    return {
        "turn:before": turn_before,
        "turn:after": turn_after,
        "turn:error": turn_error,
        "tool:after": tool_after,
        "spawn:complete": spawn_complete,
        "agent:done": agent_done,
        "replay:done": replay_done,
    }

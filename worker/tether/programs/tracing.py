"""OpenTelemetry traces of agent runs (the `otel` extra): one trace per run, across all the
invocations the run takes, with a span for the run, each turn, each model call, each tool call
and each wait for a person; a sub-agent's run under the spawn call that started it.

`tracing_from_env()` builds an `AgentTracing` from the standard `OTEL_*` variables (none without
an endpoint: see `tether.programs.trace_context.trace_exporters`), exporting OTLP over HTTP in
batches (`OTEL_BSP_*`); `tracing.hooks(...)` are hooks for `create_agent(hooks=...)`.

Spans are emitted when the work they stand for ends, by the attempt (invocation, process) that
ran its end live, so a replay never emits one twice:
- a model call (`chat <model>`, the GenAI attributes) from `turn:after` or `turn:error`, which
  fire inside the model step, live only: a call cut off by a crash is not emitted, the attempt
  that runs it again emits its own;
- a tool call (`execute_tool <tool>`) from `tool:after`; an ordinary tool's fires inside its
  step (live only), a self-journaled tool's (`spawn`, approvals, `ask_human`) also on replays,
  so it is emitted only if the run is live then, from its journaled start (`started_at`);
- a wait for a person (`park <tool>`) from `park:end`, when the run is live: from the start of
  the call to the decision (`decided_at`, else when the run took it);
- a turn (`turn <n>`) from `turn:end`, when the run is live, and a run (`invoke_agent <agent>`)
  from `agent:done`, likewise; both with their journaled start and end times.

Ids come from `trace_context`: the same run gives the same trace and parents in every attempt;
a model call's span id is random (nothing hangs under it). Spans still in the exporter's batch
when a process is SIGKILLed are lost (`OTEL_BSP_SCHEDULE_DELAY`, 5 s by default, bounds what).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._optional import extra_imports

with extra_imports("tether.programs.tracing", "otel", "opentelemetry"):
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.util.types import AttributeValue

from ..agent.hooks import HookFn, HookPayload
from ..durable.protocol import DurableRuntime
from .trace_context import (
    TraceParent,
    run_trace_id,
    span_id_of,
    trace_exporters,
    traces_endpoint,
)

log = logging.getLogger("tether.programs.tracing")
INSTRUMENTATION = "tether"
OK_OUTCOMES = frozenset({"ok"})


def now_ms() -> float:
    return time.time() * 1000


class PlannedIds(IdGenerator):
    """The tracer provider's ids: the ones planned for the span being started (derived from the
    run's ids), random ones for the rest."""

    def __init__(self) -> None:
        self._planned = threading.local()
        self._random = RandomIdGenerator()

    def plan(self, trace_id: int | None, span_id: int | None) -> None:
        self._planned.trace_id, self._planned.span_id = trace_id, span_id

    def _take(self, name: str) -> int | None:
        value: int | None = getattr(self._planned, name, None)
        setattr(self._planned, name, None)
        return value

    def generate_span_id(self) -> int:
        return self._take("span_id") or self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        return self._take("trace_id") or self._random.generate_trace_id()


@dataclass(frozen=True)
class Span:
    """One span to emit, all of it known when its work ended."""

    name: str
    trace_id: int
    span_id: int | None
    """None: a random one."""
    parent_id: int | None
    """None: the root of the trace."""
    start_ms: float
    end_ms: float
    attributes: Mapping[str, AttributeValue]
    kind: SpanKind = SpanKind.INTERNAL
    error: str | None = None
    """Set for a span that failed: its status description."""


class AgentTracing:
    """Emits the spans of agent runs through a tracer provider of its own (its id generator
    plans the derived ids). One per process; `hooks()` per agent (or run)."""

    def __init__(
        self, processors: Sequence[SpanProcessor], *, resource: Resource | None = None
    ) -> None:
        self._ids = PlannedIds()
        self.provider = TracerProvider(
            resource=resource or Resource.create(), id_generator=self._ids
        )
        for processor in processors:
            self.provider.add_span_processor(processor)
        self._tracer = self.provider.get_tracer(INSTRUMENTATION)

    def emit(self, span: Span) -> None:
        if span.parent_id is None:
            context = Context()
            self._ids.plan(span.trace_id, span.span_id)
        else:
            parent = trace.SpanContext(
                span.trace_id,
                span.parent_id,
                is_remote=True,
                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
            )
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
            self._ids.plan(None, span.span_id)
        start = int(span.start_ms * 1_000_000)
        end = max(start, int(span.end_ms * 1_000_000))
        # The planned ids (per thread) are taken by this very start.
        started = self._tracer.start_span(
            span.name,
            context=context,
            kind=span.kind,
            attributes=dict(span.attributes),
            start_time=start,
        )
        if span.error is not None:
            started.set_status(Status(StatusCode.ERROR, span.error))
        started.end(end_time=end)

    def hooks(
        self,
        *,
        agent: str,
        provider: str,
        model: str,
        durable: DurableRuntime,
        parent: TraceParent | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> dict[str, HookFn]:
        """Hooks for `create_agent(hooks=...)` that emit the spans of the agent's runs on
        `durable`. `parent`: the span a sub-agent's run hangs under (from its request's
        `traceparent`); `attributes` go on the run's span (a session id...)."""
        return RunSpans(self, agent, provider, model, durable, parent, attributes or {}).hooks()

    def force_flush(self) -> None:
        self.provider.force_flush()

    def shutdown(self) -> None:
        """Export what is left and stop."""
        self.provider.shutdown()


def tracing_from_env(
    env: Mapping[str, str], *, service_name: str = "tether"
) -> AgentTracing | None:
    """An `AgentTracing` as the `OTEL_*` variables ask (None when they ask for no traces):
    OTLP over HTTP to `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` in batches, `console` to stdout.
    `service_name` unless `OTEL_SERVICE_NAME` (or `OTEL_RESOURCE_ATTRIBUTES`) names one."""
    exporters = trace_exporters(env)
    if not exporters:
        return None
    processors: list[SpanProcessor] = []
    if "otlp" in exporters:
        with extra_imports("tether.programs.tracing", "otel", "opentelemetry"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processors.append(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_endpoint(env))))
    if "console" in exporters:
        processors.append(SimpleSpanProcessor(ConsoleSpanExporter()))
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {SERVICE_NAME: service_name})
    return AgentTracing(processors, resource=resource)


@dataclass
class _Tool:
    name: str
    started_ms: float
    replay: str
    self_journaled: bool


@dataclass
class _Run:
    """What one run's hooks know in this attempt."""

    run_id: str
    trace_id: int
    turns: dict[int, float] = field(default_factory=dict)
    """Turns whose first model call started in this attempt: when."""
    model_calls: dict[int, float] = field(default_factory=dict)
    """The model call in flight, per turn: when it started."""
    tools: dict[str, _Tool] = field(default_factory=dict)
    """Tool calls started (or, self-journaled, replayed to) in this attempt."""

    def span(self, *step: str) -> int:
        return span_id_of(self.run_id, *step)


def _harmless(fn: Callable[[HookPayload], None]) -> HookFn:
    """`fn`, whose failure is logged: tracing never fails a run."""

    def hook(payload: HookPayload) -> None:
        try:
            fn(payload)
        except Exception:
            log.warning("a tracing hook failed; the run goes on", exc_info=True)

    return hook


def _usage_attributes(usage: Mapping[str, Any]) -> dict[str, AttributeValue]:
    cache_read, cache_write = int(usage.get("cache_read") or 0), int(usage.get("cache_write") or 0)
    attributes: dict[str, AttributeValue] = {
        # GenAI conventions: input tokens include the cached ones (Tether's `input` does not).
        "gen_ai.usage.input_tokens": int(usage.get("input") or 0) + cache_read + cache_write,
        "gen_ai.usage.output_tokens": int(usage.get("output") or 0),
    }
    if cache_read:
        attributes["gen_ai.usage.cache_read.input_tokens"] = cache_read
    if cache_write:
        attributes["gen_ai.usage.cache_creation.input_tokens"] = cache_write
    return attributes


class RunSpans:
    """The spans of one agent's runs on one durable runtime, from its hooks."""

    def __init__(
        self,
        tracing: AgentTracing,
        agent: str,
        provider: str,
        model: str,
        durable: DurableRuntime,
        parent: TraceParent | None,
        attributes: Mapping[str, AttributeValue],
    ) -> None:
        self.tracing = tracing
        self.agent = agent
        self.provider = provider
        self.model = model
        self.durable = durable
        self.parent = parent
        self.attributes = attributes
        self.runs: dict[str, _Run] = {}

    def hooks(self) -> dict[str, HookFn]:
        hooks: dict[str, Callable[[HookPayload], None]] = {
            "turn:before": self.turn_before,
            "turn:after": self.turn_after,
            "turn:error": self.turn_error,
            "turn:end": self.turn_end,
            "tool:before": self.tool_before,
            "tool:after": self.tool_after,
            "park:end": self.park_end,
            "spawn:start": self.spawn_start,
            "agent:done": self.agent_done,
        }
        return {name: _harmless(fn) for name, fn in hooks.items()}

    def live(self) -> bool:
        """Whether the run is live now: a step ran live in this attempt and none is left to
        replay (a hook that fires on replays too emits only then)."""
        durable = self.durable
        return not durable.is_replaying() and durable.counters.live.total() > 0

    def run(self, run_id: Any) -> _Run:
        key = str(run_id)
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = _Run(key, run_trace_id(key, self.parent))
        return run

    def emit(
        self,
        run: _Run,
        name: str,
        *,
        span_id: int | None,
        parent_id: int | None,
        start_ms: float,
        end_ms: float,
        attributes: Mapping[str, AttributeValue],
        kind: SpanKind = SpanKind.INTERNAL,
        error: str | None = None,
    ) -> None:
        span = Span(
            name, run.trace_id, span_id, parent_id, start_ms, end_ms, attributes, kind, error
        )
        self.tracing.emit(span)

    # Model calls ------------------------------------------------------------------------------

    def turn_before(self, payload: HookPayload) -> None:
        run, turn, now = self.run(payload["run_id"]), int(payload["turn"]), now_ms()
        run.model_calls[turn] = now
        run.turns.setdefault(turn, now)

    def _model_span(
        self,
        payload: HookPayload,
        extra: Mapping[str, AttributeValue],
        error: str | None = None,
    ) -> None:
        run, turn, now = self.run(payload["run_id"]), int(payload["turn"]), now_ms()
        started = run.model_calls.pop(turn, now - float(payload.get("latency_ms") or 0.0))
        # The model the call went to (a fallback's, when the one before failed).
        provider = str(payload.get("provider") or self.provider)
        model = str(payload.get("model") or self.model)
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,
            "gen_ai.request.model": model,
            "gen_ai.agent.name": self.agent,
            "tether.run.id": run.run_id,
            "tether.turn": turn,
            **extra,
        }
        if error is not None:
            attributes["error.type"] = "ProviderError"
        self.emit(
            run,
            f"chat {model}",
            span_id=None,
            parent_id=run.span("turn", str(turn)),
            start_ms=started,
            end_ms=now,
            attributes=attributes,
            kind=SpanKind.CLIENT,
            error=error,
        )

    def turn_after(self, payload: HookPayload) -> None:
        extra: dict[str, AttributeValue] = _usage_attributes(payload.get("usage") or {})
        if payload.get("stop"):
            extra["gen_ai.response.finish_reasons"] = [str(payload["stop"])]
        if payload.get("cost"):
            extra["tether.cost_usd"] = float(payload["cost"])
        self._model_span(payload, extra)

    def turn_error(self, payload: HookPayload) -> None:
        if payload.get("skipped") or payload.get("capped"):
            return  # no call: a model cooling down was skipped, or the spend caps refused it
        retry = {"tether.retry": bool(payload.get("retry"))}
        self._model_span(payload, retry, error=str(payload.get("error")))

    # Turns ------------------------------------------------------------------------------------

    def turn_end(self, payload: HookPayload) -> None:
        run, turn = self.run(payload["run_id"]), int(payload["turn"])
        first_seen = run.turns.pop(turn, None)
        if not self.live():
            return  # the turn ended in an earlier attempt, which emitted it
        started = float(payload["started_at"])
        if first_seen is not None:  # an attempt of its model call that failed came first
            started = min(started, first_seen)
        self._turn_span(run, turn, started, float(payload["ended_at"]))

    def _turn_span(
        self, run: _Run, turn: int, start: float, end: float, error: str | None = None
    ) -> None:
        self.emit(
            run,
            f"turn {turn}",
            span_id=run.span("turn", str(turn)),
            parent_id=run.span("run"),
            start_ms=start,
            end_ms=end,
            attributes={"tether.run.id": run.run_id, "tether.turn": turn},
            error=error,
        )

    # Tool calls and parks ---------------------------------------------------------------------

    def tool_before(self, payload: HookPayload) -> None:
        run = self.run(payload["run_id"])
        started = payload.get("started_at")
        run.tools[str(payload["call_id"])] = _Tool(
            name=str(payload["name"]),
            started_ms=float(started) if started is not None else now_ms(),
            replay=str(payload.get("replay") or "unsafe"),
            self_journaled=bool(payload.get("self_journaled")),
        )

    def tool_after(self, payload: HookPayload) -> None:
        run, call_id, now = self.run(payload["run_id"]), str(payload["call_id"]), now_ms()
        tool = run.tools.pop(call_id, None)
        if tool is not None and tool.self_journaled and not self.live():
            return  # a self-journaled call that ended in an earlier attempt, replayed
        outcome = str(payload.get("outcome") or "ok")
        if tool is None:  # its start is not of this attempt: a call reported interrupted
            tool = _Tool(
                str(payload["name"]),
                now - 1000 * float(payload.get("duration_s") or 0),
                "unsafe",
                False,
            )
        result = payload.get("result")
        error = None
        if outcome not in OK_OUTCOMES:
            error = str(result)[:500] if isinstance(result, str) else outcome
        self.emit(
            run,
            f"execute_tool {tool.name}",
            span_id=run.span("tool", call_id),
            parent_id=run.span("turn", str(payload.get("turn", 0))),
            start_ms=tool.started_ms,
            end_ms=now,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool.name,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.agent.name": self.agent,
                "tether.run.id": run.run_id,
                "tether.tool.outcome": outcome,
                "tether.tool.replay": tool.replay,
            },
            error=error,
        )

    def park_end(self, payload: HookPayload) -> None:
        if not self.live():
            return  # answered in an earlier attempt
        run, call_id, now = self.run(payload["run_id"]), str(payload["call_id"]), now_ms()
        tool = run.tools.get(call_id)
        started = tool.started_ms if tool is not None else now
        decided = payload.get("decided_at")
        ended = (
            float(decided)
            if isinstance(decided, int | float) and started <= decided <= now
            else now
        )
        if payload.get("rejected") is not None:
            outcome = "rejected"
        elif payload.get("timed_out"):
            outcome = "timed_out"
        elif "approved" in payload:
            outcome = "approved" if payload["approved"] else "denied"
        else:
            outcome = "answered" if payload.get("answered") else "unanswered"
        attributes: dict[str, AttributeValue] = {
            "tether.run.id": run.run_id,
            "tether.park.kind": str(payload.get("kind")),
            "tether.park.outcome": outcome,
            "gen_ai.tool.name": str(payload.get("tool")),
            "gen_ai.tool.call.id": call_id,
        }
        for key in ("approver", "by"):
            if isinstance(payload.get(key), str):
                attributes[f"tether.park.{key}"] = payload[key]
        self.emit(
            run,
            f"park {payload.get('tool')}",
            span_id=run.span("park", call_id),
            parent_id=run.span("tool", call_id),
            start_ms=started,
            end_ms=ended,
            attributes=attributes,
        )

    def spawn_start(self, payload: HookPayload) -> None:
        """An in-process sub-agent's hooks: its spans under the spawn call's."""
        run, call_id = self.run(payload["run_id"]), str(payload["call_id"])
        parent = TraceParent(run.trace_id, run.span("tool", call_id))
        child = RunSpans(
            self.tracing, self.agent, self.provider, self.model, payload["durable"], parent, {}
        )
        for name, fn in child.hooks().items():
            payload["hooks"].setdefault(name, []).append(fn)

    # The run ----------------------------------------------------------------------------------

    def agent_done(self, payload: HookPayload) -> None:
        stats = payload["stats"]
        run = self.runs.pop(str(stats.run_id), None) or _Run(
            str(stats.run_id), run_trace_id(str(stats.run_id), self.parent)
        )
        if not self.live():
            return  # the run's end was replayed: the attempt that ran it emitted it
        ended = float(stats.ended_at or now_ms())
        for turn in list(run.model_calls):  # cut off by an abort
            self._model_span({"run_id": run.run_id, "turn": turn}, {}, error=str(stats.status))
        for turn, started in run.turns.items():  # a turn whose model call failed for good
            self._turn_span(run, turn, started, ended, error=stats.error or str(stats.status))
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": self.agent,
            "gen_ai.provider.name": self.provider,
            "gen_ai.request.model": self.model,
            "tether.run.id": run.run_id,
            "tether.run.status": str(stats.status),
            "tether.turns": int(stats.turns),
            "tether.tool_calls": int(stats.tool_calls),
            "tether.cost_usd": float(stats.total_cost_usd),
            **_usage_attributes(
                {
                    "input": stats.input_tokens,
                    "output": stats.output_tokens,
                    "cache_read": stats.cache_read_tokens,
                    "cache_write": stats.cache_write_tokens,
                }
            ),
            **self.attributes,
        }
        failed = stats.status == "error"  # a stop (max turns, budget, abort) is no failure
        self.emit(
            run,
            f"invoke_agent {self.agent}",
            span_id=run.span("run"),
            parent_id=self.parent.span_id if self.parent is not None else None,
            start_ms=float(stats.started_at or ended),
            end_ms=ended,
            attributes=attributes,
            error=(stats.error or str(stats.status)) if failed else None,
        )

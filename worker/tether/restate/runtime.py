"""`restate_runtime`: the durable runtime of one Restate invocation.

Each step is one `ctx.run_typed` entry. Concurrent steps are created in call order (which fixes
their journal positions) and awaited through the SDK's `gather`, never as free-running asyncio
tasks that each touch the context.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import restate
from restate import RunOptions
from restate.exceptions import TerminalError
from restate.serde import JsonSerde

from .. import jsoncodec
from ..durable.ids import IdSequence
from ..durable.protocol import (
    DurableRuntime,
    InterruptedFn,
    RuntimeStores,
    StepCall,
    StepCounters,
    StepFn,
    StepKind,
)
from ..durable.replay import LiveCallback, ReplayTracker
from ..messages import JSON
from ..session.store import MemoryToolStateStore, memory_store
from .chain import Values
from .clock import DEFAULT_REANCHOR_EVERY, CoalescedClock
from .errors import WorkerStopping, is_restate_control_error
from .events import RestateEventLog
from .intents import INTENTS, NOT_HERE, Handoff
from .session import restate_session_store
from .tool_state import restate_tool_state_store
from .types import RestateCombinators, RestateContextLike, RestateRuntimeOptions

log = logging.getLogger(__name__)


class FastJsonSerde(JsonSerde[Any]):
    """The SDK's JSON serde on orjson: step results are decoded again on every replay."""

    def deserialize(self, buf: bytes) -> Any:
        return jsoncodec.loads(buf) if buf else None

    def serialize(self, obj: Any) -> bytes:
        return b"" if obj is None else jsoncodec.dumps(obj)


JSON_SERDE: JsonSerde[Any] = FastJsonSerde()


DEFAULT_RUN_OPTIONS: RunOptions[Any] = RunOptions(serde=JSON_SERDE, max_attempts=1)
"""One attempt: a failing step is recorded, not retried blindly (retries are the loop's). Shared:
the SDK copies options only when it has to infer a serde, which a JsonSerde spares it."""


def default_run_options() -> RunOptions[Any]:
    return DEFAULT_RUN_OPTIONS


def journal_options(options: RunOptions[Any] | None) -> RunOptions[Any]:
    """`ctx.run_typed` options for a journaled step: one attempt by default (a failing step is
    recorded, not retried blindly), and always the JSON serde, because step functions return
    plain JSON and the SDK's default serde would guess from their annotations."""
    if options is None:
        return DEFAULT_RUN_OPTIONS
    if isinstance(options.serde, JsonSerde):
        return options
    return dataclasses.replace(options, serde=JSON_SERDE)


def _has_state(ctx: object) -> bool:
    return all(callable(getattr(ctx, name, None)) for name in ("key", "get", "set", "clear"))


def _nonce_of(intent: JSON) -> str | None:
    """The nonce of a journaled intent (None for intents journaled before there was one)."""
    nonce = intent.get("nonce") if isinstance(intent, dict) else None
    return nonce if isinstance(nonce, str) else None


class _Checkpoints:
    """When a model step sends the run's held state writes: once the steps journaled since
    they were last sent span `every_ms`, from the start of the first model call among them to
    the latest step's end. A slow turn's writes go before its next model call, as they always
    did; quick turns' go together, so a tail rewritten every turn is written once for many.
    Decided from journaled values only: a replay sends them at the same journal positions."""

    def __init__(self, values: Values, every_ms: float) -> None:
        self.values = values
        self.every_ms = every_ms
        self._since: float | None = None
        self._latest = 0.0

    def saw(self, value: Any) -> None:
        at = value.get("at") if type(value) is dict else None
        if type(at) is not float and type(at) is not int:
            return
        self._latest = at
        if self._since is None and "latency_ms" in value:  # a model call's journaled start
            self._since = at - float(value["latency_ms"])

    def before_model_step(self) -> None:
        if self._since is None or self._latest - self._since >= self.every_ms:
            self.send()

    def send(self) -> None:
        self.values.flush()
        self._since = None


class _Started:
    """A step whose journal entry exists; `executed` tells whether its body ran here."""

    def __init__(self, future: Any) -> None:
        self.future = future
        self.executed = False


async def handed_over(handoff: Handoff, nonce: str, name: str) -> Any:
    """What another process handed over of the body `name` (`NOT_HERE` if nothing): best
    effort, so a failure to learn it is a body reported interrupted, never a failed step."""
    try:
        return await handoff.result(nonce, name)
    except Exception:
        log.warning("asking for a tool result handed over failed", exc_info=True)
        return NOT_HERE


class RestateRuntime:
    """A `DurableRuntime` over a Restate context (see `restate_runtime`)."""

    backend = "restate"

    def __init__(self, ctx: RestateContextLike, options: RestateRuntimeOptions) -> None:
        self.ctx = ctx
        self.options = options
        self.promises: RestateCombinators | None = (
            restate if options.promises == "sdk" else options.promises
        )
        self.run_id = str(ctx.request().id)
        self._scope = ""
        self._seed = options.id_seed or str(ctx.uuid())
        self._ids: IdSequence | None = None
        """Made at the first `uuid()`: most scopes (a tool call's) never draw an id."""
        every = options.coalesce
        reanchor = (DEFAULT_REANCHOR_EVERY if every is True else int(every)) if every else None
        self._clock = CoalescedClock(ctx, reanchor)
        self.counters = StepCounters()
        self._run_options = {
            kind: journal_options(given) for kind, given in options.run_options.items()
        }
        self.tracker = options.replay_tracker or ReplayTracker()
        self._checkpoints: _Checkpoints | None = None
        self.stores = self._default_stores()
        self.stores.budget = options.budget

    def _default_stores(self) -> RuntimeStores:
        if self.options.session_store is not None:
            return RuntimeStores(session=self.options.session_store)
        if _has_state(self.ctx):
            # one reader of the state: the event log's tail is read with the session's
            values = Values(self.ctx)  # type: ignore[arg-type]
            self._checkpoints = _Checkpoints(values, self.options.checkpoint_every_ms)
            return RuntimeStores(
                session=restate_session_store(self.ctx, clock=self._clock.now, values=values),  # type: ignore[arg-type]
                tool_state=restate_tool_state_store(self.ctx),  # type: ignore[arg-type]
                events=RestateEventLog(
                    self.ctx,  # type: ignore[arg-type]
                    sink=self.options.live_sink,
                    retain=self.options.events_retain,
                    values=values,
                ),
            )
        return RuntimeStores(session=memory_store(), tool_state=MemoryToolStateStore())

    # Steps --------------------------------------------------------------------------------

    def _start(self, kind: StepKind, name: str, fn: StepFn) -> _Started:
        options = self._run_options.get(kind, DEFAULT_RUN_OPTIONS)
        stopping = self.options.stopping
        # Only live (a step ran live before it): a model step here would run, not replay.
        if kind == "model" and stopping and not self.tracker.is_replaying() and stopping():
            log.info("run %s leaves its stopping worker before its next model step", self.run_id)
            raise WorkerStopping()
        self._clock.step_started()
        if kind == "model" and self._checkpoints is not None:
            self._checkpoints.before_model_step()  # a model takes seconds: stored meanwhile

        async def action() -> Any:
            started.executed = True
            if self.tracker.is_replaying():
                await self.tracker.mark_live()
            return await fn()

        started = _Started(None)
        entry = f"{self._scope}/{name}" if self._scope else name
        started.future = self.ctx.run_typed(entry, action, options)
        return started

    def _finish(self, kind: StepKind, started: _Started, value: Any) -> JSON:
        # Live or replayed, `value` is what the SDK decoded from the journaled bytes, so live
        # callers already get what a replay would.
        if self._checkpoints is not None:
            self._checkpoints.saw(value)
        if started.executed:
            self.counters.live[kind] += 1
            return value
        self.counters.replayed[kind] += 1
        self.tracker.note_replayed()
        return value

    async def step(self, kind: StepKind, name: str, fn: StepFn) -> JSON:
        started = self._start(kind, name, fn)
        return self._finish(kind, started, await started.future)

    async def all(self, calls: Sequence[StepCall]) -> list[JSON]:
        if self.promises is None or len(calls) < 2:
            return [await self.step(c.kind, c.name, c.fn) for c in calls]
        started = [self._start(c.kind, c.name, c.fn) for c in calls]
        await self.promises.gather(*(s.future for s in started))
        return [
            self._finish(call.kind, s, await s.future)
            for call, s in zip(calls, started, strict=True)
        ]

    async def guarded(
        self, intent: str, calls: Sequence[StepCall], interrupted: InterruptedFn
    ) -> list[JSON]:
        # The intent is journaled, and its acknowledgement seen, before any body starts. So a
        # body with no result after a *replayed* intent may have run: a restate-server crash can
        # lose a body's own command along with its result, and an attempt that died after the
        # acknowledgement leaves the same journal as one that suspended before it. Such a body
        # is reported interrupted (a safe call runs again there), unless this process ran the
        # attempt that journaled the intent (`intents`): it then runs the bodies that attempt
        # never started, and journals the result of each one it did start.
        nonce = uuid.uuid4().hex

        async def mark() -> JSON:
            INTENTS.journaling(nonce)  # live only: a replayed intent has its journaled nonce
            return {"calls": [c.name for c in calls], "nonce": nonce}

        marker = self._start("tool", intent, mark)
        try:
            value = await marker.future
        except BaseException:
            # journaled maybe, acknowledged not: no body started
            INTENTS.settle(nonce, unstarted=True)
            raise
        INTENTS.settle(nonce, unstarted=False)
        self._finish("tool", marker, value)
        journaled = _nonce_of(value)
        if marker.executed or await INTENTS.unstarted(journaled):
            bodies = [c._replace(fn=INTENTS.body(journaled, c.name, c.fn)) for c in calls]
        else:
            handoff = self.options.handoff

            def kept(index: int, call: StepCall) -> StepCall:
                async def fn() -> JSON:
                    result = await INTENTS.result(journaled, call.name)
                    if result is NOT_HERE and handoff is not None and journaled is not None:
                        result = await handed_over(handoff, journaled, call.name)
                    return await interrupted(index) if result is NOT_HERE else result

                return call._replace(fn=fn)

            # A body whose result is journaled replays it: `fn` runs only for one without.
            bodies = [kept(i, c) for i, c in enumerate(calls)]
        try:
            values = await self.all(bodies)
        except TerminalError:  # cancelled: the invocation ends here, and so do its bodies
            INTENTS.forget(journaled, cancel=True)
            raise
        except BaseException:
            # The attempt ended before every result was acknowledged; its next may be served
            # by another process, which can only learn them through the handoff.
            if self.options.handoff is not None and journaled is not None:
                self.options.handoff.hand_over(journaled, INTENTS.started(journaled))
            raise
        INTENTS.forget(journaled)
        return values

    # Held writes --------------------------------------------------------------------------

    @contextlib.contextmanager
    def hold_writes(self) -> Iterator[None]:
        # The stores' writes wait in `Values` for a checkpoint: a sleep, a park, the block's end,
        # a model step once `_Checkpoints` says so. Their journal positions are as replay-stable
        # as the steps'.
        values = self._checkpoints.values if self._checkpoints is not None else None
        if values is None or values.holding:  # an in-process sub-agent's run: the outer sends
            yield
            return
        values.hold()
        try:
            yield
        except TerminalError:  # the invocation ends here: what it wrote stays
            values.release()
            raise
        except BaseException:
            # Suspended or failed, the attempt ends and its retry replays to the last checkpoint
            # and writes again. Sent now, the writes would sit in the journal where the retry,
            # if it goes on this time, has its next step: a journal mismatch.
            values.release(send=False)
            raise
        values.release()

    def checkpoint(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.send()

    # Ids, clock, timers -------------------------------------------------------------------

    def uuid(self) -> str:
        if self._ids is None:
            self._ids = IdSequence(self._seed + self._scope)
        return self._ids.next()

    async def now(self) -> float:
        return await self._clock.now()

    async def sleep(self, ms: float, name: str) -> None:
        self._clock.step_started()
        self.checkpoint()
        await self.ctx.sleep(timedelta(milliseconds=max(0.0, ms)), name=name)

    # Replay and control -------------------------------------------------------------------

    def is_control_error(self, error: BaseException) -> bool:
        return is_restate_control_error(error)

    def is_replaying(self) -> bool:
        return self.tracker.is_replaying()

    def on_live(self, callback: LiveCallback) -> None:
        self.tracker.on_live(callback)

    def scope(self, name: str) -> RestateRuntime:
        """Steps under a name prefix with their own id sequence. Restate's journal is one
        sequence per invocation, so scopes must run one after another, never concurrently."""
        # Everything else is the run's, shared: a copy, not a new runtime (one per tool call).
        scoped = object.__new__(type(self))
        scoped.__dict__.update(self.__dict__)
        scoped._scope = f"{self._scope}/{name}"
        scoped._ids = None
        return scoped


def restate_runtime(
    ctx: RestateContextLike, options: RestateRuntimeOptions | None = None, **settings: Any
) -> RestateRuntime:
    """The durable runtime of one Restate invocation. Build it inside the handler, once per
    invocation, and hand it to the agent:

        durable = restate_runtime(ctx, id_seed=f"{ctx.key()}/{ctx.request().id}")
        store = durable.stores.session
        session = await load_session(store, ctx.key()) or await create_session(
            id=ctx.key(), store=store)
        agent = create_agent(provider=provider, tools=tools, durable=durable, session=session)

    Model requests, tool calls and loop decisions become one journal entry each; a replay
    reuses them. Settings are the fields of `RestateRuntimeOptions`, as keywords or an object.
    """
    if options is not None and settings:
        raise TypeError("pass either RestateRuntimeOptions or keyword settings, not both")
    return RestateRuntime(ctx, options or RestateRuntimeOptions(**settings))


def _implements_the_protocol(runtime: RestateRuntime) -> DurableRuntime:
    return runtime  # mypy checks RestateRuntime against DurableRuntime here

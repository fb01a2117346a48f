"""The structural types and option records of the Restate runtime.

Contexts are Protocols over the Python SDK's `restate.Context` / `restate.ObjectContext`, so
tests and other hosts can pass anything of that shape. Combinators are the SDK's module-level
`restate.gather` / `restate.select`: pass the `restate` module itself (the default).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, NotRequired, Protocol, TypedDict, TypeVar

from restate import RunOptions

from ..durable.replay import ReplayDoneHooks, ReplayTracker
from ..session.events import DEFAULT_RETAIN

if TYPE_CHECKING:
    from ..agent.spawn import Subagent
    from ..budget import BudgetLedger
    from ..session.store import Clock, SessionStore
    from ..tools.base import ToolContext, ToolOutput
    from .intents import Handoff

T = TypeVar("T")
Token = TypeVar("Token")
Resumed = TypeVar("Resumed")

RestateRunOptions = RunOptions
"""`ctx.run_typed` options (the SDK's own `restate.RunOptions`)."""


class RestateContextLike(Protocol):
    """The slice of `restate.Context` the runtime uses. `run_typed` journals one side effect
    (a replay returns the journaled value without running it); `time()` is a journaled clock
    read in seconds; `awakeable()` mints a journal-stable id and a future that an outside
    resolver completes (`resolve_awakeable` is the resumer side)."""

    def run_typed(self, name: str, action: Any, options: Any = ..., /) -> Any: ...

    def sleep(self, delta: timedelta, name: str | None = None) -> Any: ...

    def awakeable(self, serde: Any = ..., type_hint: Any = ...) -> tuple[str, Any]: ...

    def resolve_awakeable(self, name: str, value: Any, serde: Any = ...) -> None: ...

    def reject_awakeable(
        self, name: str, failure_message: str, failure_code: int = 500
    ) -> None: ...

    def time(self) -> Any: ...

    def uuid(self) -> Any: ...

    def request(self) -> Any: ...


class RestateObjectContextLike(RestateContextLike, Protocol):
    """`RestateContextLike` plus the keyed state of a virtual object (`restate.ObjectContext`).
    `get` resolves to None for a missing key; `set` and `clear` are journaled by the SDK."""

    def key(self) -> str: ...

    def get(self, name: str, serde: Any = ..., type_hint: Any = ...) -> Awaitable[Any]: ...

    def set(self, name: str, value: Any, serde: Any = ...) -> None: ...

    def clear(self, name: str) -> None: ...

    def state_keys(self) -> Awaitable[list[str]]: ...


class RestatePromiseRaceLike(Protocol):
    """The SDK's race combinator (`restate.select`): resolves to `[key, value]` of the first
    of the keyword futures to settle."""

    async def select(self, **futures: Any) -> list[Any]: ...


class RestateCombinators(RestatePromiseRaceLike, Protocol):
    """The SDK combinators the runtime uses: `gather` (wait for all) and `select` (race).
    The `restate` module satisfies it."""

    async def gather(self, *futures: Any) -> list[Any]: ...


AwakeableToolCombinators = RestateCombinators
"""The combinators `restate_awakeable_tool` uses (the same pair)."""


@dataclass(frozen=True)
class RestateAwakeable(Generic[T]):
    """An awakeable: its journal-stable `id` (send it to whoever resolves it) and the
    `promise` that settles when it is resolved or rejected."""

    id: str
    promise: Awaitable[T]


@dataclass(frozen=True)
class AwakeableOutcome(Generic[T]):
    """How a park with a deadline ended: the resumer's `value`, or `timed_out`."""

    timed_out: bool
    value: T | None = None


@dataclass(frozen=True)
class AwakeableWithTimeoutOptions:
    """Options of `awakeable_with_timeout` and `race_with_timeout`. `timeout_ms` unset or not
    positive means no deadline; a deadline is a durable `ctx.sleep` raced through `promises`."""

    timeout_ms: float | None = None
    promises: RestatePromiseRaceLike | None = None


@dataclass(frozen=True)
class ReplayTrackerOptions:
    """Options of `create_replay_tracker`: the agent `hooks` to fire `replay:done` on, and
    whether this invocation `resuming` a prior journal (the host knows; the tracker cannot)."""

    hooks: ReplayDoneHooks | None = None
    resuming: bool = False


StepKindName = Literal["model", "tool", "decision", "sleep", "state", "clock"]


@dataclass
class RestateRuntimeOptions:
    """Options of `restate_runtime`.

    - `promises`: combinators (default: the SDK's). With them, concurrent steps start
      together and park once; set to None to run steps one at a time.
    - `id_seed`: entropy of `uuid()`; pass a per-invocation stable value (the object key with
      the invocation id: the key alone repeats across the runs of one session).
      Default: one `ctx.uuid()` draw at construction. Ids are hashed from `(id_seed, counter)`,
      never drawn from the context per call.
    - `coalesce`: `True` (every 8) or a number: journal a `ctx.time()` anchor every so many
      `now()` calls and derive a monotonic sequence in between. Default: every read journaled.
    - `replay_tracker`: shared with `restate_tool` / `restate_wait_background`.
    - `resolve_awakeable`: resolves another invocation's awakeable (default: the context's).
    - `run_options`: `RunOptions` by step kind. Default `max_attempts=1`: a failure is recorded
      as the step's outcome instead of being retried blindly.
    - `session_store`: default `restate_session_store(ctx)` on an object context, else memory.
    - `live_sink`: where the session's live events go (model text, a tool call started); the
      durable ones are kept in the object's state (`tether.restate.events`).
    - `events_retain`: durable events kept per session there (`spec.events.retain`); past it
      the oldest batches are cleared.
    - `budget`: the ledger budgeted runs and their children reserve model calls from
      (`tether.restate.budget.RestateLedger`); none: each run checks its own budget alone.
    - `checkpoint_every_ms`: a run holds its state writes (its session's turns and run record,
      its durable events) and sends them before a model call once the steps journaled since
      they were last sent span this long (their journaled times); 0: before every model call.
      A wait (a park, a sleep, a spawn's children) and the run's end always send them.
    - `handoff`: carries unsafe tool bodies' results between processes (`intents.Handoff`):
      when a run's next attempt lands on another worker replica than the one that ran them,
      they are journaled instead of reported interrupted. None: only within a process.
    - `stopping`: true once the process is stopping (the worker's SIGTERM: a scale-down, a
      node drain). A run that has gone live then ends its attempt before its next model step
      (`errors.WorkerStopping`, which Restate retries at once, elsewhere): the turn in flight,
      its model call and tool calls, ends here; none is cut off by the end of the grace
      period and run, or paid for, again.
    """

    promises: RestateCombinators | Literal["sdk"] | None = "sdk"
    id_seed: str | None = None
    coalesce: bool | int = False
    replay_tracker: ReplayTracker | None = None
    resolve_awakeable: Callable[[str, Any], Awaitable[None] | None] | None = None
    run_options: Mapping[str, RunOptions[Any]] = field(default_factory=dict)
    session_store: SessionStore | None = None
    live_sink: Callable[[str, int, Any], None] | None = None
    events_retain: int = DEFAULT_RETAIN
    budget: BudgetLedger | None = None
    checkpoint_every_ms: float = 500.0
    handoff: Handoff | None = None
    stopping: Callable[[], bool] | None = None


@dataclass
class RestateSessionStoreOptions:
    """Options of `restate_session_store`: a replay-stable `clock` for the timestamps the store
    stamps (default: `ctx.time()`), and `read_only` for a shared handler's context."""

    clock: Clock | None = None
    read_only: bool = False


@dataclass
class RestateToolStateStoreOptions:
    """Options of `restate_tool_state_store`: the state `key` (default `DEFAULT_TOOL_STATE_KEY`)
    and the per-value budget (64 KiB, far below Restate's message limit on purpose: an
    oversized value fails the invocation with RT0003 and becomes a poison pill)."""

    key: str | None = None
    max_value_bytes: int = 64 * 1024


@dataclass
class RestateDurableWait(Generic[Token, Resumed]):
    """Awakeable-based completion wait of a two-phase tool: `register` hands the awakeable id
    to the host as the resumer of `token` (journaled), the call parks outside the journal
    (optionally raced against a durable `timeout_ms`), and `result` shapes the tool result from
    the payload (None on timeout) in a final journaled step. `inline(token, input, ctx)` true
    skips the park."""

    register: Callable[[Token, str, dict[str, Any], ToolContext], Awaitable[None] | None]
    result: Callable[[Token, Resumed | None, dict[str, Any], ToolContext], Awaitable[ToolOutput]]
    timeout_ms: float | Callable[[dict[str, Any], ToolContext], float | None] | None = None
    inline: Callable[[Token, dict[str, Any], ToolContext], bool] | None = None
    promises: RestatePromiseRaceLike | None = None


@dataclass
class RestateDurableStart(Generic[Token, Resumed]):
    """Two-phase journaling for long, re-attachable tools: `start` (journaled before the body)
    kicks the work off and returns a re-attach token; then `wait` (awakeable park) or `attach`
    (one journaled step holding a short, bounded wait) produces the result. A replay gets the
    same token and re-attaches instead of starting again. `on_abort(token, ...)` cleans up a
    job nobody will wait for (Restate cancellation while parked, journaled once)."""

    start: Callable[[dict[str, Any], ToolContext], Awaitable[Token]]
    attach: Callable[[Token, dict[str, Any], ToolContext], Awaitable[ToolOutput]] | None = None
    wait: RestateDurableWait[Token, Resumed] | None = None
    on_abort: Callable[[Token, dict[str, Any], ToolContext], Awaitable[None] | None] | None = None


@dataclass
class RestateToolOptions(Generic[Token, Resumed]):
    """Options of `restate_tool`: `run_options` (default `max_attempts=1`), `entry_name(seq,
    name, input, call_id)` for the journal entry, `soft_errors` (a tool's ordinary exception
    becomes an error result instead of a terminal failure; default on), `durable_start`, and
    the `replay_tracker` to mark live from inside the journaled closures."""

    run_options: RunOptions[Any] | None = None
    entry_name: Callable[[int, str, dict[str, Any], str | None], str] | None = None
    soft_errors: bool = True
    durable_start: RestateDurableStart[Token, Resumed] | None = None
    replay_tracker: ReplayTracker | None = None


@dataclass
class RestateAwakeableToolOptions(Generic[T]):
    """Options of `restate_awakeable_tool`: the tool's `name`, `description`, `input_schema`;
    `notify(awakeable_id, input, ctx)` publishes the id out of band inside one journaled step
    (exactly once across replays); `timeout_ms` races the park against a durable sleep;
    `to_result(value, input)` shapes the resumer's payload (default: strings as they are,
    anything else as JSON)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    notify: Callable[[str, dict[str, Any], ToolContext], Awaitable[None] | None]
    timeout_ms: float | None = None
    to_result: Callable[[T, dict[str, Any]], ToolOutput] | None = None
    promises: AwakeableToolCombinators | None = None
    run_options: RunOptions[Any] | None = None
    is_concurrency_safe: bool = False


class ChildRunRequest(TypedDict):
    """What a parent hands a child invocation."""

    task: str
    depth: int
    """The child's sub-agent depth (parent + 1); the child's handler refuses runaway depth."""
    label: str
    """Session-scoped label the parent reserved (`child-1`, `child-2`, ...)."""
    model: NotRequired[str]
    parent_call_id: NotRequired[str]
    parent_run_id: NotRequired[str]
    session_id: NotRequired[str]
    subagent_type: NotRequired[str]
    traceparent: NotRequired[str]
    """The W3C trace context of the spawn call, so the child's spans join the parent's trace."""
    budget_tree: NotRequired[str]
    """The budget the parent reserves from (`tether.budget`): the child reserves there too."""
    allowed_tools: NotRequired[list[str]]
    """The most the child may have: its spawner's tools, when that was a named sub-agent or
    under one (a sub-agent never gets a tool its spawner lacks)."""


ChildStatus = Literal["completed", "error", "aborted", "timeout"]


class MergedChild(TypedDict):
    """A descendant a child already merged, handed up so the top-level parent can rebuild the
    whole subtree (a child dispatched to a service has no session of its own to write to)."""

    label: str
    task: str
    depth: int
    status: ChildStatus
    stats: dict[str, Any]
    turns: list[dict[str, Any]]
    children: NotRequired[list[MergedChild]]
    started_at: NotRequired[float]
    ended_at: NotRequired[float]


class ChildRunResult(TypedDict):
    """What a child invocation returns."""

    status: ChildStatus
    text: str
    stats: dict[str, Any]
    """`AgentStats.to_json()` of the child run, its own descendants included."""
    turns: list[dict[str, Any]]
    """`SessionTurn.to_json()` of the child's turns, in order."""
    children: NotRequired[list[MergedChild]]
    error: NotRequired[str]
    started_at: NotRequired[float]
    ended_at: NotRequired[float]


class InFlightChild(TypedDict):
    """A child that was dispatched and has not settled yet."""

    label: str
    task: str
    depth: int


@dataclass
class RestateSpawnToolOptions:
    """Options of `restate_spawn_tool`. `dispatch(request, ctx)` starts the child invocation
    and returns the SDK's call future untouched (for example `ctx.object_call(run_child, key,
    request)`); the tool awaits it. `persist` merges the child's turns and run record into the
    parent's session (default on). `on_abort(in_flight, ctx)` stops children when the parent
    aborts (cancel the parent's own invocation to cancel the whole tree); `on_child_merged`
    collects merged subtrees for a sessionless child to hand up. `max_concurrent` caps the
    children of one call that run at once: they start in waves of that many (default: all)."""

    dispatch: Callable[[ChildRunRequest, ToolContext], Any]
    name: str = "spawn"
    description: str | None = None
    persist: bool = True
    on_abort: Callable[[list[InFlightChild], ToolContext], Awaitable[None] | None] | None = None
    on_child_merged: Callable[[MergedChild, ToolContext], None] | None = None
    max_depth: int = 2
    max_concurrent: int | None = None
    agents: Sequence[Subagent] = ()
    """The named sub-agents a call may choose (`agent`); the request's `subagent_type` names
    the chosen one, which the child's handler builds."""


@dataclass
class RestateWaitBackgroundOptions:
    """Options of `restate_wait_background`: `register(awakeable_id, task_id, handle)` persists
    the resumer before `probe(handle, task_id)` snapshots the host's tasks (both journaled);
    `settle` finalises the resumer once the wait ends; `timeout_ms` is the default deadline."""

    ctx: RestateContextLike
    register: Callable[[str, str, Any], Awaitable[None] | None]
    probe: Callable[[Any, str], Awaitable[list[dict[str, Any]]] | list[dict[str, Any]]]
    settle: Callable[[str, str, Any, Any], Awaitable[None] | None] | None = None
    timeout_ms: float | None = None
    promises: RestatePromiseRaceLike | None = None
    entry_prefix: str = "wait-background"
    run_options: RunOptions[Any] | None = None
    replay_tracker: ReplayTracker | None = None

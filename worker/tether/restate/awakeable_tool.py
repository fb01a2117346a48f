"""`restate_awakeable_tool`: a tool call that parks on a Restate awakeable.

Replay contract (shared with `restate_tool`'s `durable_start.wait` and
`restate_wait_background`):

- the awakeable is minted before the journaled step that publishes its id, so a replay mints
  the same id at the same journal position and re-parks on it without publishing it again;
- the publishing step journals the id it published; a replay that mints a different id (the
  journal drifted) raises `AwakeableDriftError` instead of parking on an id nobody resolves;
- the park (`await` on the awakeable, optionally raced against a durable `ctx.sleep`) happens
  outside any `ctx.run_typed`, so the invocation suspends instead of holding a worker.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import restate
from restate.exceptions import TerminalError
from restate.serde import Serde

from ..durable.errors import DurableControlError
from ..durable.replay import ReplayTracker
from ..tools.base import ToolContext, ToolDef, ToolError, ToolOutput, ToolSpec
from .awakeable import race_with_timeout
from .errors import is_restate_cancellation
from .runtime import RestateRuntime, journal_options
from .types import (
    AwakeableOutcome,
    AwakeableWithTimeoutOptions,
    RestateAwakeableToolOptions,
    RestateContextLike,
    RestatePromiseRaceLike,
)

T = TypeVar("T")


class AwakeableDriftError(DurableControlError):
    """A replay minted a different awakeable id than the one its journaled step published: the
    code or the journal changed under the invocation. Parking would wait for an id nobody will
    ever resolve, so the attempt fails instead (Restate retries it; fix the deployment)."""

    def __init__(self, entry: str, published: object, minted: str) -> None:
        super().__init__(
            f"journal drift at {entry!r}: the journal published awakeable {published!r} but "
            f"this replay minted {minted!r}; the handler's code changed while the invocation "
            "was parked. Finish it with the deployment that started it."
        )
        self.entry = entry
        self.published = published
        self.minted = minted


class PayloadSerde(Serde[Any]):
    """How a resumer's payload is read: JSON when it parses (the ingress passes the request body
    through), else the body as UTF-8 text. A resumer that posts `approved` instead of
    `"approved"` must not turn the awakeable into a value that fails every replay."""

    def deserialize(self, buf: bytes) -> Any:
        if not buf:
            return None
        try:
            return json.loads(buf)
        except ValueError:
            return buf.decode("utf-8", errors="replace")

    def serialize(self, obj: Any) -> bytes:
        return b"" if obj is None else json.dumps(obj).encode()


PAYLOAD_SERDE = PayloadSerde()
"""The serde every awakeable of these tools is minted with."""


async def maybe_await(value: Awaitable[T] | T) -> T:
    """`value`, awaited when a callback returned an awaitable (callbacks may be sync)."""
    if inspect.isawaitable(value):
        return await value
    return value


async def mark_live(tracker: ReplayTracker | None) -> None:
    """Tell the invocation's replay tracker that a journaled body is running live."""
    if tracker is not None:
        await tracker.mark_live()


def runtime_tracker(tool_ctx: ToolContext) -> ReplayTracker | None:
    """The replay tracker of the tool's runtime when it is a `RestateRuntime`."""
    durable = tool_ctx.durable
    return durable.tracker if isinstance(durable, RestateRuntime) else None


def context_of(tool_ctx: ToolContext, given: RestateContextLike | None) -> RestateContextLike:
    """The Restate context a self-journaled tool binds to: the one it was built with, else the
    one behind the tool's `restate_runtime`."""
    if given is not None:
        return given
    durable = tool_ctx.durable
    if isinstance(durable, RestateRuntime):
        return durable.ctx
    raise TypeError(
        f"tool {tool_ctx.tool_name!r} needs a Restate context: run the agent on "
        "restate_runtime(ctx) or pass ctx= when building the tool"
    )


def check_published(entry: str, published: object, minted: str) -> None:
    """Raise `AwakeableDriftError` unless the journaled step published `minted`."""
    if published != minted:
        raise AwakeableDriftError(entry, published, minted)


async def park(
    ctx: RestateContextLike,
    promise: Any,
    timeout_ms: float | None,
    promises: RestatePromiseRaceLike | None,
) -> AwakeableOutcome[Any]:
    """Await an awakeable outside any journaled step, raced against a durable sleep when
    `timeout_ms` is positive (the SDK's `select` unless `promises` is given)."""
    race = AwakeableWithTimeoutOptions(timeout_ms=timeout_ms, promises=promises or restate)
    return await race_with_timeout(ctx, promise, race)


def rejection_message(error: TerminalError) -> str:
    """The resumer's reason for a rejected awakeable."""
    return error.message or str(error) or f"status {error.status_code}"


def default_to_result(value: Any, arguments: dict[str, Any]) -> ToolOutput:
    """Strings pass through; anything else becomes JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def restate_awakeable_tool(
    options: RestateAwakeableToolOptions[Any], *, ctx: RestateContextLike | None = None
) -> ToolDef:
    """A tool that parks on a Restate awakeable until an outside resumer resolves it.

    Per call: mint an awakeable, publish its id with `options.notify(awakeable_id, input,
    tool_ctx)` inside one journaled `ctx.run_typed` entry (exactly once across replays), then
    park on it outside any journaled entry, so the invocation suspends. With `timeout_ms` the
    park is a durable race against `ctx.sleep`. The resumer's payload becomes the tool result
    through `to_result` (default: strings as they are, anything else as JSON).

    A rejection (`POST /restate/awakeables/{id}/reject`, `ctx.reject_awakeable`) and a timeout
    become error results the model sees; the run goes on. A Restate cancellation and the other
    control errors propagate unchanged.

    `ctx` is the handler's Restate context; by default the one behind the agent's
    `restate_runtime` (the tool context's runtime). The tool is self-journaled: the loop does
    not wrap it in a step, and it must not be wrapped in `restate_tool` either (a park inside a
    journaled closure could never suspend).
    """
    to_result: Callable[[Any, dict[str, Any]], ToolOutput] = options.to_result or default_to_result
    run_options = journal_options(options.run_options)

    async def execute(arguments: dict[str, Any], tool_ctx: ToolContext) -> ToolOutput:
        restate_ctx = context_of(tool_ctx, ctx)
        tracker = runtime_tracker(tool_ctx)
        entry = f"{options.name}-notify:{tool_ctx.call_id}"
        awakeable_id, promise = restate_ctx.awakeable(serde=PAYLOAD_SERDE)

        async def notify() -> str:
            await mark_live(tracker)
            await maybe_await(options.notify(awakeable_id, arguments, tool_ctx))
            return awakeable_id

        published = await restate_ctx.run_typed(entry, notify, run_options)
        check_published(entry, published, awakeable_id)
        tool_ctx.durable.checkpoint()
        try:
            outcome = await park(restate_ctx, promise, options.timeout_ms, options.promises)
        except TerminalError as error:
            if is_restate_cancellation(error):
                raise
            raise ToolError(f"rejected: {rejection_message(error)}") from None
        if outcome.timed_out:
            raise ToolError(f"no answer within {options.timeout_ms:g} ms; the wait timed out")
        return to_result(outcome.value, arguments)

    return ToolDef(
        spec=ToolSpec(
            name=options.name,
            description=options.description,
            input_schema=options.input_schema,
        ),
        execute=execute,
        is_concurrency_safe=options.is_concurrency_safe,
        self_journaled=True,
    )

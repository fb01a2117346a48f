"""`restate_tool`: one tool whose calls journal themselves in a Restate invocation.

For agents that do not run on `restate_runtime` (whose own steps already journal every tool
call), and for tools that need the two-phase `durable_start` shape on any runtime. The wrapped
tool is self-journaled, so the loop never wraps it in a step of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from restate import RunOptions
from restate.exceptions import TerminalError

from ..durable.replay import ReplayTracker
from ..tools.base import ToolContext, ToolDef, ToolError, ToolOutput
from .awakeable_tool import (
    PAYLOAD_SERDE,
    check_published,
    mark_live,
    maybe_await,
    park,
    rejection_message,
)
from .errors import is_restate_cancellation, is_restate_control_error
from .runtime import journal_options
from .types import RestateContextLike, RestateDurableStart, RestateDurableWait, RestateToolOptions

log = logging.getLogger("tether.restate.tool")

SOFT_ERROR = "__tether_soft_error__"
"""Key of the journaled sentinel that records a tool's ordinary exception as its outcome."""


def soft_error_text(error: Exception) -> str:
    """What the model reads for a softened error: the same text the loop shows live."""
    return str(error) if isinstance(error, ToolError) else f"{type(error).__name__}: {error}"


class JournaledCall:
    """One call of a wrapped tool: its journal entry name and how its phases are journaled."""

    def __init__(
        self,
        ctx: RestateContextLike,
        entry: str,
        run_options: RunOptions[Any],
        tracker: ReplayTracker | None,
        soft_errors: bool,
    ) -> None:
        self.ctx = ctx
        self.entry = entry
        self.run_options = run_options
        self.tracker = tracker
        self.soft_errors = soft_errors

    async def run(self, name: str, body: Callable[[], Awaitable[Any]]) -> Any:
        """`body()` in one `ctx.run_typed` entry. With soft errors, an ordinary exception is
        journaled as a sentinel and raised here as a `ToolError` (an error result for the
        model); control errors, and every error without soft errors, escape the entry."""

        async def action() -> dict[str, Any]:
            await mark_live(self.tracker)
            try:
                return {"value": await body()}
            except Exception as error:
                if not self.soft_errors or is_restate_control_error(error):
                    raise
                return {SOFT_ERROR: soft_error_text(error)}

        recorded: dict[str, Any] = await self.ctx.run_typed(name, action, self.run_options)
        if SOFT_ERROR in recorded:
            raise ToolError(recorded[SOFT_ERROR])
        return recorded["value"]

    async def run_abort(self, cleanup: Callable[[], Awaitable[None] | None]) -> None:
        """The cleanup of a cancelled call, journaled once as `<entry>-abort`. Its failures are
        logged, never raised: they must not mask the cancellation being handled."""

        async def action() -> bool:
            await mark_live(self.tracker)
            try:
                await maybe_await(cleanup())
            except Exception:
                log.exception("on_abort of %s failed", self.entry)
            return True

        try:
            await self.ctx.run_typed(f"{self.entry}-abort", action, self.run_options)
        except TerminalError:
            log.exception("the journaled on_abort of %s did not complete", self.entry)


async def best_effort_abort(
    start: RestateDurableStart[Any, Any], token: Any, arguments: dict[str, Any], ctx: ToolContext
) -> None:
    """`on_abort` for the run's own abort signal: outside the journal, errors logged."""
    if start.on_abort is None or not ctx.signal.is_set():
        return
    try:
        await maybe_await(start.on_abort(token, arguments, ctx))
    except Exception:
        log.exception("on_abort of tool call %s failed", ctx.call_id)


def wait_timeout(
    wait: RestateDurableWait[Any, Any], arguments: dict[str, Any], ctx: ToolContext
) -> float | None:
    """The park deadline of this call (`timeout_ms` may be a function of the input)."""
    timeout = wait.timeout_ms
    return timeout(arguments, ctx) if callable(timeout) else timeout


async def attach_phase(
    call: JournaledCall,
    start: RestateDurableStart[Any, Any],
    token: Any,
    arguments: dict[str, Any],
    ctx: ToolContext,
) -> ToolOutput:
    """Re-attach to the started work inside one journaled entry (short, bounded waits)."""
    attach = start.attach
    assert attach is not None
    try:
        output: ToolOutput = await call.run(
            f"{call.entry}-attach", lambda: attach(token, arguments, ctx)
        )
        return output
    except asyncio.CancelledError:
        await best_effort_abort(start, token, arguments, ctx)
        raise


async def wait_phase(
    call: JournaledCall,
    start: RestateDurableStart[Any, Any],
    wait: RestateDurableWait[Any, Any],
    token: Any,
    arguments: dict[str, Any],
    ctx: ToolContext,
) -> ToolOutput:
    """Register an awakeable as the work's resumer (journaled), park on it outside the journal
    (raced against a durable timeout), then shape the result in a final journaled entry."""
    if wait.inline is not None and wait.inline(token, arguments, ctx):
        return await result_phase(call, wait, token, None, arguments, ctx)
    awakeable_id, promise = call.ctx.awakeable(serde=PAYLOAD_SERDE)

    async def register() -> str:
        await maybe_await(wait.register(token, awakeable_id, arguments, ctx))
        return awakeable_id

    entry = f"{call.entry}-register"
    check_published(entry, await call.run(entry, register), awakeable_id)
    timeout = wait_timeout(wait, arguments, ctx)
    ctx.durable.checkpoint()
    try:
        outcome = await park(call.ctx, promise, timeout, wait.promises)
    except TerminalError as error:
        if not is_restate_cancellation(error):
            raise ToolError(f"rejected: {rejection_message(error)}") from None
        if start.on_abort is not None:
            on_abort = start.on_abort
            await call.run_abort(lambda: on_abort(token, arguments, ctx))
        raise
    except asyncio.CancelledError:
        await best_effort_abort(start, token, arguments, ctx)
        raise
    resumed = None if outcome.timed_out else outcome.value
    return await result_phase(call, wait, token, resumed, arguments, ctx)


async def result_phase(
    call: JournaledCall,
    wait: RestateDurableWait[Any, Any],
    token: Any,
    resumed: Any,
    arguments: dict[str, Any],
    ctx: ToolContext,
) -> ToolOutput:
    """The tool result from the resumer's payload (None: timed out or inline), journaled."""
    output: ToolOutput = await call.run(
        f"{call.entry}-result", lambda: wait.result(token, resumed, arguments, ctx)
    )
    return output


async def two_phase(
    call: JournaledCall,
    start: RestateDurableStart[Any, Any],
    arguments: dict[str, Any],
    ctx: ToolContext,
) -> ToolOutput:
    """`start` journaled before anything else; a replay gets its token back and re-attaches
    (or re-parks) instead of starting the work again."""
    token = await call.run(f"{call.entry}-start", lambda: start.start(arguments, ctx))
    if start.wait is not None:
        return await wait_phase(call, start, start.wait, token, arguments, ctx)
    return await attach_phase(call, start, token, arguments, ctx)


def restate_tool(
    inner: ToolDef,
    ctx: RestateContextLike,
    options: RestateToolOptions[Any, Any] | None = None,
) -> ToolDef:
    """Wrap `inner` so each call journals itself in `ctx` (a handler's Restate context).

    Single phase (the default): `inner.execute` runs inside one `ctx.run_typed` entry named
    `tool-<name>-<seq>` (`<seq>` counts this wrapper's calls; `options.entry_name(seq, name,
    input, call_id)` overrides it, e.g. to key on the call id). A replay returns the journaled
    result; a crash mid-body runs the body again. With `soft_errors` (default), an ordinary
    exception is journaled as a sentinel and re-raised outside the entry as a `ToolError`, so
    the loop gives the model an error result and goes on; Restate control errors are never
    softened. Default `run_options`: one attempt.

    Two phase (`options.durable_start`): `start` runs in its own entry (`<entry>-start`) and
    returns a re-attach token; then `wait` (awakeable park: `<entry>-register`, the park
    outside the journal with an optional durable timeout race, `<entry>-result`; `inline`
    skips the park) or else `attach` (one `<entry>-attach` entry) produces the result. A replay
    gets the same token and never starts the work twice. A Restate cancellation while parked
    runs `on_abort(token, ...)` in a journaled `<entry>-abort` entry, then propagates; the
    run's own abort signal calls it outside the journal, best effort. Soft errors apply to
    every phase.

    The ToolContext given to `inner` (and to the phases) must not be used for durable calls
    inside a journaled body. `options.replay_tracker` is marked live from inside the journaled
    bodies. The result is self-journaled, so the loop does not wrap it again; do not use it on
    top of `restate_runtime`'s own wrapping of the same tool.
    """
    options = options or RestateToolOptions()
    durable_start = options.durable_start
    if durable_start is not None and durable_start.wait is None and durable_start.attach is None:
        raise ValueError(f"durable_start of tool {inner.name!r} needs `wait` or `attach`")
    run_options = journal_options(options.run_options)
    sequence = itertools.count(1)

    def entry_for(arguments: dict[str, Any], tool_ctx: ToolContext) -> str:
        seq = next(sequence)
        if options.entry_name is not None:
            return options.entry_name(seq, inner.name, arguments, tool_ctx.call_id)
        return f"tool-{inner.name}-{seq}"

    async def execute(arguments: dict[str, Any], tool_ctx: ToolContext) -> ToolOutput:
        call = JournaledCall(
            ctx,
            entry_for(arguments, tool_ctx),
            run_options,
            options.replay_tracker,
            options.soft_errors,
        )
        if durable_start is not None:
            return await two_phase(call, durable_start, arguments, tool_ctx)
        output: ToolOutput = await call.run(call.entry, lambda: inner.execute(arguments, tool_ctx))
        return output

    return ToolDef(
        spec=inner.spec,
        execute=execute,
        is_concurrency_safe=inner.is_concurrency_safe,
        replay=inner.replay,
        self_journaled=True,
    )

"""The Restate runtime: model calls, tool calls and loop decisions journaled in a Restate
invocation, sessions in a virtual object's state, awakeable waits that suspend.

    durable = restate_runtime(ctx, id_seed=f"{ctx.key()}/{ctx.request().id}")
    store = durable.stores.session
    session = await load_session(store, ctx.key()) or await create_session(
        id=ctx.key(), store=store)
    agent = create_agent(provider=anthropic(), durable=durable, session=session)
"""

from .._optional import extra_imports

with extra_imports("tether.restate", "restate", "restate"):
    from ..durable.ids import deterministic_uuid
    from ..durable.replay import ReplayDoneHooks, ReplayTracker
    from .awakeable import awakeable_with_timeout, race_with_timeout
    from .awakeable_tool import AwakeableDriftError, restate_awakeable_tool
    from .child import run_child
    from .child_results import MERGED_CHILDREN_EXTRA
    from .errors import is_restate_cancellation, is_restate_control_error, restate_control_error
    from .replay import create_replay_tracker, replay_aware_abort
    from .runtime import RestateRuntime, restate_runtime
    from .session import RestateSessionStore, restate_session_store
    from .spawn import restate_spawn_tool
    from .tool import restate_tool
    from .tool_state import DEFAULT_TOOL_STATE_KEY, RestateToolStateStore, restate_tool_state_store
    from .types import (
        AwakeableOutcome,
        AwakeableToolCombinators,
        AwakeableWithTimeoutOptions,
        ChildRunRequest,
        ChildRunResult,
        InFlightChild,
        MergedChild,
        ReplayTrackerOptions,
        RestateAwakeable,
        RestateAwakeableToolOptions,
        RestateCombinators,
        RestateContextLike,
        RestateDurableStart,
        RestateDurableWait,
        RestateObjectContextLike,
        RestatePromiseRaceLike,
        RestateRunOptions,
        RestateRuntimeOptions,
        RestateSessionStoreOptions,
        RestateSpawnToolOptions,
        RestateToolOptions,
        RestateToolStateStoreOptions,
        RestateWaitBackgroundOptions,
    )
    from .wait_background import WaitBackground, restate_wait_background

__all__ = [
    "DEFAULT_TOOL_STATE_KEY",
    "MERGED_CHILDREN_EXTRA",
    "AwakeableDriftError",
    "AwakeableOutcome",
    "AwakeableToolCombinators",
    "AwakeableWithTimeoutOptions",
    "ChildRunRequest",
    "ChildRunResult",
    "InFlightChild",
    "MergedChild",
    "ReplayDoneHooks",
    "ReplayTracker",
    "ReplayTrackerOptions",
    "RestateAwakeable",
    "RestateAwakeableToolOptions",
    "RestateCombinators",
    "RestateContextLike",
    "RestateDurableStart",
    "RestateDurableWait",
    "RestateObjectContextLike",
    "RestatePromiseRaceLike",
    "RestateRunOptions",
    "RestateRuntime",
    "RestateRuntimeOptions",
    "RestateSessionStore",
    "RestateSessionStoreOptions",
    "RestateSpawnToolOptions",
    "RestateToolOptions",
    "RestateToolStateStore",
    "RestateToolStateStoreOptions",
    "RestateWaitBackgroundOptions",
    "WaitBackground",
    "awakeable_with_timeout",
    "create_replay_tracker",
    "deterministic_uuid",
    "is_restate_cancellation",
    "is_restate_control_error",
    "race_with_timeout",
    "replay_aware_abort",
    "restate_awakeable_tool",
    "restate_control_error",
    "restate_runtime",
    "restate_session_store",
    "restate_spawn_tool",
    "restate_tool",
    "restate_tool_state_store",
    "restate_wait_background",
    "run_child",
]

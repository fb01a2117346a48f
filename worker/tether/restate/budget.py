"""The budget ledger on Restate: a virtual object keyed by the root run, shared by its children.

Sub-agents run as separate invocations, often at once, so the one place their spending meets
is the object `<agent>-budget/<root run>`: its exclusive `reserve` and `settle` handlers take
one call at a time, so no two siblings can both take the last of a budget. A run reserves with
a journaled call (a replay gets the journaled answer and never reserves again) and settles with
a journaled one-way send (never twice either). The root run asks Restate to clear the ledger a
day after it ended (`forget`); `status` reads it until then. Only runs change a ledger: its
writing handlers are private to Restate (no ingress request reaches them).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import restate

from ..budget import LedgerState, Limits, Spend

STATE_KEY = "ledger"
KEEP_AFTER_RUN = timedelta(days=1)
"""How long a root run's ledger stays readable after the run ended."""

BudgetObserver = Callable[[str, str, Spend], None]
"""Told what the ledger did to a call: ("held", key, ask), ("released", key, hold), ("spent",
key, actual), ("denied", key, ask). For metrics; called when the handler runs."""


def budget_object(
    agent: str, observe: BudgetObserver | None = None
) -> tuple[restate.VirtualObject, Callable[[Any], RestateLedger]]:
    """`<agent>-budget` and a factory of the `RestateLedger` that a run's context reserves with."""
    obj = restate.VirtualObject(
        f"{agent}-budget",
        description=f"The budgets of the {agent} agent's runs and their sub-agents, by root run.",
    )
    tell = observe or (lambda what, key, amount: None)

    @obj.handler(ingress_private=True)
    async def reserve(ctx: restate.ObjectContext, request: dict[str, Any]) -> bool:
        state = LedgerState.of(await ctx.get(STATE_KEY))
        key, ask = str(request["key"]), Spend.of(request["ask"])
        had_limits, was_held = state.limits, key in state.held
        granted = state.reserve(key, ask, Limits.of(request.get("limits")))
        newly_held = key in state.held and not was_held
        if newly_held or state.limits != had_limits:
            ctx.set(STATE_KEY, state.to_json())
        if newly_held:
            tell("held", key, ask)
        elif not granted:
            tell("denied", key, ask)
        return granted

    @obj.handler(ingress_private=True)
    async def settle(ctx: restate.ObjectContext, request: dict[str, Any]) -> None:
        state = LedgerState.of(await ctx.get(STATE_KEY))
        key, actual = str(request["key"]), Spend.of(request["actual"])
        hold = state.held.get(key)
        state.settle(key, actual)
        ctx.set(STATE_KEY, state.to_json())
        if hold is not None:
            tell("released", key, hold)
        tell("spent", key, actual)

    @obj.handler(ingress_private=True)
    async def forget(ctx: restate.ObjectContext) -> None:
        ctx.clear(STATE_KEY)

    @obj.handler(kind="shared")
    async def status(ctx: restate.ObjectSharedContext) -> dict[str, Any]:
        """The budget, what was spent and what calls in flight hold."""
        state = LedgerState.of(await ctx.get(STATE_KEY))
        return {**state.to_json(), "holding": state.holding().to_json()}

    def ledger(ctx: Any) -> RestateLedger:
        return RestateLedger(ctx, reserve, settle, forget)

    return obj, ledger


class RestateLedger:
    """A `BudgetLedger` for one invocation: calls to `<agent>-budget` through its context."""

    def __init__(self, ctx: Any, reserve: Any, settle: Any, forget: Any) -> None:
        self._ctx = ctx
        self._reserve, self._settle, self._forget = reserve, settle, forget

    async def reserve(self, tree: str, key: str, ask: Spend, limits: Limits | None) -> bool:
        request: dict[str, Any] = {"key": key, "ask": ask.to_json()}
        if limits:
            request["limits"] = limits.to_json()
        return bool(await self._ctx.object_call(self._reserve, key=tree, arg=request))

    async def settle(self, tree: str, key: str, actual: Spend) -> None:
        arg = {"key": key, "actual": actual.to_json()}
        self._ctx.object_send(self._settle, key=tree, arg=arg)

    async def close(self, tree: str) -> None:
        self._ctx.object_send(self._forget, key=tree, arg=None, send_delay=KEEP_AFTER_RUN)

"""One budget for a run and all its sub-agents: a ledger that reserves before each model call.

A run with a cost or token budget owns a ledger, keyed by its run id (the budget's *tree*). Every
model call of the run and of its descendants, however many run at once, first reserves its worst
case (`worst_case`: the input tokens it can send, plus the output tokens it may get, times the
highest price) and is settled to its actual usage once it returns. A call that cannot reserve
does not start, so the tree never spends more than its budget: what is spent plus what is held
never passes it, and a call never costs more than it held.

The ledger is the one place siblings share: a dict in process (`MemoryLedger`), a table in the
embedded SQLite file (`SqliteLedger`), a virtual object on Restate (`tether.restate.budget`).
Settling is idempotent by the call's key, so a replay that settles its journaled calls again
changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from . import jsoncodec

if TYPE_CHECKING:
    from ._sqlite import Database
    from .session.types import SessionTurn

FRAMING_TOKENS = 64
"""Tokens a message's framing (role markers, a tool call's wrapper) may add beyond its bytes."""


class Prices(Protocol):
    """USD per million tokens (a `tether.providers.Pricing`)."""

    @property
    def input_per_mtok(self) -> float: ...
    @property
    def output_per_mtok(self) -> float: ...
    @property
    def cache_read_per_mtok(self) -> float | None: ...
    @property
    def cache_write_per_mtok(self) -> float | None: ...


class Spend(NamedTuple):
    """An amount of a budget: USD and tokens (input, output and cache)."""

    cost_usd: float = 0.0
    tokens: int = 0

    def __add__(self, other: Spend) -> Spend:  # type: ignore[override]
        return Spend(self.cost_usd + other.cost_usd, self.tokens + other.tokens)

    def to_json(self) -> dict[str, Any]:
        return {"cost_usd": self.cost_usd, "tokens": self.tokens}

    @classmethod
    def of(cls, data: Mapping[str, Any] | None) -> Spend:
        data = data or {}  # never negative: a settlement cannot give a budget back
        return cls(
            max(0.0, float(data.get("cost_usd") or 0.0)), max(0, int(data.get("tokens") or 0))
        )


class Limits(NamedTuple):
    """A budget: either limit may be absent."""

    cost_usd: float | None = None
    tokens: int | None = None

    def __bool__(self) -> bool:
        return self.cost_usd is not None or self.tokens is not None

    def exceeded_by(self, total: Spend) -> str | None:
        """The limit `total` passes ("cost_usd" or "tokens"), None when it fits both."""
        if self.cost_usd is not None and total.cost_usd > self.cost_usd + 1e-12:
            return "cost_usd"
        if self.tokens is not None and total.tokens > self.tokens:
            return "tokens"
        return None

    def raised_to(self, other: Limits) -> Limits:
        """Each limit at the higher of the two; one set on one side only is set."""
        cost = [c for c in (self.cost_usd, other.cost_usd) if c is not None]
        tokens = [t for t in (self.tokens, other.tokens) if t is not None]
        return Limits(max(cost) if cost else None, max(tokens) if tokens else None)

    def to_json(self) -> dict[str, Any]:
        return {"cost_usd": self.cost_usd, "tokens": self.tokens}

    @classmethod
    def of(cls, data: Mapping[str, Any] | None) -> Limits:
        data = data or {}
        cost, tokens = data.get("cost_usd"), data.get("tokens")
        return cls(None if cost is None else float(cost), None if tokens is None else int(tokens))


def usage_tokens(usage: Mapping[str, Any] | None) -> int:
    """Every token a call used: input, output, cache reads and writes."""
    return sum(int(v) for v in (usage or {}).values() if isinstance(v, int | float))


def input_bound(turns: Sequence[SessionTurn], prefix: Sequence[Any] = (), run_id: str = "") -> int:
    """An upper bound on the input tokens of a request of `turns` (after `prefix`: the system
    prompt and the tool schemas) in run `run_id`. A token covers at least one byte of text, so
    the bytes of what is new bound its tokens; what the last answered call already sent is
    known exactly from its usage (its input and cache tokens, plus its output, now part of the
    input). A call of an earlier run may have had another system prompt or other tools: then
    the prefix counts again, in full."""
    known, new, resend_prefix = 0, 0, True
    for index in range(len(turns) - 1, -1, -1):
        turn = turns[index]
        if turn.role == "assistant" and turn.usage:
            known, new = usage_tokens(turn.usage), index + 1
            resend_prefix = turn.run_id != run_id
            break
    if resend_prefix:  # serialized only when it counts: the tool schemas are most of it
        known += len(jsoncodec.dumps(list(prefix)))
    unsent = turns[new:]
    return known + sum(len(jsoncodec.dumps(t.content)) + FRAMING_TOKENS for t in unsent)


def worst_case(input_tokens: int, output_tokens: int, pricing: Prices | None) -> Spend:
    """The most a call of `input_tokens` that may answer `output_tokens` can cost."""
    cost = 0.0
    if pricing is not None:
        prices = [pricing.input_per_mtok, pricing.cache_read_per_mtok, pricing.cache_write_per_mtok]
        input_price = max(p for p in prices if p is not None)
        cost = (input_tokens * input_price + output_tokens * pricing.output_per_mtok) / 1e6
    return Spend(cost, input_tokens + output_tokens)


@dataclass
class LedgerState:
    """One tree's ledger: its limits, what its settled calls spent, what its calls in flight
    hold, and (where settling may be repeated) the keys already settled."""

    limits: Limits = field(default_factory=Limits)
    spent: Spend = field(default_factory=Spend)
    held: dict[str, Spend] = field(default_factory=dict)
    settled: set[str] | None = None

    def holding(self) -> Spend:
        return sum(self.held.values(), Spend())

    def reserve(self, key: str, ask: Spend, limits: Limits | None = None) -> bool:
        """Hold `ask` for the call `key` if it fits; a key already held (a call run again after
        a crash) keeps its hold, and a settled key is granted without a new hold. `limits` (the
        root's) set the budget, or raise it: never lower it, so a replay that reserves with the
        limits of before a raise changes nothing."""
        if limits:
            self.limits = self.limits.raised_to(limits)
        if key in self.held or (self.settled is not None and key in self.settled):
            return True
        if self.limits.exceeded_by(self.spent + self.holding() + ask):
            return False
        self.held[key] = ask
        return True

    def settle(self, key: str, actual: Spend) -> None:
        """Release the hold of `key` and count what the call spent (once per key)."""
        if self.settled is not None:
            if key in self.settled:
                return
            self.settled.add(key)
        self.held.pop(key, None)
        self.spent = self.spent + actual

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "limits": self.limits.to_json(),
            "spent": self.spent.to_json(),
            "held": {k: v.to_json() for k, v in self.held.items()},
        }
        if self.settled is not None:
            data["settled"] = sorted(self.settled)
        return data

    @classmethod
    def of(cls, data: Mapping[str, Any] | None) -> LedgerState:
        data = data or {}
        settled = data.get("settled")
        return cls(
            limits=Limits.of(data.get("limits")),
            spent=Spend.of(data.get("spent")),
            held={k: Spend.of(v) for k, v in (data.get("held") or {}).items()},
            settled=None if settled is None else set(settled),
        )


@runtime_checkable
class BudgetLedger(Protocol):
    """Where a budget tree's reservations are kept (`RuntimeStores.budget`).

    Called by the loop outside any step: a backend whose calls are journaled (Restate) makes
    each once per journal position; the others are idempotent by `key`."""

    async def reserve(self, tree: str, key: str, ask: Spend, limits: Limits | None) -> bool:
        """Hold `ask` for call `key` of `tree` if it fits the tree's budget (set by the first
        call that gives `limits`: the root's)."""
        ...

    async def settle(self, tree: str, key: str, actual: Spend) -> None:
        """The call `key` is done and spent `actual`: release its hold, count its spend."""
        ...

    async def close(self, tree: str) -> None:
        """The root run of `tree` ended: its ledger may go (after a while, to be read)."""
        ...


class MemoryLedger:
    """The ledgers of an in-process runtime."""

    def __init__(self) -> None:
        self.trees: dict[str, LedgerState] = {}

    def state(self, tree: str) -> LedgerState:
        return self.trees.setdefault(tree, LedgerState(settled=set()))

    async def reserve(self, tree: str, key: str, ask: Spend, limits: Limits | None) -> bool:
        return self.state(tree).reserve(key, ask, limits)

    async def settle(self, tree: str, key: str, actual: Spend) -> None:
        self.state(tree).settle(key, actual)

    async def close(self, tree: str) -> None:
        """Kept: in process, a ledger lives as long as its journal."""


class SqliteLedger(MemoryLedger):
    """The ledgers of the embedded runtime, in its file, one row per call: each change is
    committed before the call it allows starts, so a resumed run sees what its first life spent
    and held."""

    def __init__(self, db: Database) -> None:
        super().__init__()
        self.db = db

    def state(self, tree: str) -> LedgerState:
        if tree not in self.trees:
            self.trees[tree] = load_ledger(self.db, tree)
        return self.trees[tree]

    async def reserve(self, tree: str, key: str, ask: Spend, limits: Limits | None) -> bool:
        state = self.state(tree)
        had_limits, held = state.limits, key in state.held
        granted = state.reserve(key, ask, limits)
        writes: list[tuple[str, tuple[Any, ...]]] = []
        if state.limits != had_limits:
            limits_json = jsoncodec.dumps(state.limits.to_json()).decode()
            writes.append(
                (
                    "INSERT INTO tether_budgets (tree, limits) VALUES (?, ?) "
                    "ON CONFLICT (tree) DO UPDATE SET limits = excluded.limits",
                    (tree, limits_json),
                )
            )
        if granted and not held and key in state.held:
            writes.append(
                (
                    "INSERT INTO tether_budget_calls (tree, key, cost_usd, tokens, settled) "
                    "VALUES (?, ?, ?, ?, 0)",
                    (tree, key, ask.cost_usd, ask.tokens),
                )
            )
        if writes:
            self.db.execute_commit(writes)
        return granted

    async def settle(self, tree: str, key: str, actual: Spend) -> None:
        state = self.state(tree)
        if state.settled is not None and key in state.settled:
            return
        state.settle(key, actual)
        self.db.execute_commit(
            [
                (
                    "INSERT INTO tether_budget_calls (tree, key, cost_usd, tokens, settled) "
                    "VALUES (?, ?, ?, ?, 1) ON CONFLICT (tree, key) DO UPDATE SET "
                    "cost_usd = excluded.cost_usd, tokens = excluded.tokens, settled = 1",
                    (tree, key, actual.cost_usd, actual.tokens),
                )
            ]
        )


def load_ledger(db: Database, tree: str) -> LedgerState:
    """The ledger of `tree` as its rows in `db` have it."""
    state = LedgerState(settled=set())
    for (limits,) in db.query("SELECT limits FROM tether_budgets WHERE tree = ?", (tree,)):
        state.limits = Limits.of(jsoncodec.loads(limits))
    rows = db.query(
        "SELECT key, cost_usd, tokens, settled FROM tether_budget_calls WHERE tree = ?", (tree,)
    )
    for key, cost, tokens, settled in rows:
        if settled:
            state.settle(key, Spend(cost, tokens))
        else:
            state.held[key] = Spend(cost, tokens)
    return state


def ledger_status(path: str, tree: str) -> dict[str, Any]:
    """The ledger of `tree` in the SQLite file at `path` (for `tether` and tests)."""
    from ._sqlite import Database

    db = Database(path)
    try:
        state = load_ledger(db, tree)
    finally:
        db.close()
    return {**state.to_json(), "settled": len(state.settled or ())}

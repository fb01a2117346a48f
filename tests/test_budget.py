"""The budget ledger's rules and the worst case of a call, without a runtime."""

from __future__ import annotations

from tether import jsoncodec
from tether.budget import LedgerState, Limits, Spend, input_bound, worst_case
from tether.providers import Pricing
from tether.session.types import SessionTurn

PREFIX = ["be brief", [{"name": "echo"}]]


def turn(role: str, text: str, usage: dict[str, int] | None = None, run: str = "r1") -> SessionTurn:
    content = [{"type": "text", "text": text}]
    return SessionTurn(id=text, role=role, content=content, created_at=0, usage=usage, run_id=run)  # type: ignore[arg-type]


def size(value: object) -> int:
    return len(jsoncodec.dumps(value))


def test_a_first_call_is_bounded_by_the_bytes_it_sends() -> None:
    turns = [turn("user", "hello")]
    assert input_bound(turns, PREFIX, "r1") == size(PREFIX) + size(turns[0].content) + 64


def test_later_calls_count_what_the_last_call_used_and_the_bytes_since() -> None:
    answered = turn("assistant", "calling", {"input": 500, "cache_read": 100, "output": 20})
    result = turn("user", "the result")
    turns = [turn("user", "hello"), answered, result]
    assert input_bound(turns, PREFIX, "r1") == 620 + size(result.content) + 64
    # The last call was another run's: its system prompt and tools may have differed.
    assert input_bound(turns, PREFIX, "r2") == 620 + size(PREFIX) + size(result.content) + 64


def test_the_worst_case_takes_the_highest_input_price() -> None:
    pricing = Pricing(input_per_mtok=3, output_per_mtok=15, cache_write_per_mtok=3.75)
    assert worst_case(1_000_000, 1000, pricing) == Spend(3.75 + 0.015, 1_001_000)
    assert worst_case(10, 5, None) == Spend(0.0, 15)


def test_holds_count_until_settled_and_a_settlement_counts_once() -> None:
    ledger = LedgerState(settled=set())
    assert ledger.reserve("a", Spend(0.4, 0), Limits(cost_usd=1.0))
    assert ledger.reserve("b", Spend(0.4, 0))
    assert not ledger.reserve("c", Spend(0.4, 0))  # 0.8 held: no room for 0.4 more
    assert ledger.reserve("a", Spend(0.4, 0))  # the same call again keeps its one hold
    ledger.settle("a", Spend(0.1, 0))
    ledger.settle("a", Spend(0.1, 0))  # a replay settles again: nothing changes
    assert ledger.spent == Spend(0.1, 0) and set(ledger.held) == {"b"}
    assert ledger.reserve("c", Spend(0.4, 0))  # 0.1 spent + 0.4 held + 0.4 <= 1.0
    assert ledger.reserve("a", Spend(0.9, 0))  # settled: granted, never held again
    assert set(ledger.held) == {"b", "c"}


def test_the_roots_limits_set_the_trees_budget_and_only_ever_raise_it() -> None:
    ledger = LedgerState()
    assert ledger.reserve("root", Spend(0, 100), Limits(tokens=1000))
    assert ledger.reserve("child", Spend(0, 800))  # a sub-agent gives no limits of its own
    assert not ledger.reserve("other", Spend(0, 200))
    assert ledger.limits == Limits(tokens=1000)
    # A person raised the budget: the root's next reservation carries the raised limits.
    assert ledger.reserve("root-2", Spend(0, 200), Limits(tokens=2000))
    # A replay reserves with the limits of before the raise: it lowers nothing.
    assert ledger.reserve("root", Spend(0, 100), Limits(tokens=1000))
    assert ledger.limits == Limits(tokens=2000)
    assert Limits(1.0, None).raised_to(Limits(None, 5)) == Limits(1.0, 5)


def test_a_settlement_cannot_give_budget_back() -> None:
    assert Spend.of({"cost_usd": -5, "tokens": -100}) == Spend(0.0, 0)

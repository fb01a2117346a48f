"""The agent loop's semantics on the in-memory runtime."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from tests.helpers import BlockingProvider, FlakyProvider, RecordingProvider, calls, results_after
from tether import Behavior, ToolContext, ToolDef, ToolSpec, create_agent, tool
from tether.agent import AgentBusyError
from tether.budget import MemoryLedger
from tether.messages import tool_uses
from tether.providers import Pricing, ProviderError, scripted
from tether.session import create_session


@tool(replay="safe", concurrency_safe=True)
async def echo(text: str) -> str:
    """Echo the text back."""
    return text


@tool
async def boom() -> str:
    """Always fails."""
    raise RuntimeError("kaput")


def every_call_has_one_result(turns: list[Any]) -> None:
    for i, turn in enumerate(turns):
        ids = [c["id"] for c in tool_uses(turn.content)] if turn.role == "assistant" else []
        if ids:
            answered = [
                b["tool_use_id"] for b in turns[i + 1].content if b["type"] == "tool_result"
            ]
            assert answered == ids


async def test_completed_run_returns_text_and_stats() -> None:
    provider = scripted(
        [
            {"text": "let me echo", **calls("echo", echo={"text": "hi"}), "usage": {"input": 7}},
            {"text": "said hi", "usage": {"input": 11, "output": 3}},
        ]
    )
    agent = create_agent(provider=provider, tools=[echo], system="be brief")
    stats = await agent.run("say hi")
    assert stats.status == "completed"
    assert stats.text == "said hi"
    assert (stats.turns, stats.tool_calls) == (2, 1)
    assert stats.input_tokens == 18
    assert agent.session is not None
    assert [t.role for t in agent.session.turns] == ["user", "assistant", "user", "assistant"]
    assert results_after(agent.session.turns, 1)["call_0_0"]["content"] == "hi"
    assert agent.session.runs[0].status == "completed"


async def test_every_tool_call_gets_exactly_one_result() -> None:
    async def gate(payload: dict[str, Any]) -> None:
        if payload["name"] == "echo" and payload["input"].get("text") == "secret":
            payload["block"], payload["reason"] = True, "no secrets"

    provider = scripted(
        [
            {
                "tool_calls": [
                    {"name": "echo", "input": {"text": "ok"}},
                    {"name": "echo", "input": {"text": "secret"}},
                    {"name": "missing", "input": {}},
                    {"name": "echo", "input": {"wrong": 1}},
                    {"name": "boom", "input": {}},
                ]
            },
            {"text": "done"},
        ]
    )
    agent = create_agent(provider=provider, tools=[echo, boom], hooks={"tool:gate": gate})
    stats = await agent.run("go")
    assert stats.status == "completed" and stats.tool_calls == 5
    assert agent.session is not None
    results = list(results_after(agent.session.turns, 1).values())
    assert results[0] == {"type": "tool_result", "tool_use_id": "call_0_0", "content": "ok"}
    assert results[1]["content"] == "Blocked: no secrets" and results[1]["is_error"]
    assert "Unknown tool 'missing'" in results[2]["content"] and results[2]["is_error"]
    assert "Invalid input for tool 'echo'" in results[3]["content"]
    assert results[4]["content"] == "Tool error: RuntimeError: kaput" and results[4]["is_error"]
    every_call_has_one_result(agent.session.turns)


async def test_concurrency_safe_tools_run_together_up_to_the_limit() -> None:
    in_flight = 0
    peak = 0
    both_started = asyncio.Event()

    @tool(concurrency_safe=True, replay="safe")
    async def slow(n: int) -> str:
        """Waits until a second call is running, then returns n."""
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight >= 2:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), 5)
        # Finish in reverse order to prove results keep call order.
        await asyncio.sleep(0.01 * (4 - n))
        in_flight -= 1
        return str(n)

    script = [{"tool_calls": [{"name": "slow", "input": {"n": i}} for i in range(4)]}, {}]
    agent = create_agent(
        provider=scripted(script), tools=[slow], behavior=Behavior(max_concurrent_tools=2)
    )
    await agent.run("go")
    assert peak == 2
    assert agent.session is not None
    contents = [r["content"] for r in results_after(agent.session.turns, 1).values()]
    assert contents == ["0", "1", "2", "3"]


async def test_tools_that_are_not_concurrency_safe_run_one_at_a_time() -> None:
    in_flight = 0
    peak = 0

    @tool
    async def write(n: int) -> str:
        """Writes."""
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        in_flight -= 1
        return "ok"

    script = [{"tool_calls": [{"name": "write", "input": {"n": i}} for i in range(3)]}, {}]
    agent = create_agent(
        provider=scripted(script), tools=[write], behavior=Behavior(max_concurrent_tools=4)
    )
    stats = await agent.run("go")
    assert stats.tool_calls == 3 and peak == 1


async def test_hooks_fire_in_order_with_turn_and_call_ids() -> None:
    seen: list[tuple[str, Any]] = []

    def record(name: str) -> Any:
        return lambda payload: seen.append((name, payload.get("call_id", payload.get("turn"))))

    names = ["turn:before", "turn:after", "tool:gate", "tool:before", "tool:transform"]
    hooks: dict[str, Any] = {n: record(n) for n in names}

    async def upper(payload: dict[str, Any]) -> None:
        payload["result"] = str(payload["result"]).upper()

    hooks["tool:transform"] = [record("tool:transform"), upper]
    hooks["tool:after"] = record("tool:after")
    hooks["agent:done"] = record("agent:done")
    deltas: list[str] = []
    hooks["stream:text"] = lambda p: deltas.append(p["delta"])
    script = [{"text": "two words", **calls("echo", echo={"text": "quiet"})}, {"text": "end"}]
    agent = create_agent(provider=scripted(script), tools=[echo], hooks=hooks)
    await agent.run("go")
    assert [name for name, _ in seen] == [
        "turn:before",
        "turn:after",
        "tool:gate",
        "tool:before",
        "tool:transform",
        "tool:after",
        "turn:before",
        "turn:after",
        "agent:done",
    ]
    assert seen[2][1] == "call_0_0"
    assert "".join(deltas) == "two wordsend"
    assert agent.session is not None
    assert results_after(agent.session.turns, 1)["call_0_0"]["content"] == "QUIET"


@pytest.mark.parametrize("name", ["tool:after", "tool:transform", "turn:before", "turn:end"])
async def test_a_hook_registered_alone_gets_its_whole_payload(name: str) -> None:
    # The loop builds a payload only for the hooks registered: each one alone must still get it.
    payloads: list[dict[str, Any]] = []
    script = [calls("echo", echo={"text": "x" * 50}), {"text": "end"}]
    behavior = Behavior(max_tool_result_bytes=20)
    agent = create_agent(
        provider=scripted(script),
        tools=[echo],
        hooks={name: payloads.append},
        behavior=behavior,
    )
    await agent.run("go")
    expected = {
        "tool:after": {"call_id", "result", "outcome", "duration_s", "is_error", "turn"},
        "tool:transform": {"call_id", "result", "is_error", "run_id", "turn"},
        "turn:before": {"turn", "request", "run_id"},
        "turn:end": {"turn", "run_id", "started_at", "ended_at"},
    }[name]
    assert payloads and expected <= payloads[0].keys(), payloads
    if name == "tool:after":  # the result as capped, and how the call went
        assert payloads[0]["outcome"] == "ok" and "bytes omitted" in payloads[0]["result"]


async def test_a_tool_that_takes_no_context_is_given_none() -> None:
    given: list[Any] = []

    async def execute(arguments: dict[str, Any], ctx: ToolContext) -> str:
        given.append(ctx)
        return "ok"

    def spec(name: str) -> ToolSpec:
        return ToolSpec(name=name, description="d", input_schema={"type": "object"})

    plain = ToolDef(spec=spec("plain"), execute=execute, uses_context=False)
    framed = ToolDef(spec=spec("framed"), execute=execute)

    @tool
    async def reads(ctx: ToolContext) -> str:
        """Reads its context."""
        return ctx.call_id

    assert not echo.uses_context and reads.uses_context
    script = [{"tool_calls": [{"name": n, "input": {}} for n in ("plain", "framed", "reads")]}]
    provider = scripted([*script, {"text": "end"}])
    agent = create_agent(provider=provider, tools=[plain, framed, reads])
    await agent.run("go")
    assert given[0] is None and isinstance(given[1], ToolContext)
    assert agent.session is not None
    assert results_after(agent.session.turns, 1)["call_0_2"]["content"] == "call_0_2"


def test_unknown_hook_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown hook 'tool:befor'"):
        create_agent(provider=scripted([]), hooks={"tool:befor": lambda p: None})


async def test_max_turns_stops_the_run() -> None:
    script = [calls("echo", echo={"text": str(i)}) for i in range(10)]
    agent = create_agent(provider=scripted(script), tools=[echo], behavior=Behavior(max_turns=3))
    stats = await agent.run("loop")
    assert stats.status == "max_turns" and stats.turns == 3


async def test_a_cost_budget_never_lets_a_call_start_that_could_pass_it() -> None:
    # $100 per million output tokens: a call of at most 1,000 output tokens may cost $0.10, and
    # each does. With $0.35, a fourth call could reach $0.40: it never starts.
    script = [{**calls("echo", echo={"text": "x"}), "usage": {"input": 10, "output": 1000}}] * 5
    provider = RecordingProvider(script, pricing=Pricing(input_per_mtok=0, output_per_mtok=100))
    behavior = Behavior(max_cost_usd=0.35, max_output_tokens=1000)
    agent = create_agent(provider=provider, tools=[echo], behavior=behavior)
    stats = await agent.run("spend")
    assert stats.status == "budget_exceeded"
    assert len(provider.requests) == 3
    assert stats.cost_usd == pytest.approx(0.30)


async def test_a_token_budget_never_lets_a_call_start_that_could_pass_it() -> None:
    script = [{**calls("echo", echo={"text": "x"}), "usage": {"input": 60, "output": 40}}] * 30
    behavior = {"max_tokens": 2000, "max_output_tokens": 100}
    agent = create_agent(provider=scripted(script), tools=[echo], behavior=behavior)
    stats = await agent.run("spend")
    assert stats.status == "budget_exceeded" and stats.turns >= 3
    assert stats.total_tokens <= 2000
    ledger = agent.durable.stores.budget
    assert isinstance(ledger, MemoryLedger)
    state = ledger.state(str(stats.run_id))  # every call settled to what it used, none held
    assert state.spent.tokens == stats.total_tokens and state.held == {}


@pytest.mark.parametrize(
    ("error", "counted"),
    [
        (ProviderError("the stream broke", provider="p", retryable=True), True),
        (ProviderError("read timed out", provider="p", code="timeout", retryable=True), True),
        (ProviderError("overloaded", provider="p", status=429, retryable=True), False),
        (ProviderError("refused", provider="p", code="connection_error", retryable=True), False),
    ],
    ids=["stream-broke", "timeout", "429", "not-reached"],
)
async def test_a_failed_call_the_provider_may_have_charged_counts_its_worst_case(
    error: ProviderError, counted: bool
) -> None:
    """The run's budget counts a call that failed after the provider had it (its worst case:
    what it generated is unknown, and may be billed) as spend caps do; a refusal with an error
    status, or a call that never reached the provider, counts nothing."""
    provider = FlakyProvider([{"text": "done", "usage": {"input": 60, "output": 40}}], 1, error)
    behavior = {"max_tokens": 5000, "max_output_tokens": 100, "max_retries": 1}
    agent = create_agent(provider=provider, behavior=behavior)
    stats = await agent.run("go")
    assert stats.status == "completed" and provider.attempts == 2
    ledger = agent.durable.stores.budget
    assert isinstance(ledger, MemoryLedger)
    state = ledger.state(str(stats.run_id))
    assert state.held == {}
    failed = state.spent.tokens - stats.total_tokens  # what the failed call counts
    # its worst case: its 100 output tokens and a bound of its input (its few bytes)
    assert 100 < failed < 500 if counted else failed == 0


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
async def test_a_charged_failure_leaves_less_of_the_budget_for_the_next_call(ledger: bool) -> None:
    """With a ledger (sub-agents, the embedded runtimes) or without (a run alone on Restate):
    a call's worst case is ~200 tokens; after one failed call counted at it, a retry under 350
    could pass the budget, so it does not start."""
    broke = ProviderError("the stream broke", provider="p", retryable=True)
    provider = FlakyProvider([{"text": "done", "usage": {"input": 60, "output": 40}}], 1, broke)
    behavior = {"max_tokens": 350, "max_output_tokens": 100, "max_retries": 1}
    agent = create_agent(provider=provider, behavior=behavior)
    if not ledger:
        agent.durable.stores.budget = None
    stats = await agent.run("go")
    assert stats.status == "budget_exceeded" and provider.attempts == 1


def answering(*answers: Any) -> tuple[list[dict[str, Any]], Any]:
    """A `wait` that answers with `answers` in turn, and what it was asked."""
    from tether.tools.human import Answer

    asked: list[dict[str, Any]] = []
    pending = list(answers)

    async def wait(ctx: ToolContext, kind: str, arguments: dict[str, Any]) -> Answer:
        asked.append({"tool": ctx.tool_name, "call_id": ctx.call_id, "kind": kind, **arguments})
        return Answer(value=pending.pop(0))

    return asked, wait


async def test_an_exhausted_budget_asks_a_person_and_an_approval_raises_it_by_its_size() -> None:
    # $0.10 a call at most, $0.25 a budget: two calls fit, the third asks; approved, the budget
    # is $0.50 and three more fit; the sixth asks again and is denied.
    script = [{**calls("echo", echo={"text": "x"}), "usage": {"input": 10, "output": 1000}}] * 9
    provider = RecordingProvider(script, pricing=Pricing(input_per_mtok=0, output_per_mtok=100))
    behavior = Behavior(max_cost_usd=0.25, max_output_tokens=1000, on_budget_exhausted="ask")
    asked, wait = answering({"approved": True, "by": "test"}, False)
    agent = create_agent(provider=provider, tools=[echo], behavior=behavior, wait=wait)
    stats = await agent.run("spend")
    assert stats.status == "budget_exceeded"
    assert len(provider.requests) == 5 and stats.cost_usd == pytest.approx(0.50)
    assert [(a["tool"], a["kind"]) for a in asked] == [("budget", "approval")] * 2
    assert asked[0]["spent"]["cost_usd"] == pytest.approx(0.20)
    assert asked[0]["next_call_at_most"]["cost_usd"] == pytest.approx(0.10)
    assert asked[0]["budget"]["cost_usd"] == 0.25 and asked[0]["raise_to"]["cost_usd"] == 0.5
    assert asked[1]["budget"]["cost_usd"] == 0.5 and asked[1]["raise_to"]["cost_usd"] == 0.75
    assert agent.session is not None
    decisions = agent.session.runs[0].decisions
    assert [(d["tool"], d["approved"]) for d in decisions] == [("budget", True), ("budget", False)]
    assert decisions[0]["by"] == "test"
    ledger = agent.durable.stores.budget
    assert isinstance(ledger, MemoryLedger)
    assert ledger.state(str(stats.run_id)).limits.cost_usd == 0.5


async def test_a_sub_agent_out_of_budget_stops_and_its_parent_asks_for_the_tree() -> None:
    from tether.agent import spawn_tool

    usage = {"usage": {"input": 10, "output": 1000}}
    work = {**calls("echo", echo={"text": "x"}), **usage}
    script = {
        "go": [{**calls("spawn", spawn={"task": "work"}), **usage}, {"text": "done", **usage}],
        "work": [work] * 5,
    }
    pricing = Pricing(input_per_mtok=0, output_per_mtok=100)
    provider = scripted(script, pricing=pricing)
    behavior = Behavior(max_cost_usd=0.35, max_output_tokens=1000, on_budget_exhausted="ask")
    asked, wait = answering(True)
    tools = [echo, spawn_tool(max_depth=1)]
    agent = create_agent(provider=provider, tools=tools, behavior=behavior, wait=wait)
    stats = await agent.run("go")
    # The spawn ($0.10) and the child's two calls fit $0.35; the child's third does not: it
    # stops, and the parent's next call asks for the whole tree, then answers in $0.70.
    assert [child.status for child in stats.children] == ["budget_exceeded"]
    assert [a["call_id"] for a in asked] == ["budget:1:0"]
    assert stats.status == "completed" and stats.total_cost_usd == pytest.approx(0.40)


def test_an_approval_may_grant_its_own_amounts_but_never_lowers_a_budget() -> None:
    from tether.agent.loop import granted
    from tether.budget import Limits

    limits, default = Limits(1.0, 1000), Limits(2.0, 2000)
    assert granted(True, limits, default) == default
    assert granted({"approved": True}, limits, default) == default
    assert granted({"raise_to": {"cost_usd": 5}}, limits, default) == Limits(5, 2000)
    assert granted({"raise_to": {"tokens": 1500.7}}, limits, default) == Limits(2.0, 1500)
    assert granted({"raise_to": {"cost_usd": 0.5}}, limits, default) == Limits(1.0, 2000)
    for junk in ("5", True, None, float("nan"), float("inf"), [5]):
        assert granted({"raise_to": {"cost_usd": junk}}, limits, default) == default
    # An amount for a budget the run does not have adds none.
    assert granted({"raise_to": {"tokens": 9}}, Limits(1.0), Limits(2.0)) == Limits(2.0)


async def test_a_sub_agent_with_a_budget_of_its_own_stops_on_it_and_never_asks() -> None:
    from tether.agent import spawn_tool

    usage = {"usage": {"input": 10, "output": 1000}}
    script = {
        "go": [calls("spawn", spawn={"task": "work"}), {"text": "done"}],
        "work": [{**calls("echo", echo={"text": "x"}), **usage}] * 5,
    }
    pricing = Pricing(input_per_mtok=0, output_per_mtok=100)
    child = {"max_cost_usd": 0.25, "max_output_tokens": 1000, "on_budget_exhausted": "ask"}
    tools = [echo, spawn_tool(max_depth=1, behavior=child)]
    agent = create_agent(provider=scripted(script, pricing=pricing), tools=tools)
    stats = await agent.run("go")  # the parent has no budget and no way to ask: it never asks
    assert stats.status == "completed"
    assert [c.status for c in stats.children] == ["budget_exceeded"]


async def test_asking_for_budget_without_a_way_to_wait_is_refused_before_the_run() -> None:
    behavior = Behavior(max_tokens=1000, on_budget_exhausted="ask")
    agent = create_agent(provider=scripted([{"text": "hi"}]), behavior=behavior)
    with pytest.raises(ValueError, match="needs the agent's `wait`"):
        await agent.run("go")


async def test_retryable_provider_errors_are_retried() -> None:
    error = ProviderError(
        "rate limited", provider="test", status=429, retryable=True, retry_after=0
    )
    provider = FlakyProvider([{"text": "finally"}], failures=2, error=error)
    agent = create_agent(provider=provider)
    stats = await agent.run("hi")
    assert stats.status == "completed" and stats.text == "finally"
    assert provider.attempts == 3
    assert agent.durable.counters.live["sleep"] == 2


async def test_retries_give_up_after_max_retries() -> None:
    error = ProviderError("overloaded", provider="test", status=529, retryable=True, retry_after=0)
    provider = FlakyProvider([{"text": "never"}], failures=10, error=error)
    agent = create_agent(provider=provider, behavior=Behavior(max_retries=2))
    stats = await agent.run("hi")
    assert stats.status == "error" and "overloaded" in (stats.error or "")
    assert provider.attempts == 3


async def test_a_non_retryable_error_ends_the_run_with_a_clear_error() -> None:
    error = ProviderError("invalid x-api-key", provider="anthropic", status=401)
    provider = FlakyProvider([{"text": "never"}], failures=1, error=error)
    agent = create_agent(provider=provider)
    stats = await agent.run("hi")
    assert stats.status == "error"
    assert stats.error == "anthropic: invalid x-api-key"
    assert provider.attempts == 1


async def test_abort_during_a_model_call() -> None:
    provider = BlockingProvider([{"text": "never"}])
    agent = create_agent(provider=provider)
    aborted: list[Any] = []
    agent.hooks.on("agent:abort", aborted.append)
    run = asyncio.create_task(agent.run("hi"))
    await provider.entered.wait()
    agent.abort()
    stats = await asyncio.wait_for(run, 5)
    assert stats.status == "aborted" and aborted


async def test_a_call_aborted_mid_answer_counts_its_worst_case_in_the_budget() -> None:
    provider = BlockingProvider([{"text": "never"}])
    agent = create_agent(provider=provider, behavior={"max_tokens": 5000, "max_output_tokens": 100})
    run = asyncio.create_task(agent.run("hi"))
    await provider.entered.wait()  # the provider has it: what it generated may be billed
    agent.abort()
    stats = await asyncio.wait_for(run, 5)
    ledger = agent.durable.stores.budget
    assert isinstance(ledger, MemoryLedger) and stats.status == "aborted"
    state = ledger.state(str(stats.run_id))
    assert state.held == {} and state.spent.tokens > 100  # its output, and its input's bound


async def test_an_external_signal_aborts_a_running_tool() -> None:
    started = asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()
        return "unreachable"

    signal = asyncio.Event()
    agent = create_agent(provider=scripted([calls("wait_forever"), {}]), tools=[wait_forever])
    run = asyncio.create_task(agent.run("hi", signal=signal))
    await started.wait()
    signal.set()
    stats = await asyncio.wait_for(run, 5)
    assert stats.status == "aborted"
    assert agent.session is not None
    result = results_after(agent.session.turns, 1)["call_0_0"]
    assert result["is_error"] and "aborted" in str(result["content"])


async def test_a_second_concurrent_run_is_rejected() -> None:
    provider = BlockingProvider([{"text": "x"}])
    agent = create_agent(provider=provider)
    run = asyncio.create_task(agent.run("one"))
    await provider.entered.wait()
    with pytest.raises(AgentBusyError):
        await agent.run("two")
    provider.release.set()
    assert (await run).status == "completed"


async def test_prompt_is_optional_only_when_the_session_has_turns() -> None:
    agent = create_agent(provider=scripted([{"text": "a"}, {"text": "b"}]))
    with pytest.raises(ValueError, match="prompt is required"):
        await agent.run()
    await agent.run("first")
    stats = await agent.run()
    assert stats.text == "b"
    assert agent.session is not None and len(agent.session.runs) == 2


async def test_cache_and_thinking_reach_the_provider() -> None:
    provider = RecordingProvider([{"text": "x"}])
    agent = create_agent(
        provider=provider, behavior=Behavior(cache=True, thinking_budget=2048), system="sys"
    )
    await agent.run("hi")
    request = provider.requests[0]
    assert request.cache and request.thinking_budget == 2048 and request.system == "sys"


async def test_tail_compaction_keeps_the_request_under_the_window() -> None:
    big = "x" * 4000  # about 1000 tokens per result
    script = [calls("echo", echo={"text": big}) for _ in range(6)] + [{"text": "done"}]
    provider = RecordingProvider(script, context_window=4000 + 4096)
    agent = create_agent(
        provider=provider, tools=[echo], behavior=Behavior(compact_strategy="tail")
    )
    stats = await agent.run("go")
    assert stats.status == "completed"
    last = provider.requests[-1].messages
    assert len(last) < 13
    assert "earlier messages were omitted" in last[0]["content"][0]["text"]
    # No kept tool result may answer a call that was dropped.
    kept_calls = {c["id"] for m in last for c in tool_uses(m["content"])}
    kept_results = {
        b["tool_use_id"] for m in last for b in m["content"] if b["type"] == "tool_result"
    }
    assert kept_results <= kept_calls
    assert agent.session is not None and len(agent.session.turns) == 14  # the session keeps all


async def test_context_transform_can_rewrite_the_request() -> None:
    provider = RecordingProvider([{"text": "x"}])

    def redact(payload: dict[str, Any]) -> None:
        payload["messages"] = [
            {"role": "user", "content": [{"type": "text", "text": "[redacted]"}]}
        ]

    agent = create_agent(provider=provider, hooks={"context:transform": redact})
    await agent.run("my password is hunter2")
    assert provider.requests[0].messages[0]["content"][0]["text"] == "[redacted]"


async def test_tools_receive_their_context() -> None:
    seen: list[ToolContext] = []

    @tool
    async def inspect_ctx(ctx: ToolContext) -> str:
        """Records its context."""
        seen.append(ctx)
        return "ok"

    session = await create_session(id="sess-1")
    agent = create_agent(
        provider=scripted([calls("inspect_ctx"), {}]), tools=[inspect_ctx], session=session
    )
    stats = await agent.run("go")
    assert seen[0].call_id == "call_0_0" and seen[0].session_id == "sess-1"
    assert seen[0].run_id == stats.run_id and seen[0].tool_name == "inspect_ctx"


async def test_tool_defs_without_the_decorator() -> None:
    async def execute(args: dict[str, Any], ctx: ToolContext) -> str:
        return f"{args['a']}!"

    shout = ToolDef(
        spec=ToolSpec(
            "shout",
            "Shouts.",
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
        ),
        execute=execute,
    )
    agent = create_agent(provider=scripted([calls("shout", shout={"a": "hey"}), {}]), tools=[shout])
    await agent.run("go")
    assert agent.session is not None
    assert results_after(agent.session.turns, 1)["call_0_0"]["content"] == "hey!"


def test_duplicate_tool_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate tool names: echo"):
        create_agent(provider=scripted([]), tools=[echo, echo])


def test_behavior_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="max_cost_usd must be positive"):
        Behavior(max_cost_usd=0)
    with pytest.raises(ValueError, match="compact_strategy"):
        Behavior(compact_strategy="head")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown Behavior fields: max_turn"):
        Behavior().override({"max_turn": 3})


async def test_large_tool_results_keep_their_head_and_tail() -> None:
    @tool
    async def dump() -> str:
        """Dumps a lot."""
        return "A" * 5000 + "B" * 5000

    agent = create_agent(
        provider=scripted([calls("dump"), {}]),
        tools=[dump],
        behavior=Behavior(max_tool_result_bytes=1000),
    )
    await agent.run("go")
    assert agent.session is not None
    content = results_after(agent.session.turns, 1)["call_0_0"]["content"]
    assert content.startswith("A" * 500) and content.endswith("B" * 500)
    assert "[... 9000 bytes omitted ...]" in content


async def test_a_finished_run_leaves_no_reference_cycles() -> None:
    # A run's objects go by reference counting when it ends. In a reference cycle they would
    # wait for a full collection: with 100 runs in flight on a worker, ~180 objects a run, and
    # the collections that walk them (issue 12).
    async def one_run() -> None:
        script = [{"text": "", **calls("echo", echo={"text": "hi"})}, {"text": "done"}]
        stats = await create_agent(provider=scripted(script), tools=[echo]).run("go")
        assert stats.status == "completed"

    await one_run()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await one_run()
        gc.collect()
        ours = [type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("tether")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert ours == []

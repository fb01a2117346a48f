"""In-process sub-agents journaled in their own scopes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.helpers import RecordingProvider, calls, results_after
from tether import ToolContext, create_agent, tool
from tether.agent import Output, Subagent, spawn_tool
from tether.durable import MemoryJournal, memory_runtime
from tether.providers import Pricing
from tether.session import INTERRUPTED_RESULT

PRICE = Pricing(input_per_mtok=1, output_per_mtok=0)


class SimulatedCrash(BaseException):
    pass


async def test_a_child_runs_the_task_and_its_stats_join_the_parent() -> None:
    executed: list[str] = []

    @tool
    async def work(item: str) -> str:
        """Works on an item."""
        executed.append(item)
        return f"{item} done"

    child = RecordingProvider(
        [calls("work", work={"item": "a"}), {"text": "a is done", "usage": {"input": 500_000}}],
        pricing=PRICE,
    )
    parent = RecordingProvider(
        [calls("spawn", spawn={"task": "do a"}), {"text": "the child did a"}], pricing=PRICE
    )
    agent = create_agent(provider=parent, tools=[work, spawn_tool(provider=child)])
    stats = await agent.run("delegate a")
    assert stats.status == "completed"
    assert executed == ["a"]
    assert len(stats.children) == 1 and stats.children[0].text == "a is done"
    assert stats.children[0].tool_calls == 1
    assert stats.total_cost_usd == pytest.approx(stats.cost_usd + 0.5 + 0.00001)
    assert agent.session is not None
    assert results_after(agent.session.turns, 1)["call_0_0"]["content"] == "a is done"


async def test_a_replay_replays_the_child_and_interrupts_its_cut_off_call() -> None:
    executed: list[str] = []
    crash = True

    @tool
    async def pay(amount: int) -> str:
        """Pays."""
        executed.append(f"pay {amount}")
        if crash and amount == 2:
            raise SimulatedCrash
        return "paid"

    def child() -> RecordingProvider:
        return RecordingProvider(
            [calls("pay", pay={"amount": 1}), calls("pay", pay={"amount": 2}), {"text": "paid"}]
        )

    def parent() -> RecordingProvider:
        return RecordingProvider([calls("spawn", spawn={"task": "pay"}), {"text": "ok"}])

    journal = MemoryJournal()

    def agent(child_provider: RecordingProvider, parent_provider: RecordingProvider) -> object:
        return create_agent(
            provider=parent_provider,
            tools=[pay, spawn_tool(provider=child_provider)],
            durable=memory_runtime(journal=journal, run_id="r"),
        )

    with pytest.raises(SimulatedCrash):
        await agent(child(), parent()).run("go")  # type: ignore[attr-defined]
    crash = False
    child_provider, parent_provider = child(), parent()
    resumed = agent(child_provider, parent_provider)
    stats = await resumed.run("go")  # type: ignore[attr-defined]
    assert stats.status == "completed"
    assert executed == ["pay 1", "pay 2"]  # neither payment ran twice
    assert len(child_provider.requests) == 1  # only the child's last answer was live
    last = child_provider.requests[0].messages[-1]["content"][0]
    assert last["type"] == "tool_result" and last["content"] == INTERRUPTED_RESULT
    assert len(parent_provider.requests) == 1
    child_turns = stats.children[0]
    assert child_turns.tool_calls == 2


async def test_children_may_not_nest_deeper_than_max_depth() -> None:
    # Every agent level gets the same script: spawn once, then answer.
    script = [calls("spawn", spawn={"task": "go deeper"}), {"text": "ok"}]
    provider = RecordingProvider(script)
    agent = create_agent(provider=provider, tools=[spawn_tool(provider=provider, max_depth=1)])
    stats = await agent.run("nest")
    assert stats.status == "completed"
    child = stats.children[0]
    assert child.status == "completed" and child.tool_calls == 1
    assert child.children == []  # the grandchild was refused


async def test_a_child_reserves_from_its_parents_budget() -> None:
    # $100 per million output tokens: each call may cost $0.10 (1,000 output tokens) and does.
    price = Pricing(input_per_mtok=0, output_per_mtok=100)
    usage = {"input": 10, "output": 1000}
    child = RecordingProvider([{**calls("spawn"), "usage": usage}] * 5, pricing=price)
    parent = RecordingProvider(
        [{**calls("spawn", spawn={"task": "spend"}), "usage": usage}, {"text": "x"}],
        pricing=price,
    )
    agent = create_agent(
        provider=parent,
        tools=[spawn_tool(provider=child, max_depth=1)],
        behavior={"max_cost_usd": 0.35, "max_output_tokens": 1000},
    )
    stats = await agent.run("spend")
    # The parent spent $0.10, so the child's calls may hold $0.25: it starts two, then stops,
    # and the parent's next call finds no room either.
    assert stats.children[0].status == "budget_exceeded"
    assert len(child.requests) == 2
    assert stats.status == "budget_exceeded"
    assert stats.total_cost_usd == pytest.approx(0.30)


async def test_a_named_sub_agent_has_its_own_prompt_tools_model_and_output() -> None:
    done: list[str] = []

    @tool
    async def work(item: str) -> str:
        """Works on an item."""
        done.append(item)
        return f"{item} done"

    @tool
    async def deploy() -> str:
        """Deploys."""
        raise AssertionError("the reviewer has no deploy tool")

    reviewer_model = RecordingProvider(
        [calls("work", work={"item": "a"}), calls("final_answer", final_answer={"ok": True})]
    )
    reviewer = Subagent(
        "reviewer",
        "Reviews a change and says whether it may ship.",
        system="You review changes.",
        tools=("work",),
        provider=reviewer_model,
        output=Output({"type": "object", "properties": {"ok": {"type": "boolean"}}}),
        behavior={"max_turns": 3},
    )
    parent = RecordingProvider(
        [calls("spawn", spawn={"task": "review a", "agent": "reviewer"}), {"text": "shipped"}]
    )
    spawn = spawn_tool(agents=[reviewer])
    agent = create_agent(provider=parent, tools=[work, deploy, spawn], system="You ship.")
    stats = await agent.run("ship a")
    assert stats.status == "completed" and done == ["a"]
    [offered] = [t for t in parent.requests[0].tools if t.name == "spawn"]
    assert offered.input_schema["properties"]["agent"]["enum"] == ["reviewer"]
    assert "reviewer: Reviews a change" in offered.description
    first = reviewer_model.requests[0]
    assert first.system == "You review changes."
    assert sorted(t.name for t in first.tools) == ["final_answer", "spawn", "work"]
    [child] = stats.children
    assert (child.output, child.text) == ({"ok": True}, '{"ok":true}')
    assert agent.session is not None
    assert results_after(agent.session.turns, 1)["call_0_0"]["content"] == '{"ok":true}'


async def test_a_spawn_call_naming_no_such_sub_agent_is_told_which_there_are() -> None:
    parent = RecordingProvider(
        [calls("spawn", spawn={"task": "t", "agent": "critic"}), {"text": "ok"}]
    )
    reviewer = Subagent("reviewer", "Reviews.", provider=RecordingProvider([{"text": "x"}]))
    agent = create_agent(provider=parent, tools=[spawn_tool(agents=[reviewer])])
    stats = await agent.run("go")
    assert stats.status == "completed" and stats.children == []
    assert agent.session is not None
    result = results_after(agent.session.turns, 1)["call_0_0"]
    assert result["is_error"] and "'critic' is not one of ['reviewer']" in result["content"]


def fruit_script() -> dict[str, Any]:
    """The parent hands three tasks out at once; each child counts with `count`, then answers."""
    tasks = {"tasks": ["apples", "pears", "plums"]}
    child = [calls("count", count={"fruit": "x"}), {"text": "counted"}]
    return {"go": [calls("spawn", spawn=tasks), {"text": "all counted"}], "*": child}


async def test_several_tasks_run_at_once_up_to_the_cap_each_in_a_scope_of_its_own() -> None:
    running, most, counted = 0, 0, []

    @tool
    async def count(fruit: str, ctx: ToolContext) -> str:
        """Counts."""
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1
        counted.append(ctx.run_id)
        return "3"

    provider = RecordingProvider(fruit_script())
    spawn = spawn_tool(max_depth=1, max_concurrent=2)
    agent = create_agent(provider=provider, tools=[count, spawn])
    stats = await agent.run("go")
    assert stats.status == "completed" and stats.text == "all counted"
    assert most == 2 and len(counted) == 3 and len(set(counted)) == 3  # three runs, two at once
    assert [c.text for c in stats.children] == ["counted"] * 3
    assert agent.session is not None
    answer = results_after(agent.session.turns, 1)["call_0_0"]["content"]
    assert answer == "[child-1] counted\n\n[child-2] counted\n\n[child-3] counted"


async def test_a_crash_amid_several_children_replays_the_finished_ones_and_resumes_the_rest() -> (
    None
):
    crash = True
    executed: list[str] = []

    @tool
    async def count(fruit: str, ctx: ToolContext) -> str:
        """Counts."""
        executed.append(ctx.run_id)
        if crash and len(executed) == 3:  # the last child's count: the process dies
            raise SimulatedCrash
        return "3"

    journal = MemoryJournal()

    def agent(provider: RecordingProvider) -> Any:
        return create_agent(
            provider=provider,
            tools=[count, spawn_tool(max_depth=1, max_concurrent=1)],
            durable=memory_runtime(journal=journal, run_id="r"),
        )

    with pytest.raises(SimulatedCrash):
        await agent(RecordingProvider(fruit_script())).run("go")
    crash = False
    resumed = RecordingProvider(fruit_script())
    stats = await agent(resumed).run("go")
    assert stats.status == "completed" and len(stats.children) == 3
    # Two children finished before the crash: replayed. The third's count was cut off (reported
    # interrupted, not run again), so only its answer and the parent's are asked again.
    assert len(executed) == 3
    assert len(resumed.requests) == 2


async def test_a_finished_fan_out_replays_whatever_order_its_children_ran_in() -> None:
    @tool
    async def count(fruit: str) -> str:
        """Counts."""
        await asyncio.sleep(0.01)  # live, the children's steps interleave; replayed, they do not
        return "3"

    def script() -> dict[str, Any]:
        tasks = {"tasks": ["apples", "pears", "plums"]}
        twice = [calls("count", count={"fruit": "a"})] * 2
        return {
            "go": [calls("spawn", spawn=tasks), {"text": "all counted"}],
            "apples": [*twice, {"text": "apples: 6"}],
            "pears": [{"text": "pears: 0"}],
            "plums": [calls("count", count={"fruit": "p"}), {"text": "plums: 3"}],
        }

    journal = MemoryJournal()

    def agent(provider: RecordingProvider) -> Any:
        return create_agent(
            provider=provider,
            tools=[count, spawn_tool(max_depth=1)],
            durable=memory_runtime(journal=journal, run_id="r"),
        )

    first = await agent(RecordingProvider(script())).run("go")
    replaying = RecordingProvider(script())
    again = await agent(replaying).run("go")
    assert replaying.requests == []  # all of it from the journal
    assert [c.text for c in again.children] == ["apples: 6", "pears: 0", "plums: 3"]
    assert (again.status, again.text) == (first.status, first.text) == ("completed", "all counted")


async def test_a_named_sub_agents_own_sub_agents_never_get_a_tool_it_lacks() -> None:
    @tool
    async def read() -> str:
        """Reads."""
        return "text"

    @tool
    async def shell() -> str:
        """Runs a command."""
        raise AssertionError("no sub-agent of the reader may run a command")

    script = {
        "go": [calls("spawn", spawn={"task": "read it", "agent": "reader"}), {"text": "ok"}],
        "read it": [
            calls("spawn", spawn={"task": "copy"}),
            calls("spawn", spawn={"task": "as another", "agent": "runner"}),
            {"text": "read"},
        ],
        "*": [calls("shell"), {"text": "no shell here"}],
    }
    provider = RecordingProvider(script)
    spawn = spawn_tool(
        max_depth=3,
        agents=[
            Subagent("reader", "Reads untrusted files.", tools=("read",)),
            Subagent("runner", "Runs commands.", tools=("shell",)),
        ],
    )
    agent = create_agent(provider=provider, tools=[read, shell, spawn])
    stats = await agent.run("go")
    assert stats.status == "completed"
    offered: dict[str, list[str]] = {}
    for request in provider.requests:  # the tools of each conversation, by its task
        task = request.messages[0]["content"][0]["text"]
        offered.setdefault(task, sorted(t.name for t in request.tools))
    assert offered == {
        "go": ["read", "shell", "spawn"],
        "read it": ["read", "spawn"],
        "copy": ["read", "spawn"],  # a copy of the reader
        "as another": ["spawn"],  # the runner, but only with what the reader has
    }

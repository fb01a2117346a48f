"""Replay semantics, on a memory journal shared by two runtimes (a crash without a process)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from tests.helpers import RecordingProvider, calls, results_after
from tether import Behavior, create_agent, tool
from tether.agent import Agent
from tether.durable import JournalMismatchError, MemoryJournal, deterministic_uuid, memory_runtime
from tether.durable.ids import IdSequence
from tether.session import INTERRUPTED_RESULT


class SimulatedCrash(BaseException):
    """Stands in for a process dying: escapes every `except Exception`."""


def make_agent(journal: MemoryJournal, provider: Any, tools: list[Any], **kw: Any) -> Agent:
    return create_agent(
        provider=provider,
        tools=tools,
        durable=memory_runtime(journal=journal, run_id="run-1"),
        **kw,
    )


async def test_a_replay_calls_neither_the_model_nor_the_tools() -> None:
    executions: list[str] = []

    @tool
    async def act(n: int) -> str:
        """Acts."""
        executions.append(f"act {n}")
        return f"acted {n}"

    script = [calls("act", act={"n": 1}), calls("act", act={"n": 2}), {"text": "done"}]
    journal = MemoryJournal()
    first = await make_agent(journal, RecordingProvider(script), [act]).run("go")
    provider = RecordingProvider(script)
    second_agent = make_agent(journal, provider, [act])
    second = await second_agent.run("go")
    assert executions == ["act 1", "act 2"]
    assert provider.requests == []
    assert second.to_json() == first.to_json()
    assert second_agent.durable.counters.live.total() == 0


async def test_ids_and_timestamps_are_replay_stable() -> None:
    journal = MemoryJournal()
    script = [calls("noop"), {"text": "done"}]

    @tool
    async def noop() -> str:
        """Does nothing."""
        return ""

    a = make_agent(journal, RecordingProvider(script), [noop])
    await a.run("go")
    b = make_agent(journal, RecordingProvider(script), [noop])
    await b.run("go")
    assert a.session is not None and b.session is not None
    assert [(t.id, t.created_at) for t in a.session.turns] == [
        (t.id, t.created_at) for t in b.session.turns
    ]


async def test_an_unsafe_tool_cut_off_by_a_crash_is_reported_as_interrupted() -> None:
    executions: list[str] = []
    crash = True

    @tool
    async def pay(amount: int) -> str:
        """Pays."""
        executions.append("pay")
        if crash:
            raise SimulatedCrash
        return "paid"

    script = [calls("pay", pay={"amount": 5}), {"text": "done"}]
    journal = MemoryJournal()
    with pytest.raises(SimulatedCrash):
        await make_agent(journal, RecordingProvider(script), [pay]).run("go")
    crash = False
    agent = make_agent(journal, RecordingProvider(script), [pay])
    stats = await agent.run("go")
    assert executions == ["pay"]
    assert stats.status == "completed"
    assert agent.session is not None
    result = results_after(agent.session.turns, 1)["call_0_0"]
    assert result == {
        "type": "tool_result",
        "tool_use_id": "call_0_0",
        "content": INTERRUPTED_RESULT,
        "is_error": True,
    }


async def test_a_safe_tool_cut_off_by_a_crash_runs_again() -> None:
    executions: list[str] = []

    @tool(replay="safe")
    async def read(path: str) -> str:
        """Reads."""
        executions.append(path)
        if len(executions) == 1:
            raise SimulatedCrash
        return "contents"

    script = [calls("read", read={"path": "a.txt"}), {"text": "done"}]
    journal = MemoryJournal()
    with pytest.raises(SimulatedCrash):
        await make_agent(journal, RecordingProvider(script), [read]).run("go")
    agent = make_agent(journal, RecordingProvider(script), [read])
    await agent.run("go")
    assert executions == ["a.txt", "a.txt"]
    assert agent.session is not None
    assert results_after(agent.session.turns, 1)["call_0_0"]["content"] == "contents"


async def test_a_crash_inside_a_parallel_group_interrupts_only_unfinished_calls() -> None:
    runs: dict[str, int] = {}
    a_done = asyncio.Event()

    @tool(concurrency_safe=True)
    async def job(name: str) -> str:
        """A job."""
        runs[name] = runs.get(name, 0) + 1
        if runs[name] == 1 and name == "b":
            await a_done.wait()
            raise SimulatedCrash
        if runs[name] == 1 and name == "c":
            await asyncio.Event().wait()  # still running when the process dies
        a_done.set()
        return f"{name} ok"

    script = [
        {"tool_calls": [{"name": "job", "input": {"name": n}} for n in "abc"]},
        {"text": "done"},
    ]
    journal = MemoryJournal()
    behavior = Behavior(max_concurrent_tools=3)
    with pytest.raises(BaseExceptionGroup) as crashed:
        await make_agent(journal, RecordingProvider(script), [job], behavior=behavior).run("go")
    assert crashed.group_contains(SimulatedCrash)
    agent = make_agent(journal, RecordingProvider(script), [job], behavior=behavior)
    await agent.run("go")
    assert agent.session is not None
    contents = [r["content"] for r in results_after(agent.session.turns, 1).values()]
    assert contents == ["a ok", INTERRUPTED_RESULT, INTERRUPTED_RESULT]
    assert runs == {"a": 1, "b": 1, "c": 1}


async def test_replay_done_fires_once_when_the_run_goes_live() -> None:
    script = [calls("noop"), calls("noop"), {"text": "done"}]
    fired: list[int] = []
    count = 0

    @tool
    async def noop() -> str:
        """Crashes on its second call in the first process."""
        nonlocal count
        count += 1
        if count == 2:
            raise SimulatedCrash
        return ""

    journal = MemoryJournal()
    with pytest.raises(SimulatedCrash):
        await make_agent(journal, RecordingProvider(script), [noop]).run("go")
    agent = make_agent(
        journal, RecordingProvider(script), [noop], hooks={"replay:done": lambda p: fired.append(1)}
    )
    await agent.run("go")
    assert fired == [1]
    fresh: list[int] = []
    other = create_agent(
        provider=RecordingProvider([{"text": "x"}]),
        hooks={"replay:done": lambda p: fresh.append(1)},
    )
    await other.run("hi")
    assert fresh == []  # nothing replayed, so no transition


async def test_hooks_about_work_do_not_fire_again_on_replay() -> None:
    seen: list[str] = []
    hooks = {
        "tool:before": lambda p: seen.append("tool:before"),
        "turn:after": lambda p: seen.append("turn:after"),
    }

    @tool
    async def noop() -> str:
        """Noop."""
        return ""

    script = [calls("noop"), {"text": "done"}]
    journal = MemoryJournal()
    await make_agent(journal, RecordingProvider(script), [noop], hooks=hooks).run("go")
    assert seen == ["turn:after", "tool:before", "turn:after"]
    await make_agent(journal, RecordingProvider(script), [noop], hooks=hooks).run("go")
    assert seen == ["turn:after", "tool:before", "turn:after"]


async def test_a_changed_program_fails_with_a_journal_mismatch_naming_the_step() -> None:
    @tool
    async def noop() -> str:
        """Noop."""
        return ""

    journal = MemoryJournal()
    await make_agent(journal, RecordingProvider([calls("noop"), {}]), [noop]).run("go")
    # The same journal under a program that reads the clock once more before the run.
    changed = make_agent(journal, RecordingProvider([calls("noop"), {}]), [noop])
    await changed.durable.now()
    with pytest.raises(JournalMismatchError) as caught:
        await changed.run("go")
    assert caught.value.expected == "clock:2" and caught.value.found == "model:0:0"
    assert "journal mismatch" in str(caught.value) and "step 1" in str(caught.value)


@pytest.mark.parametrize(("first", "second"), [(1, 10), (10, 1)])
async def test_a_replay_stops_where_the_run_stopped_whatever_the_budget_says_now(
    first: int, second: int
) -> None:
    """Whether a turn happens is journaled with the turn's model step: a replay under other
    budgets (a new version of the code) takes the path the run took, and calls nothing."""

    @tool
    async def noop() -> str:
        """Noop."""
        return ""

    script = [calls("noop"), calls("noop"), {"text": "done"}]
    journal = MemoryJournal()
    original = make_agent(journal, RecordingProvider(script), [noop], behavior={"max_turns": first})
    ran = await original.run("go")
    provider = RecordingProvider(script)
    replay = make_agent(journal, provider, [noop], behavior={"max_turns": second})
    replayed = await replay.run("go")
    assert ran.status == ("max_turns" if first == 1 else "completed")
    assert replayed.to_json() == ran.to_json() and provider.requests == []
    assert replay.durable.counters.live.total() == 0


def test_deterministic_uuid_is_a_pure_v4_shaped_uuid() -> None:
    a = deterministic_uuid("seed")
    assert a == deterministic_uuid("seed") != deterministic_uuid("seed2")
    assert a[14] == "4" and a[19] in "89ab"


def test_an_id_sequence_is_stable_unique_and_v4_shaped() -> None:
    def ids(seed: str) -> list[str]:
        sequence = IdSequence(seed)
        return [sequence.next() for _ in range(20_000)]

    run = ids("run-1")
    assert ids("run-1") == run and len(set(run)) == len(run)
    assert not set(run) & set(ids("run-2"))
    assert all(str(uuid.UUID(value)) == value and uuid.UUID(value).version == 4 for value in run)

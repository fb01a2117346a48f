"""Messages for a running agent (`MemoryInbox`): taken at turn boundaries, journaled, replayed."""

from __future__ import annotations

from typing import Any

from tests.helpers import RecordingProvider, calls
from tether import create_agent, tool
from tether.agent import Agent, MemoryInbox
from tether.durable import MemoryJournal, memory_runtime


def make_agent(journal: MemoryJournal, provider: Any, tools: list[Any], inbox: Any) -> Agent:
    durable = memory_runtime(journal=journal, run_id="run-1")
    return create_agent(provider=provider, tools=tools, durable=durable, inbox=inbox)


def texts(content: list[dict[str, Any]]) -> list[str]:
    return [b["text"] for b in content if b["type"] == "text"]


async def test_a_message_posted_while_a_tool_runs_comes_before_the_next_model_call() -> None:
    inbox = MemoryInbox()

    @tool
    async def deploy() -> str:
        """Deploys."""
        inbox.post("use the blue cluster")  # a person writes while the call runs
        return "deployed"

    provider = RecordingProvider([calls("deploy"), {"text": "done"}])
    journal = MemoryJournal()
    agent = make_agent(journal, provider, [deploy], inbox)
    stats = await agent.run("deploy it")
    assert stats.status == "completed" and stats.turns == 2
    assert agent.session is not None
    results, message = agent.session.turns[2:4]
    assert [b["type"] for b in results.content] == ["tool_result"]
    assert (message.role, texts(message.content)) == ("user", ["use the blue cluster"])
    # The model's second request carries the message after the tool result: the step that
    # would have called the model looked at the inbox first, and journaled that instead.
    assert [m["role"] for m in provider.requests[1].messages[-2:]] == ["user", "user"]
    assert texts(provider.requests[1].messages[-1]["content"]) == ["use the blue cluster"]
    assert journal.names()[-3:] == ["model:1:0", "inbox:0", "model:1:1"]


async def test_a_message_after_the_answer_is_a_follow_up() -> None:
    inbox = MemoryInbox()
    inbox.post("and the changelog?")
    provider = RecordingProvider([{"text": "notes written"}, {"text": "changelog written"}])
    agent = make_agent(MemoryJournal(), provider, [], inbox)
    stats = await agent.run("write the notes")
    assert (stats.status, stats.text, stats.turns) == ("completed", "changelog written", 2)
    assert agent.session is not None
    assert [(t.role, texts(t.content)) for t in agent.session.turns] == [
        ("user", ["write the notes"]),
        ("assistant", ["notes written"]),
        ("user", ["and the changelog?"]),
        ("assistant", ["changelog written"]),
    ]


async def test_a_replay_sees_the_same_messages_at_the_same_places() -> None:
    journal = MemoryJournal()
    inbox = MemoryInbox()
    executions = []

    @tool
    async def step(n: int) -> str:
        """Steps."""
        executions.append(n)
        if n == 1:
            inbox.post("go faster")
        return f"step {n}"

    script = [calls("step", step={"n": 1}), calls("step", step={"n": 2}), {"text": "done"}]
    first = make_agent(journal, RecordingProvider(script), [step], inbox)
    await first.run("go")
    # A replay with a different message waiting: the journal decides, nothing is taken twice,
    # and the new message stays for a later run.
    later = MemoryInbox()
    later.post("a message for later")
    provider = RecordingProvider(script)
    second = make_agent(journal, provider, [step], later)
    await second.run("go")
    assert executions == [1, 2] and provider.requests == []
    assert first.session is not None and second.session is not None
    assert [t.content for t in second.session.turns] == [t.content for t in first.session.turns]
    assert await later.take(memory_runtime(), "check") == ["a message for later"]


async def test_without_an_inbox_the_journal_is_unchanged() -> None:
    journal = MemoryJournal()
    await make_agent(journal, RecordingProvider([{"text": "hi"}]), [], None).run("hello")
    names = journal.names()
    assert names and not [name for name in names if name.startswith("inbox:")]


async def test_quick_tool_turns_look_at_the_inbox_once_a_second_and_the_answer_always(
    monkeypatch: Any,
) -> None:
    journal = MemoryJournal()
    inbox = MemoryInbox()

    @tool
    async def step(n: int) -> str:
        """Steps."""
        if n == 2:
            inbox.post("use the blue cluster")
        return f"step {n}"

    script = [*(calls("step", step={"n": n}) for n in range(1, 5)), {"text": "done"}]
    script.append({"text": "done, blue"})
    agent = make_agent(journal, RecordingProvider(script), [step], inbox)
    stats = await agent.run("go")
    # The first boundary looks (in the next model step): nothing yet. The next ones come
    # within a second of it. The answer's step looks and finds the message: a take, and a
    # follow-up, whose answer's look finds nothing. A look costs no step of its own.
    assert [n for n in journal.names() if n.startswith("inbox:")] == ["inbox:4"]
    assert (stats.status, stats.text) == ("completed", "done, blue")
    assert agent.session is not None
    assert [texts(t.content) for t in agent.session.turns[-3:]] == [
        ["done"],
        ["use the blue cluster"],
        ["done, blue"],
    ]

    # Turns a second apart look at every boundary: the message follows the tool's results.
    monkeypatch.setattr("tether.agent.loop.STEERING_EVERY_MS", 0.0)
    journal, inbox = MemoryJournal(), MemoryInbox()
    agent = make_agent(journal, RecordingProvider(script), [step], inbox)
    await agent.run("go")
    assert [n for n in journal.names() if n.startswith("inbox:")] == ["inbox:1"]
    assert agent.session is not None
    assert texts(agent.session.turns[5].content) == ["use the blue cluster"]
    assert [t.role for t in agent.session.turns[4:7]] == ["user", "user", "assistant"]

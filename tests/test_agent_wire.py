"""The agent loop with the real Anthropic and OpenAI SDK clients against a local server that
speaks their wire formats."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.model_server import ErrorReply, ModelServer, Reply, ToolCall
from tether import create_agent, tool
from tether.durable import sqlite_runtime
from tether.providers import anthropic, openai
from tether.providers.base import Provider
from tether.session import create_session

KEY = "sk-test-wire-0123456789"


@tool(replay="safe")
async def echo(text: str) -> str:
    """Echo."""
    return text.upper()


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as running:
        yield running


@pytest.fixture(params=["anthropic", "openai"])
def wire(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def provider_for(wire: str, server: ModelServer) -> Provider:
    if wire == "anthropic":
        return anthropic("claude-sonnet-4-6", api_key=KEY, base_url=server.anthropic_url)
    return openai("gpt-4o", api_key=KEY, base_url=server.openai_url)


def tool_result_sent(wire: str, body: dict[str, object]) -> str:
    messages = body["messages"]
    assert isinstance(messages, list)
    if wire == "anthropic":
        block = messages[-1]["content"][0]
        assert block["type"] == "tool_result"
        return str(block["content"])
    tool_message = next(m for m in messages if m["role"] == "tool")
    return str(tool_message["content"])


async def test_a_tool_using_run_over_the_wire(wire: str, server: ModelServer) -> None:
    server.script(
        Reply(text=["Let me ", "echo."], tool_calls=[ToolCall("echo", {"text": "hi"})]),
        Reply(text=["It said ", "HI."], input_tokens=30, output_tokens=4),
    )
    deltas: list[str] = []
    agent = create_agent(
        provider=provider_for(wire, server),
        tools=[echo],
        hooks={"stream:text": lambda p: deltas.append(p["delta"])},
    )
    stats = await agent.run("echo hi")
    assert stats.status == "completed" and stats.text == "It said HI."
    assert "".join(deltas) == "Let me echo.It said HI."
    assert len(server.requests) == 2
    assert tool_result_sent(wire, server.requests[1].body) == "HI"
    assert stats.input_tokens == 40


async def test_a_429_is_retried_by_the_loop_then_succeeds(wire: str, server: ModelServer) -> None:
    server.script(ErrorReply(429, "rate limited, slow down", retry_after="0"), Reply(text=["ok"]))
    agent = create_agent(provider=provider_for(wire, server))
    stats = await agent.run("hi")
    assert stats.status == "completed" and stats.text == "ok"
    assert len(server.requests) == 2  # one per attempt: the SDK itself does not retry
    assert agent.durable.counters.live["sleep"] == 1


async def test_a_400_ends_the_run_with_a_clear_error(wire: str, server: ModelServer) -> None:
    server.script(ErrorReply(400, "messages: field required", error_type="invalid_request_error"))
    agent = create_agent(provider=provider_for(wire, server))
    stats = await agent.run("hi")
    assert stats.status == "error"
    assert stats.error is not None and "messages: field required" in stats.error
    assert "400" in stats.error and KEY not in stats.error
    assert len(server.requests) == 1


async def test_a_resumed_run_does_not_call_the_model_again(
    wire: str, server: ModelServer, tmp_path: Path
) -> None:
    server.script(Reply(tool_calls=[ToolCall("echo", {"text": "x"})]), Reply(text=["done"]))
    for attempt in range(2):
        with sqlite_runtime(tmp_path / "j.db", "run") as durable:
            assert durable.stores.session is not None
            session = await create_session(id="s", store=durable.stores.session)
            agent = create_agent(
                provider=provider_for(wire, server), tools=[echo], durable=durable, session=session
            )
            stats = await agent.run("go")
            assert stats.status == "completed", (attempt, stats.error)
    assert len(server.requests) == 2

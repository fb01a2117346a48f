"""The agent loop with the real Anthropic and OpenAI SDK clients against a local server that
speaks their wire formats."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.model_server import ErrorReply, ModelServer, Reply, ToolCall
from tether import create_agent, tool
from tether.durable import sqlite_runtime
from tether.errors import ConfigError
from tether.providers import Cooldown, anthropic, openai
from tether.providers.base import Pricing, Provider
from tether.session import create_session
from tether.spec import parse_agent
from tether.spec.assemble import fallbacks_from_spec, provider_from_spec

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


async def test_a_structured_output_over_the_wire(wire: str, server: ModelServer) -> None:
    schema = {
        "type": "object",
        "properties": {"verdict": {"type": "string"}, "score": {"type": "number"}},
        "required": ["verdict", "score"],
    }
    server.script(
        Reply(text=["Looks fine."]),  # text only: told to use the tool
        Reply(tool_calls=[ToolCall("final_answer", {"verdict": "ok", "score": 0.9})]),
    )
    agent = create_agent(provider=provider_for(wire, server), output=schema)
    stats = await agent.run("judge")
    assert (stats.status, stats.output) == ("completed", {"verdict": "ok", "score": 0.9})
    sent = server.requests[0].body["tools"]
    if wire == "anthropic":
        assert [(t["name"], t["input_schema"]) for t in sent] == [("final_answer", schema)]
    else:
        assert [(t["function"]["name"], t["function"]["parameters"]) for t in sent] == [
            ("final_answer", schema)
        ]
    assert len(server.requests) == 2
    required = {"type": "any"} if wire == "anthropic" else "required"
    assert [r.body.get("tool_choice") for r in server.requests] == [required, required]


async def test_an_output_with_extended_thinking_leaves_the_tool_to_the_prompt(
    server: ModelServer,
) -> None:
    server.script(Reply(tool_calls=[ToolCall("final_answer", {"value": 1})]))
    agent = create_agent(
        provider=provider_for("anthropic", server),
        output={"type": "integer"},
        behavior={"thinking_budget": 1024},
    )
    stats = await agent.run("count")
    assert (stats.status, stats.output) == ("completed", 1)
    [request] = server.requests
    assert "tool_choice" not in request.body and request.body["thinking"]["budget_tokens"] == 1024


async def test_a_429_is_retried_by_the_loop_then_succeeds(wire: str, server: ModelServer) -> None:
    server.script(ErrorReply(429, "rate limited, slow down", retry_after="0"), Reply(text=["ok"]))
    agent = create_agent(provider=provider_for(wire, server))
    stats = await agent.run("hi")
    assert stats.status == "completed" and stats.text == "ok"
    assert len(server.requests) == 2  # one per attempt: the SDK itself does not retry
    assert "tool_choice" not in server.requests[0].body  # no output: the model may answer text
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


# Fallback models: the real SDK clients of both providers against one server, so each request's
# path says which model it went to.
PRIMARY, FALLBACK = "/v1/messages", "/chat/completions"


def models_asked(server: ModelServer) -> list[str]:
    return [PRIMARY if r.path.endswith(PRIMARY) else FALLBACK for r in server.requests]


def with_fallback(server: ModelServer, **options: object) -> dict[str, object]:
    return {
        "provider": anthropic("claude-sonnet-4-6", api_key=KEY, base_url=server.anthropic_url),
        "fallbacks": [
            openai(
                "gpt-4o",
                api_key=KEY,
                base_url=server.openai_url,
                pricing=Pricing(input_per_mtok=1_000_000, output_per_mtok=0),
            )
        ],
        **options,
    }


async def test_an_overloaded_model_falls_back_to_the_next_at_once(server: ModelServer) -> None:
    server.script(
        ErrorReply(529, "Overloaded", "overloaded_error"),
        Reply(text=["Let me echo."], tool_calls=[ToolCall("echo", {"text": "hi"})]),
        Reply(text=["It said HI."]),
    )
    events: list[dict[str, object]] = []
    agent = create_agent(
        **with_fallback(server, tools=[echo]),  # type: ignore[arg-type]
        hooks={"turn:error": lambda p: events.append(p)},
    )
    stats = await agent.run("echo hi")
    assert stats.status == "completed" and stats.text == "It said HI."
    # The turn that failed went on to the fallback without a backoff; the next one starts
    # from the first model again.
    assert models_asked(server) == [PRIMARY, FALLBACK, PRIMARY]
    assert agent.durable.counters.live["sleep"] == 0
    # the fallback's price for its call (10 input tokens at $1 each), the first's for the answer
    assert 10.0 < stats.cost_usd < 10.001
    assert [(e["provider"], e["model"]) for e in events] == [("anthropic", "claude-sonnet-4-6")]
    done = []
    async for event in agent.events():
        if event["type"] == "model_done":
            done.append(event)
        if event["type"] == "run_ended":
            break
    assert [(e["provider"], e["model"]) for e in done] == [
        ("openai", "gpt-4o"),
        ("anthropic", "claude-sonnet-4-6"),
    ]


async def test_when_every_model_fails_the_loop_backs_off_and_starts_again_from_the_first(
    server: ModelServer,
) -> None:
    server.script(
        ErrorReply(429, "slow down", retry_after="0"),
        ErrorReply(503, "unavailable"),
        Reply(text=["ok"]),
    )
    agent = create_agent(**with_fallback(server))  # type: ignore[arg-type]
    stats = await agent.run("hi")
    assert stats.status == "completed" and stats.text == "ok"
    assert models_asked(server) == [PRIMARY, FALLBACK, PRIMARY]
    assert agent.durable.counters.live["sleep"] == 1


async def test_a_final_failure_of_the_last_model_ends_the_run(server: ModelServer) -> None:
    # Even a failure the first model would not retry goes on to the next one (a bad key, a
    # request too large for it); the last one's decides.
    server.script(
        ErrorReply(401, "invalid x-api-key", "authentication_error"),
        ErrorReply(400, "model not found", "invalid_request_error"),
    )
    agent = create_agent(**with_fallback(server))  # type: ignore[arg-type]
    stats = await agent.run("hi")
    assert stats.status == "error" and stats.error is not None
    assert "model not found" in stats.error and KEY not in stats.error
    assert models_asked(server) == [PRIMARY, FALLBACK]
    assert agent.durable.counters.live["sleep"] == 0


async def test_a_resumed_run_asks_the_models_its_journal_asked(
    server: ModelServer, tmp_path: Path
) -> None:
    server.script(
        ErrorReply(500, "internal"),
        Reply(tool_calls=[ToolCall("echo", {"text": "x"})]),
        Reply(text=["done"]),
    )
    for attempt in range(2):
        with sqlite_runtime(tmp_path / "j.db", "run") as durable:
            assert durable.stores.session is not None
            session = await create_session(id="s", store=durable.stores.session)
            agent = create_agent(
                **with_fallback(server, tools=[echo], durable=durable, session=session)  # type: ignore[arg-type]
            )
            stats = await agent.run("go")
            assert stats.status == "completed", (attempt, stats.error)
    assert models_asked(server) == [PRIMARY, FALLBACK, PRIMARY]  # none again on the replay
    # A journal that went on to a fallback needs one to replay: a clear error, nothing lost.
    with sqlite_runtime(tmp_path / "j.db", "run") as durable:
        assert durable.stores.session is not None
        session = await create_session(id="s", store=durable.stores.session)
        agent = create_agent(
            provider=anthropic("claude-sonnet-4-6", api_key=KEY, base_url=server.anthropic_url),
            tools=[echo],
            durable=durable,
            session=session,
        )
        with pytest.raises(ConfigError, match="moved model:0 on to fallback model 1"):
            await agent.run("go")
    assert len(server.requests) == 3


async def test_a_model_that_keeps_failing_is_skipped_until_its_cooldown_ends(
    server: ModelServer, tmp_path: Path
) -> None:
    clock = [0.0]

    @tool(replay="safe")
    async def wait_a_minute() -> str:
        """Moves the cooldown's clock on by a minute."""
        clock[0] += 61
        return "later"

    server.script(
        ErrorReply(529, "Overloaded", "overloaded_error"),
        Reply(tool_calls=[ToolCall("echo", {"text": "a"})]),
        ErrorReply(503, "unavailable"),  # its second failure in a row: skipped for 60 s
        Reply(tool_calls=[ToolCall("echo", {"text": "b"})]),
        Reply(tool_calls=[ToolCall("wait_a_minute", {})]),  # the fallback, asked at once
        Reply(tool_calls=[ToolCall("echo", {"text": "c"})]),  # the first again, a minute on
        Reply(text=["done"]),
    )
    skipped: list[dict[str, object]] = []
    for attempt in range(2):
        with sqlite_runtime(tmp_path / "j.db", "run") as durable:
            assert durable.stores.session is not None
            session = await create_session(id="s", store=durable.stores.session)
            agent = create_agent(
                **with_fallback(server, tools=[echo, wait_a_minute], durable=durable),  # type: ignore[arg-type]
                session=session,
                # a new one on the resume: what the first attempt learned is gone with it
                cooldown=Cooldown(failures=2, seconds=60, clock=lambda: clock[0]),
                hooks={"turn:error": lambda p: skipped.extend([p] if p.get("skipped") else [])},
            )
            stats = await agent.run("go")
            assert (stats.status, stats.text) == ("completed", "done"), attempt
    assert models_asked(server) == [
        PRIMARY,
        FALLBACK,
        PRIMARY,
        FALLBACK,
        FALLBACK,
        PRIMARY,
        PRIMARY,
    ]
    assert [(p["turn"], p["model"]) for p in skipped] == [(2, "claude-sonnet-4-6")]
    assert "cooling down for 60 s more after failing 2 calls in a row" in str(skipped[0]["error"])
    # The resume asked no model again: the skip is in the journal, not in the Cooldown.
    assert len(server.requests) == 7


async def test_a_model_that_hangs_past_its_timeout_hands_the_call_to_the_next(
    server: ModelServer,
) -> None:
    # As the spec builds them: the first model waits 1 s for its stream, not the SDK's 10 min.
    hung = Reply(text=["never"], hold_after=0)
    server.script(hung, Reply(text=["from the fallback"]))
    spec = parse_agent(
        {
            "apiVersion": "tether.dev/v1alpha1",
            "kind": "DurableAgent",
            "metadata": {"name": "a"},
            "spec": {
                "model": {
                    "provider": "anthropic",
                    "name": "claude-sonnet-4-6",
                    "baseUrl": server.anthropic_url,
                    "timeout": "1s",
                    "fallbacks": [
                        {"provider": "openai", "name": "gpt-4o", "baseUrl": server.openai_url}
                    ],
                },
            },
        }
    ).spec
    env = {"ANTHROPIC_API_KEY": KEY, "OPENAI_API_KEY": KEY}
    agent = create_agent(
        provider=provider_from_spec(spec, KEY), fallbacks=fallbacks_from_spec(spec, env)
    )
    started = time.monotonic()
    try:
        stats = await agent.run("hi")
    finally:
        hung.release.set()
    assert stats.status == "completed" and stats.text == "from the fallback"
    assert 1 <= time.monotonic() - started < 10
    assert models_asked(server) == [PRIMARY, FALLBACK]

"""The Anthropic and OpenAI providers, with the official SDK clients, against a local HTTP server
that speaks their wire formats (tests/fakes/model_server.py)."""

from __future__ import annotations

import copy
import json
import socket
import traceback
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.fakes.model_server import ErrorReply, ModelServer, Reply, ToolCall
from tether.messages import ImageBlock, Message, text_block, tool_result, user_message
from tether.providers.anthropic_provider import AnthropicProvider
from tether.providers.anthropic_provider import default_pricing as claude_pricing
from tether.providers.base import (
    ContextWindowExceededError,
    ModelRequest,
    Pricing,
    ProviderError,
)
from tether.providers.openai_provider import OpenAIProvider
from tether.providers.openai_provider import default_pricing as openai_pricing
from tether.tools.base import ToolSpec

API_KEY = "sk-test-SECRET-5f1e2d3c4b5a"
CLAUDE = "claude-sonnet-4-6"  # not on the SDK's deprecation list, so no warning per call
GPT = "gpt-4o"

WEATHER = ToolSpec(
    name="weather",
    description="Current weather of a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)
CLOCK = ToolSpec(name="clock", description="The time.")


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as running:
        yield running


@pytest.fixture
async def claude(server: ModelServer) -> AsyncIterator[AnthropicProvider]:
    provider = AnthropicProvider(CLAUDE, API_KEY, server.anthropic_url, timeout=20)
    yield provider
    await provider.aclose()


@pytest.fixture
async def gpt(server: ModelServer) -> AsyncIterator[OpenAIProvider]:
    provider = OpenAIProvider(GPT, API_KEY, server.openai_url, timeout=20)
    yield provider
    await provider.aclose()


@pytest.fixture(params=["anthropic", "openai"])
def provider(
    request: pytest.FixtureRequest, claude: AnthropicProvider, gpt: OpenAIProvider
) -> AnthropicProvider | OpenAIProvider:
    return claude if request.param == "anthropic" else gpt


class TextSink:
    def __init__(self) -> None:
        self.deltas: list[str] = []

    async def __call__(self, delta: str) -> None:
        self.deltas.append(delta)


def ask(text: str = "hi", **kwargs: Any) -> ModelRequest:
    return ModelRequest(messages=[user_message(text)], **kwargs)


def weather_conversation() -> list[Message]:
    """A user question, the assistant's two tool calls, and the user's two results + text."""
    return [
        user_message("Weather in Paris and Oslo?"),
        {
            "role": "assistant",
            "content": [
                text_block("Checking."),
                {"type": "tool_use", "id": "call_a", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_b", "name": "weather", "input": {"city": "Oslo"}},
            ],
        },
        {
            "role": "user",
            "content": [
                tool_result("call_a", "18C and sunny"),
                tool_result("call_b", "station offline", is_error=True),
                text_block("Be brief."),
            ],
        },
    ]


# --- text and streaming ----------------------------------------------------------------------


async def test_text_deltas_reach_on_text_in_order(
    server: ModelServer, provider: AnthropicProvider | OpenAIProvider
) -> None:
    server.script(Reply(text=["Hel", "lo, ", "world"]))
    sink = TextSink()

    response = await provider.complete(ask(), on_text=sink)

    assert sink.deltas == ["Hel", "lo, ", "world"]
    assert response.content == [{"type": "text", "text": "Hello, world"}]
    assert response.stop_reason == "end_turn"
    assert len(server.requests) == 1
    assert server.requests[0].body["stream"] is True


async def test_anthropic_request_shape(server: ModelServer, claude: AnthropicProvider) -> None:
    server.script(Reply(text=["ok"]))

    await claude.complete(ask("hello", system="Be terse.", tools=[WEATHER], max_output_tokens=99))

    sent = server.requests[0]
    assert sent.path == "/v1/messages"
    assert sent.body["model"] == CLAUDE
    assert sent.body["max_tokens"] == 99
    assert sent.body["system"] == "Be terse."
    assert sent.body["messages"] == [{"role": "user", "content": [text_block("hello")]}]
    assert sent.body["tools"] == [
        {
            "name": "weather",
            "description": "Current weather of a city.",
            "input_schema": WEATHER.input_schema,
        }
    ]
    assert "thinking" not in sent.body
    assert "anthropic-version" in sent.headers


async def test_openai_request_shape(server: ModelServer, gpt: OpenAIProvider) -> None:
    server.script(Reply(text=["ok"]))

    await gpt.complete(ask("hello", system="Be terse.", tools=[WEATHER], max_output_tokens=99))

    sent = server.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.body["model"] == GPT
    assert sent.body["stream_options"] == {"include_usage": True}
    # A custom base_url means a compatible server: the widely supported `max_tokens`.
    assert sent.body["max_tokens"] == 99
    assert "max_completion_tokens" not in sent.body
    assert sent.body["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "hello"},
    ]
    assert sent.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Current weather of a city.",
                "parameters": WEATHER.input_schema,
            },
        }
    ]


# --- tool calls ------------------------------------------------------------------------------


async def test_anthropic_tool_call_and_thinking_are_assembled(
    server: ModelServer, claude: AnthropicProvider
) -> None:
    server.script(
        Reply(
            thinking=["Need the ", "weather."],
            signature="sig-123",
            text=["Let me check."],
            tool_calls=[ToolCall("weather", {"city": "Paris", "days": [1, 2]}, id="toolu_9")],
        )
    )
    sink = TextSink()

    response = await claude.complete(ask(tools=[WEATHER]), on_text=sink)

    assert response.content == [
        {"type": "thinking", "thinking": "Need the weather.", "signature": "sig-123"},
        {"type": "text", "text": "Let me check."},
        {
            "type": "tool_use",
            "id": "toolu_9",
            "name": "weather",
            "input": {"city": "Paris", "days": [1, 2]},
        },
    ]
    assert response.stop_reason == "tool_use"
    assert sink.deltas == ["Let me check."]  # thinking is not streamed as text


async def test_openai_tool_calls_are_assembled_by_index(
    server: ModelServer, gpt: OpenAIProvider
) -> None:
    server.script(
        Reply(
            tool_calls=[
                ToolCall("weather", {"city": "Paris"}, id="call_1"),
                ToolCall("clock", {}, id="call_2"),
            ]
        )
    )

    response = await gpt.complete(ask(tools=[WEATHER, CLOCK]))

    assert response.content == [
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "clock", "input": {}},
    ]
    assert response.stop_reason == "tool_use"


async def test_invalid_tool_arguments_are_kept_raw(
    server: ModelServer, provider: AnthropicProvider | OpenAIProvider
) -> None:
    server.script(Reply(tool_calls=[ToolCall("weather", raw_arguments='{"city": "Par')]))

    response = await provider.complete(ask(tools=[WEATHER]))

    [block] = response.content
    assert block["type"] == "tool_use"
    assert block["input"] == {"_raw_arguments": '{"city": "Par'}


# --- multi-turn conversion -------------------------------------------------------------------


async def test_anthropic_passes_tool_results_through(
    server: ModelServer, claude: AnthropicProvider
) -> None:
    conversation = weather_conversation()
    server.script(Reply(text=["Paris 18C; Oslo unknown."]))

    await claude.complete(ModelRequest(messages=conversation, tools=[WEATHER]))

    assert server.requests[0].body["messages"] == conversation


async def test_anthropic_drops_unsigned_thinking(
    server: ModelServer, claude: AnthropicProvider
) -> None:
    server.script(Reply(text=["ok"]))
    conversation: list[Message] = [
        user_message("q"),
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "from elsewhere"}, text_block("a")],
        },
        user_message("q2"),
    ]

    await claude.complete(ModelRequest(messages=conversation))

    assert server.requests[0].body["messages"][1]["content"] == [text_block("a")]


async def test_openai_converts_tool_calls_and_results(
    server: ModelServer, gpt: OpenAIProvider
) -> None:
    server.script(Reply(text=["Paris 18C; Oslo unknown."]))

    await gpt.complete(ModelRequest(messages=weather_conversation(), tools=[WEATHER]))

    sent = server.requests[0].body["messages"]
    assert sent[0] == {"role": "user", "content": "Weather in Paris and Oslo?"}
    assistant = sent[1]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == "Checking."
    assert [call["id"] for call in assistant["tool_calls"]] == ["call_a", "call_b"]
    assert assistant["tool_calls"][0]["type"] == "function"
    assert assistant["tool_calls"][0]["function"]["name"] == "weather"
    arguments = assistant["tool_calls"][0]["function"]["arguments"]
    assert isinstance(arguments, str)
    assert json.loads(arguments) == {"city": "Paris"}
    # One tool message per result, in order, before the rest of the user's message.
    assert sent[2:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "18C and sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "Error: station offline"},
        {"role": "user", "content": "Be brief."},
    ]


async def test_openai_sends_images_as_data_urls(server: ModelServer, gpt: OpenAIProvider) -> None:
    server.script(Reply(text=["a cat"]))
    image: ImageBlock = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAA"},
    }
    message: Message = {"role": "user", "content": [text_block("What is it?"), image]}

    await gpt.complete(ModelRequest(messages=[message]))

    assert server.requests[0].body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is it?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
            ],
        }
    ]


async def test_openai_sends_raw_arguments_back_unchanged(
    server: ModelServer, gpt: OpenAIProvider
) -> None:
    server.script(Reply(text=["ok"]))
    conversation: list[Message] = [
        user_message("q"),
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "call_x",
                    "name": "weather",
                    "input": {"_raw_arguments": "{oops"},
                }
            ],
        },
        {"role": "user", "content": [tool_result("call_x", "bad arguments", is_error=True)]},
    ]

    await gpt.complete(ModelRequest(messages=conversation))

    assistant = server.requests[0].body["messages"][1]
    assert assistant["content"] is None
    assert assistant["tool_calls"][0]["function"]["arguments"] == "{oops"


# --- prompt caching and thinking -------------------------------------------------------------


async def test_anthropic_cache_breakpoints(server: ModelServer, claude: AnthropicProvider) -> None:
    conversation = weather_conversation()
    original = copy.deepcopy(conversation)
    server.script(Reply(text=["ok"]))

    await claude.complete(
        ModelRequest(messages=conversation, system="Sys.", tools=[WEATHER, CLOCK], cache=True)
    )

    body = server.requests[0].body
    ephemeral = {"type": "ephemeral"}
    assert body["system"] == [{"type": "text", "text": "Sys.", "cache_control": ephemeral}]
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][-1]["cache_control"] == ephemeral
    last_message = body["messages"][-1]["content"]
    assert last_message[-1] == {**text_block("Be brief."), "cache_control": ephemeral}
    assert json.dumps(body).count("cache_control") == 3  # the API allows at most 4
    assert conversation == original  # the journaled messages are not touched


async def test_anthropic_no_cache_breakpoints_without_cache(
    server: ModelServer, claude: AnthropicProvider
) -> None:
    server.script(Reply(text=["ok"]))

    await claude.complete(
        ModelRequest(messages=weather_conversation(), system="Sys.", tools=[WEATHER])
    )

    assert "cache_control" not in json.dumps(server.requests[0].body)


async def test_anthropic_thinking_budget(server: ModelServer, claude: AnthropicProvider) -> None:
    server.script(Reply(text=["ok"]))

    await claude.complete(ask(thinking_budget=2048, max_output_tokens=1024))

    body = server.requests[0].body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["max_tokens"] > 2048  # room to answer after thinking
    assert "temperature" not in body


# --- usage and cost --------------------------------------------------------------------------


async def test_anthropic_usage_and_cost(server: ModelServer, claude: AnthropicProvider) -> None:
    server.script(
        Reply(
            text=["ok"],
            input_tokens=1000,
            output_tokens=500,
            cache_read_tokens=2000,
            cache_write_tokens=400,
        )
    )

    response = await claude.complete(ask())

    assert response.usage == {"input": 1000, "output": 500, "cache_read": 2000, "cache_write": 400}
    assert claude.pricing is not None
    expected = (1000 * 3 + 500 * 15 + 2000 * 0.3 + 400 * 3.75) / 1_000_000
    assert claude.pricing.cost(response.usage) == pytest.approx(expected)


async def test_openai_usage_excludes_cached_tokens_and_cost(
    server: ModelServer, gpt: OpenAIProvider
) -> None:
    # The server reports prompt_tokens=1300 of which 300 were cached.
    server.script(Reply(text=["ok"], input_tokens=1000, output_tokens=200, cache_read_tokens=300))

    response = await gpt.complete(ask())

    assert response.usage == {"input": 1000, "output": 200, "cache_read": 300}
    assert gpt.pricing is not None
    expected = (1000 * 2.5 + 200 * 10 + 300 * 1.25) / 1_000_000
    assert gpt.pricing.cost(response.usage) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("model", "rates"),
    [
        ("claude-sonnet-4-5", (3, 15)),
        ("claude-sonnet-4-20250514", (3, 15)),
        ("claude-haiku-4-5-20251001", (1, 5)),
        ("claude-opus-4-1", (15, 75)),
        ("claude-opus-4-5-20251101", (5, 25)),
        ("gpt-4o", (2.5, 10)),
        ("gpt-4o-mini-2024-07-18", (0.15, 0.6)),
        ("gpt-4.1", (2, 8)),
    ],
)
def test_known_model_prices(model: str, rates: tuple[float, float]) -> None:
    pricing = claude_pricing(model) if model.startswith("claude") else openai_pricing(model)
    assert pricing is not None
    assert (pricing.input_per_mtok, pricing.output_per_mtok) == rates


def test_unknown_models_have_no_price() -> None:
    assert claude_pricing("claude-3-opus-20240229") is None
    assert openai_pricing("llama3.1:8b") is None
    assert openai_pricing("gpt-4.1-nano") is None


def test_explicit_pricing_and_context_window_win() -> None:
    pricing = Pricing(input_per_mtok=1, output_per_mtok=2)
    provider = OpenAIProvider("llama3.1:8b", None, "http://127.0.0.1:9/v1", pricing=pricing)
    assert provider.pricing is pricing
    assert provider.context_window == 128_000
    assert AnthropicProvider(CLAUDE, API_KEY, context_window=1_000_000).context_window == 1_000_000


# --- errors ----------------------------------------------------------------------------------


async def test_rate_limit_is_retryable_after_one_request(
    server: ModelServer, provider: AnthropicProvider | OpenAIProvider
) -> None:
    server.script(ErrorReply(429, "Slow down.", "rate_limit_error", retry_after="7"))

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask())

    assert caught.value.retryable is True
    assert caught.value.retry_after == 7.0
    assert caught.value.status == 429
    assert caught.value.provider == provider.name
    assert len(server.requests) == 1  # max_retries=0: the SDK did not retry on its own


@pytest.mark.parametrize("status", [500, 503, 529])
async def test_server_errors_are_retryable(
    server: ModelServer, provider: AnthropicProvider | OpenAIProvider, status: int
) -> None:
    server.script(ErrorReply(status, "Internal trouble.", "overloaded_error"))

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask())

    assert caught.value.retryable is True
    assert caught.value.retry_after is None
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_client_errors_are_final_and_explain(
    server: ModelServer, provider: AnthropicProvider | OpenAIProvider, status: int
) -> None:
    server.script(ErrorReply(status, "messages.0.content: field required", "invalid_request_error"))

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask())

    assert not isinstance(caught.value, ContextWindowExceededError)
    assert caught.value.retryable is False
    assert caught.value.status == status
    assert "messages.0.content: field required" in str(caught.value)
    assert str(status) in str(caught.value)
    assert len(server.requests) == 1


async def test_anthropic_prompt_too_long(server: ModelServer, claude: AnthropicProvider) -> None:
    server.script(
        ErrorReply(
            400, "prompt is too long: 210000 tokens > 200000 maximum", "invalid_request_error"
        )
    )

    with pytest.raises(ContextWindowExceededError) as caught:
        await claude.complete(ask())

    assert caught.value.retryable is False
    assert "210000 tokens" in str(caught.value)


async def test_openai_context_length_exceeded(server: ModelServer, gpt: OpenAIProvider) -> None:
    server.script(
        ErrorReply(
            400,
            "This model's maximum context length is 128000 tokens.",
            "invalid_request_error",
            code="context_length_exceeded",
        )
    )

    with pytest.raises(ContextWindowExceededError) as caught:
        await gpt.complete(ask())

    assert caught.value.retryable is False
    assert caught.value.code == "context_length_exceeded"


async def test_api_key_never_appears_in_errors(
    server: ModelServer, provider: AnthropicProvider | OpenAIProvider
) -> None:
    server.script(ErrorReply(401, f"invalid x-api-key: {API_KEY}", "authentication_error"))

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask())

    assert caught.value.retryable is False
    assert "invalid x-api-key" in str(caught.value)
    assert API_KEY not in "".join(traceback.format_exception(caught.value))
    assert API_KEY not in repr(provider)


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (Reply(text=["partial ", "answer"], cut_after=3), None),  # the connection breaks
        (Reply(text=["partial ", "answer"], end_after=3), "stream_incomplete"),  # body ends
    ],
    ids=["broken", "ended"],
)
async def test_unfinished_stream_is_retryable(
    server: ModelServer,
    provider: AnthropicProvider | OpenAIProvider,
    reply: Reply,
    code: str | None,
) -> None:
    server.script(reply)

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask())

    assert caught.value.retryable is True
    if code is not None:
        assert caught.value.code == code
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("error_type", "retryable"),
    [("overloaded_error", True), ("api_error", True), ("invalid_request_error", False)],
)
async def test_error_event_inside_a_stream(
    server: ModelServer,
    provider: AnthropicProvider | OpenAIProvider,
    error_type: str,
    retryable: bool,
) -> None:
    server.script(ErrorReply(200, "Something broke mid-answer.", error_type, mid_stream=True))

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask())

    assert caught.value.retryable is retryable
    assert "Something broke mid-answer." in str(caught.value)
    assert len(server.requests) == 1


async def test_unreachable_server_is_retryable() -> None:
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    providers: list[AnthropicProvider | OpenAIProvider] = [
        AnthropicProvider(CLAUDE, API_KEY, f"http://127.0.0.1:{port}"),
        OpenAIProvider(GPT, API_KEY, f"http://127.0.0.1:{port}/v1"),
    ]
    for provider in providers:
        with pytest.raises(ProviderError) as caught:
            await provider.complete(ask())
        assert caught.value.retryable is True
        assert caught.value.code == "connection_error"
        await provider.aclose()


def test_missing_api_key_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)

    with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY"):
        AnthropicProvider(CLAUDE)
    with pytest.raises(ProviderError, match="OPENAI_API_KEY"):
        OpenAIProvider(GPT)
    # A compatible local server (Ollama, vLLM) needs no key.
    assert OpenAIProvider("llama3.1:8b", base_url="http://127.0.0.1:9/v1").model == "llama3.1:8b"

"""A real HTTP server that speaks the Anthropic Messages and OpenAI Chat Completions wire formats.

Tests point the official SDK clients at it. It answers from a queue of scripted replies and
records every request (path, headers, JSON body), so a test can assert on what the SDK sent and
on how many HTTP requests one call made.

    with ModelServer() as server:
        server.script(Reply(text=["Hel", "lo"]), ErrorReply(429, "slow down", retry_after="7"))
        provider = anthropic(base_url=server.anthropic_url, api_key="test")
        ...
        assert server.requests[0].body["model"] == "..."

Streaming responses use chunked transfer encoding, so `Reply(cut_after=n)` (close the connection
after n events, without the final chunk) looks to the client like a network failure mid-stream,
while `Reply(end_after=n)` ends the body properly but leaves the answer unfinished.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANTHROPIC_STOP_TO_OPENAI = {
    "end_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}


@dataclass
class ToolCall:
    name: str
    input: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    raw_arguments: str | None = None
    """Sent instead of `json.dumps(input)`: lets a test script invalid JSON."""

    def arguments(self) -> str:
        return self.raw_arguments if self.raw_arguments is not None else json.dumps(self.input)


@dataclass
class Reply:
    """One successful model answer, rendered in whichever wire format the request used."""

    text: list[str] = field(default_factory=list)
    """Text deltas, streamed in this order (joined for a non-streaming answer)."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    signature: str = ""
    input_tokens: int = 10
    """Uncached input tokens (the OpenAI rendering adds cache reads to prompt_tokens)."""
    output_tokens: int = 5
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    stop_reason: str | None = None
    """Anthropic-style; defaults to "tool_use" with tool calls, else "end_turn"."""
    cut_after: int | None = None
    """Break the connection after this many stream events (streaming only)."""
    end_after: int | None = None
    """End the stream body cleanly after this many events, as a server that gave up would."""
    hold_after: int | None = None
    """Stop after this many stream events until `release` is set (a model still answering)."""
    release: threading.Event = field(default_factory=threading.Event)

    def final_stop_reason(self) -> str:
        return self.stop_reason or ("tool_use" if self.tool_calls else "end_turn")


@dataclass
class ErrorReply:
    """An HTTP error with the provider's JSON error body."""

    status: int
    message: str
    error_type: str = "api_error"
    code: str | None = None
    """OpenAI's `error.code` (e.g. "context_length_exceeded")."""
    retry_after: str | None = None
    mid_stream: bool = False
    """Start a 200 stream, then send the error as an event in it (streaming requests only)."""


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    """Lower-cased header names."""
    body: dict[str, Any]


ScriptedReply = Reply | ErrorReply


class ModelServer:
    """The server, on 127.0.0.1 and a free port, serving from a background thread."""

    def __init__(self) -> None:
        self._replies: deque[ScriptedReply] = deque()
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._http.model_server = self  # type: ignore[attr-defined]
        # A short poll interval: shutdown() waits for the serving loop to notice it.
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: ScriptedReply) -> None:
        """Queue replies; each request takes the next one."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._replies)

    def start(self) -> ModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _take(self, request: RecordedRequest) -> ScriptedReply | None:
        with self._lock:
            self.requests.append(request)
            return self._replies.popleft() if self._replies else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, like the real APIs
    timeout = 10  # an idle keep-alive connection must not hold a thread forever

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep the test output clean

    def do_POST(self) -> None:
        try:
            self._answer()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (an aborted call): no one to tell

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        headers = {name.lower(): value for name, value in self.headers.items()}
        server: ModelServer = self.server.model_server  # type: ignore[attr-defined]
        reply = server._take(RecordedRequest(self.path, headers, body))
        wire = _wire_format(self.path)
        if wire is None:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})
        elif reply is None:
            self._send_error(wire, ErrorReply(500, "fake model server: no scripted reply left"))
        elif isinstance(reply, ErrorReply) and reply.mid_stream and body.get("stream"):
            self._send_error_event(wire, reply, body)
        elif isinstance(reply, ErrorReply):
            self._send_error(wire, reply)
        elif body.get("stream"):
            self._send_stream(wire, reply, body)
        else:
            render = _anthropic_message if wire == "anthropic" else _openai_completion
            self._send_json(200, render(reply, body))

    def _send_error(self, wire: str, error: ErrorReply) -> None:
        extra = {"retry-after": error.retry_after} if error.retry_after is not None else {}
        self._send_json(error.status, _error_body(wire, error), extra)

    def _send_error_event(self, wire: str, error: ErrorReply, body: dict[str, Any]) -> None:
        self._start_stream()
        if wire == "anthropic":
            first = next(_anthropic_events(Reply(), body))
            event = _sse("error", _error_body(wire, error))
        else:
            first = next(_openai_events(Reply(), body))
            event = f"data: {json.dumps(_error_body(wire, error))}\n\n"
        self._write_chunk(first.encode())
        self._write_chunk(event.encode())
        self._write_chunk(b"")

    def _send_json(self, status: int, payload: Any, extra: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _send_stream(self, wire: str, reply: Reply, body: dict[str, Any]) -> None:
        self._start_stream()
        events = (
            _anthropic_events(reply, body) if wire == "anthropic" else _openai_events(reply, body)
        )
        for count, event in enumerate(events):
            if reply.cut_after is not None and count >= reply.cut_after:
                self.close_connection = True  # no final chunk: the client sees a broken body
                return
            if reply.end_after is not None and count >= reply.end_after:
                break
            if count == reply.hold_after:
                reply.release.wait(120)
            self._write_chunk(event.encode())
        self._write_chunk(b"")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def _error_body(wire: str, error: ErrorReply) -> dict[str, Any]:
    if wire == "anthropic":
        return {"type": "error", "error": {"type": error.error_type, "message": error.message}}
    return {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": None,
            "code": error.code,
        }
    }


def _wire_format(path: str) -> str | None:
    if path.rstrip("/").endswith("/v1/messages"):
        return "anthropic"
    if path.rstrip("/").endswith("/chat/completions"):
        return "openai"
    return None


# --- Anthropic Messages ----------------------------------------------------------------------


def _anthropic_usage(reply: Reply) -> dict[str, int]:
    return {
        "input_tokens": reply.input_tokens,
        "output_tokens": reply.output_tokens,
        "cache_read_input_tokens": reply.cache_read_tokens,
        "cache_creation_input_tokens": reply.cache_write_tokens,
    }


def _anthropic_blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.thinking:
        thinking = "".join(reply.thinking)
        blocks.append({"type": "thinking", "thinking": thinking, "signature": reply.signature})
    if reply.text:
        blocks.append({"type": "text", "text": "".join(reply.text)})
    for n, call in enumerate(reply.tool_calls):
        blocks.append(
            {
                "type": "tool_use",
                "id": call.id or f"toolu_{n}",
                "name": call.name,
                "input": call.input,
            }
        )
    return blocks


def _anthropic_message(reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "fake"),
        "content": _anthropic_blocks(reply),
        "stop_reason": reply.final_stop_reason(),
        "stop_sequence": None,
        "usage": _anthropic_usage(reply),
    }


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def _anthropic_events(reply: Reply, body: dict[str, Any]) -> Iterator[str]:
    start = _anthropic_message(reply, body) | {"content": [], "stop_reason": None}
    start["usage"] = _anthropic_usage(reply) | {"output_tokens": 1}
    yield _sse("message_start", {"type": "message_start", "message": start})
    yield _sse("ping", {"type": "ping"})
    index = 0
    if reply.thinking:
        yield from _block_events(
            index,
            {"type": "thinking", "thinking": "", "signature": ""},
            [{"type": "thinking_delta", "thinking": piece} for piece in reply.thinking]
            + [{"type": "signature_delta", "signature": reply.signature}],
        )
        index += 1
    if reply.text:
        yield from _block_events(
            index,
            {"type": "text", "text": ""},
            [{"type": "text_delta", "text": piece} for piece in reply.text],
        )
        index += 1
    for n, call in enumerate(reply.tool_calls):
        arguments = call.arguments()
        half = len(arguments) // 2  # two pieces, as the API splits partial JSON anywhere
        yield from _block_events(
            index,
            {"type": "tool_use", "id": call.id or f"toolu_{n}", "name": call.name, "input": {}},
            [
                {"type": "input_json_delta", "partial_json": arguments[:half]},
                {"type": "input_json_delta", "partial_json": arguments[half:]},
            ],
        )
        index += 1
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": reply.final_stop_reason(), "stop_sequence": None},
            "usage": {"output_tokens": reply.output_tokens},
        },
    )
    yield _sse("message_stop", {"type": "message_stop"})


def _block_events(index: int, start: dict[str, Any], deltas: list[dict[str, Any]]) -> Iterator[str]:
    yield _sse(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": start},
    )
    for delta in deltas:
        yield _sse(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )
    yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})


# --- OpenAI Chat Completions -----------------------------------------------------------------


def _openai_usage(reply: Reply) -> dict[str, Any]:
    prompt = reply.input_tokens + reply.cache_read_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": reply.output_tokens,
        "total_tokens": prompt + reply.output_tokens,
        "prompt_tokens_details": {"cached_tokens": reply.cache_read_tokens},
    }


def _openai_tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [
        {
            "id": call.id or f"call_{n}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments()},
        }
        for n, call in enumerate(reply.tool_calls)
    ]


def _finish_reason(reply: Reply) -> str:
    stop = reply.final_stop_reason()
    return ANTHROPIC_STOP_TO_OPENAI.get(stop, stop)


def _openai_completion(reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(reply.text) or None}
    if reply.tool_calls:
        message["tool_calls"] = _openai_tool_calls(reply)
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(reply)}],
        "usage": _openai_usage(reply),
    }


def _openai_events(reply: Reply, body: dict[str, Any]) -> Iterator[str]:
    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        data = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": body.get("model", "fake"),
            "choices": choices,
            "usage": usage,
        }
        return f"data: {json.dumps(data)}\n\n"

    def delta(content: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": content, "finish_reason": finish}]

    yield chunk(delta({"role": "assistant", "content": ""}))
    for piece in reply.text:
        yield chunk(delta({"content": piece}))
    for n, call in enumerate(_openai_tool_calls(reply)):
        head = {"index": n, "id": call["id"], "type": "function"}
        head["function"] = {"name": call["function"]["name"], "arguments": ""}
        yield chunk(delta({"tool_calls": [head]}))
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        for piece in (arguments[:half], arguments[half:]):
            yield chunk(delta({"tool_calls": [{"index": n, "function": {"arguments": piece}}]}))
    yield chunk(delta({}, _finish_reason(reply)))
    if (body.get("stream_options") or {}).get("include_usage"):
        yield chunk([], _openai_usage(reply))
    yield "data: [DONE]\n\n"

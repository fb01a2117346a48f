"""`tether watch <session>`: follow a session's event stream in the terminal.

It reads the sidecar's `GET /v1/sessions/<session>/events` (Server-Sent Events) with a read token
it mints with the webhook secret, prints one line per step (model text as it streams), and
reconnects with `Last-Event-ID` when the connection drops, so nothing of a completed step is
missed or shown twice.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO
from urllib.parse import quote

import httpx2

from .webhooks import events_token

RECONNECT_SECONDS = 1.0


def events_url(sidecar: str, agent: str, session: str, secret: bytes, ttl: int = 3600) -> str:
    """The URL of a session's stream with a read token that works for `ttl` seconds."""
    token = events_token(secret, agent, session, int(time.time()) + ttl)
    return f"{sidecar.rstrip('/')}/v1/sessions/{quote(session, safe='')}/events?token={token}"


def sse_events(response: httpx2.Response) -> Iterator[dict[str, Any]]:
    """The events of an SSE response (the `data:` of each, as JSON)."""
    data: list[str] = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif not line and data:
            yield json.loads("\n".join(data))
            data = []


def follow(url: str, after: str | None = None) -> Iterator[dict[str, Any]]:
    """Every event of the stream at `url` after the id `after`, reconnecting where it left off
    whenever the connection drops; until the caller stops."""
    while True:
        headers = {"accept": "text/event-stream"}
        if after:
            headers["last-event-id"] = after
        try:
            with httpx2.stream("GET", url, headers=headers, timeout=None) as response:
                if response.status_code in (400, 401, 403, 404):
                    response.read()
                    raise SystemExit(f"tether watch: {response.status_code} {response.text}")
                for event in sse_events(response):
                    after = str(event.get("cursor") or event["id"])
                    yield event
        except httpx2.HTTPError:
            pass
        time.sleep(RECONNECT_SECONDS)


class Printer:
    """One line per step, model text as it streams, and what waits for a person."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out
        self.streaming = False

    def _line(self, text: str) -> None:
        if self.streaming:
            self.out.write("\n")
            self.streaming = False
        self.out.write(text + "\n")
        self.out.flush()

    def show(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "model_text":
            if not self.streaming:
                self.out.write("  model: ")
                self.streaming = True
            self.out.write(event.get("delta", ""))
            self.out.flush()
        elif kind == "model_restarted":
            self._line("  (the model call was cut off by a crash; it starts again)")
        elif kind == "run_started":
            self._line(f"run {event['run']} started")
        elif kind == "model_done":
            usage = event.get("usage") or {}
            calls = ", ".join(c["name"] for c in event.get("tool_calls", [])) or "no tool calls"
            tokens = sum(v for v in usage.values() if isinstance(v, int))
            self._line(f"turn {event.get('turn')}: {calls} ({tokens} tokens)")
        elif kind == "tool_started":
            self._line(f"  {event['tool']} running...")
        elif kind == "tool_finished":
            duration = event.get("duration_s")
            took = f" in {duration:.2f} s" if isinstance(duration, int | float) else ""
            self._line(f"  {event['tool']}: {event.get('outcome')}{took}")
        elif kind.endswith("_parked"):
            since = time.strftime("%H:%M:%S", time.localtime(event["at"] / 1000))
            self._line(f"  {event['tool']} waits for a person since {since}")
        elif kind in ("approval_resolved", "question_answered"):
            who = event.get("approver") or event.get("by") or "someone"
            verdict = "approved" if event.get("approved") else "answered"
            self._line(f"  {event['tool']} {verdict} by {who}")
        elif kind == "budget_warning":
            self._line(f"  budget: {event['spent']:.4g} of {event['limit']:.4g} {event['budget']}")
        elif kind == "run_ended":
            self._line(
                f"run {event['run']} {event['status']}: {event.get('turns')} turns, "
                f"{event.get('tokens')} tokens, ${event.get('cost_usd', 0):.4f}"
            )
        else:
            self._line(f"  {kind}")


def watch(url: str, *, after: str | None, as_json: bool, until_end: bool) -> int:
    printer = Printer()
    for event in follow(url, after):
        if as_json:
            print(json.dumps(event), flush=True)
        else:
            printer.show(event)
        if until_end and event["type"] == "run_ended":
            return 0 if event.get("status") == "completed" else 1
    return 0

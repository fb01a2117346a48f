"""`tether watch <session>`: follow a session's event stream in the terminal.

It reads the sidecar's `GET /v1/sessions/<session>/events` (Server-Sent Events) with a read token
it mints with the webhook secret, prints one line per step (model text as it streams), and
reconnects with `Last-Event-ID` when the connection drops, so nothing of a completed step is
missed or shown twice.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO
from urllib.parse import quote

import httpx2

from .webhooks import events_token

RECONNECT_SECONDS = 1.0
TICK_SECONDS = 1.0
"""How often the progress line of a terminal is redrawn."""


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


def duration(seconds: float) -> str:
    """`45s`, `3m12s`, `1h02m03s`."""
    minutes, secs = divmod(max(0, int(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Printer:
    """One line per step, model text as it streams, and what waits for a person.

    On a terminal it also keeps a progress line under them, redrawn in place (`\\r`) at each
    event and each `tick()`: the current turn, the model call or tools running, and the calls
    parked with how long they have waited. Piped, it writes only the lines of the steps.
    """

    def __init__(
        self,
        out: TextIO | None = None,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.out = out or sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self.clock = clock
        self.streaming = False
        self.turn: int | None = None
        self.thinking: float | None = None
        """When the model call going on started (epoch ms), until its first text."""
        self.running: dict[str, tuple[str, float]] = {}
        """The tools running: call id -> (tool, started at, epoch ms)."""
        self.parked: dict[str, tuple[str, float]] = {}
        """The calls waiting for a person: call id -> (tool, parked at, epoch ms)."""
        self.status = ""
        """The progress line on the screen ("" when none is)."""
        self._lock = threading.RLock()
        self._stop = threading.Event()

    def _clear(self) -> None:
        if self.status:
            self.out.write("\r\x1b[K")
            self.status = ""

    def _line(self, text: str) -> None:
        self._clear()
        if self.streaming:
            self.out.write("\n")
            self.streaming = False
        self.out.write(text + "\n")
        self.out.flush()

    def progress(self) -> str:
        """What is going on now, and for how long: "" when nothing is."""
        now = self.clock() * 1000
        parts = [
            f"{tool} waits for a person: {duration((now - at) / 1000)}"
            for tool, at in self.parked.values()
        ]
        parts += [
            f"{tool} running: {duration((now - at) / 1000)}"
            for call, (tool, at) in self.running.items()
            if call not in self.parked
        ]
        if self.thinking is not None:
            parts.append(f"the model is thinking: {duration((now - self.thinking) / 1000)}")
        if not parts:
            return ""
        turn = f"turn {self.turn} · " if self.turn is not None else ""
        return "  " + turn + " · ".join(parts)

    def tick(self) -> None:
        """Redraw the progress line (on a terminal, between lines of model text never)."""
        with self._lock:
            if not self.tty or self.streaming:
                return
            text = self.progress()[: shutil.get_terminal_size().columns - 1]
            if text != self.status:
                self.out.write(f"\r{text}\x1b[K")
                self.out.flush()
                self.status = text

    def start_ticker(self, every: float | None = None) -> None:
        """Tick every `every` seconds (`TICK_SECONDS`) in a thread of its own, events or not,
        until `close`; on a terminal only."""
        if self.tty:
            interval = every or TICK_SECONDS

            def run() -> None:
                while not self._stop.wait(interval):
                    self.tick()

            threading.Thread(target=run, name="tether-watch-ticker", daemon=True).start()

    def close(self) -> None:
        """Stop the ticker and take the progress line off the screen."""
        self._stop.set()
        with self._lock:
            self._clear()
            self.out.flush()

    def show(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._track(event)
            self._print(event)
            self.tick()

    def _track(self, event: dict[str, Any]) -> None:
        kind, call = event["type"], str(event.get("call_id"))
        if kind in ("run_started", "run_ended"):
            self.turn, self.thinking = None, None
            self.running.clear()
            self.parked.clear()
        elif kind == "model_started":
            self.turn, self.thinking = event.get("turn"), event.get("at")
        elif kind in ("model_text", "model_done", "model_restarted"):
            self.thinking = None
            self.turn = event.get("turn", self.turn)
        elif kind == "tool_started":
            self.running[call] = (event["tool"], event["at"])
        elif kind == "tool_finished":
            self.running.pop(call, None)
        elif kind.endswith("_parked"):
            self.parked[call] = (event["tool"], event["at"])

    def _print(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "model_text":
            if not self.streaming:
                self._clear()
                self.out.write("  model: ")
                self.streaming = True
            self.out.write(event.get("delta", ""))
            self.out.flush()
        elif kind == "model_restarted":
            self._line("  (the model call was cut off by a crash; it starts again)")
        elif kind == "run_started":
            self._line(f"run {event['run']} started")
        elif kind == "model_started":
            pass  # the progress line says it
        elif kind == "model_done":
            usage = event.get("usage") or {}
            calls = ", ".join(c["name"] for c in event.get("tool_calls", [])) or "no tool calls"
            tokens = sum(v for v in usage.values() if isinstance(v, int))
            self._line(f"turn {event.get('turn')}: {calls} ({tokens} tokens)")
        elif kind == "tool_started":
            self._line(f"  {event['tool']} running...")
        elif kind == "tool_finished":
            duration_s = event.get("duration_s")
            took = f" in {duration_s:.2f} s" if isinstance(duration_s, int | float) else ""
            self._line(f"  {event['tool']}: {event.get('outcome')}{took}")
        elif kind.endswith("_parked"):
            since = time.strftime("%H:%M:%S", time.localtime(event["at"] / 1000))
            self._line(f"  {event['tool']} waits for a person since {since}")
        elif kind in ("approval_resolved", "question_answered"):
            who = event.get("approver") or event.get("by") or "someone"
            verdict = "approved" if event.get("approved") else "answered"
            parked = self.parked.pop(str(event.get("call_id")), None)
            waited = f" after {duration((event['at'] - parked[1]) / 1000)}" if parked else ""
            self._line(f"  {event['tool']} {verdict} by {who}{waited}")
        elif kind == "budget_warning":
            self._line(f"  budget: {event['spent']:.4g} of {event['limit']:.4g} {event['budget']}")
        elif kind == "budget_raised":
            raised = event.get("raise_to") or {}
            amounts = [f"${raised['cost_usd']:.2f}"] if "cost_usd" in raised else []
            amounts += [f"{raised['tokens']} tokens"] if "tokens" in raised else []
            self._line(f"  budget raised to {', '.join(amounts)}")
        elif kind == "spend_cap_waiting":  # up to a month: the day too
            until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event["until"] / 1000))
            left = duration(event["until"] / 1000 - event["at"] / 1000)
            cap = f"{event['cap']} spend cap" if event.get("cap") else "agent's spend cap"
            self._line(f"  waits {left} for the {cap}, until {until}")
        elif kind == "run_ended":
            self._line(
                f"run {event['run']} {event['status']}: {event.get('turns')} turns, "
                f"{event.get('tokens')} tokens, ${event.get('cost_usd', 0):.4f}"
            )
        else:
            self._line(f"  {kind}")


def watch(url: str, *, after: str | None, as_json: bool, until_end: bool) -> int:
    printer = Printer(sys.stdout)
    if not as_json:
        printer.start_ticker()  # on a terminal: waits for a person count up with no event
    try:
        for event in follow(url, after):
            if as_json:
                print(json.dumps(event), flush=True)
            else:
                printer.show(event)
            if until_end and event["type"] == "run_ended":
                return 0 if event.get("status") == "completed" else 1
    finally:
        printer.close()
    return 0

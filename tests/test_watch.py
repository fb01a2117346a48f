"""`tether watch`'s terminal output (`tether.programs.watch.Printer`): a line per step, and on a
terminal a progress line redrawn in place, with or without events, that counts how long a call
has waited for a person; piped, only the lines."""

from __future__ import annotations

import io
import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tether.programs import watch as watch_module
from tether.programs.watch import Printer, duration
from tether.testing import wait_until

T0 = 1_700_000_000.0
"""The fake clock's start (epoch seconds)."""


class Terminal(io.StringIO):
    """What is written, and whether it claims to be a terminal."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def screen(written: str) -> list[str]:
    """What a terminal shows after `written`: lines, `\\r` back to the start of the line,
    `ESC [K` erasing to its end."""
    lines: list[str] = []
    line, cursor = "", 0
    for part in re.split(r"(\r|\n|\x1b\[K)", written):
        if part == "\n":
            lines.append(line)
            line, cursor = "", 0
        elif part == "\r":
            cursor = 0
        elif part == "\x1b[K":
            line = line[:cursor]
        else:
            line = line[:cursor] + part + line[cursor + len(part) :]
            cursor += len(part)
    return [*lines, line]


def ms(seconds: float) -> float:
    return (T0 + seconds) * 1000


def run_with_a_park() -> list[tuple[float, dict[str, Any]]]:
    """(clock, event) of a run whose tool waits 3m20s for a person."""
    call = {"run": "r1", "call_id": "c1", "tool": "approve_refund"}
    done = {"turn": 1, "usage": {"input": 10}, "tool_calls": [{"name": "approve_refund"}]}
    answer = {"approved": True, "approver": "alice"}
    return [
        (0, {"type": "run_started", "run": "r1", "at": ms(0)}),
        (0, {"type": "model_started", "run": "r1", "at": ms(0), "turn": 1, "call": "m1"}),
        (2, {"type": "model_done", "run": "r1", "at": ms(2), **done}),
        (2, {"type": "tool_started", "at": ms(2), **call}),
        (3, {"type": "approval_parked", "at": ms(3), **call}),
        (203, {"type": "approval_resolved", "at": ms(203), **answer, **call}),
        (204, {"type": "tool_finished", "at": ms(204), "outcome": "ok", "duration_s": 202, **call}),
    ]


def park_lines() -> list[str]:
    """The lines of `run_with_a_park()`, on a terminal or piped."""
    since = time.strftime("%H:%M:%S", time.localtime(T0 + 3))
    return [
        "run r1 started",
        "turn 1: approve_refund (10 tokens)",
        "  approve_refund running...",
        f"  approve_refund waits for a person since {since}",
        "  approve_refund approved by alice after 3m20s",
        "  approve_refund: ok in 202.00 s",
    ]


def test_durations_read_like_a_clock() -> None:
    assert [duration(s) for s in (0, 9.9, 60, 192, 3723, -5)] == [
        "0s",
        "9s",
        "1m00s",
        "3m12s",
        "1h02m03s",
        "0s",
    ]


def test_on_a_terminal_the_progress_line_counts_up_in_place_while_a_call_waits() -> None:
    now = [T0]
    out = Terminal(tty=True)
    printer = Printer(out, clock=lambda: now[0])
    events = run_with_a_park()
    for at, event in events[:3]:
        now[0] = T0 + at
        printer.show(event)
    assert printer.status == ""  # nothing going on between the model's answer and the tool
    now[0] = T0 + 2
    printer.show(events[3][1])
    assert printer.status == "  turn 1 · approve_refund running: 0s"
    now[0] = T0 + 3
    printer.show(events[4][1])
    assert printer.status == "  turn 1 · approve_refund waits for a person: 0s"

    for elapsed in (1, 2, 192):  # no event: the ticks alone
        now[0] = T0 + 3 + elapsed
        printer.tick()
        assert screen(out.getvalue())[-1] == (
            f"  turn 1 · approve_refund waits for a person: {duration(elapsed)}"
        )
    assert "approve_refund waits for a person: 3m12s" in out.getvalue()

    for at, event in events[5:]:
        now[0] = T0 + at
        printer.show(event)
    printer.close()
    assert screen(out.getvalue()) == [*park_lines(), ""]  # the progress line is gone


def test_piped_there_is_no_progress_line_only_a_line_when_parked_and_answered() -> None:
    now = [T0]
    out = Terminal(tty=False)
    printer = Printer(out, clock=lambda: now[0])
    for at, event in run_with_a_park():
        now[0] = T0 + at
        printer.show(event)
        printer.tick()
    printer.close()
    assert out.getvalue().splitlines() == park_lines()
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_model_text_is_never_cut_by_the_progress_line() -> None:
    now = [T0]
    out = Terminal(tty=True)
    printer = Printer(out, clock=lambda: now[0])
    printer.show({"type": "model_started", "run": "r1", "at": ms(0), "turn": 2, "call": "m"})
    now[0] = T0 + 4
    printer.tick()
    assert printer.status == "  turn 2 · the model is thinking: 4s"
    for delta in ("The ", "answer"):
        printer.show({"type": "model_text", "run": "r1", "at": ms(4), "delta": delta})
        now[0] += 1
        printer.tick()
    printer.show({"type": "model_done", "run": "r1", "at": ms(7), "turn": 2, "usage": {}})
    assert screen(out.getvalue()) == ["  model: The answer", "turn 2: no tool calls (0 tokens)", ""]


def test_tether_watch_ticks_on_a_terminal_while_no_event_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`watch` with the stream silent for over a second (keep-alives only): the waiting time on
    the terminal goes on counting."""
    parked_at = (time.time() - 61) * 1000
    call = {"run": "r1", "call_id": "c1", "tool": "approve_refund"}

    def follow(url: str, after: str | None = None) -> Iterator[dict[str, Any]]:
        yield {"type": "approval_parked", "at": parked_at, **call}
        time.sleep(1.3)
        resolved = {"at": parked_at + 62_000, "approved": True, "approver": "bo", **call}
        yield {"type": "approval_resolved", **resolved}
        yield {"type": "run_ended", "run": "r1", "at": 0, "status": "completed", "turns": 1}

    out = Terminal(tty=True)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(watch_module, "follow", follow)
    monkeypatch.setattr(watch_module, "TICK_SECONDS", 0.05)
    code = watch_module.watch("http://sidecar", after=None, as_json=False, until_end=True)
    assert code == 0
    written = out.getvalue()
    drawn = re.findall(r"\r  approve_refund waits for a person: (\dm\d\ds)", written)
    assert len(set(drawn)) >= 2, written  # redrawn by the ticker, with no event in between
    assert screen(written)[-3:-1] == [
        "  approve_refund approved by bo after 1m02s",
        "run r1 completed: 1 turns, None tokens, $0.0000",
    ]

    piped = Terminal(tty=False)
    monkeypatch.setattr(sys, "stdout", piped)
    watch_module.watch("http://sidecar", after=None, as_json=False, until_end=True)
    assert "\r" not in piped.getvalue() and len(piped.getvalue().splitlines()) == 3


def test_the_ticker_redraws_from_its_own_thread() -> None:
    now = [T0]
    out = Terminal(tty=True)
    printer = Printer(out, clock=lambda: now[0])
    printer.show({"type": "question_parked", "at": ms(0), "tool": "ask_human", "call_id": "q"})
    printer.start_ticker(every=0.01)
    now[0] = T0 + 75
    wait_until(
        lambda: printer.status == "  ask_human waits for a person: 1m15s",
        timeout=5,
        what="the ticker's redraw",
    )
    printer.close()
    assert screen(out.getvalue())[-1] == ""


def test_a_raised_budget_reads_as_its_new_amounts() -> None:
    out = Terminal(tty=False)
    printer = Printer(out, clock=lambda: T0)
    raise_to = {"cost_usd": 0.5, "tokens": 20000}
    printer.show({"type": "budget_raised", "at": T0 * 1000, "raise_to": raise_to})
    printer.close()
    assert out.getvalue().splitlines() == ["  budget raised to $0.50, 20000 tokens"]


def test_a_run_waiting_for_the_spend_cap_says_how_long_and_until_when() -> None:
    out = Terminal(tty=False)
    printer = Printer(out, clock=lambda: T0)
    until = (T0 + 3 * 3600 + 5) * 1000
    waiting = {"type": "spend_cap_waiting", "at": T0 * 1000, "until": until, "reason": "r"}
    printer.show(waiting)  # journaled by an earlier version: no cap named
    printer.show({**waiting, "cap": "hour:anthropic/claude-opus"})
    printer.close()
    day = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(until / 1000))
    assert out.getvalue().splitlines() == [
        f"  waits 3h00m05s for the agent's spend cap, until {day}",
        f"  waits 3h00m05s for the hour:anthropic/claude-opus spend cap, until {day}",
    ]

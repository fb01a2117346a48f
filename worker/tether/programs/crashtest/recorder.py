"""The child of a crash test: `tether run` with a recorder (`python -m tether.programs.crashtest`).

A commit observer (`Database.committed`), a wrapper of the spec's tools (MCP servers' too) and
hooks append what the run does to the trial's events file, and kill the process tree at the
trial's kill point.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from ..._sqlite import Database, Params
from ...durable.answers import AnswerBook
from ...session import INTERRUPTED_RESULT
from ...tools.base import ToolContext, ToolDef, ToolOutput
from ..run import PARKED_EXIT, run_command
from .events import RUN_ID, Events


def _descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Recorder:
    """Appends what the run does to `path`, one fsynced line per event, and kills the process
    at the trial's kill point. Commits are counted across the run's processes (a run resumed
    after a park goes on counting), so a kill point names one moment of the run."""

    def __init__(
        self,
        path: Path,
        kill_after_commit: int | None,
        kill_in_call: str | None,
        kill_after_step: bool = False,
    ):
        self.path = path
        self.kill_after_commit = kill_after_commit
        self.kill_after_step = kill_after_step  # after this process's first commit of a step
        self.kill_in_call = kill_in_call  # RUN/CALL
        self.commits = Events.read(path).commits
        self._lock = threading.Lock()  # commits come from the threads that make them
        self.note("start")

    def note(self, *words: object) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (" ".join(map(str, words)) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def kill(self) -> None:
        """As a pod dies: this process and all it started, in its group or in sessions of
        their own (`shell` commands)."""
        self.note("kill")
        groups = set()
        for pid in _descendants(os.getpid()):
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(pid))
        for group in groups - {os.getpgrp()}:  # before its own, which this process is in
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        os.killpg(0, signal.SIGKILL)

    def _kill_in(self, run_id: str, call_id: str) -> None:
        if f"{run_id}/{call_id}" == self.kill_in_call:
            self.kill()

    def committed(self, writes: Sequence[tuple[str, Params]]) -> None:
        # A result that says the call was interrupted is not one a later cut could lose: marked.
        steps = [
            p[4] + ("!" if INTERRUPTED_RESULT in str(p[5]) else "")
            for sql, p in writes
            if sql.startswith("INSERT INTO tether_steps")
        ]
        with self._lock:
            self.commits += 1
            self.note("commit", self.commits, *steps)
            if self.commits == self.kill_after_commit or (steps and self.kill_after_step):
                self.kill()

    def wrap(self, tool: ToolDef) -> ToolDef:
        """A tool of the spec (built-in, `python` or an MCP server's) whose body is counted as
        it starts, and killed in as it ends; given before an approval gate, whose hooks fire on
        replays. A self-journaled one runs again on every replay: not counted."""
        if tool.self_journaled:
            return tool
        execute, uses_context = tool.execute, tool.uses_context

        async def counted(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
            self.note("tool", ctx.run_id, ctx.call_id, tool.name, tool.replay)
            try:
                return await execute(arguments, ctx if uses_context else cast(ToolContext, None))
            finally:
                self._kill_in(ctx.run_id, ctx.call_id)

        return dataclasses.replace(tool, execute=counted, uses_context=True)

    def hooks(self) -> dict[str, Any]:
        def turn_after(payload: dict[str, Any]) -> None:  # a model call answered, and its calls
            calls = [b["id"] for b in payload["content"] if b["type"] == "tool_use"]
            self.note("model", payload["run_id"], payload["turn"], *calls)

        def tool_after(payload: dict[str, Any]) -> None:
            # Cut off by a crash: sub-agents' transcripts are not kept, so it is said here.
            if payload["outcome"] == "interrupted" or INTERRUPTED_RESULT in str(payload["result"]):
                self.note("cut", payload["run_id"], payload["call_id"])

        hooks: dict[str, Any] = {"turn:after": turn_after, "tool:after": tool_after}

        def spawn_start(payload: dict[str, Any]) -> None:
            for name, fn in hooks.items():  # sub-agents' calls are counted too, at every depth
                payload["hooks"].setdefault(name, []).append(fn)

        hooks["spawn:start"] = spawn_start
        return hooks

    def answer(self, db_path: str, approve: bool, human: str | None) -> None:
        """Answer the run's waiting calls: approvals (and requests for more budget) with an
        approval, `ask_human` calls with `human` (JSON, when given)."""
        db = Database(db_path)
        try:
            book = AnswerBook(db)
            for call in book.waiting(RUN_ID):
                if call.kind == "approval" and approve:
                    value: Any = {"approved": True, "by": "crashtest"}
                elif call.kind == "ask_human" and human is not None:
                    value = json.loads(human)
                else:
                    continue
                self.note("answer", call.tool, call.call_id)
                book.answer(RUN_ID, call.call_key, value)
        finally:
            db.close()


def child_main(argv: list[str] | None = None) -> int:
    from ..cli import USER_ERRORS, build_parser  # cli imports this package when asked for it
    from ..hardening import make_undumpable
    from ..redact import install as install_redaction

    make_undumpable()  # as `tether run`
    install_redaction()
    parser = argparse.ArgumentParser(prog="python -m tether.programs.crashtest")
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--kill-after-commit", type=int)
    parser.add_argument("--kill-in-call", metavar="RUN/CALL")
    parser.add_argument("--kill-after-step", action="store_true")
    parser.add_argument("--approve", action="store_true")
    parser.add_argument("--human-answer", metavar="JSON")
    own, rest = parser.parse_known_args(argv)
    args = build_parser().parse_args(["run", *rest])
    recorder = Recorder(own.events, own.kill_after_commit, own.kill_in_call, own.kill_after_step)
    Database.committed = recorder.committed
    try:
        code = run_command(args, dict(os.environ), hooks=recorder.hooks(), wrap_tool=recorder.wrap)
    except USER_ERRORS as error:
        print(f"tether: {error}", file=sys.stderr)
        return 2
    if code == PARKED_EXIT:
        recorder.answer(args.db, own.approve, own.human_answer)
    return code

"""What a crash test compares: how a run ended (its status, transcript and files), and where
one departs from another."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._sqlite import Database
from ...durable import run_status
from ...session import INTERRUPTED_RESULT
from .events import RUN_ID

WORKSPACE_MARK = "<workspace>"
"""Each run's workspace path, in what is compared: every run has a directory of its own."""


Transcript = list[tuple[str, Any]]


@dataclass
class Outcome:
    """A run as it ended: its status, its transcript and the files it left."""

    status: str | None
    transcript: Transcript  # the run's session (`tether run` keeps no sub-agent's)
    files: dict[str, bytes]


def outcome_of(db: Path, workspace: Path) -> Outcome:
    """The run's outcome, its workspace's path written as `WORKSPACE_MARK` (each run has its
    own: a tool that prints `pwd` says the same in every run)."""
    paths = sorted({str(workspace), str(workspace.resolve())}, key=len, reverse=True)

    def marked(data: bytes) -> bytes:
        for path in paths:
            data = data.replace(os.fsencode(path), WORKSPACE_MARK.encode())
        return data

    file = Database(db)
    try:
        rows = file.query(
            "SELECT role, content FROM tether_turns WHERE session_id = ? ORDER BY position",
            (RUN_ID,),  # `tether run`'s session: the run's id
        )
    finally:
        file.close()
    transcript = [(role, json.loads(marked(content.encode()))) for role, content in rows]
    files = {
        str(path.relative_to(workspace)): marked(path.read_bytes())
        for path in sorted(workspace.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }
    return Outcome(run_status(db, RUN_ID), transcript, files)


def _results(transcript: Transcript) -> dict[str, str]:
    """Each tool call's result in `transcript`, as text."""
    return {
        block["tool_use_id"]: json.dumps(block.get("content"))
        for role, content in transcript
        if role == "user" and isinstance(content, list)
        for block in content
        if block.get("type") == "tool_result"
    }


def cut_calls(reference: Outcome, outcome: Outcome) -> set[str]:
    """The calls reported as interrupted where the clean run had their result."""
    before = _results(reference.transcript)
    return {
        call
        for call, result in _results(outcome.transcript).items()
        if INTERRUPTED_RESULT in result and INTERRUPTED_RESULT not in before.get(call, "")
    }


def unanswered(transcript: Transcript) -> list[str]:
    """Tool calls not answered exactly once, in the turn after theirs."""
    wrong = []
    for i, (role, content) in enumerate(transcript):
        if role != "assistant" or not isinstance(content, list):
            continue
        calls = [b["id"] for b in content if b.get("type") == "tool_use"]
        after = transcript[i + 1][1] if i + 1 < len(transcript) else []
        answers = Counter(
            b["tool_use_id"]
            for b in (after if isinstance(after, list) else [])
            if b.get("type") == "tool_result"
        )
        wrong += [call for call in calls if answers[call] != 1]
    return wrong


def first_difference(a: Transcript, b: Transcript, cut: set[str]) -> str:
    """Where transcript `b` departs from `a`, results of the calls in `cut` aside ("" if never)."""

    def plain(content: Any) -> Any:
        if not isinstance(content, list):
            return content
        return [
            dict(block, content=None, is_error=None)
            if block.get("type") == "tool_result" and block.get("tool_use_id") in cut
            else block
            for block in content
        ]

    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x[0] != y[0] or plain(x[1]) != plain(y[1]):
            return f"turn {i + 1} ({y[0]}) differs: {json.dumps(y[1])[:160]}"
    if len(a) != len(b):
        return f"{len(b)} turns, against {len(a)}"
    return ""


def changed_files(a: Outcome, b: Outcome) -> list[str]:
    names = set(a.files) | set(b.files)
    return sorted(name for name in names if a.files.get(name) != b.files.get(name))

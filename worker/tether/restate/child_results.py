"""What a child run hands back to its parent (`ChildRunResult`), and how the parent reads it.

A child is a separate invocation; its result arrives as JSON through the parent's journal, from a
worker that may run another version, so reading it tolerates what this version does not know.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, cast, get_args

from ..agent.stats import AgentStats
from ..session.types import RunStatus
from .types import (
    ChildRunResult,
    ChildStatus,
    MergedChild,
)

MERGED_CHILDREN_EXTRA = "tether.restate.merged_children"
"""`ToolContext.extras` key of the list that collects `MergedChild` records. `run_child` sets
it, so a child's own spawn tool hands its merged descendants up without extra wiring."""

_RUN_STATUSES = frozenset(get_args(RunStatus))
_STATS_FIELDS = frozenset(f.name for f in dataclasses.fields(AgentStats))


def agent_stats(data: dict[str, Any]) -> AgentStats:
    """`AgentStats` from a child's JSON, ignoring fields this version does not know."""
    known = {k: v for k, v in data.items() if k in _STATS_FIELDS and k != "children"}
    children = [agent_stats(c) for c in data.get("children") or [] if isinstance(c, dict)]
    return AgentStats(**known, children=children)


def child_result(raw: Any) -> ChildRunResult:
    """The awaited call result as a `ChildRunResult` (a `generic_call` gives JSON bytes)."""
    value = json.loads(raw) if isinstance(raw, bytes | bytearray) else raw
    if not isinstance(value, dict) or "status" not in value:
        return failed_result(f"the child returned {type(value).__name__}, not a ChildRunResult")
    value.setdefault("text", "")
    value.setdefault("stats", {})
    value.setdefault("turns", [])
    return cast(ChildRunResult, value)


def failed_result(error: str, status: ChildStatus = "error") -> ChildRunResult:
    """The result of a child that never produced one (refused, failed invocation)."""
    stats = AgentStats(status="aborted" if status == "aborted" else "error", error=error)
    return {"status": status, "text": "", "stats": stats.to_json(), "turns": [], "error": error}


def child_status(stats: AgentStats) -> tuple[ChildStatus, str | None]:
    """How a child run ended, as a `ChildStatus` and an error detail."""
    if stats.status in ("completed", "aborted"):
        return stats.status, stats.error
    return "error", stats.error or f"the sub-agent stopped: {stats.status}"


def run_status(node: MergedChild) -> RunStatus:
    """The session status of a merged run: the child's own run status when it has one."""
    status = node["stats"].get("status")
    if status in _RUN_STATUSES:
        return cast(RunStatus, status)
    return "completed" if node["status"] == "completed" else "error"

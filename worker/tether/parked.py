"""The record of calls parked on an awakeable, shared by the worker (writer) and the sidecar.

The worker keeps one map `{awakeable id: ParkedCall}` per session in the agent object's state
under `PARKED_STATE_KEY`, written by the exclusive `run` handler when a call parks and removed
when it resumes, and the same records in the agent's index (`tether.programs.worker.parked_index`),
which its sidecars read with a signed request. It lives in Restate, so it stays true when a worker
restarts.
"""

from __future__ import annotations

import json
from typing import Any, Literal, NotRequired, TypedDict

PARKED_STATE_KEY = "tether:parked"
INDEX_KEY = "all"
"""The one key of an agent's index of parked calls (`tether.programs.worker.parked_index`)."""
ParkedKind = Literal["approval", "ask_human"]
SUMMARY_CHARS = 300
BUDGET_TOOL = "budget"
"""The tool name of a run's request for more budget (`limits.onExhausted: ask`), parked as an
approval; its call id is `budget:<turn>:<attempt>`."""


def asks_for_budget(tool: str, call_id: str) -> bool:
    """Whether a parked approval is a run's request for more budget, not a tool call's."""
    return tool == BUDGET_TOOL and call_id.startswith(f"{BUDGET_TOOL}:")


def summarize(value: Any) -> str:
    """A call's input as compact JSON, cut to `SUMMARY_CHARS` for a person to read."""
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 3] + "..."


class ParkedCall(TypedDict):
    awakeable_id: str
    kind: ParkedKind
    agent: str
    session: str
    tool: str
    call_id: str
    input_summary: str
    """The call's input as JSON, cut to a few hundred characters."""
    created_at: float
    """Epoch milliseconds (journaled clock)."""
    expires_at: NotRequired[float]
    """When the park times out, if it has a deadline."""

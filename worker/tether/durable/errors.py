"""Errors of the durable layer. Control errors escape the agent loop unchanged."""

from __future__ import annotations

from ..errors import TetherError


class DurableControlError(TetherError):
    """Base of errors that must never be turned into a tool result or swallowed by the loop."""


class JournalMismatchError(DurableControlError):
    """The code asked for a different step than the journal recorded at that position."""

    def __init__(self, run_id: str, scope: str, seq: int, expected: str, found: str) -> None:
        where = f"run {run_id!r}" + (f", scope {scope!r}" if scope else "")
        super().__init__(
            f"journal mismatch in {where} at step {seq}: the code asked for step {expected!r} "
            f"but the journal recorded {found!r}. The agent's code or configuration changed "
            "since this run started; finish it with the old version or start a new run id."
        )
        self.run_id = run_id
        self.scope = scope
        self.seq = seq
        self.expected = expected
        self.found = found


class RunLeasedError(DurableControlError):
    """Another live process holds the run."""


class RunClosedError(DurableControlError):
    """The runtime was closed; build a new one to resume the run."""

"""Kubernetes-style status conditions (`type`, `status`, `reason`, `message`,
`lastTransitionTime`, `observedGeneration`) built on `tether.spec.Condition`."""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Literal

from tether.spec import Condition

READY, REGISTERED, PROGRESSING, DRAINING = "Ready", "Registered", "Progressing", "Draining"
ORDER = (READY, REGISTERED, PROGRESSING, DRAINING)


def now_rfc3339() -> str:
    return rfc3339(time.time())


def rfc3339(t: float) -> str:
    """Epoch seconds as an RFC 3339 timestamp in UTC, to the second."""
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    """Epoch seconds of an RFC 3339 timestamp such as 2026-01-01T00:00:00Z."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class Verdict:
    """What one condition should say now."""

    type: str
    ok: bool
    reason: str
    message: str


def merge(
    previous: list[Condition], verdicts: list[Verdict], generation: int | None
) -> list[Condition]:
    """New conditions; `lastTransitionTime` moves only when the status flips."""
    before = {c.type: c for c in previous}
    stamp = now_rfc3339()
    merged: list[Condition] = []
    for verdict in sorted(verdicts, key=lambda v: ORDER.index(v.type)):
        status: Literal["True", "False"] = "True" if verdict.ok else "False"
        old = before.get(verdict.type)
        merged.append(
            Condition(
                type=verdict.type,
                status=status,
                reason=verdict.reason,
                message=verdict.message,
                last_transition_time=(
                    old.last_transition_time if old and old.status == status else stamp
                ),
                observed_generation=generation,
            )
        )
    return merged

"""How Restate retries the invocations of an agent's services."""

from __future__ import annotations

from datetime import timedelta

import restate

RETRY_AFTER_WORKER_LOSS = restate.InvocationRetryPolicy(
    initial_interval=timedelta(milliseconds=100),
    exponentiation_factor=2.0,
    max_interval=timedelta(seconds=1),
    max_attempts=3600,
    on_max_attempts="pause",
)
"""How Restate retries a run whose worker died. Its default (500 ms doubling to 1 min) left a
run standing 12 s after a pod was replaced in 3; capped at 1 s, a run resumes within about a
second of a worker answering again (`bench/worker_loss.py`: with a second replica up, back at
work 159 ms after the SIGKILL, against 40 ms for a retry after 1 ms and 596 ms by default).
Tool and model errors never get here (they are results, or retried inside the journal), so what
retries is a lost worker: about an hour of attempts before the run pauses (resumable), like
Restate's default."""

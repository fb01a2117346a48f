"""How Restate retries the invocations of an agent's services."""

from __future__ import annotations

from datetime import timedelta

import restate

RETRY_AFTER_WORKER_LOSS = restate.InvocationRetryPolicy(
    initial_interval=timedelta(milliseconds=20),
    exponentiation_factor=1.5,
    max_interval=timedelta(seconds=1),
    max_attempts=3600,
    on_max_attempts="pause",
)
"""How Restate retries a run whose worker died: 20 ms, growing by half to at most 1 s.

- Many attempts early. On Kubernetes a SIGKILLed worker's pod keeps its address among the
  Service's endpoints while its container restarts (about 1.5 s), so each attempt is a coin flip
  between it (refused) and a live replica. Eight attempts come in the first second: with 2
  replicas `bench/worker_loss.py --routing service --start-delay 1` measured the run back at
  work 58 ms after the SIGKILL (median; p90 221 ms, max 353), against 236 ms (p90 1.8 s: four
  refusals in a row, then the restarted container) with 100 ms doubling; on the real node the
  next step came 0.14 s after the SIGKILL (median of 21; max 0.87 s) against 0.20 s (3 of 10
  at 0.91-1.87 s).
- At most 1 s apart, so a run resumes within about a second of a worker answering again.
  Restate's default (500 ms doubling to 1 min) left a run standing 12 s after a pod was replaced
  in 3.

Tool and model errors never get here (they are results, or retried inside the journal), so what
retries is a lost worker: about an hour of attempts before the run pauses (resumable), like
Restate's default."""

"""Whether the serving process is stopping: SIGTERM (a scale-down, a node drain, a deleted pod).

Hypercorn then stops taking connections and new streams, and marks its worker context
terminated; the runs in flight may go on for its graceful timeout. Our HTTP/2 protocol
(`connection_age.RetiringH2Protocol`, one per connection) hands that event here, and each run's
runtime reads it before its next model step (`RestateRuntimeOptions.stopping`): the run leaves
at its turn's boundary, and Restate resumes it on another replica at once.
"""

from __future__ import annotations

from hypercorn.typing import Event

_terminated: Event | None = None
"""Hypercorn's `WorkerContext.terminated` (one per serving process), once a connection came."""


def watch(terminated: Event) -> None:
    global _terminated
    _terminated = terminated


def is_stopping() -> bool:
    return _terminated is not None and _terminated.is_set()

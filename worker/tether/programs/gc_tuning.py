"""The garbage collector of a long-lived worker process, set for many runs in flight."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Net allocations of tracked objects between two collections of the youngest generation
(Python's default: 700). A turn allocates hundreds, nearly all freed by reference counting: at
700, 100 runs in flight made a young collection every ~11 turns and an older one every ten of
those (`bench/many_runs.py`'s agent: 0.024 ms a turn in collections, 0.008 at 10,000)."""


def settle_heap() -> None:
    """Freeze what is imported and built by now, which lives as long as the process: a full
    collection no longer walks it (in `bench/many_runs.py`'s worker, 100 runs in flight: ~75 ms
    a full pass, ~49 ms frozen); and collect the young generation less often."""
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)

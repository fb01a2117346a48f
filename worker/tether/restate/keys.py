"""The state keys of a session's virtual object that more than one module names.

A session's turns, its run records and its events are each a `Chain` named by its prefix
(`tether.restate.chain`). The session's meta and the three chains' tails are what every run
reads and each checkpoint writes: they are kept together in one value, the head
(`chain.Values`), under the meta's key.
"""

from __future__ import annotations

SESSION = "tether:session"
TURNS = "tether:turns/"
RUNS = "tether:run-records/"
EVENTS = "tether:events/"
"""The chains' prefixes. Restate sends the shortest keys first: the turns' segments, then the
events', then the run records'."""

HEAD = (SESSION, f"{TURNS}tail", f"{RUNS}tail", f"{EVENTS}tail")
"""The keys kept in the head; it is stored under the first."""

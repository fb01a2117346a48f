"""`tether worker`'s own process: hypercorn as a child, with a hard deadline after SIGTERM.

On SIGTERM hypercorn stops taking connections and waits `graceful_timeout` for the invocations
in flight. It does not always stop there: a stream that ignores cancellation, or a new invocation
Restate opens on the draining worker (a call that a run there waits for), keeps it alive until
Kubernetes SIGKILLs the pod at the end of its grace period. This process ends it a moment after
the graceful timeout, so Restate takes the runs elsewhere as soon as it can: they resume from
their journals.

`tether worker` checks the manifest, then execs this file as a script (standard library only),
so the supervising process stays small:

    python deadline.py <graceful timeout> <hypercorn command...>

In a pod this process is PID 1 and holds the worker's secrets in its environment (the webhook
secret, the model keys): the first thing it does is make itself non-dumpable, so the agent's
`shell` commands, which run as the same user, cannot read its `/proc/<pid>/environ` or memory
(`tether.programs.hardening`; a copy here, this script imports nothing of tether).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

log = logging.getLogger("tether.programs.worker")
HARD_EXIT_MARGIN = 2.0
"""Seconds past the graceful timeout before the worker's processes are killed."""
PR_SET_DUMPABLE = 4


def make_undumpable() -> bool:
    """`prctl(PR_SET_DUMPABLE, 0)` (Linux; elsewhere nothing), as `tether.programs.hardening`
    does."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """`pid`'s children, grandchildren, ... (Linux `/proc`; empty elsewhere)."""
    found: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        found += [int(c) for c in children]
        pending += [int(c) for c in children]
    return found


def run_supervised(command: list[str], env: Mapping[str, str], graceful_timeout: float) -> int:
    """Run `command` (the hypercorn CLI) until it exits; forward SIGTERM and SIGINT to it, and
    kill it and its workers if it is still there `graceful_timeout` + a margin after."""
    # The same process group as this process, so that a kill of the group reaches it too.
    child = subprocess.Popen(command, env=dict(env))
    deadline: float | None = None

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal deadline
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)
        if deadline is None:
            deadline = time.monotonic() + graceful_timeout + HARD_EXIT_MARGIN

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            if deadline is None or time.monotonic() < deadline:
                continue
        log.warning("the worker did not stop within its graceful timeout; killing it")
        for pid in [*descendants(child.pid), child.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child.wait()
        return 1


if __name__ == "__main__":
    make_undumpable()
    logging.basicConfig(format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s")
    sys.exit(run_supervised(sys.argv[2:], os.environ, float(sys.argv[1])))

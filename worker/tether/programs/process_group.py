"""Stopping a child process and everything it started.

The processes tether starts (restate-server, the hypercorn worker, the uvicorn sidecar) run in
a session of their own (`start_new_session=True`), so their process group holds whatever they
forked: signalling the group reaches all of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any


def signal_group(popen: subprocess.Popen[Any], sig: int) -> None:
    """Send `sig` to the process group led by `popen` (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def stop_group(popen: subprocess.Popen[Any], *, grace: float, sig: int = signal.SIGTERM) -> None:
    """`sig` to the group; if the leader has not exited after `grace` seconds, SIGKILL. Then
    SIGKILL whatever is left of the group and reap the leader."""
    if popen.poll() is None:
        signal_group(popen, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=grace)
    signal_group(popen, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=10.0)

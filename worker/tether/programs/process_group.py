"""Starting a child process in a group of its own, and stopping it with everything it started.

The processes tether starts (restate-server, the hypercorn worker, the uvicorn sidecar) run in
a session of their own (`start_new_session=True`), so their process group holds whatever they
forked: signalling the group reaches all of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
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


class GroupProcess:
    """A child started in a session of its own (so its whole group can be signalled), with its
    output appended to a log file."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                list(argv),
                env=None if env is None else dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        signal_group(self.popen, sig)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (`stop_group`)."""
        stop_group(self.popen, grace=grace)

    def kill(self) -> None:
        stop_group(self.popen, grace=0, sig=signal.SIGKILL)

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

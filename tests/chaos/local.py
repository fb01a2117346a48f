"""The chaos platform on loopback: `tether.programs.dev.DevStack` (restate-server, `tether
worker` and `tether sidecar` as real processes), each killed with SIGKILL and started again on
the same ports (restate-server on its data directory)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

import tether
from tests.chaos.scenario import LEDGER, write_agent
from tether.programs.dev import DevStack, Process, wait_for
from tether.testing import group_alive, wait_until

SERVER_ENV = {"RESTATE_DEFAULT_RETRY_POLICY__MAX_INTERVAL": "2s"}
"""Retries of a killed attempt back off to 2 s at most (the default grows to a minute)."""


class LocalPlatform:
    """A `tests.chaos.scenario.Platform` on loopback."""

    kill_kinds: tuple[str, ...] = ("worker", "restate", "sidecar")
    exact_metrics = True  # the sidecar sums every worker process's files, the killed ones' too

    def __init__(self, turns: int, directory: Path | None = None) -> None:
        self._temp = None
        if directory is None:
            self._temp = tempfile.TemporaryDirectory(prefix="tether-chaos-")
            directory = Path(self._temp.name)
        root = Path(directory)
        self.workspace = root / "workspace"
        self.workspace.mkdir(parents=True, exist_ok=True)
        spec = write_agent(root, turns)
        self.stack = DevStack(spec, root / "data", workspace=self.workspace, server_env=SERVER_ENV)
        # The code the processes start with, frozen: a worker restarted after someone edited
        # the working tree would replay its journal with other code (as no deployment would).
        code = root / "code"
        shutil.rmtree(code, ignore_errors=True)
        shutil.copytree(
            Path(tether.__file__).parent,
            code / "tether",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        for process in (self.stack.worker, self.stack.sidecar):
            process.env["PYTHONPATH"] = os.pathsep.join(
                [str(code), *filter(None, [process.env.get("PYTHONPATH")])]
            )

    def metrics_urls(self) -> list[str]:
        return [f"{self.sidecar_url}/metrics"]  # the worker's processes' too (one directory)

    def __enter__(self) -> Self:
        self.stack.start()
        self.ingress_url = self.stack.server.ingress_url
        self.sidecar_url = self.stack.sidecar_url
        self.secret = self.stack.secret.encode()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stack.stop()
        finally:
            if self._temp is not None:
                self._temp.cleanup()

    @property
    def logs(self) -> Path:
        return self.stack.data_dir

    def kill(self, kind: str) -> str:
        if kind == "worker":
            return self._restart(self.stack.worker, f"{self.stack.worker_url}/health")
        if kind == "sidecar":
            return self._restart(self.stack.sidecar, f"{self.stack.sidecar_url}/healthz")
        if kind == "restate":
            pid = self.stack.server.pid
            self.stack.server.restart(graceful=False)
            return f"SIGKILLed restate-server {pid}, started {self.stack.server.pid}"
        raise ValueError(f"no such kill: {kind}")

    @staticmethod
    def _restart(process: Process, health: str) -> str:
        """SIGKILL the process group, wait until every member is gone, start it again."""
        assert process.popen is not None
        pgid = process.popen.pid
        process.kill(signal.SIGKILL)
        wait_until(lambda: not group_alive(pgid), timeout=60, what=f"the killed {process.name}")
        process.start()
        wait_for(health, process.name, process, timeout=120)
        assert process.popen is not None
        return f"SIGKILLed the {process.name}'s group {pgid}, started {process.popen.pid}"

    def ledger(self) -> list[str]:
        path = self.workspace / LEDGER
        return path.read_text().splitlines() if path.exists() else []

"""Test helpers: a Restate service module served by the hypercorn CLI, plus small HTTP helpers.

The hypercorn CLI runs the app in a child process (``workers = 1`` means one spawned worker
under a supervising parent), so a crash test must signal the whole process group: a SIGKILL of
the parent alone leaves the child serving. Each worker therefore runs in its own session.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlencode, urljoin, urlsplit

from tether.process_group import signal_group
from tether.restate_server import RestateServer, free_port

T = TypeVar("T")

#: Retry a failed attempt after at most 2 s (default policy: 500 ms doubling up to 60 s), so a
#: replaced worker is picked up quickly even when it took a while to start.
FAST_RETRY_ENV = {"RESTATE_DEFAULT_RETRY_POLICY__MAX_INTERVAL": "2s"}

#: Suspend at every await: each journal completion ends the attempt and the next one replays.
ALWAYS_SUSPEND_ENV = {"RESTATE_WORKER__INVOKER__INACTIVITY_TIMEOUT": "0s"}

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns a truthy value (returned) or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, ValueError, KeyError) as err:
            last_error = err
        if time.monotonic() > deadline:
            suffix = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{suffix}")
        time.sleep(interval)


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


def http(
    method: str,
    url: str,
    payload: Any = None,
    *,
    raw: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> Response:
    """One HTTP/1.1 request; non-2xx statuses are returned, not raised."""
    body = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    hdrs = {"accept": "application/json", **(headers or {})}
    if body is not None:
        hdrs.setdefault("content-type", "application/json")
    req = urllib.request.Request(url, data=body, method=method, headers=hdrs)
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return Response(err.code, err.read())


# --------------------------------------------------------------------------------------------
# Approval links: a GET shows a page, its form's POST decides
# --------------------------------------------------------------------------------------------


class _LinkForm(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self.buttons: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "form":
            self.action = attributes.get("action")
        elif tag == "input" and attributes.get("type") == "hidden":
            self.fields[str(attributes["name"])] = str(attributes["value"])
        elif tag == "button":
            self.buttons.append(str(attributes.get("value")))


@dataclass(frozen=True)
class LinkPage:
    """The page an approval link opens, and where its form posts."""

    url: str
    text: str
    post_to: str
    fields: dict[str, str]
    buttons: list[str]


def open_link(url: str) -> LinkPage:
    """GET an approval link (absolute URL) as a browser does: the page, which decides nothing."""
    response = http("GET", url, headers={"accept": "text/html"})
    assert response.status == 200, response.text
    form = _LinkForm()
    form.feed(response.text)
    assert form.action is not None, response.text
    return LinkPage(url, response.text, urljoin(url, form.action), form.fields, form.buttons)


def press(page: LinkPage, decision: str, headers: Mapping[str, str] | None = None) -> Response:
    """POST the page's form as its `decision` button does, from the page's own origin."""
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(page.url))
    body = urlencode({**page.fields, "decision": decision}).encode()
    form_headers = {
        "content-type": "application/x-www-form-urlencoded",
        "accept": "text/html",
        "origin": origin,
        "sec-fetch-site": "same-origin",
        **(headers or {}),
    }
    return http("POST", page.post_to, raw=body, headers=form_headers)


def decide_by_link(url: str, decision: str = "approve") -> Response:
    """Open the link and press its `decision` button (the answer page)."""
    return press(open_link(url), decision)


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc (Linux)."""
    members: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    if Path("/proc/self/stat").exists():
        return bool(_group_members(pgid))
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


PROC_PROBE = Path(__file__).resolve().parent.parent / "programs" / "proc_probe.py"
"""What a `shell` command can read of the processes around it (see the program)."""


def without_capabilities() -> list[str]:
    """A command prefix: the program runs as this user id with no capabilities at all.

    The agent's `shell` runs as the worker's user: a pod's non-root user, which has none.
    These tests may run as root, whose CAP_SYS_PTRACE (and the capabilities a target would
    hold beyond the reader's) lets it read any process's `/proc/<pid>/environ` and `mem`, so
    they would show nothing. Root without any capability is the same uid as the worker and
    no more: it reads a dumpable process of its uid, and a non-dumpable one not. (Another uid
    cannot run this interpreter here: /root is 0700.)"""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to drop root's capabilities"
    return [setpriv, "--bounding-set", "-all", "--inh-caps", "-all", "--"]


_HYPERCORN_CONFIG = """\
bind = ["127.0.0.1:{port}"]
workers = 1
h2_max_concurrent_streams = 2147483647
keep_alive_max_requests = 2147483647
keep_alive_timeout = 2147483647
graceful_timeout = 5
"""


class HypercornWorker:
    """``python -m hypercorn <app>`` on 127.0.0.1:<port> (h2c and HTTP/1.1 on one port).

    ``app`` is ``module:attr`` or ``/path/to/file.py:attr``. The process runs in its own session
    (``start_new_session=True``); :meth:`kill` signals the whole group.
    """

    def __init__(
        self,
        app: str,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        startup_timeout: float = 60.0,
        command: Sequence[str] | None = None,
    ) -> None:
        self.app = app
        self._command = list(command) if command else None
        """Run this instead (`{port}` is replaced), e.g. the `tether worker` CLI."""
        self.port = port if port is not None else free_port()
        self._env = dict(env or {})
        self._tmp = Path(tempfile.mkdtemp(prefix="tether-worker-")) if log_dir is None else None
        self._dir = log_dir if log_dir is not None else self._tmp
        assert self._dir is not None
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def returncode(self) -> int | None:
        """The exit code of the hypercorn parent process, None while it runs."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def log_path(self) -> Path:
        assert self._dir is not None
        return self._dir / f"hypercorn-{self.port}.log"

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return ""

    def start(self) -> None:
        assert self._dir is not None
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError("worker already running")
        config = self._dir / f"hypercorn-{self.port}.toml"
        config.write_text(_HYPERCORN_CONFIG.format(port=self.port))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self._env}
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {self.starts} at {time.ctime()} ===\n".encode())
            log.flush()
            default = [sys.executable, "-m", "hypercorn", "--config", str(config), self.app]
            command = [c.format(port=self.port) for c in self._command or []] or default
            self._proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + self._startup_timeout
        while True:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise RuntimeError(
                    f"hypercorn exited with {code} before listening; log:\n{self.log_tail()}"
                )
            # The SDK app answers GET /health once the worker child has imported the module.
            with contextlib.suppress(OSError):
                if http("GET", f"{self.url}/health", timeout=2.0).status == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"hypercorn on port {self.port} not ready after {self._startup_timeout:.0f}s; "
                    f"log:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def kill(self, sig: signal.Signals = signal.SIGKILL, *, timeout: float = 60.0) -> None:
        """Send ``sig`` to the whole process group and wait until every member has exited."""
        proc = self._proc
        if proc is None:
            return
        pgid = proc.pid  # session leader: pgid == pid
        signal_group(proc, sig)
        deadline = time.monotonic() + timeout
        while proc.poll() is None or group_alive(pgid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"process group {pgid} still alive {timeout:.0f}s after {sig!r}")
            time.sleep(0.02)
        self._proc = None

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL it if it has not exited after 15 s."""
        proc = self._proc
        if proc is None:
            return
        try:
            self.kill(signal.SIGTERM, timeout=15.0)
        except TimeoutError:
            self._proc = proc
            self.kill(signal.SIGKILL)

    def restart(self) -> None:
        """A fresh worker on the same port (the old one must have been killed)."""
        self.start()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass
class ServedApp:
    """A service module served by hypercorn and registered with a server."""

    worker: HypercornWorker
    server: RestateServer
    deployment_id: str


# --------------------------------------------------------------------------------------------
# The raw_steps journal file
# --------------------------------------------------------------------------------------------

SERVICES_DIR = Path(__file__).resolve().parent / "services"


def service_app(module: str, attr: str = "app") -> str:
    """The hypercorn app spec of a module in ``tests/restate/services``."""
    return f"{SERVICES_DIR / f'{module}.py'}:{attr}"


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def count(lines: list[str], line: str) -> int:
    return sum(1 for x in lines if x == line)

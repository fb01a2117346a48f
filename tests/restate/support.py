"""Test helpers: small HTTP helpers, approval links, and the services of ``services/``.

The hypercorn worker, ``wait_until``, ``group_alive`` and the server settings are the library's
(``tether.testing``, which users test their agents with); they are re-exported here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

import httpx2
import yaml

from tether.programs.local_http import Response
from tether.programs.local_http import request_json as http
from tether.programs.restate_identity import IDENTITY_KEYS_ENV
from tether.programs.restate_server import RestateServer, free_port
from tether.programs.worker.deadline import descendants
from tether.testing import (
    ALWAYS_SUSPEND_ENV,
    FAST_RETRY_ENV,
    HypercornWorker,
    group_alive,
    wait_until,
)

__all__ = [
    "ALWAYS_SUSPEND_ENV",
    "FAST_RETRY_ENV",
    "PROC_PROBE",
    "HypercornWorker",
    "LinkPage",
    "Response",
    "ServedApp",
    "approval_manifest",
    "count",
    "decide_by_link",
    "descendants",
    "free_port",
    "group_alive",
    "http",
    "open_link",
    "press",
    "read_lines",
    "service_app",
    "wait_until",
    "without_capabilities",
    "worker_process",
]


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------


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


def worker_process(
    server: RestateServer,
    directory: Path,
    document: Mapping[str, Any],
    *,
    prefix: Sequence[str] = (),
    **env: str | None,
) -> HypercornWorker:
    """`tether worker` serving `document` as a process that only `server` may invoke, its
    workspace and logs in `directory`; not started. `env` adds to its environment (a stop
    waits a second for its runs by default), or with None takes a variable out."""
    spec = directory / f"{document['metadata']['name']}.yaml"
    spec.write_text(yaml.safe_dump(dict(document)))
    command = [*prefix, sys.executable, "-m", "tether", "worker", "--spec", str(spec)]
    command += ["--host", "127.0.0.1", "--port", "{port}"]
    settings = {
        "TETHER_WORKSPACE": str(directory),
        "TETHER_WORKER_GRACEFUL_TIMEOUT": "1",
        IDENTITY_KEYS_ENV: server.identity_public_key,
        **env,
    }
    present = {name: value for name, value in settings.items() if value is not None}
    return HypercornWorker("", command=command, env=present, log_dir=directory)


def send_run(ingress_url: str, agent: str, session: str, prompt: str) -> str:
    """Start a run through Restate's ingress without waiting for it; its invocation id."""
    response = httpx2.post(
        f"{ingress_url}/{agent}/{session}/run/send", json={"prompt": prompt}, timeout=30
    )
    assert response.status_code == 202, response.text
    invocation: str = response.json()["invocationId"]
    return invocation


def attach(ingress_url: str, invocation: str, timeout: float) -> Any:
    """The result of a run, once it ends (at most `timeout` seconds)."""
    url = f"{ingress_url}/restate/invocation/{invocation}/attach"
    response = httpx2.get(url, timeout=timeout)
    assert response.status_code == 200, response.text
    return response.json()


def approval_manifest(
    directory: Path, name: str, script: list[Any], model: dict[str, Any] | None = None
) -> Path:
    """`<directory>/<name>.yaml`: an agent whose `write_file` waits for an approval; its model
    scripted with `script`, unless `model` is given."""
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": name},
        "spec": {
            "model": model or {"provider": "scripted", "name": "s", "script": script},
            "tools": [{"name": "write_file", "builtin": "write_file", "requireApproval": True}],
        },
    }
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


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


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process below it, each with its group (`tether dev` starts
    its children in groups of their own: killing it alone would orphan them)."""
    for target in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(target), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, signal.SIGKILL)

"""The real ``restate-server`` with the raw Python SDK: invocation, crash recovery, awakeables,
server restarts and forced suspension. Every wait is a poll with a deadline."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.restate.support import ServedApp, count, http, read_lines, wait_until
from tether.programs.restate_install import DEFAULT_RESTATE_VERSION, find_or_install_restate_server
from tether.programs.restate_server import RestateServer

REPO = Path(__file__).resolve().parents[2]
STEPS = 20
STEP_SECONDS = 0.1
DEADLINE = 60.0


def send(server: RestateServer, handler: str, payload: dict[str, Any], key: str) -> str:
    """Start ``RawSteps/<key>/<handler>`` without waiting; return the invocation id."""
    resp = http("POST", f"{server.ingress_url}/RawSteps/{key}/{handler}/send", payload)
    assert resp.status == 202, resp.text
    invocation_id: str = resp.json()["invocationId"]
    return invocation_id


def attach(server: RestateServer, invocation_id: str, timeout: float = 120.0) -> Any:
    """Wait for the invocation's result (``GET /restate/invocation/{id}/attach``)."""
    resp = http(
        "GET", f"{server.ingress_url}/restate/invocation/{invocation_id}/attach", timeout=timeout
    )
    assert resp.status == 200, resp.text
    return resp.json()


def invocation_row(server: RestateServer, invocation_id: str) -> dict[str, Any] | None:
    rows = server.query(
        "SELECT id, status, target, retry_count, last_failure, pinned_deployment_id "
        f"FROM sys_invocation WHERE id = '{invocation_id}'"
    )
    return rows[0] if rows else None


def ended_steps(path: Path) -> int:
    return sum(1 for line in read_lines(path) if line.startswith("end "))


def attempts(lines: list[str]) -> list[list[int]]:
    """The steps started by each attempt of ``run`` (an attempt begins with ``enter``)."""
    result: list[list[int]] = []
    for line in lines:
        if line == "enter":
            result.append([])
        elif line.startswith("start "):
            result[-1].append(int(line.split()[1]))
    return result


def assert_journaled_steps_never_rerun(lines: list[str]) -> None:
    """Every step finished, and no journaled step ran again.

    Within an attempt, step ``i + 1`` starts only after step ``i``'s result was journaled (the
    SDK waits for the server's acknowledgement). So when an attempt dies, every step before the
    last one it started is journaled, and the next attempt may re-run at most that last step.
    """
    for i in range(STEPS):
        assert count(lines, f"end {i}") >= 1, f"step {i} never finished: {lines}"
    runs = attempts(lines)
    for number, (before, after) in enumerate(itertools.pairwise(runs), start=1):
        if before and after:
            assert min(after) >= max(before), (
                f"attempt {number + 1} re-ran journaled step {min(after)} "
                f"(attempt {number} had reached step {max(before)}): {lines}"
            )
    for run in runs:
        assert run == sorted(set(run)), f"steps out of order or repeated in one attempt: {run}"


# --------------------------------------------------------------------------------------------


def test_install_script_pins_the_same_version() -> None:
    script = (REPO / "scripts" / "install-restate.sh").read_text()
    match = re.search(r'^RESTATE_VERSION="([^"]+)"$', script, re.MULTILINE)
    assert match is not None and match.group(1) == DEFAULT_RESTATE_VERSION


def test_install_script_reuses_the_cache(restate_binary: Path) -> None:
    started = time.monotonic()
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "install-restate.sh")],
        capture_output=True,
        text=True,
        check=True,
        timeout=DEADLINE,
    )
    assert out.stdout.strip().splitlines()[-1] == str(restate_binary)
    assert time.monotonic() - started < 5.0


FAKE_NPM = r"""#!/usr/bin/env bash
# Stands in for npm: records its arguments; like `npm --omit=optional`, it installs the platform
# package (without the executable bit) only when asked for it by name.
echo "$*" >> "$FAKE_NPM_LOG"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    *) spec="$1"; shift ;;
  esac
done
name="${spec%@*}"
mkdir -p "$prefix/node_modules/$name/bin"
if [[ "$name" == *-linux-* || "$name" == *-darwin-* ]]; then
  bin="$prefix/node_modules/$name/bin/restate-server"
  printf '#!/bin/sh\necho "restate-server %s"\n' "${spec##*@}" > "$bin"
fi
"""


def test_install_ignores_scripts_and_installs_the_platform_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    npm = tmp_path / "npm"
    npm.write_text(FAKE_NPM)
    npm.chmod(0o755)
    log = tmp_path / "npm.log"
    monkeypatch.setenv("FAKE_NPM_LOG", str(log))
    monkeypatch.delenv("TETHER_RESTATE_SERVER", raising=False)

    binary = find_or_install_restate_server("9.9.9", cache_dir=tmp_path / "cache", npm=str(npm))
    assert binary.is_relative_to(tmp_path / "cache" / "9.9.9" / "node_modules")
    assert os.access(binary, os.X_OK)
    calls = read_lines(log)
    assert len(calls) == 2  # the wrapper, then the platform package by name
    assert all("--ignore-scripts" in call.split() for call in calls)
    assert calls[0].endswith("@restatedev/restate-server@9.9.9")

    again = find_or_install_restate_server("9.9.9", cache_dir=tmp_path / "cache", npm=str(npm))
    assert again == binary and len(read_lines(log)) == 2  # served from the cache


def test_invoke_through_ingress(
    serve_app: Callable[..., ServedApp], restate_server: RestateServer, tmp_path: Path
) -> None:
    serve_app("raw_steps")
    journal = tmp_path / "steps.log"
    resp = http(
        "POST",
        f"{restate_server.ingress_url}/RawSteps/{uuid.uuid4().hex}/run",
        {"path": str(journal), "steps": 3},
    )
    assert resp.status == 200, resp.text
    assert resp.json() == [0, 1, 4]
    assert read_lines(journal) == [
        "enter",
        "start 0",
        "end 0",
        "start 1",
        "end 1",
        "start 2",
        "end 2",
    ]


def test_sigkilled_worker_is_replaced_and_steps_are_not_rerun(
    serve_app: Callable[..., ServedApp], restate_server: RestateServer, tmp_path: Path
) -> None:
    app = serve_app("raw_steps")
    journal = tmp_path / "steps.log"
    payload = {"path": str(journal), "steps": STEPS, "step_seconds": STEP_SECONDS}
    invocation_id = send(restate_server, "run", payload, key=uuid.uuid4().hex)

    wait_until(lambda: ended_steps(journal) >= 5, timeout=DEADLINE, what="5 finished steps")
    app.worker.kill(signal.SIGKILL)
    assert ended_steps(journal) < STEPS, "the run finished before the kill"

    # The server notices the broken stream and backs off; the invocation stays pinned.
    row = wait_until(
        lambda: (
            (r := invocation_row(restate_server, invocation_id))
            and r["status"] == "backing-off"
            and r
        ),
        timeout=DEADLINE,
        what="status backing-off",
    )
    assert row["pinned_deployment_id"] == app.deployment_id

    app.worker.restart()  # same port, so the same deployment: no re-registration
    assert attach(restate_server, invocation_id) == [i * i for i in range(STEPS)]

    final = read_lines(journal)
    assert_journaled_steps_never_rerun(final)
    assert count(final, "enter") == 2  # one attempt before the kill, one replay after it


def test_hypercorn_parent_kill_alone_leaves_the_worker_serving(
    serve_app: Callable[..., ServedApp],
) -> None:
    """Why :meth:`HypercornWorker.kill` signals the group: the app runs in a child process."""
    app = serve_app("raw_steps")
    pid = app.worker.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: app.worker.returncode() is not None, what="the parent to exit")
    assert http("GET", f"{app.worker.url}/health", timeout=10.0).status == 200
    app.worker.kill(signal.SIGKILL)  # the group: the orphaned child goes too
    with pytest.raises(OSError):
        http("GET", f"{app.worker.url}/health", timeout=5.0)


@pytest.mark.parametrize("server_fixture", ["restate_server", "restate_server_always_suspend"])
def test_awakeable_resolved_through_ingress(
    serve_app: Callable[..., ServedApp],
    server_fixture: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    server: RestateServer = request.getfixturevalue(server_fixture)
    serve_app("raw_steps", server=server)
    journal = tmp_path / "awakeable.log"
    invocation_id = send(server, "wait_for_awakeable", {"path": str(journal)}, uuid.uuid4().hex)

    line = wait_until(
        lambda: next((x for x in read_lines(journal) if x.startswith("awakeable ")), None),
        timeout=DEADLINE,
        what="the awakeable id",
    )
    awakeable_id = line.split(" ", 1)[1]
    assert awakeable_id.startswith("sign_1")

    parked = "suspended" if server_fixture == "restate_server_always_suspend" else "running"
    wait_until(
        lambda: (r := invocation_row(server, invocation_id)) and r["status"] == parked,
        timeout=DEADLINE,
        what=f"status {parked}",
    )

    resp = http(
        "POST", f"{server.ingress_url}/restate/awakeables/{awakeable_id}/resolve", "approved"
    )
    assert resp.status == 202, resp.text
    assert attach(server, invocation_id) == "resolved:approved"
    assert count(read_lines(journal), line) == 1  # the publishing step was not re-run


@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "sigkill"])
def test_server_restart_mid_run(
    new_restate_server: Callable[..., RestateServer],
    serve_app: Callable[..., ServedApp],
    graceful: bool,
    tmp_path: Path,
) -> None:
    server = new_restate_server()
    serve_app("raw_steps", server=server)
    journal = tmp_path / "steps.log"
    payload = {"path": str(journal), "steps": STEPS, "step_seconds": STEP_SECONDS}
    invocation_id = send(server, "run", payload, key=uuid.uuid4().hex)

    wait_until(lambda: ended_steps(journal) >= 5, timeout=DEADLINE, what="5 finished steps")
    ports = server.ports
    server.restart(graceful=graceful)
    assert server.ports == ports

    assert attach(server, invocation_id) == [i * i for i in range(STEPS)]
    final = read_lines(journal)
    # The broken stream cancels the handler in the worker; the restarted server re-invokes it
    # and the journal written before the restart is replayed, not re-run.
    assert count(final, "enter") >= 2, "the run finished before the restart"
    assert_journaled_steps_never_rerun(final)


def test_forced_suspension_at_every_await(
    serve_app: Callable[..., ServedApp],
    restate_server_always_suspend: RestateServer,
    tmp_path: Path,
) -> None:
    server = restate_server_always_suspend
    serve_app("raw_steps", server=server)
    assert server.query("SELECT 1 AS one") == [{"one": 1}]
    journal = tmp_path / "steps.log"
    invocation_id = send(
        server, "run", {"path": str(journal), "steps": STEPS}, key=uuid.uuid4().hex
    )
    assert attach(server, invocation_id) == [i * i for i in range(STEPS)]

    final = read_lines(journal)
    assert_journaled_steps_never_rerun(final)
    for i in range(STEPS):
        assert (count(final, f"start {i}"), count(final, f"end {i}")) == (1, 1), final
    # Every step completion suspended the invocation; each resumption replayed the journal.
    assert count(final, "enter") > 1

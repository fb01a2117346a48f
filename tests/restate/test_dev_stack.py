"""`tether dev` and `tether resolve`: the local stack with the real worker and sidecar."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from tests.restate.support import (
    PROC_PROBE,
    approval_manifest,
    decide_by_link,
    descendants,
    http,
    kill_tree,
    wait_until,
    without_capabilities,
)
from tether.errors import ConfigError
from tether.programs.dev import DevStack
from tether.programs.webhooks import sign_request, signed_link

SCRIPT = [
    {"tool_calls": [{"name": "write_file", "input": {"path": "out.txt", "content": "yes"}}]},
    {"text": "done"},
]


def read_until_up(process: subprocess.Popen[str]) -> str:
    """What `tether dev` printed until it said it is up (its last line names `tether resolve`)."""
    assert process.stdout is not None
    lines: list[str] = []
    while not any("resolve:" in line for line in lines):
        line = process.stdout.readline()
        assert line, "tether dev exited: " + "".join(lines)
        lines.append(line)
    return "".join(lines)


def approvals(stack: DevStack) -> list[dict[str, Any]]:
    headers = sign_request(stack.secret.encode(), b"", path="/v1/approvals")
    response = httpx2.get(f"{stack.sidecar_url}/v1/approvals", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    parked: list[dict[str, Any]] = response.json()["parked"]
    return parked


def start_run(stack: DevStack, session: str, node: int = 0) -> str:
    """Start a run through the ingress of Restate node `node` (the only one of a one-node
    stack)."""
    url = f"{stack.ingress_urls[node]}/{stack.agent}/{session}/run/send"
    response = httpx2.post(url, json={"prompt": "write it"}, timeout=30)
    assert response.status_code == 202, response.text
    invocation: str = response.json()["invocationId"]
    return invocation


def result_of(stack: DevStack, invocation: str, node: int = 0) -> Any:
    url = f"{stack.ingress_urls[node]}/restate/invocation/{invocation}/attach"
    return httpx2.get(url, timeout=120).json()


def approve_and_finish(
    stack: DevStack, invocation: str, workspace: Path, node: int = 0
) -> dict[str, Any]:
    """Approve the one parked call by its signed link (its page, then the page's Approve); the
    run completes (its result read through node `node`) and writes out.txt. Returns the call's
    record."""
    [call] = wait_until(lambda: approvals(stack), what="a parked call")
    expires = int(time.time()) + 600
    link = signed_link(
        stack.sidecar_url, stack.secret.encode(), "approve", call["awakeable_id"], expires
    )
    assert decide_by_link(link).status == 200
    assert result_of(stack, invocation, node)["status"] == "completed"
    assert (workspace / "out.txt").read_text() == "yes"
    return call


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TETHER_WORKSPACE", str(tmp_path))
    monkeypatch.delenv("TETHER_WEBHOOK_SECRET", raising=False)
    data_dir = tmp_path.with_name(f"{tmp_path.name}-dev")  # outside the workspace
    with DevStack(approval_manifest(tmp_path, "dev-clerk", SCRIPT), data_dir) as running:
        yield running


def test_approve_by_signed_link_and_reject_by_tether_resolve(
    stack: DevStack, tmp_path: Path
) -> None:
    invocation = start_run(stack, "a")
    approve_and_finish(stack, invocation, tmp_path)
    (tmp_path / "out.txt").unlink()

    second = start_run(stack, "b")
    [call] = wait_until(lambda: approvals(stack), what="the second parked call")
    cli = [sys.executable, "-m", "tether", "approvals", "--sidecar", stack.sidecar_url]
    cli += ["--data-dir", str(stack.data_dir)]
    listed = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    [line] = listed.stdout.splitlines()
    assert line.startswith(f"{call['awakeable_id']}  approval  session=b  tool=")
    as_json = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(as_json.stdout)["parked"] == [call]
    resolve = [
        sys.executable,
        "-m",
        "tether",
        "resolve",
        call["awakeable_id"],
        "--reject",
        "--reason",
        "not now",
        "--sidecar",
        stack.sidecar_url,
        "--data-dir",
        str(stack.data_dir),
    ]
    forged = [*resolve[:-1], str(tmp_path / "another-secret")]
    refused = subprocess.run(forged, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and refused.stderr.startswith("401 "), refused
    done = subprocess.run(resolve, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert result_of(stack, second)["status"] == "completed"
    assert not (tmp_path / "out.txt").exists()
    metrics = httpx2.get(f"{stack.sidecar_url}/metrics", timeout=10).text
    assert 'tether_webhook_requests_total{outcome="approved"} 1.0' in metrics
    assert 'tether_webhook_requests_total{outcome="rejected"} 1.0' in metrics
    assert 'tether_runs_total{agent="dev-clerk",status="completed"} 2.0' in metrics


def test_the_tether_dev_command_prints_its_urls_and_stops_everything(tmp_path: Path) -> None:
    spec = approval_manifest(tmp_path, "dev-cli", SCRIPT)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tether",
            "dev",
            "--spec",
            str(spec),
            "--data-dir",
            str(tmp_path / "dev"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        text = read_until_up(process)
        ingress = re.search(r"ingress:\s+(\S+)", text)
        metrics = re.search(r"metrics:\s+(\S+)", text)
        assert ingress and metrics
        health = httpx2.get(f"{ingress.group(1)}/restate/health", timeout=10)
        assert health.status_code == 200
        assert httpx2.get(metrics.group(1), timeout=10).status_code == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        with pytest.raises(httpx2.HTTPError):
            httpx2.get(metrics.group(1), timeout=5)
        with pytest.raises(httpx2.HTTPError):
            httpx2.get(f"{ingress.group(1)}/restate/health", timeout=5)
    finally:
        if process.poll() is None:  # it did not stop: take its stack down with it
            kill_tree(process.pid)
            process.wait()


@pytest.mark.parametrize("first", [True, False], ids=["approve-then-deny", "deny-then-approve"])
def test_the_first_answer_wins_when_two_reach_restate(
    stack: DevStack, tmp_path: Path, first: bool
) -> None:
    """Two answers sent straight to Restate's awakeable endpoint both get 202: Restate keeps the
    first completion of an awakeable and ignores later ones, silently. This pins that behaviour;
    the sidecar does not rely on it (its answers go to the session's `answer` handler under one
    idempotency key per call, so a second one, through any replica, is refused with 409:
    test_sidecar_replicas.py)."""
    invocation = start_run(stack, "twice")
    [call] = wait_until(lambda: approvals(stack), what="a parked call")
    assert stack.worker.popen is not None
    worker = stack.worker.popen.pid
    os.killpg(worker, signal.SIGSTOP)  # both answers arrive before the worker can take one
    try:
        for approved in (first, not first):
            url = f"{stack.server.ingress_url}/restate/awakeables/{call['awakeable_id']}/resolve"
            response = httpx2.post(url, json={"approved": approved}, timeout=30)
            assert response.status_code == 202, response.text
    finally:
        os.killpg(worker, signal.SIGCONT)
    assert result_of(stack, invocation)["status"] == "completed"
    assert (tmp_path / "out.txt").exists() == first


def test_a_signed_webhook_starts_a_run_once(stack: DevStack, tmp_path: Path) -> None:
    """`POST /v1/sessions/{id}/runs` through the real sidecar and ingress: a retried delivery
    with the same (signed) Idempotency-Key is the same run."""
    path = "/v1/sessions/hooked/runs"
    body = json.dumps({"prompt": "write it"}).encode()

    def deliver(timestamp: int | None = None) -> httpx2.Response:
        signed = sign_request(
            stack.secret.encode(),
            body,
            path=path,
            timestamp=timestamp,
            idempotency_key="delivery-1",
        )
        headers = {**signed, "content-type": "application/json"}
        return httpx2.post(f"{stack.sidecar_url}{path}", content=body, headers=headers, timeout=30)

    first = deliver()
    assert first.status_code == 202, first.text
    invocation = first.json()["invocation_id"]
    assert first.json()["status"] == "Accepted"
    retried = deliver(int(time.time()) + 1)
    assert retried.status_code == 202, retried.text
    assert retried.json() == {
        "session": "hooked", "invocation_id": invocation, "status": "PreviouslyAccepted"
    }  # fmt: skip
    assert approve_and_finish(stack, invocation, tmp_path)["session"] == "hooked"


def test_a_message_reaches_the_running_agent_at_its_next_turn(
    stack: DevStack, tmp_path: Path
) -> None:
    """Posted through the sidecar while the run waits for an approval, the message joins the
    tool results of that turn: the model reads it before it goes on."""
    invocation = start_run(stack, "talk")
    wait_until(lambda: approvals(stack), what="the parked call")
    path = "/v1/sessions/talk/messages"
    body = json.dumps({"text": "ship it to staging first"}).encode()
    headers = {
        **sign_request(stack.secret.encode(), body, path=path),
        "content-type": "application/json",
    }
    posted = httpx2.post(f"{stack.sidecar_url}{path}", content=body, headers=headers, timeout=30)
    assert posted.status_code == 202, posted.text
    assert posted.json() == {"session": "talk", "waiting": 1}
    approve_and_finish(stack, invocation, tmp_path)
    url = f"{stack.server.ingress_url}/{stack.agent}/talk/session"
    turns = httpx2.post(url, timeout=30).json()["turns"]
    results = turns[2]
    assert results["role"] == "user"
    assert [b["type"] for b in results["content"]] == ["tool_result", "text"]
    assert results["content"][1]["text"] == "ship it to staging first"


def tool_results(stack: DevStack, session: str) -> list[str]:
    url = f"{stack.server.ingress_url}/{stack.agent}/{session}/session"
    turns = httpx2.post(url, timeout=30).json()["turns"]
    return [
        str(block["content"])
        for turn in turns
        for block in turn["content"]
        if block["type"] == "tool_result"
    ]


def test_the_file_tools_cannot_read_what_the_dev_stack_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tether dev` started in a project (the workspace): its secret, which approves calls, and
    its logs are out of the file tools' reach, where they were (`.tether/dev` in the workspace)
    and where they are (Tether's state directory), by relative, `..` or absolute path."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    monkeypatch.chdir(workspace)
    monkeypatch.delenv("TETHER_WORKSPACE", raising=False)
    monkeypatch.delenv("TETHER_WEBHOOK_SECRET", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    state = tmp_path / "state" / "tether" / "dev"
    paths = [f".tether/dev/{name}" for name in ("webhook-secret", "worker.log", "sidecar.log")]
    paths += ["../state/tether/dev/webhook-secret", str(state / "webhook-secret")]
    calls = [{"name": "read_file", "input": {"path": path}} for path in paths]
    calls.append({"name": "list_files", "input": {"path": "."}})
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "dev-reader"},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": [{"tool_calls": calls}]},
            "tools": [
                {"name": "read_file", "builtin": "read_file"},
                {"name": "list_files", "builtin": "list_files"},
            ],
        },
    }
    spec = tmp_path / "dev-reader.yaml"
    spec.write_text(yaml.safe_dump(document))
    with DevStack(spec) as stack:
        url = f"{stack.server.ingress_url}/{stack.agent}/s/run"
        done = httpx2.post(url, json={"prompt": "read"}, timeout=120)
        assert done.status_code == 200, done.text
        results = tool_results(stack, "s")
        written = [path for path in stack.data_dir.rglob("*") if path.is_file()]
    assert len(results) == len(calls), results
    assert not [r for r in results if stack.secret in r], results
    assert {"webhook-secret", "worker.log", "sidecar.log"} <= {path.name for path in written}
    assert not [p for p in written if workspace.resolve() in p.resolve().parents], written
    in_workspace = [path for path in workspace.rglob("*") if path.is_file()]
    assert not [p for p in in_workspace if stack.secret in p.read_text(errors="replace")]


def test_a_data_dir_inside_the_workspace_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_WORKSPACE", str(tmp_path))
    monkeypatch.delenv("TETHER_WEBHOOK_SECRET", raising=False)
    spec = approval_manifest(tmp_path, "dev-refused", SCRIPT)
    with pytest.raises(ValueError, match="is inside the workspace"):
        DevStack(spec, tmp_path / "dev")
    command = [sys.executable, "-m", "tether", "dev", "--spec", str(spec)]
    command += ["--data-dir", str(tmp_path / ".tether" / "dev")]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
    assert f"is inside the workspace {tmp_path.resolve()}" in refused.stderr
    assert "pass --data-dir outside the workspace" in refused.stderr
    assert not (tmp_path / "dev").exists() and not (tmp_path / ".tether").exists()


def test_no_process_of_the_dev_stack_lets_the_same_user_read_its_secret(tmp_path: Path) -> None:
    """Every process of `tether dev` that holds the webhook secret (`tether dev` itself, the
    worker's supervisor, hypercorn master and child, the sidecar) is non-dumpable, and those
    that cannot be (multiprocessing's resource tracker, restate-server) never get it, nor a
    model key: a process of the same user id, without capabilities like the agent's `shell`,
    finds them in no `/proc/<pid>/environ` and no Python process's memory."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    spec = approval_manifest(tmp_path, "dev-probed", SCRIPT)
    data_dir = tmp_path / "dev"
    hidden = ("TETHER_WEBHOOK_SECRET", "TETHER_WORKSPACE")
    key = secrets.token_hex(16)  # a model key in the user's environment
    env = {**{k: v for k, v in os.environ.items() if k not in hidden}, "ANTHROPIC_API_KEY": key}
    command = [*without_capabilities(), sys.executable, "-m", "tether", "dev"]
    command += ["--spec", str(spec), "--data-dir", str(data_dir)]
    process = subprocess.Popen(
        command,
        cwd=workspace,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        read_until_up(process)
        secret = (data_dir / "webhook-secret").read_text().strip()
        pids = [process.pid, *descendants(process.pid)]
        probe = [*without_capabilities(), sys.executable, str(PROC_PROBE), "--pids"]
        read = subprocess.run(
            [*probe, *map(str, pids)], capture_output=True, text=True, timeout=120
        )
        output = read.stdout
        assert read.returncode == 0 and "probe done" in output, output + read.stderr
        assert "self CapEff:\t0000000000000000" in output, output
        assert secret not in output and key not in output, output
        found = re.findall(r"^pid (\d+): (.*)\n  (.*)\n  (.*)$", output, re.MULTILINE)

        def reads_of(program: str) -> tuple[str, str]:
            [reads] = [(e, m) for _, c, e, m in found if re.match(rf"\S+ {program}", c)]
            return reads

        denied = (
            "environ: cannot read (Permission denied)",
            "memory: cannot read (Permission denied)",
        )
        for holder in (
            "-m tether dev",
            "-I \\S+/deadline.py",
            "-m hypercorn",
            "-m tether sidecar",
        ):
            assert reads_of(holder) == denied, (holder, output)
        assert reads_of("-B -c from multiprocessing.spawn") == denied, output
        assert reads_of("-B -c from multiprocessing.resource_tracker")[0] == "environ: no secret"
        [restate] = [e for _, c, e, _ in found if c.split(" ")[0].endswith("restate-server")]
        assert restate == "environ: no secret", output
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_a_three_node_stack_goes_on_when_the_sidecars_node_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`DevStack(nodes=3)` (`tether dev --nodes 3`): a replicated Restate cluster; the worker and
    the sidecar get every node's ingress, first node first. A run completes; with a second run
    parked on its approval, the first node (the one the sidecar and the worker were using) is
    SIGKILLed, and the approval sent through the sidecar still reaches the run."""
    monkeypatch.setenv("TETHER_WORKSPACE", str(tmp_path))
    monkeypatch.delenv("TETHER_WEBHOOK_SECRET", raising=False)
    data_dir = tmp_path.with_name(f"{tmp_path.name}-dev")
    spec = approval_manifest(tmp_path, "dev-cluster", SCRIPT)
    with DevStack(spec, data_dir, nodes=3) as stack:
        cluster = stack.cluster
        assert cluster is not None and cluster.live() == [0, 1, 2]
        every = [cluster.ingress_url(i) for i in range(3)]
        assert stack.sidecar.env["RESTATE_INGRESS_URL"] == ",".join(every)
        assert stack.worker.env["RESTATE_INGRESS_URL"] == ",".join(every)
        assert "other nodes:" in stack.describe()

        approve_and_finish(stack, start_run(stack, "a", node=1), tmp_path, node=1)
        (tmp_path / "out.txt").unlink()

        second = start_run(stack, "b", node=2)
        wait_until(lambda: approvals(stack), what="the second parked call")
        cluster.kill(0)  # the sidecar's first node: its connections to it fail from now on
        approve_and_finish(stack, second, tmp_path, node=2)
        assert cluster.live() == [1, 2]
        log = (stack.data_dir / "sidecar.log").read_text()
        assert f"Restate at {every[0]} did not answer" in log  # it did fail over


def test_two_nodes_are_refused(tmp_path: Path) -> None:
    spec = approval_manifest(tmp_path, "dev-two", SCRIPT)
    with pytest.raises(ConfigError, match=r"--nodes 2: use 1 .* or 3 or more"):
        DevStack(spec, tmp_path.with_name(f"{tmp_path.name}-dev"), nodes=2)


def test_the_dev_stack_sets_the_specs_schedules_on_its_restate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_WORKSPACE", str(tmp_path))
    monkeypatch.delenv("TETHER_WEBHOOK_SECRET", raising=False)
    path = approval_manifest(tmp_path, "dev-cron", [{"text": f"beat {n}"} for n in range(30)])
    document = yaml.safe_load(path.read_text())
    document["spec"]["webhook"] = {"secretRef": {"name": "hook", "key": "key"}}
    beat = {"name": "beat", "cron": "*/2 * * * * *", "prompt": "beat", "session": "beats"}
    document["spec"]["schedules"] = [beat]
    path.write_text(yaml.safe_dump(document))
    data_dir = tmp_path.with_name(f"{tmp_path.name}-dev")
    with DevStack(path, data_dir) as stack:
        url = f"{stack.ingress_url}/dev-cron/beats/session"
        wait_until(lambda: len(http("POST", url).json()["runs"]) >= 2, timeout=30)
        said = [t["content"][0]["text"] for t in http("POST", url).json()["turns"]]
        assert said[:4] == ["beat", "beat 0", "beat", "beat 1"]

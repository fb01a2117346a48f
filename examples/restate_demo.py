"""`make demo`, part 2: the release clerk on a local Restate stack (`tether dev`).

The same agent, with its `deploy` tool gated by a person's approval:
1. a real restate-server, the worker and the sidecar start on loopback;
2. a run starts through Restate's ingress and parks on the approval (the invocation suspends);
3. the worker is killed with SIGKILL while the run is parked, and a new one started;
4. the approval is sent through the sidecar as a signed webhook (`tether resolve`);
5. the run finishes on the new worker, and the sidecar's /metrics shows what was counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import yaml

from tether.programs.dev import DevStack
from tether.programs.webhooks import sign_request

EXAMPLES = Path(__file__).resolve().parent
PROMPT = "Ship release 1.4.0: notes, deploy, health check, report."
CHANGELOG = "# Changelog\n\n## 1.4.0\n- Faster startup\n- Fix login redirect\n"
SESSION = "release-1-4-0"


def manifest(directory: Path) -> Path:
    """release_clerk.yaml with `deploy` behind an approval (and the scripted model when no API
    key is set, as in part 1)."""
    document = yaml.safe_load((EXAMPLES / "release_clerk.yaml").read_text())
    spec = document["spec"]
    for entry in spec["tools"]:
        if entry["name"] == "deploy":
            entry["requireApproval"] = True
    spec["approvals"] = {"timeout": "1h", "onTimeout": "deny"}
    if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("OPENAI_API_KEY")):
        script = yaml.safe_load((EXAMPLES / "release_clerk.script.yaml").read_text())
        spec["model"] = {"provider": "scripted", "name": "scripted", "script": script["responses"]}
        print("model: scripted (no ANTHROPIC_API_KEY or OPENAI_API_KEY is set)")
    path = directory / "release_clerk_restate.yaml"
    path.write_text(yaml.safe_dump(document))
    (directory / "clerk_tools.py").write_text((EXAMPLES / "clerk_tools.py").read_text())
    return path


def step(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def wait(predicate: Any, what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


def parked_calls(stack: DevStack) -> list[dict[str, Any]]:
    headers = sign_request(stack.secret.encode(), b"", path="/v1/approvals")
    response = httpx2.get(f"{stack.sidecar_url}/v1/approvals", headers=headers, timeout=10)
    response.raise_for_status()
    calls: list[dict[str, Any]] = response.json()["parked"]
    return calls


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tether-restate-demo-") as directory:
        workspace = Path(directory) / "workspace"
        workspace.mkdir()
        (workspace / "CHANGELOG.md").write_text(CHANGELOG)
        os.chdir(workspace)  # the worker's tools work here
        spec = manifest(workspace)
        step("starting restate-server, the worker and the sidecar (tether dev)")
        # Its secret and logs next to the workspace: inside, the file tools could read them.
        with DevStack(spec, Path(directory) / "dev") as stack:
            print(stack.describe())
            return run_demo(stack, workspace)


def run_demo(stack: DevStack, workspace: Path) -> int:
    ingress = stack.server.ingress_url
    step(f"starting a run: POST {ingress}/{stack.agent}/{SESSION}/run/send")
    sent = httpx2.post(
        f"{ingress}/{stack.agent}/{SESSION}/run/send", json={"prompt": PROMPT}, timeout=30
    )
    sent.raise_for_status()
    invocation = sent.json()["invocationId"]
    print(f"invocation {invocation}")
    [call] = wait(lambda: parked_calls(stack), "the deploy to park for approval")
    print(f"parked for approval: {call['tool']}({call['input_summary']})")
    print(f"  awakeable {call['awakeable_id']} (listed by the sidecar's /v1/approvals)")

    step("kill -9 the worker while the run is parked, then start a new one")
    stack.worker.kill()
    print("worker killed; the parked run lives in Restate's journal, not in any worker")
    stack.start_worker()
    print(f"new worker up at {stack.worker_url}")
    assert parked_calls(stack), "the parked call must survive the worker"

    step("approve through the sidecar: tether resolve (an HMAC-signed webhook)")
    resolve = [sys.executable, "-m", "tether", "resolve", call["awakeable_id"]]
    resolve += ["--sidecar", stack.sidecar_url, "--data-dir", str(stack.data_dir)]
    print(subprocess.run(resolve, capture_output=True, text=True, check=True).stdout.strip())

    result = httpx2.get(f"{ingress}/restate/invocation/{invocation}/attach", timeout=120).json()
    step(f"the run finished: {result['status']} after {result['turns']} turns")
    print(f"final answer: {result['text']}")
    ledger = (workspace / "ledger.log").read_text().splitlines()
    print("ledger.log:", *(f"  {line}" for line in ledger), sep="\n")

    step("what the sidecar's /metrics counted")
    metrics = httpx2.get(f"{stack.sidecar_url}/metrics", timeout=10).text
    for line in metrics.splitlines():  # without histograms' buckets and series still at 0
        if line.startswith("tether_") and "_bucket{" not in line and not line.endswith(" 0.0"):
            print(f"  {line}")

    problems = []
    if result["status"] != "completed":
        problems.append(f"the run ended {result['status']!r}")
    if ledger.count("deploy 1.4.0 started") != 1 or ledger.count("deploy 1.4.0 finished") != 1:
        problems.append("the approved deploy did not run exactly once")
    step("result")
    for problem in problems:
        print(f"  FAILED: {problem}")
    if not problems:
        print("  OK: parked, survived kill -9, approved by webhook, finished; deploy ran once")
    print(json.dumps({"invocation": invocation, "status": result["status"]}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""`make demo`: a real agent run killed with SIGKILL mid-deploy, then resumed from its journal.

1. `tether run examples/release_clerk.yaml --run-id demo` starts in a fresh workspace.
2. When the agent starts the slow, unsafe `deploy` tool, the whole process gets SIGKILL.
3. The same command runs again: it replays the journaled steps (no model call, no tool call
   repeated), reports the cut-off deploy to the model as interrupted instead of deploying again,
   and finishes live.
4. The demo checks the workspace's ledger to prove that no tool ran twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
SPEC = EXAMPLES / "release_clerk.yaml"
PROMPT = "Ship release 1.4.0: notes, deploy, health check, report."
CHANGELOG = "# Changelog\n\n## 1.4.0\n- Faster startup\n- Fix login redirect\n"


def journal_of(workspace: Path) -> Path:
    """The run's SQLite journal: next to the workspace, out of the agent's file tools' reach."""
    return workspace.with_name("runs.db")


def tether(workspace: Path, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tether", "run", str(SPEC), "--run-id", "demo"]
    command += ["--db", str(journal_of(workspace))]
    return subprocess.Popen(
        [*command, "--prompt", PROMPT, *extra],
        cwd=workspace,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def banner(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def first_attempt(workspace: Path) -> bool:
    """Run until the deploy starts, then SIGKILL the process. True if it was killed."""
    banner("attempt 1: run until the agent starts deploying, then kill -9")
    process = tether(workspace)
    assert process.stdout is not None
    killed = False
    for line in process.stdout:
        print(f"  | {line}", end="", flush=True)
        if "→ deploy(" in line:
            # The call is announced just before its body runs: kill once the body has written
            # its first effect, so the deploy is cut off in the middle (it takes 2 s).
            deadline = time.monotonic() + 10
            ledger = workspace / "ledger.log"
            while "deploy 1.4.0 started" not in (ledger.read_text() if ledger.exists() else ""):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            os.killpg(process.pid, signal.SIGKILL)
            killed = True
            break
    process.wait()
    if killed:
        print(f"  >>> SIGKILL while `deploy` was running (exit code {process.returncode})")
    else:
        print("  >>> the model never called deploy, so no crash was injected")
    return killed


def second_attempt(workspace: Path) -> dict[str, object]:
    banner("attempt 2: the same command resumes the run from its SQLite journal")
    process = tether(workspace, "--json")
    assert process.stdout is not None
    result: dict[str, object] = {}
    for line in process.stdout:
        if line.startswith("{"):
            result = json.loads(line)
        else:
            print(f"  | {line}", end="", flush=True)
    process.wait()
    return result


def verify(workspace: Path, result: dict[str, object], killed: bool) -> list[str]:
    banner("what happened")
    stats = result.get("stats", {})
    assert isinstance(stats, dict)
    replayed = Counter(result.get("replayed", {}))
    live = Counter(result.get("live", {}))
    print(f"  steps replayed from the journal: {replayed.total()} {dict(replayed)}")
    print(f"  steps run live after the restart: {live.total()} {dict(live)}")
    ledger = (workspace / "ledger.log").read_text().splitlines()
    print("  ledger.log (every side effect the tools made, in order):")
    for line in ledger:
        print(f"    {line}")
    problems = []
    if stats.get("status") != "completed":
        problems.append(f"the resumed run ended {stats.get('status')!r}, not 'completed'")
    repeated = [line for line, n in Counter(ledger).items() if n > 1]
    if repeated:
        problems.append(f"side effects ran twice: {repeated}")
    if killed:
        started = ledger.count("deploy 1.4.0 started")
        if started > 1 or "deploy 1.4.0 finished" in ledger:
            problems.append("the interrupted deploy was run again")
        elif started == 0:
            problems.append("the kill came before the deploy started (nothing was cut off)")
        else:
            print("  the deploy cut off by SIGKILL started once and was never re-run: the model")
            print("  was told its outcome is unknown and checked health instead")
        if not replayed["model"]:
            problems.append("no model call was replayed from the journal")
    return problems


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tether-demo-") as directory:
        workspace = Path(directory) / "workspace"
        workspace.mkdir()
        (workspace / "CHANGELOG.md").write_text(CHANGELOG)
        print(f"workspace: {workspace} (journal in {journal_of(workspace)})")
        killed = first_attempt(workspace)
        result = second_attempt(workspace)
        problems = verify(workspace, result, killed)
    banner("result")
    if problems:
        for problem in problems:
            print(f"  FAILED: {problem}")
        return 1
    print("  OK: the run survived kill -9; nothing was paid for or run twice")
    return 0


if __name__ == "__main__":
    sys.exit(main())

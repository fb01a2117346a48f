"""Unsafe tool calls across worker replicas whose connections to Restate are cut: how many are
journaled with their body's result and how many are reported interrupted, with and without the
handoff between replicas (`tether.programs.worker.handoff`).

    .venv/bin/python bench/replica_cuts.py [--runs 40] [--tool-turns 10] [--cut-every 0.5]
        [--repeat 2] [--seed 5]

One real restate-server and two `tether worker` replicas (index included) of one agent behind a
Kubernetes-like Service (`tether.testing.ServiceFront`: each new connection goes to a replica
picked at random). `--runs` runs start at once, each of `--tool-turns` turns of one unsafe tool
(it stamps its session, call and replica, then works 50-600 ms) and an answer. Meanwhile every
~`--cut-every` seconds (0.3x to 1.7x, seeded) every connection through the Service is reset, as
a lost Restate node or network path resets them: each attempt in flight ends, and the next lands
on either replica. Counted once the runs complete, from their sessions and the stamps: the
calls journaled with a result and those reported interrupted, the bodies run, and any run twice
(must be none). "without the handoff": the same workers without a webhook secret, which the
handoff needs (bodies then reach only a later attempt in their own process).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml
from scripted_agent import scripted_agent

from tether.programs.local_http import request_json as http
from tether.programs.restate_identity import IDENTITY_KEYS_ENV
from tether.programs.restate_install import DEFAULT_RESTATE_VERSION
from tether.programs.restate_server import RestateServer
from tether.testing import HypercornWorker, ServiceFront

AGENT = "cut-agent"
TOOL = '''
import asyncio, os, random
from pathlib import Path

from tether import ToolContext, tool


@tool
async def record(n: int, ctx: ToolContext) -> str:
    """Records step n (unsafe: behind an intent)."""
    with Path(os.environ["CUT_STAMPS"]).open("a") as out:
        out.write("%s %s %s\\n" % (ctx.session_id, ctx.call_id, os.environ["CUT_REPLICA"]))
    await asyncio.sleep(random.uniform(0.05, 0.6))
    return "recorded %d" % n
'''


def call(server: RestateServer, method: str, path: str, payload: Any = None) -> Any:
    resp = http(method, f"{server.ingress_url}/{path}", payload, timeout=600.0)
    if resp.status not in (200, 202):
        raise RuntimeError(f"{path}: HTTP {resp.status}: {resp.body[:500]!r}")
    return resp.json()


def one_round(args: argparse.Namespace, handoff: bool, rng: random.Random) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="tether-cuts-") as tmp,
        RestateServer() as server,
        ExitStack() as stack,
    ):
        directory = Path(tmp)
        (directory / "cut_tools.py").write_text(TOOL)
        script = [
            {"text": f"step {n}", "tool_calls": [{"name": "record", "input": {"n": n}}]}
            for n in range(args.tool_turns)
        ]
        tools = [{"name": "record", "python": "cut_tools:record"}]
        manifest = scripted_agent(AGENT, [*script, {"text": "done"}], tools, args.tool_turns + 1)
        spec = directory / "agent.yaml"
        spec.write_text(yaml.safe_dump(manifest))
        command = [sys.executable, "-m", "tether", "worker", "--spec", str(spec)]
        command += ["--host", "127.0.0.1", "--port", "{port}"]
        ports = []
        for replica in ("a", "b"):
            env = {
                "TETHER_WORKSPACE": str(directory),
                "TETHER_WORKER_GRACEFUL_TIMEOUT": "1",
                "RESTATE_INGRESS_URL": server.ingress_url,
                IDENTITY_KEYS_ENV: server.identity_public_key,
                "CUT_STAMPS": str(directory / "stamps"),
                "CUT_REPLICA": replica,
                "PYTHONPATH": str(directory),
            }
            if handoff:
                env["TETHER_WEBHOOK_SECRET"] = "bench-replica-cuts-0123456789abcdef"
            worker = HypercornWorker("", command=command, env=env, log_dir=directory)
            ports.append(stack.enter_context(worker).port)
        front = stack.enter_context(ServiceFront(lambda: rng.choice(ports)))
        server.register(front.url)

        stop, cuts = threading.Event(), [0]

        def cutter() -> None:
            while not stop.wait(rng.uniform(0.3, 1.7) * args.cut_every):
                front.cut()
                cuts[0] += 1

        thread = threading.Thread(target=cutter, daemon=True)
        sessions = [f"s{i}" for i in range(args.runs)]
        started = time.monotonic()
        thread.start()
        try:
            invocations = [
                call(server, "POST", f"{AGENT}/{s}/run/send", {"prompt": "go"})["invocationId"]
                for s in sessions
            ]
            results = [call(server, "GET", f"restate/invocation/{i}/attach") for i in invocations]
        finally:
            stop.set()
            thread.join()
        seconds = time.monotonic() - started
        stamps = [line.split() for line in (directory / "stamps").read_text().splitlines()]
        ran = Counter((session, call_id) for session, call_id, _ in stamps)
        outcomes: Counter[str] = Counter()
        for session in sessions:
            turns = call(server, "POST", f"{AGENT}/{session}/session")["turns"]
            for block in (b for t in turns for b in t["content"]):
                if block.get("type") == "tool_result":
                    outcomes["interrupted" if block.get("is_error") else "journaled"] += 1
        return {
            "cuts": cuts[0],
            "seconds": seconds,
            "completed": sum(r.get("status") == "completed" for r in results),
            "journaled": outcomes["journaled"],
            "interrupted": outcomes["interrupted"],
            "bodies": len(stamps),
            "twice": sum(1 for n in ran.values() if n > 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--tool-turns", type=int, default=10)
    parser.add_argument("--cut-every", type=float, default=0.5, help="seconds between cuts")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    calls = args.runs * args.tool_turns
    print(
        f"{args.runs} runs of {args.tool_turns} unsafe tool turns on 2 worker replicas, every "
        f"connection cut every ~{args.cut_every} s; restate-server {DEFAULT_RESTATE_VERSION}"
    )
    twice = 0
    for i in range(args.repeat):
        for handoff in (True, False):
            r = one_round(args, handoff, rng)
            twice += r["twice"]
            print(
                f"  {'with' if handoff else 'without'} the handoff, round {i + 1}: {r['cuts']} "
                f"cuts in {r['seconds']:.1f} s; runs completed {r['completed']}/{args.runs}; "
                f"calls journaled {r['journaled']}/{calls}, reported interrupted "
                f"{r['interrupted']}; bodies run {r['bodies']}, twice {r['twice']}"
            )
    if twice:
        raise SystemExit(f"{twice} unsafe bodies ran twice")


if __name__ == "__main__":
    main()

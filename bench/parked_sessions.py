"""1,000 sessions parked on a person's answer at once, on a local stack (`tether dev`).

    python bench/parked_sessions.py [--sessions 1000] [--concurrency 50]

Prints the worker's memory (RSS of the hypercorn processes) before the runs, while they are all
parked, for a fresh worker started while they all stay parked (parked runs are suspended in
Restate: they must not hold worker memory), and after they finished; and the resolutions per
second through the sidecar (signed webhooks) against the same kind of resolutions sent straight
to Restate's ingress, in the same run. Goal: ratio >= 0.8 and every run completes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import yaml

from tether.dev import DevStack
from tether.webhooks import sign_request

SCRIPT = [
    {"tool_calls": [{"name": "ask", "input": {"question": "Ship it?"}}]},
    {"text": "done"},
]


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its descendants, in MiB."""
    total = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
        pending += [int(c) for c in children]
    return total / 1024


def count(stack: DevStack, status: str) -> int:
    rows = stack.server.query(
        "SELECT count(*) AS n FROM sys_invocation "
        f"WHERE target_service_name = '{stack.agent}' AND status = '{status}'"
    )
    return int(rows[0]["n"]) if rows else 0


async def wait_for(check: Callable[[], bool], what: str, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.5)


async def bounded(jobs: list[Callable[[], Awaitable[Any]]], concurrency: int) -> float:
    """Run the jobs with at most `concurrency` in flight; returns the seconds it took."""
    gate = asyncio.Semaphore(concurrency)

    async def one(job: Callable[[], Awaitable[Any]]) -> None:
        async with gate:
            await job()

    started = time.perf_counter()
    await asyncio.gather(*(one(j) for j in jobs))
    return time.perf_counter() - started


async def bench(stack: DevStack, sessions: int, concurrency: int) -> dict[str, Any]:
    worker_pid = stack.worker.popen.pid if stack.worker.popen else 0
    ingress, sidecar = stack.server.ingress_url, stack.sidecar_url
    secret = stack.secret.encode()
    # Keep every connection alive: the default pool keeps 20, and reconnecting costs both paths.
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx2.AsyncClient(timeout=120, limits=limits) as client:
        before = rss_mib(worker_pid)

        async def start(i: int) -> None:
            url = f"{ingress}/{stack.agent}/s{i}/run/send"
            (await client.post(url, json={"prompt": "go"})).raise_for_status()

        await bounded([lambda i=i: start(i) for i in range(sessions)], concurrency)
        await wait_for(lambda: count(stack, "suspended") >= sessions, "all runs suspended")
        parked_rss = rss_mib(worker_pid)
        # A fresh worker while every run stays parked: parked runs live in Restate, not here.
        stack.worker.kill()
        stack.start_worker()
        worker_pid = stack.worker.popen.pid if stack.worker.popen else 0
        fresh_rss = rss_mib(worker_pid)
        headers = sign_request(secret, b"", path="/v1/approvals")
        listed = (await client.get(f"{sidecar}/v1/approvals", headers=headers)).json()["parked"]
        ids = [call["awakeable_id"] for call in listed]
        assert len(ids) == sessions, f"{len(ids)} parked calls listed, expected {sessions}"

        async def via_sidecar(awakeable: str) -> None:
            body = json.dumps({"answer": "yes"}).encode()
            path = f"/v1/awakeables/{awakeable}/resolve"
            signed = {"content-type": "application/json", **sign_request(secret, body, path=path)}
            url = f"{sidecar}{path}"
            (await client.post(url, content=body, headers=signed)).raise_for_status()

        async def via_ingress(awakeable: str) -> None:
            url = f"{ingress}/restate/awakeables/{awakeable}/resolve"
            (await client.post(url, json={"answer": "yes"})).raise_for_status()

        # The worker is stopped (SIGSTOP) while resolutions are timed, so both paths are measured
        # on the same quiet machine rather than against the worker resuming runs; Restate keeps
        # the completions and the runs go on when it continues. Alternating quarters evens out
        # what drift is left.
        os.killpg(worker_pid, signal.SIGSTOP)
        quarter = len(ids) // 4
        chunks = [ids[i * quarter : (i + 1) * quarter] for i in range(4)]
        sidecar_s = ingress_s = 0.0
        for n, chunk in enumerate(chunks):
            path = via_sidecar if n % 2 == 0 else via_ingress
            seconds = await bounded([lambda a=a, p=path: p(a) for a in chunk], concurrency)
            if n % 2 == 0:
                sidecar_s += seconds
            else:
                ingress_s += seconds
        os.killpg(worker_pid, signal.SIGCONT)
        await wait_for(lambda: count(stack, "completed") >= 4 * quarter, "all runs completed")
        after = rss_mib(worker_pid)
    sidecar_rate = 2 * quarter / sidecar_s
    ingress_rate = 2 * quarter / ingress_s
    return {
        "rss_before": before,
        "rss_parked": parked_rss,
        "rss_fresh": fresh_rss,
        "rss_after": after,
        "sidecar_rate": sidecar_rate,
        "ingress_rate": ingress_rate,
        "ratio": sidecar_rate / ingress_rate,
        "completed": count(stack, "completed"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tether-parked-") as directory:
        spec = Path(directory) / "parked.yaml"
        spec.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "tether.dev/v1alpha1",
                    "kind": "DurableAgent",
                    "metadata": {"name": "parked"},
                    "spec": {
                        "model": {"provider": "scripted", "name": "s", "script": SCRIPT},
                        "tools": [{"name": "ask", "builtin": "ask_human"}],
                    },
                }
            )
        )
        os.environ["TETHER_WORKSPACE"] = directory
        with DevStack(spec, Path(directory) / "dev") as stack:
            r = asyncio.run(bench(stack, args.sessions, args.concurrency))
    print(f"{args.sessions} sessions parked on ask_human at once")
    print(
        f"  worker RSS: {r['rss_before']:.0f} MiB before, {r['rss_parked']:.0f} MiB with all "
        f"parked (suspended), {r['rss_fresh']:.0f} MiB for a fresh worker while all stay parked, "
        f"{r['rss_after']:.0f} MiB after all finished"
    )
    print(
        f"  resolutions: sidecar {r['sidecar_rate']:.0f}/s, ingress {r['ingress_rate']:.0f}/s, "
        f"ratio {r['ratio']:.2f} (goal >= 0.8); completed {r['completed']}/{args.sessions}"
    )


if __name__ == "__main__":
    main()

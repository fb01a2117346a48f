"""1,000 sessions parked on a person's answer at once, on a local stack (`tether dev`).

    python bench/parked_sessions.py [--sessions 1000] [--concurrency 50]

Prints the worker's memory (RSS of the hypercorn processes) before the runs, while they are all
parked, for a fresh worker started while they all stay parked (parked runs are suspended in
Restate: they must not hold worker memory), and after they finished; and the resolutions per
second through the sidecar (signed webhooks) against the same kind of resolutions sent straight
to Restate's ingress, in the same run, with the CPU each process spent per resolution. Goal:
ratio >= 0.8 and every run completes. A third path, bench/minimal_proxy.py (a bare ASGI app that
forwards and checks nothing), shows the floor of any Python hop on the same machine.

The client is aiohttp: its cost per request (~0.1 ms) is below the ingress's own, so the rates
measure the two paths rather than the client (an httpx2 client, at ~0.6 ms per request, bounded
both paths at ~1,500/s and so hid most of the sidecar's cost).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tether.programs.dev import DevStack
from tether.programs.process_group import stop_group
from tether.programs.restate_server import free_port
from tether.programs.webhooks import sign_request
from tether.programs.worker.deadline import descendants

BENCH = str(Path(__file__).resolve().parent)
SCRIPT = [
    {"tool_calls": [{"name": "ask", "input": {"question": "Ship it?"}}]},
    {"text": "done"},
]


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its descendants, in MiB."""
    total = 0
    for current in [pid, *descendants(pid)]:
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:

        async def post(url: str, body: bytes, headers: dict[str, str]) -> None:
            headers = {"content-type": "application/json", **headers}
            async with client.post(url, data=body, headers=headers) as response:
                response.raise_for_status()

        before = rss_mib(worker_pid)
        prompt = json.dumps({"prompt": "go"}).encode()
        starts = [f"{ingress}/{stack.agent}/s{i}/run/send" for i in range(sessions)]
        await bounded([lambda url=url: post(url, prompt, {}) for url in starts], concurrency)
        await wait_for(lambda: count(stack, "suspended") >= sessions, "all runs suspended")
        parked_at = time.monotonic()
        parked_rss = rss_mib(worker_pid)

        async def listed() -> list[str]:
            headers = sign_request(secret, b"", path="/v1/approvals")
            async with client.get(f"{sidecar}/v1/approvals", headers=headers) as response:
                return [call["awakeable_id"] for call in (await response.json())["parked"]]

        # Each run adds its call to the agent's index with a one-way send, after it parked.
        ids = await listed()
        while len(ids) < sessions:
            if time.monotonic() - parked_at > 300:
                raise TimeoutError(f"{len(ids)} parked calls listed, expected {sessions}")
            await asyncio.sleep(0.2)
            ids = await listed()
        index_lag = time.monotonic() - parked_at
        # A fresh worker while every run stays parked: parked runs live in Restate, not here.
        stack.worker.kill()
        stack.start_worker()
        worker_pid = stack.worker.popen.pid if stack.worker.popen else 0
        fresh_rss = rss_mib(worker_pid)
        assert len(await listed()) == sessions, "the fresh worker's index lost parked calls"
        answer = json.dumps({"answer": "yes"}).encode()

        async def via_sidecar(awakeable: str) -> None:
            path = f"/v1/awakeables/{awakeable}/resolve"
            await post(f"{sidecar}{path}", answer, sign_request(secret, answer, path=path))

        async def via_ingress(awakeable: str) -> None:
            await post(f"{ingress}/restate/awakeables/{awakeable}/resolve", answer, {})

        async def via_proxy(awakeable: str) -> None:
            await post(f"{proxy.url}/v1/awakeables/{awakeable}/resolve", answer, {})

        # The worker is stopped (SIGSTOP) while resolutions are timed, so the paths are measured
        # on the same quiet machine rather than against the worker resuming runs; Restate keeps
        # the completions and the runs go on when it continues. The paths take turns in the
        # order A B C C B A, which evens out what drift is left.
        paths = {"sidecar": via_sidecar, "proxy": via_proxy, "ingress": via_ingress}
        order = [*paths, *reversed(paths)]
        chunk_size = len(ids) // len(order)
        with MinimalProxy(ingress) as proxy:
            processes = {
                "sidecar": stack.sidecar.popen.pid if stack.sidecar.popen else 0,
                "proxy": proxy.pid,
                "restate": stack.server.pid or 0,
            }
            os.killpg(worker_pid, signal.SIGSTOP)
            seconds = dict.fromkeys(paths, 0.0)
            cpu = {f"{path} {name}": 0.0 for path in paths for name in [*processes, "client"]}
            for n, path in enumerate(order):
                chunk = ids[n * chunk_size : (n + 1) * chunk_size]
                send = paths[path]
                cpu_before = {name: cpu_seconds(pid) for name, pid in processes.items()}
                client_before = time.process_time()
                jobs = [lambda a=a, s=send: s(a) for a in chunk]
                seconds[path] += await bounded(jobs, concurrency)
                for name, pid in processes.items():
                    cpu[f"{path} {name}"] += cpu_seconds(pid) - cpu_before[name]
                cpu[f"{path} client"] += time.process_time() - client_before
            os.killpg(worker_pid, signal.SIGCONT)
        timed = chunk_size * len(order)
        await bounded([lambda a=a: via_sidecar(a) for a in ids[timed:]], concurrency)  # the rest
        await wait_for(lambda: count(stack, "completed") >= sessions, "all runs completed")
        after = rss_mib(worker_pid)
    resolved = 2 * chunk_size  # per path
    rates = {path: resolved / spent for path, spent in seconds.items()}
    return {
        "rss_before": before,
        "rss_parked": parked_rss,
        "rss_fresh": fresh_rss,
        "rss_after": after,
        "index_lag": index_lag,
        "rates": rates,
        "cpu_ms": {key: 1000 * value / resolved for key, value in cpu.items()},
        "completed": count(stack, "completed"),
        "timed": timed,
    }


class MinimalProxy:
    """bench/minimal_proxy.py on uvicorn, on a free loopback port, for the `with` block."""

    def __init__(self, ingress: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "uvicorn", "minimal_proxy:app", "--app-dir", BENCH]
        command += ["--port", str(self.port), "--loop", "uvloop", "--http", "httptools"]
        command += ["--no-access-log", "--log-level", "warning"]
        self.popen = subprocess.Popen(
            command, env={**os.environ, "INGRESS": ingress}, start_new_session=True
        )
        self.pid = self.popen.pid

    def __enter__(self) -> MinimalProxy:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline or self.popen.poll() is not None:
                    stop_group(self.popen, grace=5)
                    raise RuntimeError("the minimal proxy did not start") from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        stop_group(self.popen, grace=5)


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
        workspace = Path(directory) / "workspace"  # the stack's own files stay out of it
        workspace.mkdir()
        os.environ["TETHER_WORKSPACE"] = str(workspace)
        with DevStack(spec, Path(directory) / "dev") as stack:
            r = asyncio.run(bench(stack, args.sessions, args.concurrency))
    print(f"{args.sessions} sessions parked on ask_human at once")
    print(
        f"  worker RSS: {r['rss_before']:.0f} MiB before, {r['rss_parked']:.0f} MiB with all "
        f"parked (suspended), {r['rss_fresh']:.0f} MiB for a fresh worker while all stay parked, "
        f"{r['rss_after']:.0f} MiB after all finished"
    )
    print(
        f"  the sidecar listed all {args.sessions} parked calls {r['index_lag']:.1f} s after the "
        "last run parked (each run adds its call to the agent's index after it parks)"
    )
    rates = r["rates"]
    print(
        f"  resolutions: sidecar {rates['sidecar']:.0f}/s, ingress {rates['ingress']:.0f}/s, "
        f"ratio {rates['sidecar'] / rates['ingress']:.2f} (goal >= 0.8); completed "
        f"{r['completed']}/{args.sessions} ({r['timed']} timed)"
    )
    print(
        f"  floor of any Python hop: a proxy that checks nothing {rates['proxy']:.0f}/s, ratio "
        f"{rates['proxy'] / rates['ingress']:.2f} to the ingress; the sidecar makes "
        f"{rates['sidecar'] / rates['proxy']:.2f} of its rate"
    )
    for path in r["rates"]:
        spent = ", ".join(
            f"{key.split()[1]} {ms:.2f}"
            for key, ms in r["cpu_ms"].items()
            if key.startswith(f"{path} ")
        )
        print(f"  CPU ms per resolution via {path}: {spent}")


if __name__ == "__main__":
    main()

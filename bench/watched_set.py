"""The cost of the watched set (`<agent>-watchers/all`), whose whole value every question reads,
and how often a busy worker asks it.

    .venv/bin/python bench/watched_set.py [--sizes 100,1000,10000] [--questions 200]

Questions: an index (`tether worker --serve index`, its own process, as on the sidecar's pods)
on a restate-server. For each size the set is filled through the ingress (`watch`, 1,000 fresh
tags a call), then `--questions` questions of 100 other tags each (a worker's sessions, none
watched) go 8 at a time. Printed per size: questions a second, their p50, the CPU of the index's
processes and of restate-server per question, and the time of one more `watch` (a registration:
it rewrites the set).

Asking: a `LivePublisher` (the worker's) with 100 sessions streaming text (a batch every 50 ms
each), their runs starting 30 ms apart and lasting `--run-seconds` (each run a new session),
against a stand-in index that answers that nobody watches. Printed per run length: the questions
a second from 4 s to 12 s, and how many tags each carried.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web
from many_runs import AGENT, group_cpu_seconds, process_cpu_seconds, worker_spec

from tether.programs.local_http import request_json as http
from tether.programs.restate_server import RestateServer, free_port
from tether.programs.webhooks import watch_request
from tether.programs.worker.live import LivePublisher
from tether.testing import HypercornWorker

TAGS_PER_QUESTION = 100
SECRET = b"b" * 32


def tags(n: int) -> list[str]:
    return [secrets.token_hex(16) for _ in range(n)]


def registration(n: int) -> dict[str, Any]:
    """`n` new tags, signed as a sidecar registers them (the index's secret: `worker_spec`)."""
    return watch_request(b"bench", tags(n))


def questions(sizes: list[int], count: int) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp,
        RestateServer() as server,
    ):
        env = {
            **worker_spec(Path(tmp), 1, False, server.ingress_url),
            "TETHER_WORKER_SERVES": "index",
        }
        with HypercornWorker(
            "tether.programs.worker.asgi:app", log_dir=Path(tmp), env=env
        ) as index:
            assert index.pid is not None and server.pid is not None
            server.register(index.url)
            base = f"{server.ingress_url}/{AGENT}-watchers/all"
            registered = 0
            print(f"the watched set: {count} questions of {TAGS_PER_QUESTION} tags, 8 at a time")
            for size in sizes:
                while registered < size:
                    batch = min(1_000, size - registered)
                    assert (
                        http("POST", f"{base}/watch", registration(batch), timeout=60).status == 200
                    )
                    registered += batch
                asked = [tags(TAGS_PER_QUESTION) for _ in range(count)]

                def ask(body: list[str]) -> float:
                    started = time.perf_counter()
                    assert http("POST", f"{base}/watched", body, timeout=60).status == 200
                    return time.perf_counter() - started

                index_before, server_before = (
                    group_cpu_seconds(index.pid),
                    process_cpu_seconds(server.pid),
                )
                started = time.perf_counter()
                with ThreadPoolExecutor(8) as pool:
                    latencies = list(pool.map(ask, asked))
                wall = time.perf_counter() - started
                index_cpu = group_cpu_seconds(index.pid) - index_before
                server_cpu = process_cpu_seconds(server.pid) - server_before
                started = time.perf_counter()
                assert http("POST", f"{base}/watch", registration(1), timeout=60).status == 200
                registering = time.perf_counter() - started
                registered += 1
                print(
                    f"  {size:6} tags: {count / wall:5.0f} questions/s, p50 "
                    f"{statistics.median(latencies) * 1000:5.1f} ms; CPU a question: index "
                    f"{index_cpu / count * 1000:.2f} ms, restate-server "
                    f"{server_cpu / count * 1000:.2f} ms; a watch {registering * 1000:.1f} ms"
                )


async def asking(run_seconds: float, sessions: int = 100, seconds: float = 12.0) -> None:
    asked: list[tuple[float, int]] = []

    async def handle(request: web.Request) -> web.Response:
        if request.path.endswith("/watched"):
            asked.append((time.monotonic(), len(await request.json())))
            return web.json_response({})
        return web.json_response({}, status=202)

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    publisher = LivePublisher(
        "bench", f"http://127.0.0.1:{port}", SECRET, timeout=3.0, watch_secrets=(SECRET,)
    )
    try:
        started = time.monotonic()
        while (now := time.monotonic() - started) < seconds:
            for i in range(sessions):
                if now >= i * 0.03:
                    run = int((now - i * 0.03) // run_seconds)
                    publisher(f"s{i}-{run}", 0, {"type": "model_text", "delta": "x"})
            await asyncio.sleep(0.05)
    finally:
        await publisher.close()
        await runner.cleanup()
    steady = [n for at, n in asked if 4 <= at - started < seconds]
    print(
        f"  runs of {run_seconds:g} s: {len(steady) / (seconds - 4):.1f} questions/s, "
        f"{statistics.mean(steady):.0f} tags each"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--run-seconds", default="30,3")
    args = parser.parse_args()
    questions([int(s) for s in args.sizes.split(",")], args.questions)
    print("a worker's questions: 100 sessions streaming")
    for run in args.run_seconds.split(","):
        asyncio.run(asking(float(run)))


if __name__ == "__main__":
    main()

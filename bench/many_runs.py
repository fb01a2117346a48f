"""Many runs through one worker: throughput, CPU per turn and memory per active run, against raw
SDK handlers doing the floor's steps at the same concurrency, on the same restate-server and
worker process.

    python bench/many_runs.py [--runs 100] [--tool-turns 10] [--rounds 9] [--shaped] [--worker]

Ours: `--runs` concurrent runs of a scripted agent on `restate_runtime` (`BenchAgent/run` of
`bench/restate_bench_service.py`), each `--tool-turns` tool turns and a final answer. The floor:
as many concurrent raw handlers (`BenchRaw/steps`), each doing the steps a run must journal (per
safe tool turn the model step and the body, per unsafe one also the intent; the answer's model
step). Each round runs ours and the floor once (alternating which goes first) and reports:

- throughput: tool turns per second over the round's wall time (first request to last answer),
  ours against the floor's turns (its steps divided by the steps per turn);
- worker CPU per turn: the CPU time of the worker's process group over the round (its
  processes' CPU clocks, in ns). While the worker is the bottleneck (one process near a core),
  the floor's against ours is the throughput ratio's steadier twin;
- with `--shaped`, a third side: the floor's steps journaled in the shape of ours (the other
  entries a run journals, at their sizes: `BenchRaw/shaped`), against the floor. It parts the
  gap: what the journal's shape costs, and what is left, Tether's own code in the worker;
- with `--worker`, a fourth side: the same runs on Tether's worker (`tether worker`'s app in a
  process of its own, serving a DurableAgent of the scripted model and the same tool), against
  the floor. What users run: the library's loop with the worker's parts, its metrics hooks, its
  inbox (a call per run to the session's inbox object), its spec's tools, its live events
  (Restate's ingress is set, as on Kubernetes; no client watches the sessions) and its metrics
  in files (`PROMETHEUS_MULTIPROC_DIR`, as on Kubernetes). As on Kubernetes too, the index (the
  inboxes, the watched set, the live events) is served by a second process (`--serve index`,
  the sidecar's pods there): the worker's CPU per turn is the agent's process group's, and the
  index's is printed apart;
- worker RSS per active run: the group's peak RSS during the round above its idle RSS (after a
  warm-up, before the first round), divided by the runs; and the RSS after each round, which
  must level off instead of growing from round to round.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from scripted_agent import scripted_agent

from tether.programs.local_http import request_json as http
from tether.programs.restate_install import DEFAULT_RESTATE_VERSION
from tether.programs.restate_server import RestateServer
from tether.testing import HypercornWorker

BENCH = Path(__file__).resolve().parent
SERVICE = BENCH / "restate_bench_service.py"
AGENT = "bench-worker"
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
_LIBC = ctypes.CDLL(None, use_errno=True)


# The worker's process group, from /proc -------------------------------------------------------


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:  # the 5th field of stat: the process group
                pids.append(int(entry))
    return pids


def process_cpu_seconds(pid: int) -> float:
    # The process's CPU clock counts ns, its exited threads included; stat's utime + stime count
    # clock ticks (10 ms: 2% of a round's worker CPU), the fallback.
    clock = ctypes.c_int()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) == 0:
        try:
            return time.clock_gettime(clock.value)
        except OSError:  # it exited
            return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def group_cpu_seconds(pgid: int) -> float:
    return sum(process_cpu_seconds(pid) for pid in group_pids(pgid))


def rss_of(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except OSError:
            continue
    return total


def group_rss_bytes(pgid: int) -> int:
    return rss_of(group_pids(pgid))


class PeakRss:
    """Samples the group's RSS every 20 ms until stopped; the peak."""

    def __init__(self, pgid: int) -> None:
        self.pgid, self.peak = pgid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, group_rss_bytes(self.pgid))
            self._stop.wait(0.02)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def middle_half(values: Sequence[float]) -> str:
    """The first and third quartiles: how far a round's figure moves on a busy machine."""
    if len(values) < 4:
        return "n/a under 4 rounds"
    low, _, high = statistics.quantiles(values, n=4)
    return f"{low:.2f}-{high:.2f}"


# One side of a round --------------------------------------------------------------------------


def call(server: RestateServer, path: str, payload: Any) -> None:
    resp = http("POST", f"{server.ingress_url}/{path}", payload, timeout=600.0)
    if resp.status != 200:
        raise RuntimeError(f"{path}: HTTP {resp.status}: {resp.body[:500]!r}")


def measure(
    server: RestateServer,
    pgid: int,
    runs: int,
    one: Callable[[str], tuple[str, Any]],
    index_pgid: int = 0,
) -> dict[str, float]:
    """`runs` concurrent calls of `one(key) -> (path, payload)`: wall, CPU and RSS figures (and
    the CPU of the process group `index_pgid`, when given)."""
    requests = [one(uuid.uuid4().hex[:12]) for _ in range(runs)]
    assert server.pid is not None
    cpu_before = group_cpu_seconds(pgid)
    index_before = group_cpu_seconds(index_pgid) if index_pgid else 0.0
    server_before = process_cpu_seconds(server.pid)
    with PeakRss(pgid) as peak, ThreadPoolExecutor(max_workers=runs) as pool:
        started = time.perf_counter()
        for future in [pool.submit(call, server, path, payload) for path, payload in requests]:
            future.result()
        wall = time.perf_counter() - started
    return {
        "wall": wall,
        "cpu": group_cpu_seconds(pgid) - cpu_before,
        "server_cpu": process_cpu_seconds(server.pid) - server_before,
        "index_cpu": group_cpu_seconds(index_pgid) - index_before if index_pgid else 0.0,
        "rss_peak": peak.peak,
        "rss_after": group_rss_bytes(pgid),
    }


def worker_spec(directory: Path, turns: int, unsafe: bool, ingress_url: str) -> dict[str, str]:
    """The environment of a worker serving a DurableAgent whose runs are those of `BenchAgent`
    (the scripted model's turns, the bench service's tool), its spec written in `directory`;
    as on Kubernetes, with Restate's ingress (it sends the live events of watched sessions) and
    its metrics in files (`PROMETHEUS_MULTIPROC_DIR`, which its processes share)."""
    metrics = directory / "metrics"
    metrics.mkdir(exist_ok=True)
    from restate_bench_service import script

    tool = "record" if unsafe else "lookup"
    tools = [{"name": tool, "python": f"restate_bench_service:{tool}"}]
    manifest = scripted_agent(AGENT, script(turns + 1, tool), tools, turns + 1)
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return {
        "TETHER_SPEC": str(path),
        "TETHER_WORKSPACE": str(directory),
        "TETHER_WEBHOOK_SECRET": "bench",
        "TETHER_WEBHOOK_BASE_URL": "http://sidecar.invalid",
        "RESTATE_INGRESS_URL": ingress_url,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics),
        "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="concurrent runs")
    parser.add_argument("--tool-turns", type=int, default=10, help="tool turns per run")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--unsafe", action="store_true", help="unsafe tools (an intent each)")
    parser.add_argument(
        "--shaped", action="store_true", help="also raw steps journaled in the shape of ours"
    )
    parser.add_argument(
        "--worker", action="store_true", help="also the same runs on Tether's worker app"
    )
    args = parser.parse_args()

    turns = args.tool_turns
    per_turn = 3 if args.unsafe else 2
    floor_steps = per_turn * turns + 1

    def ours(key: str) -> tuple[str, Any]:
        return f"BenchAgent/{key}/run", {"turns": turns + 1, "unsafe": args.unsafe}

    def raw(key: str) -> tuple[str, Any]:
        return f"BenchRaw/{key}/steps", floor_steps

    def shaped(key: str) -> tuple[str, Any]:
        return f"BenchRaw/{key}/shaped", floor_steps

    def on_worker(key: str) -> tuple[str, Any]:
        return f"{AGENT}/{key}/run", {"prompt": "go"}

    if args.shaped and args.unsafe:
        parser.error("--shaped has the shape of a safe tool run")

    with (
        tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp,
        RestateServer() as server,
        HypercornWorker(f"{SERVICE}:app", log_dir=Path(tmp)) as worker,
        contextlib.ExitStack() as stack,
    ):
        server.register(worker.url)
        assert worker.pid is not None
        pgid = worker.pid
        measure(server, pgid, 10, ours)  # warm-up: imports, connections
        measure(server, pgid, 10, raw)
        worker_pgid = index_pgid = 0
        if args.worker:  # the agent's worker and the index, as their two Deployments serve them
            env = worker_spec(Path(tmp), turns, args.unsafe, server.ingress_url)
            app = "tether.programs.worker.asgi:app"
            pids: dict[str, int] = {}
            for serves in ("agent", "index"):
                served = stack.enter_context(
                    HypercornWorker(
                        app, log_dir=Path(tmp), env={**env, "TETHER_WORKER_SERVES": serves}
                    )
                )
                server.register(served.url)
                assert served.pid is not None
                pids[serves] = served.pid
            worker_pgid, index_pgid = pids["agent"], pids["index"]
            measure(server, worker_pgid, 10, on_worker)
        idle = group_rss_bytes(pgid)
        kind = "unsafe" if args.unsafe else "safe"
        print(
            f"{args.runs} concurrent runs of {turns} {kind} tool turns and an answer through one "
            f"worker, against raw SDK handlers of {floor_steps} steps; restate-server "
            f"{DEFAULT_RESTATE_VERSION}; {args.rounds} rounds; worker idle RSS "
            f"{idle / 2**20:.0f} MiB"
        )
        ratios, cpu_ours, cpu_raw, per_run, after = [], [], [], [], []
        server_ours, server_raw = [], []
        shaped_ratios: list[float] = []
        worker_ratios: list[float] = []
        cpu_worker: list[float] = []
        cpu_index: list[float] = []
        for i in range(args.rounds):
            sides = [("ours", ours), ("raw", raw), *([("shaped", shaped)] if args.shaped else [])]
            sides += [("worker", on_worker)] if args.worker else []
            results = {
                name: (
                    measure(server, worker_pgid, args.runs, one, index_pgid)
                    if name == "worker"
                    else measure(server, pgid, args.runs, one)
                )
                for name, one in (sides if i % 2 == 0 else sides[::-1])
            }
            o, r = results["ours"], results["raw"]
            total_turns = args.runs * turns
            ratio = (total_turns / o["wall"]) / (total_turns / r["wall"])
            ratios.append(ratio)
            cpu_ours.append(o["cpu"] / total_turns)
            cpu_raw.append(r["cpu"] / total_turns)
            server_ours.append(o["server_cpu"] / total_turns)
            server_raw.append(r["server_cpu"] / total_turns)
            per_run.append((o["rss_peak"] - idle) / args.runs)
            after.append(o["rss_after"])
            print(
                f"  round {i + 1}: ours {total_turns / o['wall']:6.0f} turns/s, floor "
                f"{total_turns / r['wall']:6.0f} turns/s, throughput ratio {ratio:.2f}; worker CPU "
                f"per turn {cpu_ours[-1] * 1000:.2f} ms (floor {cpu_raw[-1] * 1000:.2f} ms), "
                f"restate-server's {server_ours[-1] * 1000:.2f} ms (floor "
                f"{server_raw[-1] * 1000:.2f} ms); RSS "
                f"peak +{per_run[-1] / 2**10:.0f} KiB per active run (floor "
                f"+{(r['rss_peak'] - idle) / args.runs / 2**10:.0f} KiB), after the "
                f"round {o['rss_after'] / 2**20:.0f} MiB"
            )
            if args.shaped:
                shape = results["shaped"]
                shaped_ratios.append(r["wall"] / shape["wall"])
                print(
                    f"    shaped: {total_turns / shape['wall']:6.0f} turns/s, ratio "
                    f"{shaped_ratios[-1]:.2f}; worker CPU per turn "
                    f"{shape['cpu'] / total_turns * 1000:.2f} ms, restate-server's "
                    f"{shape['server_cpu'] / total_turns * 1000:.2f} ms"
                )
            if args.worker:
                served_round = results["worker"]
                worker_ratios.append(r["wall"] / served_round["wall"])
                cpu_worker.append(served_round["cpu"] / total_turns)
                cpu_index.append(served_round["index_cpu"] / total_turns)
                print(
                    f"    the worker: {total_turns / served_round['wall']:6.0f} turns/s, ratio "
                    f"{worker_ratios[-1]:.2f}; worker CPU per turn {cpu_worker[-1] * 1000:.2f} "
                    f"ms, its index's {cpu_index[-1] * 1000:.2f} ms, restate-server's "
                    f"{served_round['server_cpu'] / total_turns * 1000:.2f} ms"
                )
        print(
            f"  median: throughput ratio {statistics.median(ratios):.2f} (goal >= 0.8; its middle "
            f"half {middle_half(ratios)}), worker CPU per turn "
            f"{statistics.median(cpu_ours) * 1000:.3f} ms vs the floor's "
            f"{statistics.median(cpu_raw) * 1000:.3f} ms (the floor's against ours "
            f"{statistics.median(cpu_raw) / statistics.median(cpu_ours):.2f}; restate-server's "
            f"{statistics.median(server_ours) * 1000:.2f} ms vs "
            f"{statistics.median(server_raw) * 1000:.2f} ms), RSS per active run "
            f"{max(per_run) / 2**10:.0f} KiB at most; RSS after rounds "
            f"{', '.join(f'{a / 2**20:.0f}' for a in after)} MiB (idle {idle / 2**20:.0f} MiB)"
        )
        if args.shaped:
            print(
                f"  shaped: throughput ratio {statistics.median(shaped_ratios):.2f} (its middle "
                f"half {middle_half(shaped_ratios)}): the journal's shape; ours against it "
                f"{statistics.median(ratios) / statistics.median(shaped_ratios):.2f}: Tether's "
                "code in the worker"
            )
        if args.worker:
            print(
                f"  the worker: throughput ratio {statistics.median(worker_ratios):.2f} (its "
                f"middle half {middle_half(worker_ratios)}), worker CPU per turn "
                f"{statistics.median(cpu_worker) * 1000:.3f} ms (the floor's against it "
                f"{statistics.median(cpu_raw) / statistics.median(cpu_worker):.2f}), its "
                f"index's {statistics.median(cpu_index) * 1000:.3f} ms"
            )


if __name__ == "__main__":
    main()

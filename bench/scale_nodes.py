"""Scale by numbers (issue 16, part 5): the same concurrent runs on 1 Restate node with 1 worker,
3 nodes with 1 worker and 3 nodes with 3 workers, all on loopback.

    python bench/scale_nodes.py [--runs 200] [--tool-turns 10] [--rounds 3] [--streams 8] [--json]

Load: `--runs` concurrent runs of the scripted agent of `bench/restate_bench_service.py`
(`BenchAgent/<key>/run` on `restate_runtime`: `--tool-turns` safe tool turns and an answer), each
run a different object key, so Restate spreads them over its partitions. The client sends run
`i` to the ingress of node `i mod nodes`, as a load balancer in front of every node would, and
holds every request open until its run's answer.

Configurations, all with `--partitions` (default 6) partitions so that only the nodes and the
workers change:

- (a) `1n1w`: one `RestateServer` (a single node: local loglet, local metadata) and one worker;
- (b) `3n1w`: a `RestateCluster` of 3 nodes (replicated metadata, logs and partitions on
  `--replication`, default 2, nodes) and the same worker;
- (c) `3n3w`: the same cluster and 3 worker processes behind one registered address.

Three workers behind one address: Restate sends a service's new invocations to its latest
deployment, so three registered URLs would not share the work; in Kubernetes three pods share a
Service, which kube-proxy balances per TCP connection. Here the three workers are three separate
process groups (three "pods"), each the hypercorn CLI exactly as `HypercornWorker` runs it, but
bound (`--bind fd://N`) to a socket this script makes with `SO_REUSEPORT` on one port (`--serve-
worker`): the kernel hashes each new connection to one of them, per connection like kube-proxy,
and no forwarder sits in between (a Python forwarder would cost more CPU than what it measures,
on the same 2 cores). Restate multiplexes invocations as HTTP/2 streams over few long-lived
connections (`http2-streams-per-connection-limit`, default 128; `--streams` sets it on every
node), so how evenly the workers are used depends on how many connections each node opens and
where they land: the open connections from each node to each worker are counted (from
`/proc/net/tcp` and the processes' sockets) after each measurement.

The stacks stay up for all rounds (about 1 GB of RSS in all); (b) and (c) share the cluster,
switched by registering the one or the other address again (forced: it becomes the latest
deployment; every node is polled until it routes there). Each round runs every configuration
once, in the order a b c, then c b a, and so on; each configuration first does a warm-up of 20
runs. Measured per configuration and round:

- throughput: tool turns per second over the wall time from the first request to the last
  answer (a tool turn is two journaled steps: the model's and the tool's);
- turn latency: from the journal's `appended_at` (`sys_journal`, ms resolution): the time from
  one tool step's completion (`Notification: Run` after `Command: Run tool:...`) to the next, the
  first from the run's `Input` entry; p50 and p99 over every turn of every run. And the run
  latency the client saw (p50, p99);
- CPU per tool turn of each process group (`/proc` utime + stime; each restate-server node, each
  worker, the client: this process, `getrusage`) and each group's peak RSS (sampled every
  100 ms); and how busy the whole machine was (`/proc/stat`): other work on shared cores takes
  its share, and throughput is the share left to us divided by the CPU per turn;
- what the runs touched: the runs per partition (from the partition key in `sys_invocation_status`)
  and per partition leader (`RestateCluster.leaders`), and the invocations of every service
  Restate recorded during the round (a run that touched a shared Tether key, a budget ledger, the
  parked index, an inbox, would show there);
- a hot key for comparison: `--hot-calls` (default `--runs`) concurrent one-step exclusive calls
  (`BenchRaw/<key>/steps`) on one key against as many on distinct keys: what Restate does with
  one key that every request must pass (Tether's `<agent>-parked/all` index is such a key for
  parking and answering; nothing on a step's path is);
- the operator's two queries (`tether_operator.restate_admin`: unfinished invocations by
  deployment, parked calls from `state`), best of 3, against the invocations and state rows
  Restate keeps by then.

Before the rounds, each process's idle CPU and RSS are measured over `--idle` seconds (default
5). Medians over the rounds are printed with the range; `--json` prints one JSON object instead.
On 2 shared cores this cannot show scale-out (three nodes share the cores one node had), only
what each process costs per step and that nothing in the path serializes what Restate spreads.
Every process is stopped and every directory removed on exit (`with`). Results and the plan they
back: `docs/scale.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from many_runs import SERVICE, TICKS, group_cpu_seconds, group_pids, rss_of

from tether.programs.local_http import request_json as http
from tether.programs.restate_cluster import RestateCluster, partition_of_key
from tether.programs.restate_install import DEFAULT_RESTATE_VERSION
from tether.programs.restate_server import RestateServer
from tether.testing import HypercornWorker

APP = f"{SERVICE}:app"
WARMUP = 20
SAMPLE_EVERY = 0.1
QUERY_MEMORY = {"RESTATE_ADMIN__QUERY_ENGINE__MEMORY_SIZE": "64MiB"}  # as the cluster's nodes
STREAMS_ENV = "RESTATE_WORKER__INVOKER__HTTP2_STREAMS_PER_CONNECTION_LIMIT"


# Processes, from /proc -----------------------------------------------------------------------


@dataclass
class Proc:
    """A process group the bench measures: a restate-server node or a worker."""

    name: str
    pgid: int

    def cpu(self) -> float:
        return group_cpu_seconds(self.pgid)


def machine_cpu() -> tuple[float, float, float]:
    """Seconds of CPU time since boot over all cores: busy, idle, waiting for I/O."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    user, nice, system, idle, iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / TICKS, idle / TICKS, iowait / TICKS


def client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class PeakRss:
    """The peak RSS of each group, sampled every 100 ms (their pids listed once, at the start)."""

    def __init__(self, procs: Sequence[Proc]) -> None:
        self.pids = {p.name: group_pids(p.pgid) for p in procs}
        self.peak = dict.fromkeys(self.pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            for name, pids in self.pids.items():
                self.peak[name] = max(self.peak[name], rss_of(pids))
            self._stop.wait(SAMPLE_EVERY)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def tcp_table() -> list[tuple[int, int, str, int]]:
    """(local port, remote port, state: "0A" listening, "01" established; inode) of every IPv4
    TCP socket (all of them on 127.0.0.1 here)."""
    table = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(f.split(":")[1], 16) for f in fields[1:3])
        table.append((local, remote, fields[3], int(fields[9])))
    return table


def socket_inodes(pgid: int) -> set[int]:
    inodes: set[int] = set()
    for pid in group_pids(pgid):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(int(target[8:-1]))
    return inodes


def listening(pgid: int, port: int) -> bool:
    mine = socket_inodes(pgid)
    return any(
        local == port and state == "0A" and inode in mine for local, _, state, inode in tcp_table()
    )


def connections(nodes: Sequence[Proc], workers: Sequence[Proc], port: int) -> dict[str, int]:
    """The open connections from each node to each worker on `port` ("n1>w2": count)."""
    table = tcp_table()
    established = {(local, remote): inode for local, remote, state, inode in table if state == "01"}
    owner = {inode: p.name for p in [*nodes, *workers] for inode in socket_inodes(p.pgid)}
    found: Counter[str] = Counter()
    for (local, remote), inode in established.items():
        peer = established.get((remote, port))
        if local == port and inode in owner and peer in owner:
            found[f"{owner[peer]}>{owner[inode]}"] += 1
    return dict(sorted(found.items()))


# Three workers on one port -------------------------------------------------------------------


def serve_worker(port: int, config: str, app: str) -> None:
    """Become the hypercorn CLI, bound to a socket of `port` shared with `SO_REUSEPORT`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.set_inheritable(True)
    python = sys.executable
    argv = [python, "-m", "hypercorn", "--config", config, "--bind", f"fd://{sock.fileno()}", app]
    os.execv(python, argv)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def reuseport_workers(stack: contextlib.ExitStack, count: int, root: Path) -> list[HypercornWorker]:
    """`count` worker process groups sharing one port, each listening before this returns."""
    port = free_port()
    workers = []
    for i in range(count):
        log_dir = root / f"w3-{i + 1}"
        log_dir.mkdir()
        config = str(log_dir / "hypercorn-{port}.toml")  # written by HypercornWorker.start
        command = [sys.executable, __file__, "--serve-worker", "{port}", config, APP]
        worker = HypercornWorker(APP, port=port, log_dir=log_dir, command=command)
        workers.append(stack.enter_context(worker))
        deadline = time.monotonic() + 60
        # The port answers once any of them serves: wait until this one listens too.
        while worker.pid is None or not listening(worker.pid, port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {i + 1} is not listening:\n{worker.log_tail()}")
            time.sleep(0.05)
    return workers


# Configurations --------------------------------------------------------------------------------


@dataclass
class Config:
    name: str
    what: str
    ingresses: list[str]
    nodes: list[Proc]
    workers: list[Proc]
    worker_port: int
    query: Callable[[str], list[dict[str, Any]]]
    activate: Callable[[], None] = lambda: None
    partitions: int = 1
    leaders: Callable[[], dict[int, int]] = dict
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def procs(self) -> list[Proc]:
        return [*self.nodes, *self.workers]


def cluster_switch(cluster: RestateCluster, uri: str) -> Callable[[], None]:
    """Make `uri` the latest deployment of the bench's services, on every node."""

    def activate() -> None:
        deployment = cluster.register(uri)
        deadline = time.monotonic() + 60
        sql = "SELECT deployment_id FROM sys_service WHERE name = 'BenchAgent'"
        for node in cluster.nodes:
            while [r.get("deployment_id") for r in node.query(sql)] != [deployment]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{node.admin_url} does not route to {uri}")
                time.sleep(0.1)

    return activate


# One measurement -------------------------------------------------------------------------------


def post(url: str, payload: Any) -> Any:
    resp = http("POST", url, payload, timeout=900.0)
    if resp.status != 200:
        raise RuntimeError(f"{url}: HTTP {resp.status}: {resp.body[:500]!r}")
    return resp.json()


def concurrently(urls: Sequence[str], payload: Any) -> tuple[float, list[float]]:
    """POST every URL at once; the wall time and each call's latency."""
    latencies = [0.0] * len(urls)

    def one(i: int) -> None:
        began = time.perf_counter()
        post(urls[i], payload)
        latencies[i] = time.perf_counter() - began

    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        started = time.perf_counter()
        for future in [pool.submit(one, i) for i in range(len(urls))]:
            future.result()
        wall = time.perf_counter() - started
    return wall, latencies


def run_urls(config: Config, keys: Sequence[str]) -> list[str]:
    ingress = config.ingresses
    return [f"{ingress[i % len(ingress)]}/BenchAgent/{key}/run" for i, key in enumerate(keys)]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def when(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def poll_rows(config: Config, sql: str, want: int, what: str) -> list[dict[str, Any]]:
    """A query's rows once there are `want` of them (a cluster node may answer without the rows
    of a partition it hands over)."""
    deadline = time.monotonic() + 60
    while True:
        rows = config.query(sql)
        if len(rows) >= want:
            return rows
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {len(rows)} rows, expected {want}")
        time.sleep(0.2)


def services_seen(config: Config) -> Counter[str]:
    sql = (
        "SELECT target_service_name AS s, COUNT(*) AS n FROM sys_invocation_status "
        "GROUP BY target_service_name"
    )
    return Counter({str(r["s"]): int(r["n"]) for r in config.query(sql)})


def journal_of(config: Config, tag: str, runs: int) -> dict[str, Any]:
    """Turn latencies and the spread of the round's runs, from Restate's tables."""
    invocations = poll_rows(
        config,
        "SELECT id, partition_key FROM sys_invocation_status "
        f"WHERE target_service_key LIKE '{tag}-%'",
        runs,
        "the round's invocations",
    )
    ids = ", ".join(f"'{r['id']}'" for r in invocations)
    entries = config.query(
        f"SELECT id, index, entry_type, name, appended_at FROM sys_journal WHERE id IN ({ids})"
    )
    by_run: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_run.setdefault(str(entry["id"]), []).append(entry)
    turns: list[float] = []
    runs_steps: list[int] = []
    sizes: list[int] = []
    for journal in by_run.values():
        journal.sort(key=lambda e: int(e["index"]))
        sizes.append(len(journal))
        runs_steps.append(sum(1 for e in journal if e["entry_type"] == "Command: Run"))
        last = when(journal[0]["appended_at"])  # the Input entry
        waiting_for_tool = False
        for entry in journal:
            kind = entry["entry_type"]
            if kind == "Command: Run":
                waiting_for_tool = str(entry["name"]).startswith("tool:")
            elif kind == "Notification: Run" and waiting_for_tool:
                at = when(entry["appended_at"])
                turns.append(at - last)
                last, waiting_for_tool = at, False
    partitions = Counter(
        partition_of_key(int(r["partition_key"]), config.partitions) for r in invocations
    )
    leaders = config.leaders()
    per_leader = Counter(
        config.nodes[leaders[p]].name for p in partitions.elements() if p in leaders
    )
    return {
        "turn_ms": [t * 1000 for t in turns],
        "journals": len(by_run),
        "entries_per_run": statistics.median(sizes) if sizes else 0,
        "run_steps_per_run": statistics.median(runs_steps) if runs_steps else 0,
        "runs_per_partition": dict(sorted(partitions.items())),
        "runs_per_leader": dict(sorted(per_leader.items())),
    }


# The operator's queries (`tether_operator.restate_admin`): every supervision pass reads the
# first (cached, at most 10 s old), and the parked calls of every agent with the second.
OPERATOR_QUERIES = {
    "in_flight": (
        "SELECT pinned_deployment_id AS id, target_service_name AS service, status, "
        "COUNT(*) AS n FROM sys_invocation WHERE status != 'completed' "
        "GROUP BY pinned_deployment_id, target_service_name, status"
    ),
    "parked": (
        "SELECT service_name AS service, value_utf8 AS value FROM state WHERE key = 'tether:parked'"
    ),
}


def operator_queries(config: Config) -> dict[str, float]:
    """The time of each of the operator's queries (best of 3, ms), and the rows they scan."""
    out: dict[str, float] = {}
    for name, sql in OPERATOR_QUERIES.items():
        times = []
        for _ in range(3):
            began = time.perf_counter()
            config.query(sql)
            times.append(time.perf_counter() - began)
        out[f"{name}_ms"] = min(times) * 1000
    for name, sql in (
        ("invocations", "SELECT COUNT(*) AS n FROM sys_invocation_status"),
        ("state_rows", "SELECT COUNT(*) AS n FROM state"),
    ):
        out[name] = float(config.query(sql)[0]["n"])
    return out


def hot_key(config: Config, calls: int, tag: str) -> dict[str, float]:
    """One-step exclusive calls: all on one key, then each on a key of its own."""
    ingress = config.ingresses
    hot = [f"{ingress[i % len(ingress)]}/BenchRaw/{tag}-hot/steps" for i in range(calls)]
    spread = [f"{ingress[i % len(ingress)]}/BenchRaw/{tag}-{i}/steps" for i in range(calls)]
    hot_wall, _ = concurrently(hot, 1)
    spread_wall, _ = concurrently(spread, 1)
    return {"one_key_per_s": calls / hot_wall, "distinct_keys_per_s": calls / spread_wall}


def measure(config: Config, runs: int, tool_turns: int, hot_calls: int) -> dict[str, Any]:
    config.activate()
    payload = {"turns": tool_turns + 1}
    warm = f"w{uuid.uuid4().hex[:8]}"
    concurrently(run_urls(config, [f"{warm}-{i}" for i in range(WARMUP)]), payload)
    tag = f"m{uuid.uuid4().hex[:8]}"
    keys = [f"{tag}-{i}" for i in range(runs)]
    urls = run_urls(config, keys)
    seen_before = services_seen(config)
    procs = config.procs
    cpu_before = {p.name: p.cpu() for p in procs}
    client_before = client_cpu()
    machine_before = machine_cpu()
    with PeakRss(procs) as peak:
        wall, latencies = concurrently(urls, payload)
    machine = [after - before for after, before in zip(machine_cpu(), machine_before, strict=True)]
    client = client_cpu() - client_before
    cpu = {p.name: p.cpu() - cpu_before[p.name] for p in procs}
    cpu["client"] = client
    open_connections = connections(config.nodes, config.workers, config.worker_port)
    journal = journal_of(config, tag, runs)
    touched = services_seen(config) - seen_before
    turns_total = runs * tool_turns
    turn_ms = journal.pop("turn_ms")
    result = {
        "wall_s": wall,
        "turns_per_s": turns_total / wall,
        "turn_p50_ms": percentile(turn_ms, 50),
        "turn_p99_ms": percentile(turn_ms, 99),
        "turns_timed": len(turn_ms),
        "run_p50_s": percentile(latencies, 50),
        "run_p99_s": percentile(latencies, 99),
        "cpu_ms_per_turn": {k: v / turns_total * 1000 for k, v in cpu.items()},
        "cpu_cores": {k: v / wall for k, v in cpu.items()},
        "machine_cores": {
            "busy": machine[0] / wall,
            "idle": machine[1] / wall,
            "iowait": machine[2] / wall,
        },
        "rss_peak_mib": {k: v / 2**20 for k, v in peak.peak.items()},
        "worker_connections": open_connections,
        "invocations_by_service": dict(touched),
        **journal,
    }
    if hot_calls:
        result["hot_key"] = hot_key(config, hot_calls, f"h{uuid.uuid4().hex[:8]}")
    result["operator_queries"] = operator_queries(config)
    return result


# The stacks ------------------------------------------------------------------------------------


@contextlib.contextmanager
def stacks(args: argparse.Namespace) -> Iterator[list[Config]]:
    """Every configuration's processes, up for all rounds; all stopped on the way out."""
    wanted = args.configs.split(",")
    extra = {STREAMS_ENV: str(args.streams)} if args.streams else {}
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tether-scale-")))
        (root / "w1").mkdir()
        w1 = stack.enter_context(HypercornWorker(APP, log_dir=root / "w1"))
        assert w1.pid is not None
        w1_proc = Proc("w1", w1.pid)
        configs: list[Config] = []
        if "1n1w" in wanted:
            env = {"RESTATE_DEFAULT_NUM_PARTITIONS": str(args.partitions), **QUERY_MEMORY, **extra}
            single = stack.enter_context(RestateServer(extra_env=env, node_name="single"))
            single.register(w1.url)
            assert single.pid is not None
            configs.append(
                Config(
                    "1n1w",
                    "1 node, 1 worker",
                    [single.ingress_url],
                    [Proc("n", single.pid)],
                    [w1_proc],
                    w1.port,
                    single.query,
                    partitions=args.partitions,
                    leaders=lambda: dict.fromkeys(range(args.partitions), 0),
                )
            )
        if {"3n1w", "3n3w"} & set(wanted):
            cluster = stack.enter_context(
                RestateCluster(
                    size=3,
                    partitions=args.partitions,
                    replication=args.replication,
                    extra_env=extra,
                )
            )
            nodes = []
            for i, node in enumerate(cluster.nodes):
                assert node.pid is not None
                nodes.append(Proc(f"n{i + 1}", node.pid))
            ingresses = [cluster.ingress_url(i) for i in range(cluster.size)]
            common: dict[str, Any] = {
                "query": cluster.query,
                "partitions": args.partitions,
                "leaders": cluster.leaders,
            }
            if "3n1w" in wanted:
                configs.append(
                    Config(
                        "3n1w",
                        "3 nodes, 1 worker",
                        ingresses,
                        nodes,
                        [w1_proc],
                        w1.port,
                        activate=cluster_switch(cluster, w1.url),
                        **common,
                    )
                )
            if "3n3w" in wanted:
                w3 = reuseport_workers(stack, 3, root)
                procs = []
                for i, worker in enumerate(w3):
                    assert worker.pid is not None
                    procs.append(Proc(f"w{i + 1}", worker.pid))
                configs.append(
                    Config(
                        "3n3w",
                        "3 nodes, 3 workers",
                        ingresses,
                        nodes,
                        procs,
                        w3[0].port,
                        activate=cluster_switch(cluster, w3[0].url),
                        **common,
                    )
                )
        yield configs


def idle(configs: Sequence[Config], seconds: float) -> dict[str, dict[str, float]]:
    """Each distinct process's CPU (share of a core) while nothing runs, and its RSS (MiB)."""
    procs = {p.pgid: p for c in configs for p in c.procs}
    names = {p.pgid: "/".join(c.name for c in configs if p in c.procs) for p in procs.values()}
    before = {pgid: p.cpu() for pgid, p in procs.items()}
    time.sleep(seconds)
    return {
        f"{p.name} ({names[pgid]})": {
            "cpu_cores": (p.cpu() - before[pgid]) / seconds,
            "rss_mib": rss_of(group_pids(pgid)) / 2**20,
        }
        for pgid, p in procs.items()
    }


# Report ----------------------------------------------------------------------------------------


def spread(values: Sequence[float], fmt: str = "{:.0f}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-" + (
        f"{fmt.format(max(values))}]"
    )


def summary(configs: Sequence[Config]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in configs:
        rs = c.results
        names = list(rs[0]["cpu_ms_per_turn"])
        out[c.name] = {
            "turns_per_s": [r["turns_per_s"] for r in rs],
            "turn_p50_ms": [r["turn_p50_ms"] for r in rs],
            "turn_p99_ms": [r["turn_p99_ms"] for r in rs],
            "run_p50_s": [r["run_p50_s"] for r in rs],
            "run_p99_s": [r["run_p99_s"] for r in rs],
            "cpu_ms_per_turn": {n: [r["cpu_ms_per_turn"][n] for r in rs] for n in names},
            "cpu_ms_per_turn_total": [sum(r["cpu_ms_per_turn"].values()) for r in rs],
            "rss_peak_mib": {
                n: max(r["rss_peak_mib"][n] for r in rs) for n in rs[0]["rss_peak_mib"]
            },
        }
    base = configs[0]
    out["throughput_ratios"] = {
        f"{c.name}/{base.name}": [
            r["turns_per_s"] / b["turns_per_s"]
            for r, b in zip(c.results, base.results, strict=True)
        ]
        for c in configs[1:]
    }
    return out


def report(
    args: argparse.Namespace, configs: Sequence[Config], quiet: dict[str, dict[str, float]]
) -> None:
    s = summary(configs)
    print(
        f"{args.runs} concurrent runs of {args.tool_turns} safe tool turns and an answer, "
        f"{args.partitions} partitions, replication {args.replication} on 3 nodes, "
        f"restate-server {DEFAULT_RESTATE_VERSION}, {args.streams or 128} HTTP/2 streams per "
        f"worker connection, {os.cpu_count()} cores, {args.rounds} "
        "round(s): medians [min-max]"
    )
    print(
        f"  {'config':<19}{'turns/s':>18}{'turn p50 ms':>17}{'turn p99 ms':>19}"
        f"{'run p50 s':>17}{'run p99 s':>17}{'CPU ms/turn':>18}"
    )
    for c in configs:
        x = s[c.name]
        print(
            f"  {c.name + ' ' + c.what:<19}{spread(x['turns_per_s']):>18}"
            f"{spread(x['turn_p50_ms']):>17}{spread(x['turn_p99_ms']):>19}"
            f"{spread(x['run_p50_s'], '{:.1f}'):>17}{spread(x['run_p99_s'], '{:.1f}'):>17}"
            f"{spread(x['cpu_ms_per_turn_total'], '{:.2f}'):>18}"
        )
    for name, ratios in s["throughput_ratios"].items():
        print(
            f"  throughput {name}: {spread(ratios, '{:.2f}')} (per round: "
            + ", ".join(f"{r:.2f}" for r in ratios)
            + ")"
        )
    print("  CPU ms per tool turn by process (peak RSS MiB):")
    for c in configs:
        x = s[c.name]
        parts = [
            f"{n} {spread(v, '{:.2f}')}"
            + (f" ({x['rss_peak_mib'][n]:.0f})" if n in x["rss_peak_mib"] else "")
            for n, v in x["cpu_ms_per_turn"].items()
        ]
        print(f"    {c.name}: " + "; ".join(parts))
    print("  cores busy during the round (CPU s / wall s), last round:")
    for c in configs:
        cores = c.results[-1]["cpu_cores"]
        machine = c.results[-1]["machine_cores"]
        print(
            f"    {c.name}: "
            + ", ".join(f"{n} {v:.2f}" for n, v in cores.items())
            + f"; total {sum(cores.values()):.2f}; whole machine busy {machine['busy']:.2f}, "
            f"idle {machine['idle']:.2f}, I/O wait {machine['iowait']:.2f}"
        )
    print(
        "  idle: CPU (share of a core), RSS: "
        + ", ".join(f"{n} {v['cpu_cores']:.3f}, {v['rss_mib']:.0f} MiB" for n, v in quiet.items())
    )
    print("  what the runs touched (last round):")
    for c in configs:
        r = c.results[-1]
        print(
            f"    {c.name}: runs per partition {r['runs_per_partition']}, per leader node "
            f"{r['runs_per_leader']}; invocations by service {r['invocations_by_service']}; "
            f"{r['entries_per_run']:.0f} journal entries and {r['run_steps_per_run']:.0f} ctx.run "
            f"steps per run; worker connections {r['worker_connections']}"
        )
    print("  the operator's queries (best of 3) against what Restate keeps, after each round:")
    for c in configs:
        print(
            f"    {c.name}: "
            + "; ".join(
                f"{q['invocations']:.0f} invocations, {q['state_rows']:.0f} state rows: in flight "
                f"{q['in_flight_ms']:.0f} ms, parked {q['parked_ms']:.0f} ms"
                for q in (r["operator_queries"] for r in c.results)
            )
        )
    if args.hot_calls:
        print(
            f"  a hot key: {args.hot_calls} one-step exclusive calls per second, one key against "
            "distinct keys:"
        )
        for c in configs:
            hot = [r["hot_key"]["one_key_per_s"] for r in c.results]
            cold = [r["hot_key"]["distinct_keys_per_s"] for r in c.results]
            print(f"    {c.name}: one key {spread(hot)}/s, distinct keys {spread(cold)}/s")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--serve-worker":
        serve_worker(int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="concurrent runs")
    parser.add_argument("--tool-turns", type=int, default=10, help="tool turns per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--replication", type=int, default=2)
    parser.add_argument("--configs", default="1n1w,3n1w,3n3w", help="any of 1n1w,3n1w,3n3w")
    parser.add_argument("--hot-calls", type=int, default=None, help="default: --runs; 0: none")
    parser.add_argument(
        "--streams",
        type=int,
        default=None,
        help="the invoker's HTTP/2 streams per connection to a worker (Restate's default: 128)",
    )
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU sampling")
    parser.add_argument("--json", action="store_true", help="one JSON object, no table")
    args = parser.parse_args()
    if args.hot_calls is None:
        args.hot_calls = args.runs
    with stacks(args) as configs:
        for c in configs:  # connections, imports, the cluster's deployments
            c.activate()
            concurrently(
                run_urls(c, [f"s{uuid.uuid4().hex[:8]}-{i}" for i in range(10)]), {"turns": 2}
            )
        quiet = idle(configs, args.idle)
        for i in range(args.rounds):
            for c in configs if i % 2 == 0 else configs[::-1]:
                c.results.append(measure(c, args.runs, args.tool_turns, args.hot_calls))
                if not args.json:
                    r = c.results[-1]
                    print(
                        f"  round {i + 1} {c.name}: {r['turns_per_s']:.0f} turns/s, turn p50 "
                        f"{r['turn_p50_ms']:.0f} ms p99 {r['turn_p99_ms']:.0f} ms, CPU ms/turn "
                        + ", ".join(f"{n} {v:.2f}" for n, v in r["cpu_ms_per_turn"].items())
                        + f"; machine busy {r['machine_cores']['busy']:.2f} cores; connections "
                        + str(r["worker_connections"]),
                        flush=True,
                    )
        if args.json:
            print(
                json.dumps(
                    {
                        "args": vars(args),
                        "restate": DEFAULT_RESTATE_VERSION,
                        "idle": quiet,
                        "summary": summary(configs),
                        "rounds": {c.name: c.results for c in configs},
                    }
                )
            )
        else:
            report(args, configs, quiet)


if __name__ == "__main__":
    main()

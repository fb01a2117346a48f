"""How long a run stands still after its worker dies (issue 12, part 3).

    .venv/bin/python bench/worker_loss.py [--kills 10] [--policies ours,restate-default]
        [--cases 2,1] [--routing reuseport] [--start-delay 0] [--tool-turns 16]
        [--tool-seconds 0.2] [--seed 12]

One real restate-server and the agent's worker as `tether worker` runs it (hypercorn with
`tether.programs.worker.hypercorn_config`, the app `tether.programs.worker.asgi:app`), all started
and stopped by the script. Two replicas serve the same manifest behind one address, as a
Kubernetes Service in front of a Deployment of 2 does: two process groups that each listen on the
same loopback port with SO_REUSEPORT (the kernel spreads new connections between them; once one is
dead, new connections reach the other). Restate registers that one URL. Each replica also listens
on a port of its own, which the script polls for its readiness.

`--routing service` puts a Kubernetes Service's routing in front instead (`tether.testing.
ServiceFront`): each new connection goes to a replica picked at random, the killed one included,
whose connections are refused until it is started again on its own port at once (after
`--start-delay`), as the kubelet restarts a SIGKILLed container in a pod whose address stays an
endpoint. There every attempt before the restart is a coin flip, so a retry policy's first
intervals decide the tail.

The agent is scripted (provider `scripted`): `--tool-turns` tool turns, each a safe tool that
stamps its start (step, process group, `time.time()`) to a file and sleeps `--tool-seconds`
(200 ms), then an answer. The workers' app stamps each attempt of a run as it arrives, too. Per
kill, a run starts on a fresh session; at a random (seeded) step and a random moment of that
step's body, the process group that runs it is SIGKILLed. Measured, one machine, one clock:

- pause: the SIGKILL -> the interrupted step's body starting again on another worker, when the run
  is back doing its own work; it splits into wait (the SIGKILL -> the new attempt's request
  reaching a worker: noticing the death, the retry interval, a connection) and replay (that
  request -> the body: the journal sent and replayed up to the step);
- the SIGKILL -> the next journal entry (`sys_journal.appended_at`, ms): the re-run body's
  completion, so a body (`--tool-seconds`) and its journaling more than the pause;
- attempts: `sys_invocation.retry_count` once the run is back (1 is the first attempt).

After each kill the killed replica is replaced (a new process group on the shared port) and the
run must complete with every step's body run once, and the interrupted one once more.

(a) 2 replicas, per retry policy of the agent's services (`--policies`): `ours` is
    `RETRY_AFTER_WORKER_LOSS` (`tether.programs.worker.retries`), `restate-default` none at all
    (the server's default: 500 ms, x2, at most 60 s), `<initial ms>:<factor>:<max ms>` a
    candidate. The workers serve a small app module that sets the policy before the services are
    built (nothing in the worker changes); each policy gets its own replicas on a port of their
    own, registered as a deployment of its own.
(b) The floor, measured first, the same way: 2 replicas and a policy that retries 1 ms after a
    failure (`1:1:1`). A retry cannot come sooner, so what is left is the cost of any retry:
    Restate noticing the death (the connection reset), a new connection to the survivor, the
    request, the replay up to the step. The pause over the floor is what a policy's waiting
    adds. (Pausing and resuming the run's attempt through the admin API, a floor with no death at
    all, cut no step in our tries: the attempt always journaled the step before it ended.)
(c) 1 replica, per policy: the only worker is SIGKILLed and a replacement started at once, as a
    Deployment of 1 does when its pod dies. The pause includes the replacement's start-up (its
    process started -> its own port answers `/health`), printed separately, and so is what the
    policy adds: the replacement up -> the step again. `--start-delay` makes the replacement wait
    before it starts, as a pod being scheduled and started does (Restate's default policy waits
    2^n x 500 ms between attempts, so the later the replacement, the longer the run idles after it).

Goal: (a) with `ours` under 1 s on loopback.
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tether.programs.restate_identity import IDENTITY_KEYS_ENV
from tether.programs.restate_install import DEFAULT_RESTATE_VERSION
from tether.programs.restate_server import RestateServer, free_port
from tether.programs.worker.retries import RETRY_AFTER_WORKER_LOSS
from tether.testing import HypercornWorker, RestateHarness, ServiceFront, wait_until

AGENT = "bench-loss"
POLL = 0.005
ARRIVAL = -1
"""The step of an attempt's arrival stamp."""
FLOOR = "1:1:1"
"""The floor's policy: retry 1 ms after a failure, every time."""

TOOL = '''
import asyncio
import os
import time

from tether import tool


def stamp(step):
    line = "%d %d %.6f\\n" % (step, os.getpgrp(), time.time())
    fd = os.open(os.environ["BENCH_STAMPS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@tool
async def slow(n: int) -> str:
    """Works on step n for a while."""
    stamp(n)
    await asyncio.sleep(float(os.environ["BENCH_TOOL_SECONDS"]))
    return f"step {n} done"
'''

APP = '''
"""`tether.programs.worker.asgi:app`, its services registered with the retry policy of
$BENCH_RETRY_POLICY ("ours": unchanged, "none": the server's default, or initial_ms:factor:max_ms),
stamping each attempt of a run as it arrives (step -1)."""
import os
from datetime import timedelta

import restate

from tether.programs.worker import retries

_policy = os.environ["BENCH_RETRY_POLICY"]
if _policy == "none":
    retries.RETRY_AFTER_WORKER_LOSS = None
elif _policy != "ours":
    _initial, _factor, _max = _policy.split(":")
    retries.RETRY_AFTER_WORKER_LOSS = restate.InvocationRetryPolicy(
        initial_interval=timedelta(milliseconds=float(_initial)),
        exponentiation_factor=float(_factor),
        max_interval=timedelta(milliseconds=float(_max)),
        max_attempts=retries.RETRY_AFTER_WORKER_LOSS.max_attempts,
        on_max_attempts="pause",
    )

from loss_tools import stamp  # noqa: E402
from tether.programs.worker.asgi import app as _app  # noqa: E402

_RUN = "/invoke/%s/run" % os.environ["BENCH_AGENT"]


async def app(scope, receive, send):
    if scope["type"] == "http" and scope["path"].endswith(_RUN):
        stamp(-1)
    await _app(scope, receive, send)
'''

LISTEN_AND_EXEC = """
import os, socket, sys, time
time.sleep(float(os.environ["BENCH_START_DELAY"]))
argv = sys.argv[2:]
if sys.argv[1] != "-":
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", int(sys.argv[1])))
    os.set_inheritable(sock.fileno(), True)
    argv = [a.replace("fd://SHARED", "fd://%d" % sock.fileno()) for a in argv]
os.execv(sys.executable, [sys.executable, *argv])
"""
"""`python -c LISTEN_AND_EXEC <port> <args>`: a socket bound to the shared port with SO_REUSEPORT,
handed to `python <args>` (hypercorn, `--bind fd://SHARED`) in the same process (after
`$BENCH_START_DELAY` seconds: a pod being scheduled, its container started), so the replica's
process group holds it. Hypercorn's worker listens on it once it has loaded the app, as it does on
a port it binds itself; until then a connection is refused, as a Service with no ready endpoint
refuses it. With `-` for the port, no shared socket (`--routing service`: the replica listens on
its own port only). No braces: `HypercornWorker` formats the command (`{port}`)."""


def policy_name(policy: str) -> str:
    if policy == "ours":
        p = RETRY_AFTER_WORKER_LOSS
        assert p.initial_interval is not None and p.max_interval is not None
        return (
            f"ours ({p.initial_interval.total_seconds() * 1000:.0f} ms, "
            f"x{p.exponentiation_factor:g}, max {p.max_interval.total_seconds() * 1000:.0f} ms)"
        )
    if policy == "restate-default":
        return "restate-default (500 ms, x2, max 60 s)"
    if policy == FLOOR:
        return "floor (retry after 1 ms)"
    initial_ms, factor, max_ms = policy.split(":")
    return f"{initial_ms} ms, x{factor}, max {max_ms} ms"


def policy_env(policy: str) -> str:
    """`BENCH_RETRY_POLICY` for the app module; a typo refused here, not in the workers."""
    if policy in ("ours", "restate-default"):
        return {"ours": "ours", "restate-default": "none"}[policy]
    initial_ms, factor, max_ms = policy.split(":")
    float(initial_ms), float(factor), float(max_ms)
    return policy


# The agent and its stamps -----------------------------------------------------------------------


def write_agent(directory: Path, turns: int) -> Path:
    (directory / "loss_tools.py").write_text(TOOL)
    (directory / "loss_app.py").write_text(APP)
    script: list[dict[str, Any]] = [
        {"text": f"step {n}", "tool_calls": [{"name": "slow", "input": {"n": n}}]}
        for n in range(turns)
    ]
    manifest = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": AGENT},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": [*script, {"text": "done"}]},
            "tools": [{"name": "slow", "python": "loss_tools:slow", "replay": "safe"}],
            "limits": {"maxTurns": turns + 5},
        },
    }
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


@dataclass(frozen=True)
class Stamp:
    step: int
    """The tool step whose body started, or `ARRIVAL` (an attempt of a run reached a worker)."""
    pgid: int
    at: float


class Stamps:
    """The stamps of the workers (one line each), from the line `start` on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def read(self, start: int = 0) -> list[Stamp]:
        lines = self.path.read_text().splitlines()[start:]
        return [Stamp(int(s), int(g), float(t)) for s, g, t in (line.split() for line in lines)]

    def count(self) -> int:
        return len(self.path.read_text().splitlines())

    def wait(self, start: int, match: Callable[[Stamp], bool], what: str) -> Stamp:
        def found() -> Stamp | None:
            return next((s for s in self.read(start) if match(s)), None)

        return wait_until(found, timeout=600, interval=POLL, what=what)


# The replicas -----------------------------------------------------------------------------------


@dataclass
class Replicas:
    """Worker process groups behind one front port (one deployment URL): a port they share
    (`--routing reuseport`), or a `ServiceFront`'s (`--routing service`)."""

    port: int
    workers: list[HypercornWorker] = field(default_factory=list)
    add: Callable[[], HypercornWorker] | None = None
    """Start one more replica behind the front (a scale-out), stopped with the others."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def by_pgid(self, pgid: int) -> HypercornWorker:
        return next(w for w in self.workers if w.pid == pgid)  # a session leader: pid == pgid


@contextmanager
def replicas(
    count: int,
    policy: str,
    spec: Path,
    stamps: Stamps,
    server: RestateServer,
    args: argparse.Namespace,
    start_delay: float = 0.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[Replicas]:
    """`count` replicas of the worker with `policy` (and `env`) on a new shared port, registered;
    stopped (process groups, ports) at exit, whatever happens; `add` starts one more."""
    group = Replicas(free_port())
    app = f"{spec.parent / 'loss_app.py'}:app"
    settings = {
        "TETHER_SPEC": str(spec),
        "TETHER_WORKSPACE": str(spec.parent),
        "TETHER_WORKER_PROCESSES": "1",
        "TETHER_WORKER_GRACEFUL_TIMEOUT": "1",  # stopping at the end (SIGTERM) is quick
        "RESTATE_INGRESS_URL": server.ingress_url,  # live events, as in a cluster
        IDENTITY_KEYS_ENV: server.identity_public_key,
        "BENCH_AGENT": AGENT,
        "BENCH_RETRY_POLICY": policy_env(policy),
        "BENCH_STAMPS": str(stamps.path),
        "BENCH_TOOL_SECONDS": str(args.tool_seconds),
        "BENCH_START_DELAY": str(start_delay),
        **(env or {}),
    }
    shared = args.routing == "reuseport"
    command = [sys.executable, "-c", LISTEN_AND_EXEC, str(group.port) if shared else "-"]
    command += ["-m", "hypercorn", "--config", "python:tether.programs.worker.hypercorn_config"]
    command += ["--bind", "127.0.0.1:{port}", *(["--bind", "fd://SHARED"] if shared else []), app]
    with ExitStack() as stack:
        if not shared:  # a Service: a replica picked at random per connection, dead or alive
            pick = random.Random(args.seed)
            route = lambda: pick.choice([w.port for w in group.workers])  # noqa: E731
            stack.enter_context(ServiceFront(route, port=group.port))

        def add() -> HypercornWorker:
            worker = HypercornWorker(app, env=settings, command=command, log_dir=spec.parent)
            group.workers.append(stack.enter_context(worker))
            return worker

        group.add = add
        for _ in range(count):
            add()
        server.register(group.url)
        yield group


# Measuring --------------------------------------------------------------------------------------


@dataclass
class Sample:
    pause: float
    """SIGKILL (or resume) -> the interrupted step's body starts again."""
    wait: float
    """SIGKILL (or resume) -> the new attempt's request reaches a worker."""
    journal: float | None = None
    """SIGKILL -> the next journal entry (the re-run body's completion)."""
    attempts: int | None = None
    startup: float | None = None
    """The replacement's start-up (1 replica): its process started -> it answered `/health`."""
    after_up: float | None = None
    """The replacement answered `/health` -> the run's step started again (1 replica)."""


def quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def epoch(value: Any) -> float:
    """`appended_at` as the admin API answers it: RFC 3339, ms."""
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


class Bench:
    def __init__(self, args: argparse.Namespace, harness: RestateHarness, stamps: Stamps) -> None:
        self.args = args
        self.harness = harness
        self.server = harness.server
        self.stamps = stamps
        self.rng = random.Random(args.seed)

    def invocation(self, invocation: str) -> dict[str, Any]:
        rows = self.server.query(
            f"SELECT status, retry_count FROM sys_invocation WHERE id = {quoted(invocation)}"
        )
        return rows[0] if rows else {}

    def next_journaled(self, invocation: str, after: float) -> float | None:
        rows = self.server.query(
            f"SELECT appended_at FROM sys_journal WHERE id = {quoted(invocation)}"
        )
        later = [epoch(r["appended_at"]) for r in rows if r.get("appended_at")]
        later = [at for at in later if at > after]
        return min(later) - after if later else None

    def start_run(self) -> tuple[str, int, int]:
        """A run on a fresh session: its invocation id, its first stamp, a random step."""
        start = self.stamps.count()
        invocation = self.harness.send(f"{AGENT}/{uuid.uuid4().hex[:12]}/run", {"prompt": "go"})
        return invocation, start, self.rng.randrange(2, max(3, self.args.tool_turns - 2))

    def finish(self, invocation: str, start: int, cut: int | None) -> None:
        """The run completes, each step's body having run once, and the `cut` one twice."""
        result = self.harness.result(invocation, timeout=600)
        if result.get("status") != "completed":
            raise RuntimeError(f"run {invocation} did not complete: {result}")
        runs: dict[int, int] = {}
        for stamp in self.stamps.read(start):
            if stamp.step != ARRIVAL:
                runs[stamp.step] = runs.get(stamp.step, 0) + 1
        expected = {n: 1 for n in range(self.args.tool_turns)}
        if cut is not None:
            expected[cut] = 2
        if runs != expected:
            odd = {n: c for n, c in runs.items() if c != expected.get(n)}
            raise RuntimeError(f"run {invocation}: bodies run (step: times) {odd}")

    def warm_up(self) -> None:
        """A run without a kill (imports, connections)."""
        invocation, start, _ = self.start_run()
        self.finish(invocation, start, None)

    def back(self, start: int, since: float, step: int, away: int | None) -> Sample:
        """The attempt that arrived after `since` (on a group other than `away`) and the body of
        `step` it started."""

        def new(s: Stamp) -> bool:
            return s.at > since and s.pgid != away

        body = self.stamps.wait(start, lambda s: s.step == step and new(s), f"step {step} again")
        arrivals = [s for s in self.stamps.read(start) if s.step == ARRIVAL and new(s)]
        if not arrivals:
            raise RuntimeError(f"step {step} ran again, and no attempt arrived")
        return Sample(body.at - since, arrivals[0].at - since)

    def kill(self, group: Replicas, *, replace_first: bool) -> Sample:
        """SIGKILL the group running a run at a random moment of a random step's body; with
        `replace_first` start its replacement at once (1 replica; 2 behind a `ServiceFront`,
        where the replacement is the killed container restarted on its address), else once the
        run is back."""
        invocation, start, step = self.start_run()
        cut = self.stamps.wait(start, lambda s: s.step == step, f"step {step}")
        time.sleep(
            max(0.0, cut.at + self.rng.uniform(0.1, 0.9) * self.args.tool_seconds - time.time())
        )
        victim = group.by_pgid(cut.pgid)
        killed_at = time.time()
        victim.kill()
        startup = up_at = None
        if replace_first:
            began = time.monotonic()
            victim.start()
            up_at = time.time()
            startup = time.monotonic() - began
        sample = self.back(start, killed_at, step, cut.pgid)
        sample.attempts = self.invocation(invocation).get("retry_count")
        sample.startup = startup
        if up_at is not None and len(group.workers) == 1:
            sample.after_up = killed_at + sample.pause - up_at
        if not replace_first:
            victim.start()
        self.finish(invocation, start, step)
        sample.journal = self.next_journaled(invocation, killed_at)
        return sample


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return (
        f"median {statistics.median(ordered) * 1000:.0f} ms, p90 {p90 * 1000:.0f}, max "
        f"{ordered[-1] * 1000:.0f}"
    )


def report(title: str, samples: list[Sample]) -> str:
    lines = [
        f"  {title} (n={len(samples)}):",
        f"    pause  {summary([s.pause for s in samples])}",
        f"      wait (-> the attempt arrives) {summary([s.wait for s in samples])}; replay "
        f"{summary([s.pause - s.wait for s in samples])}",
    ]
    journal = [s.journal for s in samples if s.journal is not None]
    if journal:
        lines.append(f"    -> next journal entry {summary(journal)}")
    attempts = [s.attempts for s in samples if s.attempts is not None]
    if attempts:
        lines.append(f"    attempts when back: {' '.join(str(a) for a in attempts)}")
    startups = [s.startup for s in samples if s.startup is not None]
    if startups:
        lines.append(f"    replacement start-up {summary(startups)}")
    after_up = [s.after_up for s in samples if s.after_up is not None]
    if after_up:
        lines.append(f"    replacement up -> the step again {summary(after_up)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="kills per policy and case")
    parser.add_argument("--tool-turns", type=int, default=16)
    parser.add_argument("--tool-seconds", type=float, default=0.2)
    parser.add_argument(
        "--policies",
        default="ours,restate-default",
        help="comma-separated: ours, restate-default, <initial ms>:<factor>:<max ms>",
    )
    parser.add_argument(
        "--cases", default="2,1", help="replicas per case: 2 (and the floor), 1, or both"
    )
    parser.add_argument(
        "--start-delay",
        type=float,
        default=0.0,
        help="seconds a replacement waits before it starts (a pod being scheduled, a container "
        "restarted): 1 replica, and 2 with --routing service",
    )
    parser.add_argument(
        "--routing",
        choices=("reuseport", "service"),
        default="reuseport",
        help="how the replicas share the URL: one port (only live ones get connections), or a "
        "Service's random pick per connection, a killed one included until it restarts",
    )
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args()
    policies = [FLOOR, *args.policies.split(",")]
    cases = args.cases.split(",")
    for policy in policies:
        policy_env(policy)
    # A SIGTERM (`timeout`, a CI runner) unwinds like Ctrl-C: every process group is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    paired: dict[str, list[Sample]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="tether-bench-") as temp,
        RestateServer() as server,
        RestateHarness(server) as harness,
    ):
        spec = write_agent(Path(temp), args.tool_turns)
        bench = Bench(args, harness, Stamps(Path(temp) / "stamps"))
        print(
            f"restate-server {DEFAULT_RESTATE_VERSION}; runs of {args.tool_turns} tool turns of "
            f"{args.tool_seconds * 1000:.0f} ms; {args.kills} kills per case; routing "
            f"{args.routing}; seed {args.seed}",
            flush=True,
        )
        # Behind a Service the killed container restarts on its address (after --start-delay).
        restart = args.routing == "service"
        for policy in policies if "2" in cases else []:
            paired[policy] = []
            delay = args.start_delay if restart else 0.0
            with replicas(2, policy, spec, bench.stamps, server, args, delay) as group:
                bench.warm_up()
                for _ in range(args.kills):
                    paired[policy].append(bench.kill(group, replace_first=restart))
            print(report(f"2 replicas, {policy_name(policy)}", paired[policy]), flush=True)
        if paired:
            floor = statistics.median(s.pause for s in paired[FLOOR])
            for policy in policies[1:]:
                ratio = statistics.median(s.pause for s in paired[policy]) / floor
                print(f"  2 replicas, {policy_name(policy)}: median pause / floor = {ratio:.2f}")
        if "1" in cases:
            for policy in policies[1:]:
                single: list[Sample] = []
                delay = args.start_delay
                with replicas(1, policy, spec, bench.stamps, server, args, delay) as group:
                    bench.warm_up()
                    for _ in range(args.kills):
                        single.append(bench.kill(group, replace_first=True))
                print(report(f"1 replica, {policy_name(policy)}", single), flush=True)


if __name__ == "__main__":
    main()

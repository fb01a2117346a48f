"""A worker replica that joins its Service under steady load: how soon, and how much, it works.

    .venv/bin/python bench/scale_out.py [--clients 32] [--seconds 30] [--max-ages 10,0]
        [--warm-up 8] [--window 5] [--tool-turns 4] [--tool-seconds 0.2] [--seed 1]

One real restate-server; the agent's worker as in `worker_loss.py` (`tether worker`'s hypercorn
config and app, a scripted agent of `--tool-turns` safe tool turns that each stamp their start
and sleep `--tool-seconds`), behind a `tether.testing.ServiceFront` that sends each new
connection to a replica picked at random, as a Kubernetes Service does. `--clients` clients each
start a run and wait for its end, again and again: a steady load.

Per max age of the workers' connections (`TETHER_WORKER_CONNECTION_MAX_AGE`, seconds; `0` keeps
them for good, which is how Restate's connection pool behaves on its own): one replica serves the
load for `--warm-up` seconds, then a second joins the Service, as a scale-out adds a pod. For
`--seconds` after that:

- per `--window`: the new replica's share of the tool bodies that started (the fair share, the
  floor's figure, is 0.5);
- the time from the join to the new replica's first tool body;
- runs per second before and after the join (on a 2-core machine both replicas share the cores
  with restate-server, so this shows no gain, only that retiring connections cost none);
- what retiring connections must not cost: a failed attempt (Restate's `TransientError` journal
  events) or a tool body run twice (every run's bodies are counted).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from worker_loss import AGENT, ARRIVAL, Stamps, replicas, write_agent

from tether.programs.restate_install import DEFAULT_RESTATE_VERSION
from tether.programs.restate_server import RestateServer
from tether.testing import RestateHarness


def failed_attempts(server: RestateServer) -> int:
    rows = server.query(
        "SELECT count(*) AS n FROM sys_journal_events WHERE event_type = 'TransientError'"
    )
    return int(rows[0]["n"])


def one_case(max_age: str, server: RestateServer, args: argparse.Namespace, temp: Path) -> None:
    spec = write_agent(temp, args.tool_turns)
    stamps = Stamps(temp / f"stamps-{max_age}")
    env = {"TETHER_WORKER_CONNECTION_MAX_AGE": max_age}
    failed_before = failed_attempts(server)
    with (
        RestateHarness(server) as harness,
        replicas(1, "ours", spec, stamps, server, args, env=env) as group,
    ):
        stop = threading.Event()
        ended: list[float] = []

        def client(c: int) -> None:
            n = 0
            while not stop.is_set():
                run = harness.send(f"{AGENT}/{max_age}-{c}-{n}/run", {"prompt": "go"})
                result = harness.result(run, timeout=300)
                assert result["status"] == "completed", result
                ended.append(time.time())
                n += 1

        clients = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
        for thread in clients:
            thread.start()
        try:
            time.sleep(args.warm_up)
            assert group.add is not None
            new = group.add()  # routed to from the moment it answers `/health`
            joined = time.time()
            time.sleep(args.seconds)  # the measured span
        finally:
            stop.set()
            for thread in clients:
                thread.join()
        bodies = [s for s in stamps.read() if s.step != ARRIVAL]
        assert len(bodies) == len(ended) * args.tool_turns, "a tool body ran twice"
        failed = failed_attempts(server) - failed_before
        print(f"max age {max_age} s: {len(ended)} runs, {failed} failed attempts")
        windows = int(args.seconds // args.window)
        shares = []
        for w in range(windows):
            start = joined + w * args.window
            inside = [s for s in bodies if start <= s.at < start + args.window]
            share = sum(s.pgid == new.pid for s in inside) / max(1, len(inside))
            shares.append(share)
            print(
                f"  {w * args.window:3.0f}-{(w + 1) * args.window:3.0f} s after the join: "
                f"the new replica's share {share:.2f} of {len(inside)} tool bodies"
            )
        first = min((s.at for s in bodies if s.pgid == new.pid), default=None)
        before = sum(joined - args.warm_up <= t < joined for t in ended) / args.warm_up
        after = sum(t >= joined for t in ended) / args.seconds
        print(
            f"  first tool body on the new replica: "
            f"{'never' if first is None else f'{first - joined:.1f} s after the join'}; "
            f"median share {statistics.median(shares):.2f} (fair 0.50); "
            f"runs/s {before:.1f} before the join, {after:.1f} after"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warm-up", type=float, default=8.0)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--max-ages", default="10,0", help="comma-separated seconds; 0: never")
    parser.add_argument("--tool-turns", type=int, default=4)
    parser.add_argument("--tool-seconds", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    args.routing = "service"
    with tempfile.TemporaryDirectory() as temp, RestateServer() as server:
        print(
            f"{args.clients} clients, runs of {args.tool_turns} tool turns of "
            f"{args.tool_seconds} s; restate-server {DEFAULT_RESTATE_VERSION}"
        )
        for max_age in args.max_ages.split(","):
            directory = Path(temp) / max_age
            directory.mkdir()
            one_case(max_age, server, args, directory)


if __name__ == "__main__":
    main()

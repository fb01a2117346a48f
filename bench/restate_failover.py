"""How long a replicated Restate cluster's partitions stay without a leader after a node is lost.

    python bench/restate_failover.py [--kills 3] [--blackhole] [--env NAME=VALUE ...]

A `RestateCluster` of 3 nodes on loopback, replication 2, the chart's partitions (24) and its
`networking.connect-timeout` (1 s). Per kill, once the leaders have stayed put for 8 s, the node
that leads the most partitions is SIGKILLed; the time from the kill to a new leader of each of
its partitions is read from the survivors' logs (first, median, last), then the node is started
again on its data directory. Its partitions' runs stand still that long (their approvals are
still taken: `tether resolve` retries through it).

A crash on loopback is the kind case: the kernel resets the dead node's connections and refuses
new ones at once. `--blackhole` also drops every packet to the node's port (an `iptables` rule
on `lo`, removed after the kill's measurement; root only), as when a machine vanishes from the
network: connections to it then fail only at their timeouts. `--env` passes Restate settings to
every node (`RESTATE_METADATA_CLIENT__CONNECT_TIMEOUT=1s`), to try them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import subprocess
import time
from collections.abc import Iterator

from tether.programs.restate_cluster import RestateCluster

PARTITIONS = 24  # restate-server 1.7's default-num-partitions: the chart leaves it
CHART_ENV = {"RESTATE_NETWORKING__CONNECT_TIMEOUT": "1s"}
STEADY = 8.0
"""Seconds without a leadership move before a kill (the scheduler moves leaders for a few
seconds after a node rejoins)."""
GIVE_UP = 180.0


@contextlib.contextmanager
def blackholed(port: int | None) -> Iterator[None]:
    """Drop every packet to `port` on loopback while inside (nothing when None)."""
    rule = ["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"]
    if port is not None:
        subprocess.run(["iptables", "-I", *rule], check=True)
    try:
        yield
    finally:
        if port is not None:
            subprocess.run(["iptables", "-D", *rule], check=True)


def lose_a_node(cluster: RestateCluster, blackhole: bool) -> tuple[str, list[float], int]:
    """Kill the node leading the most partitions; seconds to each of its partitions' new
    leader, and how many never got one within `GIVE_UP`."""
    leaders = cluster.wait_for_leaders(steady=STEADY)
    node = collections.Counter(leaders.values()).most_common(1)[0][0]
    led = [p for p, n in leaders.items() if n == node]
    moved: dict[int, float] = {}
    killed = time.monotonic()
    cluster.kill(node)
    with blackholed(cluster.nodes[node].ports.node if blackhole else None):
        while len(moved) < len(led) and time.monotonic() - killed < GIVE_UP:
            now = cluster.leaders()
            for p in led:
                if p not in moved and p in now:
                    moved[p] = time.monotonic() - killed
            time.sleep(0.02)
    cluster.start(node)
    return f"n{node + 1}", sorted(moved.values()), len(led) - len(moved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--blackhole", action="store_true", help="drop the lost node's packets")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    env = {**CHART_ENV, **dict(item.split("=", 1) for item in args.env)}
    how = "SIGKILL, its port blackholed" if args.blackhole else "SIGKILL"
    print(f"3 nodes, replication 2, {PARTITIONS} partitions; a node lost by {how}; {env}")
    lasts: list[float] = []
    with RestateCluster(partitions=PARTITIONS, extra_env=env) as cluster:
        for _ in range(args.kills):
            name, moved, missing = lose_a_node(cluster, args.blackhole)
            lasts.append(moved[-1] if moved and not missing else GIVE_UP)
            print(
                f"  {name}, leader of {len(moved) + missing}: new leaders after "
                + (
                    f"{moved[0]:.2f} s (first), {statistics.median(moved):.2f} s (median), "
                    f"{moved[-1]:.2f} s (last)"
                    if moved
                    else "none"
                )
                + (f"; {missing} without one after {GIVE_UP:.0f} s" if missing else ""),
                flush=True,
            )
    print(f"  every partition led again after: {', '.join(f'{s:.2f}' for s in lasts)} s")


if __name__ == "__main__":
    main()

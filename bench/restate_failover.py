"""How long a replicated Restate cluster's partitions stay without a leader after a node is lost.

    python bench/restate_failover.py [--kills 3] [--loss crash|blackhole|freeze]
        [--lose partition-leader|metadata-leader] [--env NAME=VALUE ...] [--fresh]

A `RestateCluster` of 3 nodes on loopback, replication 2, with the chart's partitions (24) and
timeouts for a lost node (`LOST_NODE_TIMEOUTS`). Per loss, once the leaders have stayed put for
8 s, a node is lost: the one that leads the most partitions, or (`--lose metadata-leader`) the
Raft leader of the replicated metadata store, which every node's metadata client talks to. The
time from the loss to a new leader of each of its partitions is read from the survivors' logs
(first, median, last), then the node is started again on its data directory. Its partitions'
runs stand still that long (their approvals are still taken: `tether resolve` retries through it).

`--loss crash` (SIGKILL) on loopback is the kind case: the kernel resets the node's connections
and refuses new ones at once. `blackhole` also drops every packet to the node's port (an
`iptables` rule on `lo`, removed afterwards; root only), as when a pod's address goes with it:
connections to it fail only at their timeouts. `freeze` stops the node (SIGSTOP) behind the same
rule, as a machine gone from the network: nothing is closed and nothing answers. `--env` passes
Restate settings to every node (`RESTATE_METADATA_CLIENT__CONNECT_TIMEOUT=3s`, Restate's
default), to compare. `--fresh` loses each node from a new cluster, whose first node leads the
metadata store and runs the cluster controller: the slowest case, with a tail.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import time

from tether.programs.restate_cluster import LOST_NODE_TIMEOUTS, RestateCluster

PARTITIONS = 24  # restate-server 1.7's default-num-partitions: the chart leaves it
STEADY = 8.0
"""Seconds without a leadership move before a kill (the scheduler moves leaders for a few
seconds after a node rejoins)."""
GIVE_UP = 180.0
LOSSES = {
    "crash": "SIGKILL",
    "blackhole": "SIGKILL, its port blackholed",
    "freeze": "SIGSTOP, its port blackholed",
}


def lose_a_node(cluster: RestateCluster, loss: str, which: str) -> tuple[str, list[float], int]:
    """Lose a node (`which`: the one leading the most partitions, or the metadata store's
    leader) by `loss`; seconds to each of its partitions' new leader, and how many never got one
    within `GIVE_UP`. The node then starts again on its data directory."""
    leaders = cluster.wait_for_leaders(steady=STEADY)
    node = cluster.metadata_leader() if which == "metadata-leader" else None
    if node is None:
        node = collections.Counter(leaders.values()).most_common(1)[0][0]
    led = [p for p, n in leaders.items() if n == node]
    moved: dict[int, float] = {}
    with cluster.unreachable(node) if loss != "crash" else contextlib.nullcontext():
        lost = time.monotonic()
        if loss == "freeze":
            cluster.freeze(node)  # a frozen node still "leads" until replaced
        else:
            cluster.kill(node)
        while len(moved) < len(led) and time.monotonic() - lost < GIVE_UP:
            now = cluster.leaders()
            for p in led:
                if p not in moved and now.get(p, node) != node:
                    moved[p] = time.monotonic() - lost
            time.sleep(0.02)
    cluster.kill(node)
    cluster.start(node)
    return f"n{node + 1}", sorted(moved.values()), len(led) - len(moved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--loss", choices=LOSSES, default="crash")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="a new cluster for each loss (its first node leads the metadata store and runs the "
        "cluster controller, so losing it loses both)",
    )
    parser.add_argument(
        "--lose",
        choices=["partition-leader", "metadata-leader"],
        default="partition-leader",
        help="the node leading the most partitions, or the metadata store's Raft leader",
    )
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    how = LOSSES[args.loss]
    print(f"3 nodes, replication 2, {PARTITIONS} partitions; the {args.lose} lost by {how}")
    print(f"  {LOST_NODE_TIMEOUTS | env}")
    lasts: list[str] = []  # a lower bound (>) where a partition got no leader
    with contextlib.ExitStack() as clusters:
        cluster: RestateCluster | None = None
        for _ in range(args.kills):
            if cluster is None or args.fresh:
                clusters.close()  # the previous loss's cluster, with --fresh
                cluster = clusters.enter_context(
                    RestateCluster(partitions=PARTITIONS, extra_env=env)
                )
            name, moved, missing = lose_a_node(cluster, args.loss, args.lose)
            lasts.append(f"{moved[-1]:.2f}" if moved and not missing else f">{GIVE_UP:.0f}")
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
    print(f"  every partition led again after: {', '.join(lasts)} s")


if __name__ == "__main__":
    main()

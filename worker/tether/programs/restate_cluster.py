"""A replicated ``restate-server`` cluster on loopback, for tests that lose nodes.

In production Restate runs as several nodes, each partition led by one of them and replicated
on another. What a run sees when a node dies (its partition's leader, a follower, or the node
whose ingress a client used) is a leadership move: the new leader starts the invocation again
from the journal and re-runs the ``ctx.run`` bodies that were in flight. The tests of Tether's
answer to that (an unsafe tool cut off is reported interrupted, never run twice; approvals sent
meanwhile reach their call) need such a cluster on one machine.

`RestateCluster` is N (default 3) `RestateServer` nodes on 127.0.0.1 forming one cluster: every
role on every node, a replicated metadata store over all of them, partitions and logs replicated
on ``replication`` (default 2) nodes, the first node provisioning it. They start together and are
ready once every partition has a leader on a live node and a query succeeds (about 10 s). A node
is killed (SIGKILL) and started again on its data directory by its index; admin calls go through
any live node. A crash on loopback is the kind case (the kernel resets the node's connections and
refuses new ones at once); `unreachable` drops the packets to a node's port instead, as when its
machine or its pod's address is gone, and `freeze` stops a node without closing anything. The
nodes give up on a lost node with the Helm chart's timeouts (`LOST_NODE_TIMEOUTS`).

Restate 1.7 shows no partition leaders in SQL (no such ``sys_`` table; ``restatectl`` asks over
gRPC). Each node logs the leaderships it wins with the partition's leader epoch, which only
grows ("Processor became Leader of epoch e7 ... partition_id=3", at the ``restate=info`` level
`RestateServer` logs at): a partition's leader is the node that won its highest epoch, if that
node has run since (`leaders`). An invocation's id carries its partition key
(`partition_key_of`), and the server splits the 64-bit key space into equal ranges, one per
partition (`partition_of_key`).

While partitions move between nodes, a query through a node may answer 200 without the rows of
a partition it is handing over (1.7.12 logs "partition N doesn't exist on this node"), or cut
its chunked answer short: `query` tries another node on the latter; poll for the rows you
expect rather than trusting one empty answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import string
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.client import HTTPException
from pathlib import Path
from typing import Any, TypeVar

from .lifecycle import Lifecycle
from .restate_admin import AdminRefused
from .restate_identity import PRIVATE_KEY_ENV
from .restate_install import DEFAULT_RESTATE_VERSION, find_or_install_restate_server
from .restate_server import (
    IDENTITY_KEY_FILE,
    START_MARKER,
    RestatePorts,
    RestateServer,
    RestateServerError,
)

__all__ = [
    "LOST_NODE_TIMEOUTS",
    "RestateCluster",
    "RestateServerError",
    "partition_key_of",
    "partition_of_key",
]

T = TypeVar("T")

LOST_NODE_TIMEOUTS = {
    "RESTATE_NETWORKING__CONNECT_TIMEOUT": "1s",
    "RESTATE_METADATA_CLIENT__CONNECT_TIMEOUT": "100ms",
    "RESTATE_METADATA_CLIENT__KEEP_ALIVE_INTERVAL": "1s",
    "RESTATE_METADATA_CLIENT__KEEP_ALIVE_TIMEOUT": "2s",
}
"""The Helm chart's timeouts for a node lost without a reset (its templates say why: Restate's
own left a lost metadata leader's partitions without a leader for minutes)."""

_LEADER_LINE = re.compile(r"became Leader of epoch e(\d+)\b.*?\bpartition_id=(\d+)")
_METADATA_LEADER_LINE = re.compile(r"^(\S+) .*Won metadata cluster leadership", re.MULTILINE)
_BASE62 = string.digits + string.ascii_lowercase + string.ascii_uppercase


def partition_key_of(invocation_id: str) -> int:
    """The partition key an invocation id carries: ``inv_`` and a version (``1``), then 11
    base62 digits ([0-9a-zA-Z]) of the key's big-endian bytes taken as a number (the server
    encodes ``key.to_be()``), then the invocation's UUID."""
    body = invocation_id.removeprefix("inv_")
    digits = body[1:12]
    if body == invocation_id or not body.startswith("1") or len(digits) != 11:
        raise RestateServerError(f"not an invocation id: {invocation_id!r}")
    swapped = 0
    for char in digits:
        if char not in _BASE62:
            raise RestateServerError(f"not an invocation id: {invocation_id!r}")
        swapped = swapped * 62 + _BASE62.index(char)
    if swapped >> 64:
        raise RestateServerError(f"not an invocation id: {invocation_id!r}")
    return int.from_bytes(swapped.to_bytes(8, "big"), "little")


def partition_of_key(partition_key: int, partitions: int) -> int:
    """The partition a partition key belongs to: the server splits [0, 2^64) into ``partitions``
    equal ranges, partition ``i`` starting at ``ceil(i * 2^64 / partitions)``."""
    return (int(partition_key) * partitions) >> 64


class RestateCluster(Lifecycle):
    """``size`` ``restate-server`` nodes on 127.0.0.1 forming one replicated cluster.

    >>> with RestateCluster() as cluster:                    # doctest: +SKIP
    ...     cluster.register("http://127.0.0.1:9080")
    ...     node = cluster.leader_of(cluster.partition_of_invocation(invocation_id))
    ...     cluster.kill(node)                               # SIGKILL
    ...     cluster.start(node)                              # again, on its data directory

    ``extra_env`` adds or overrides server settings on every node (as for `RestateServer`). All
    nodes sign their requests to deployments with one key (:attr:`identity_public_key`).
    :meth:`close` SIGKILLs every node and deletes the data directories.

    ``node_configs``, given the nodes' loopback addresses (node ``i`` is reached at the ``i``-th),
    returns each node's configuration file (TOML), e.g. the Helm chart's with its addresses
    replaced: the nodes then take their cluster settings (names, provisioning, replication,
    metadata store) from those files alone, not from this class (``replication`` is then only
    checked against ``size``). ``server_class`` runs each node (a `RestateServer` subclass).
    """

    def __init__(
        self,
        binary: Path | None = None,
        *,
        size: int = 3,
        partitions: int = 4,
        replication: int = 2,
        version: str = DEFAULT_RESTATE_VERSION,
        extra_env: Mapping[str, str] | None = None,
        cluster_name: str = "tether-test",
        startup_timeout: float = 90.0,
        node_configs: Callable[[list[str]], Sequence[str]] | None = None,
        server_class: type[RestateServer] = RestateServer,
    ) -> None:
        if size < 1 or not 1 <= replication <= size:
            raise RestateServerError(f"cannot replicate {replication} times over {size} node(s)")
        self._binary = binary
        self._version = version
        self.size = size
        self.partitions = partitions
        self.replication = replication
        self._extra_env = dict(extra_env or {})
        self._cluster_name = cluster_name
        self._startup_timeout = startup_timeout
        self._node_configs = node_configs
        self._server_class = server_class
        self._root: Path | None = None
        self.nodes: list[RestateServer] = []

    # -- nodes -------------------------------------------------------------------------------

    def _make_nodes(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="tether-restate-cluster-"))
        ports = _distinct_ports(self.size)
        addresses = [f"http://127.0.0.1:{p.node}/" for p in ports]
        configs = None if self._node_configs is None else list(self._node_configs(addresses))
        if configs is not None and len(configs) != self.size:
            raise RestateServerError(f"{len(configs)} configuration files for {self.size} nodes")
        for i, node_ports in enumerate(ports):
            env = {
                "RESTATE_DEFAULT_NUM_PARTITIONS": str(self.partitions),
                "RESTATE_ADMIN__QUERY_ENGINE__MEMORY_SIZE": "64MiB",
                PRIVATE_KEY_ENV: str(self._root / IDENTITY_KEY_FILE),
            }
            config_file = None
            if configs is None:
                env |= {
                    "RESTATE_CLUSTER_NAME": self._cluster_name,
                    "RESTATE_AUTO_PROVISION": "true" if i == 0 else "false",
                    "RESTATE_DEFAULT_REPLICATION": str(self.replication),
                    "RESTATE_METADATA_CLIENT__TYPE": "replicated",
                    "RESTATE_METADATA_CLIENT__ADDRESSES": json.dumps(addresses),
                    **LOST_NODE_TIMEOUTS,
                }
            else:
                config_file = self._root / f"n{i + 1}.toml"
                config_file.write_text(configs[i])
            self.nodes.append(
                self._server_class(
                    self._binary,
                    base_dir=self._root / f"n{i + 1}",
                    ports=node_ports,
                    extra_env={**env, **self._extra_env},
                    node_name=f"n{i + 1}",
                    startup_timeout=self._startup_timeout,
                    config_file=config_file,
                )
            )

    def start(self, node: int | None = None) -> None:
        """Start every node at once (``node`` None) and wait until the cluster processes
        invocations, or start that (killed) node again on its data directory and wait until it
        is back and every partition has a leader. Running nodes are left as they are."""
        if self.nodes:
            again = [self.nodes[node]] if node is not None else self.nodes
            for server in again:
                server.launch()
            for server in again:
                server.wait_ready()
            self.wait_for_leaders()
            return
        if node is not None:
            raise RestateServerError("start the cluster before starting one of its nodes again")
        if self._binary is None:
            self._binary = find_or_install_restate_server(self._version)
        # A random port can be taken between probing and binding: then again, on fresh ports.
        for attempt in range(3):
            self._make_nodes()
            for server in self.nodes:
                server.launch()
            try:
                for server in self.nodes:
                    server.wait_ready()
                self.wait_for_leaders()
                return
            except RestateServerError:
                logs = " ".join(s.log_tail(20000).lower() for s in self.nodes)
                if "address already in use" not in logs or attempt == 2:
                    raise
                self.close()

    def kill(self, node: int) -> None:
        """SIGKILL the node's process group (a crash; its data directory stays)."""
        self.nodes[node].kill()

    def freeze(self, node: int) -> None:
        """SIGSTOP the node's process group: its connections stay open and nothing answers on
        them (with `unreachable`, a machine gone from the network); `kill` ends it."""
        pid = self.nodes[node].pid
        if pid is not None:
            os.killpg(pid, signal.SIGSTOP)

    @contextlib.contextmanager
    def unreachable(self, node: int) -> Iterator[None]:
        """Drop every packet to the node's port while inside (an iptables rule on loopback,
        removed on the way out; root only): connections to it then fail at their timeouts."""
        rule = ["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(self.nodes[node].ports.node)]
        subprocess.run(["iptables", "-I", *rule, "-j", "DROP"], check=True)
        try:
            yield
        finally:
            subprocess.run(["iptables", "-D", *rule, "-j", "DROP"], check=True)

    def is_running(self, node: int) -> bool:
        return self.nodes[node].is_running()

    def live(self) -> list[int]:
        """The indexes of the nodes whose process runs."""
        return [i for i in range(len(self.nodes)) if self.nodes[i].is_running()]

    def ingress_url(self, node: int) -> str:
        return self.nodes[node].ingress_url

    def admin_url(self, node: int) -> str:
        return self.nodes[node].admin_url

    @property
    def identity_public_key(self) -> str:
        """The key that verifies the requests of every node to deployments."""
        return self.nodes[0].identity_public_key

    def log_tails(self, max_chars: int = 4000) -> dict[str, str]:
        """The end of each node's log, by node name (for failed tests)."""
        return {f"n{i + 1}": n.log_tail(max_chars) for i, n in enumerate(self.nodes)}

    def close(self) -> None:
        """SIGKILL every node and delete the data directories."""
        for server in self.nodes:
            server.kill()
        self.nodes = []
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    # -- admin API through any live node -----------------------------------------------------

    def _any_node(self, what: str, call: Callable[[RestateServer, float], T], timeout: float) -> T:
        """``call(server, timeout)`` on the first live node that answers it. A node that is
        down, refuses (HTTP 5xx: no leader for a partition yet) or cuts its answer short (a
        query whose partition went away mid-answer) is passed over, and the round repeated
        until ``timeout``."""
        deadline = time.monotonic() + timeout
        problems: dict[int, str] = {}
        while True:
            for i in self.live():
                remaining = deadline - time.monotonic()
                try:
                    return call(self.nodes[i], max(min(remaining, 10.0), 1.0))
                except AdminRefused as refused:
                    if refused.status < 500:
                        raise
                    problems[i] = str(refused)
                except (RestateServerError, HTTPException) as err:
                    problems[i] = repr(err)
            if time.monotonic() > deadline:
                raise RestateServerError(f"{what}: no live node answered: {problems}")
            time.sleep(0.1)

    def register(self, uri: str, *, timeout: float = 60.0) -> str:
        """Register a deployment through any live node; its id."""
        return self._any_node(
            f"registering {uri}", lambda s, t: s.register(uri, timeout=t), timeout
        )

    def query(self, sql: str, *, timeout: float = 60.0) -> list[dict[str, Any]]:
        """An introspection query through any live node (see `RestateServer.query`, and the
        module's note on rows missing while partitions move)."""
        return self._any_node("SQL introspection", lambda s, t: s.query(sql, timeout=t), timeout)

    # -- partitions and leaders --------------------------------------------------------------

    def partition_of_invocation(self, invocation_id: str) -> int:
        """The partition that holds the invocation (its id says)."""
        return partition_of_key(partition_key_of(invocation_id), self.partitions)

    def leaders(self) -> dict[int, int]:
        """Partition -> index of the live node that leads it, from the nodes' logs: the node
        that won the partition's highest leader epoch, if it has run since. A partition whose
        latest leader died (or restarted) has none until another node wins a higher epoch."""
        top: dict[int, tuple[int, int | None]] = {}
        for i, server in enumerate(self.nodes):
            running = server.is_running()
            for epoch, partition, current in _leaderships(server.log_path):
                if partition not in top or epoch > top[partition][0]:
                    top[partition] = (epoch, i if running and current else None)
        return {p: node for p, (_, node) in top.items() if node is not None}

    def leader_of(self, partition: int) -> int | None:
        """The index of the live node that leads ``partition``, None while it has none."""
        return self.leaders().get(partition)

    def metadata_leader(self) -> int | None:
        """The index of the live node that last won the leadership of the replicated metadata
        store since it started, from the nodes' logs (their lines begin with the time)."""
        won = []
        for i, server in enumerate(self.nodes):
            if server.is_running():
                text = _log_text(server.log_path)
                since_start = text[text.rfind(START_MARKER) :]
                won += [(m[1], i) for m in _METADATA_LEADER_LINE.finditer(since_start)]
        return max(won)[1] if won else None

    def wait_for_leaders(
        self, timeout: float | None = None, *, steady: float = 0.0
    ) -> dict[int, int]:
        """Wait until every partition has a leader on a live node, unchanged for ``steady``
        seconds (the scheduler moves leaders for a few seconds after a node joins or leaves),
        and a query over every partition succeeds through a live node; the leaders."""
        limit = self._startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        since, seen = time.monotonic(), self.leaders()
        while True:
            leaders = self.leaders()
            if leaders != seen:
                since, seen = time.monotonic(), leaders
            if len(leaders) == self.partitions and time.monotonic() - since >= steady:
                self.query("SELECT COUNT(*) AS n FROM sys_invocation_status", timeout=30.0)
                return leaders
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {k}\n{v}" for k, v in self.log_tails(2000).items())
                raise RestateServerError(
                    f"partitions without a steady leader after {limit:.0f}s (leaders: "
                    f"{leaders}); log tails:\n{tails}"
                )
            time.sleep(0.1)


def _log_text(log: Path) -> str:
    try:
        return log.read_text(errors="replace")
    except OSError:
        return ""


def _leaderships(log: Path) -> list[tuple[int, int, bool]]:
    """(epoch, partition, since the node's last start) of each leadership the node logged."""
    text = _log_text(log)
    last_start = text.rfind(START_MARKER)
    return [(int(m[1]), int(m[2]), m.start() > last_start) for m in _LEADER_LINE.finditer(text)]


def _distinct_ports(count: int) -> list[RestatePorts]:
    ports: list[RestatePorts] = []
    taken: set[int] = set()
    while len(ports) < count:
        candidate = RestatePorts.random()
        chosen = {candidate.ingress, candidate.admin, candidate.node}
        if not chosen & taken:
            taken |= chosen
            ports.append(candidate)
    return ports

"""A kube-proxy for the stand-in worker, on loopback: a version is reachable only while its
Deployment has pods.

The stand-in worker serves every agent and version by URL path, whether or not the version has
pods (kwok's pods run nothing). With the operator started with `TETHER_WORKER_SERVICE_TYPE=
NodePort` and `TETHER_WORKER_URL_TEMPLATE=http://127.0.0.1:{node_port}/{namespace}/{agent}/{hash}`,
this helper listens on each version Service's node port and forwards the connections to the
stand-in, but only while the version's Deployment has a ready replica: at zero replicas the port
is closed and every open connection is cut, so Restate meets a refused connection as it would at
a Service without endpoints, and backs off.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from typing import Any

from kubernetes.client import ApiException

from tests.operator.op_harness import Cluster

MANAGED = "app.kubernetes.io/managed-by=tether-operator"


class Gate:
    """One listening port forwarding to `target`, opened and closed at will."""

    def __init__(self, port: int, target: int) -> None:
        self.port = port
        self.target = target
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        if self.server is None:
            self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        tasks = list(self.connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.connections.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target
            )
        except OSError:
            writer.close()
            self.connections.discard(task)
            return
        try:
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        except asyncio.CancelledError:
            pass  # the gate closed: the pod is gone
        finally:
            for stream in (writer, upstream_writer):
                with contextlib.suppress(Exception):
                    stream.close()
            self.connections.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class LocalProxy:
    """Follows the namespace's version Deployments every 0.1 s (see the module's docstring).

    `opened[name]` / `closed[name]`: when the port of Deployment `name` last opened / closed
    (time.monotonic()), for the tests' latency figures."""

    def __init__(self, cluster: Cluster, target: int) -> None:
        self.cluster = cluster
        self.target = target
        self.gates: dict[str, Gate] = {}
        self.opened: dict[str, float] = {}
        self.closed: dict[str, float] = {}
        self.loop = asyncio.new_event_loop()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="local-proxy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.loop.run_until_complete(self._follow())

    async def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                wanted = await asyncio.to_thread(self._ready_ports)
                await self._sync(wanted)
            except Exception as error:  # keep following: the API server answers again later
                sys.stderr.write(f"local proxy: {error!r}\n")
            await asyncio.sleep(0.1)
        for gate in self.gates.values():
            await gate.close()

    def _ready_ports(self) -> dict[str, tuple[int, bool]]:
        """Node port and "has a ready replica" of each version Deployment."""
        ns = self.cluster.namespace
        found: dict[str, tuple[int, bool]] = {}
        deployments = self.cluster.apps.list_namespaced_deployment(ns, label_selector=MANAGED)
        for deployment in deployments.items:
            assert deployment.metadata and deployment.metadata.name and deployment.spec
            name = deployment.metadata.name
            try:
                service = self.cluster.core.read_namespaced_service(name, ns)
            except ApiException as error:
                if error.status == 404:  # a version being retired: its Service went first
                    continue
                raise
            ports = (service.spec.ports if service.spec else None) or []
            if not ports or not ports[0].node_port:
                continue
            ready = bool(deployment.spec.replicas) and bool(
                deployment.status and deployment.status.ready_replicas
            )
            found[name] = (ports[0].node_port, ready)
        return found

    async def _sync(self, wanted: dict[str, tuple[int, bool]]) -> None:
        for name in [n for n in self.gates if n not in wanted]:
            await self.gates.pop(name).close()
        for name, (port, ready) in wanted.items():
            gate = self.gates.setdefault(name, Gate(port, self.target))
            was_open = gate.server is not None
            if ready and not was_open:
                await gate.open()
                self.opened[name] = time.monotonic()
            elif not ready and was_open:
                await gate.close()
                self.closed[name] = time.monotonic()

    def is_open(self, name: str) -> bool:
        gate = self.gates.get(name)
        return gate is not None and gate.server is not None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.loop.close()


def url_template() -> dict[str, Any]:
    """The operator's settings for versions reached through the proxy."""
    return {
        "TETHER_WORKER_SERVICE_TYPE": "NodePort",
        "TETHER_WORKER_URL_TEMPLATE": "http://127.0.0.1:{node_port}/{namespace}/{agent}/{hash}",
    }

"""`GET /metrics`: the worker's and the sidecar's metrics in one Prometheus exposition.

Both processes write to `PROMETHEUS_MULTIPROC_DIR` (prometheus_client's multiprocess mode) and
this merges the files with `MultiProcessCollector`. `tether_parked_calls{agent,kind}` and
`tether_parked_oldest_seconds{agent}` (the age of the oldest parked call, 0 when none waits) are
computed at scrape time from the parked-call records in Restate. When this process itself is not in
multiprocess mode (the variable was not set when prometheus_client was imported), its own
webhook counter is served from memory instead.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ...parked import ParkedCall
from ..metrics import (
    PARKED_CALLS_HELP,
    PARKED_CALLS_NAME,
    PARKED_KINDS,
    PARKED_OLDEST_HELP,
    PARKED_OLDEST_NAME,
    WEBHOOK_REQUESTS,
    WEBHOOK_REQUESTS_NAME,
    merged_files,
    multiprocess_dir,
    multiprocess_enabled,
)
from .context import Sidecar, SidecarDep
from .rejection import Rejection

log = logging.getLogger("tether.programs.sidecar")
router = APIRouter()


class ParkedCallsCollector(Collector):
    """`tether_parked_calls{agent,kind}` (every kind, zeros too) and
    `tether_parked_oldest_seconds{agent}` (0 when nothing is parked) from a read of the records,
    at the time of the scrape."""

    def __init__(self, agent: str, records: Mapping[str, ParkedCall]) -> None:
        self._agent = agent
        self._records = records

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(PARKED_CALLS_NAME, PARKED_CALLS_HELP, labels=["agent", "kind"])
        counts = Counter(str(r.get("kind", "approval")) for r in self._records.values())
        for kind in sorted(set(PARKED_KINDS) | set(counts)):
            family.add_metric([self._agent, kind], counts.get(kind, 0))
        yield family
        now = time.time()
        created = [
            float(r["created_at"]) / 1000
            for r in self._records.values()
            if type(r.get("created_at")) in (int, float)
        ]
        oldest = GaugeMetricFamily(PARKED_OLDEST_NAME, PARKED_OLDEST_HELP, labels=["agent"])
        oldest.add_metric([self._agent], max(0.0, now - min(created)) if created else 0.0)
        yield oldest


class WithoutFamilies(Collector):
    """Another collector's output minus the families served by someone else."""

    def __init__(self, inner: Collector, names: Iterable[str]) -> None:
        self._inner = inner
        self._names = frozenset(names)

    def collect(self) -> Iterable[Metric]:
        return [family for family in self._inner.collect() if family.name not in self._names]


def build_registry(sidecar: Sidecar, records: Mapping[str, ParkedCall] | None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    served_here = {PARKED_CALLS_NAME, PARKED_OLDEST_NAME}
    if not multiprocess_enabled():
        registry.register(WEBHOOK_REQUESTS)
        served_here.add(WEBHOOK_REQUESTS_NAME)
    directory = multiprocess_dir(sidecar.settings.prometheus_multiproc_dir)
    if directory is not None:
        registry.register(WithoutFamilies(merged_files(directory), served_here))
    if records is not None:
        registry.register(ParkedCallsCollector(sidecar.settings.agent, records))
    return registry


@router.get("/metrics")
async def metrics(sidecar: SidecarDep) -> Response:
    records: Mapping[str, ParkedCall] | None
    try:
        records = await sidecar.parked.all()
    except Rejection:
        log.warning("metrics: the parked calls could not be read; tether_parked_* are left out")
        records = None
    registry = build_registry(sidecar, records)
    body = await run_in_threadpool(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)

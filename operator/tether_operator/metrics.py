"""The operator's Prometheus metrics: per version, its active and parked runs and the replicas the
operator wants for it, for an HPA (through a metrics adapter) or KEDA (its Prometheus scaler) to
scale a version on while its runs are active; per schedule, its next and last runs' times (as
Restate keeps them), for an alert on a schedule whose next run never came; per spend cap, the
share of it spent, for an alert before runs are refused.

Served at `/metrics` on `TETHER_METRICS_PORT` (default 8000; 0: not served) from a registry of
the operator's own. The counts are Restate's (the one cached `sys_invocation` query of the
supervision pass): at most 10 s old, 1 s while a version of the agent drains or is at zero.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TypeVar

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tether.spec import ScheduleStatus, SpendStatus, VersionStatus

from .conditions import parse_rfc3339

log = logging.getLogger("tether_operator")

REGISTRY = CollectorRegistry(auto_describe=True)
LABELS = ("namespace", "agent", "version")
ACTIVE_RUNS = Gauge(
    "tether_version_active_runs",
    "Runs of the version that are running, ready or backing off: they need a worker now.",
    LABELS,
    registry=REGISTRY,
)
PARKED_RUNS = Gauge(
    "tether_version_parked_runs",
    "Runs pinned to the version that wait without a worker (suspended: for a person, a timer "
    "or another call; or paused).",
    LABELS,
    registry=REGISTRY,
)
REPLICAS = Gauge(
    "tether_version_replicas",
    "Worker pods the operator wants for the version: its replicas, or 0 while it is scaled to "
    "zero.",
    LABELS,
    registry=REGISTRY,
)
VERSION_GAUGES = (ACTIVE_RUNS, PARKED_RUNS, REPLICAS)
SCHEDULE_LABELS = ("namespace", "agent", "schedule")
NEXT_RUN = Gauge(
    "tether_schedule_next_run_timestamp_seconds",
    "When the schedule's next run is due (Unix time), as Restate keeps it; none while suspended.",
    SCHEDULE_LABELS,
    registry=REGISTRY,
)
LAST_RUN = Gauge(
    "tether_schedule_last_run_timestamp_seconds",
    "When the schedule's last run was due (Unix time).",
    SCHEDULE_LABELS,
    registry=REGISTRY,
)
SCHEDULE_GAUGES = (NEXT_RUN, LAST_RUN)
SPEND_USED = Gauge(
    "tether_spend_cap_used_ratio",
    "The larger share of a spend cap's limits that the agent's runs spent in its current period "
    "(1: reached, and calls are refused before it).",
    ("namespace", "agent", "period", "model"),  # model: "" for a cap on all of the agent's calls
    registry=REGISTRY,
)
SPEND_GAUGES = (SPEND_USED,)


def serve(port: int) -> None:
    """Serve `/metrics` on `port` (all addresses); 0: not at all. A port that is taken is
    logged, and the operator runs on without metrics."""
    if port == 0:
        return
    try:
        start_http_server(port, registry=REGISTRY)
    except OSError as error:
        log.warning("serving metrics on port %d failed: %s; running without them", port, error)


def report(namespace: str, agent: str, versions: list[VersionStatus], shown: set[str]) -> None:
    """Set the gauges of the agent's `versions` and drop those of versions that are gone;
    `shown` (the hashes reported before) is updated."""
    for version in versions:
        labels = (namespace, agent, version.hash)
        ACTIVE_RUNS.labels(*labels).set(version.active_runs or 0)
        PARKED_RUNS.labels(*labels).set(version.parked_runs or 0)
        REPLICAS.labels(*labels).set(version.replicas or 0)
    _shown_now(namespace, agent, shown, {v.hash for v in versions}, VERSION_GAUGES)


def report_schedules(
    namespace: str, agent: str, schedules: list[ScheduleStatus], shown: set[str]
) -> None:
    """Set the gauges of the agent's `schedules` and drop those of schedules that are gone;
    `shown` (the names reported before) is updated."""
    for schedule in schedules:
        labels = (namespace, agent, schedule.name)
        for gauge, stamp in zip(
            SCHEDULE_GAUGES, (schedule.next_run, schedule.last_run), strict=True
        ):
            if stamp is None:
                forget(namespace, agent, {schedule.name}, (gauge,))
            else:
                gauge.labels(*labels).set(parse_rfc3339(stamp))
    _shown_now(namespace, agent, shown, {s.name for s in schedules}, SCHEDULE_GAUGES)


def report_spend(
    namespace: str, agent: str, spend: list[SpendStatus], shown: set[tuple[str, str]]
) -> None:
    """Set the gauge of each of the agent's spend caps and drop those of caps that are gone;
    `shown` (the periods and models reported before) is updated."""
    caps: dict[tuple[str, str], float] = {(cap.per, cap.model or ""): cap.used for cap in spend}
    for (per, model), used in caps.items():
        SPEND_USED.labels(namespace, agent, per, model).set(used)
    _shown_now(namespace, agent, shown, set(caps), SPEND_GAUGES)


Key = TypeVar("Key", str, tuple[str, str])
"""A gauge's labels after the namespace and the agent's: a version's hash, a schedule's name, a
spend cap's period and model."""


def _shown_now(
    namespace: str, agent: str, shown: set[Key], current: set[Key], gauges: tuple[Gauge, ...]
) -> None:
    """Drop the `gauges` of the keys `shown` before that are not `current`; `shown` becomes
    `current`."""
    forget(namespace, agent, shown - current, gauges)
    shown.clear()
    shown.update(current)


def forget(
    namespace: str, agent: str, keys: set[Key], gauges: tuple[Gauge, ...] = VERSION_GAUGES
) -> None:
    """Drop the `gauges` of the agent's `keys` (versions, schedules or spend caps)."""
    for key in keys:
        labels = (key,) if isinstance(key, str) else key
        for gauge in gauges:
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, agent, *labels)

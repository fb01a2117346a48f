"""Running helm on the chart, and reading what it renders."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import Counter, Gauge, Histogram

from tether.programs import metrics
from tether_operator import metrics as operator_metrics_module

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "tether"
Manifest = dict[str, Any]
METRIC = re.compile(r"\btether_[a-z_]+\b")
"""A name of Tether's in a PromQL query."""
HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


def helm(
    helm_bin: Path, *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run helm (with `env`, e.g. a control plane's KUBECONFIG); fail with its stderr."""
    result = subprocess.run(
        [str(helm_bin), *args],
        capture_output=True,
        text=True,
        env=env or dict(os.environ),
        timeout=300,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render(helm_bin: Path, *sets: str, namespace: str = "tether-system") -> list[Manifest]:
    """The objects `helm template` renders with `--set` values."""
    args = ["template", "t", str(CHART), "--namespace", namespace]
    for value in sets:
        args += ["--set", value]
    return [doc for doc in yaml.safe_load_all(helm(helm_bin, *args).stdout) if doc]


def by_kind(objects: list[Manifest], kind: str) -> list[Manifest]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[Manifest], kind: str) -> Manifest:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_specs(objects: list[Manifest]) -> Iterator[tuple[str, Manifest]]:
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"]


def env_of(container: Manifest) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def tether_metrics() -> dict[str, str]:
    """Every metric `tether.programs.metrics` declares (the workers' and the sidecars'), by its
    name in Prometheus, with its type; and the one the sidecar computes at scrape time without a
    declared metric."""
    return {metrics.PARKED_OLDEST_NAME: "gauge", **_declared(vars(metrics).values())}


def operator_metrics() -> dict[str, str]:
    """Every metric the operator declares (`tether_operator.metrics`), as `tether_metrics`."""
    return _declared(vars(operator_metrics_module).values())


def _declared(values: Iterable[object]) -> dict[str, str]:
    found = {}
    for value in values:
        if isinstance(value, Counter):
            found[f"{value._name}_total"] = "counter"
        elif isinstance(value, Histogram):
            found[value._name] = "histogram"
        elif isinstance(value, Gauge):
            found[value._name] = "gauge"
    return found

"""Fixtures of the chart tests: the helm CLI (built from its Go module by scripts/build-helm.sh
into the cache outside the repository) and the shared tier-2 control plane.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.kube.conftest import kube_cluster  # noqa: F401  (the shared tier-2 control plane)

REPO = Path(__file__).resolve().parents[2]


def built(script: str) -> Path:
    """The binary `scripts/<script>` builds (cached outside the repository, built once)."""
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / script)],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return Path(done.stdout.strip())


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    return built("build-helm.sh")


@pytest.fixture(scope="session")
def promtool_bin() -> Path:
    """Prometheus's promtool (the alert tests)."""
    return built("build-promtool.sh")


PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.85.0"


@pytest.fixture(scope="session")
def prometheus_operator_crds() -> Path:
    """The directory of the Prometheus Operator's CRDs (PodMonitor, PrometheusRule...), from its
    Go module (the proxy serves the module's files; cached with the other Go modules outside the
    repository)."""
    cache = Path(os.environ.get("TETHER_CACHE") or Path.home() / ".cache" / "tether")
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOMODCACHE": str(cache / "go" / "mod"), "GOFLAGS": "-modcacherw"}
    downloaded = subprocess.run(
        ["go", "mod", "download", "-json", PROMETHEUS_OPERATOR],
        capture_output=True,
        text=True,
        env=env,
        cwd=cache,
        timeout=600,
    )
    assert downloaded.returncode == 0, downloaded.stdout + downloaded.stderr
    module = Path(json.loads(downloaded.stdout)["Dir"])
    return module / "example" / "prometheus-operator-crd"

"""The whole user path of Tether on a real node (`e2e/steps.py`, the steps `e2e/kind.sh` runs
on kind): images from the Dockerfile, `helm install`, an agent in a restricted namespace, a
parked run surviving its pod, a signed approval, Prometheus, NetworkPolicy, rollouts, kills."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from e2e.cluster import Cluster, Report
from e2e.steps import run_all

REPORT = Path(os.environ.get("TETHER_E2E_REPORT", "/tmp/tether-e2e-report.json"))
LOGS = Path(os.environ.get("TETHER_E2E_LOGS", "/tmp/tether-e2e-logs"))


def dump_logs(cluster: Cluster) -> None:
    """Every container's log (and the previous one's, after a restart) for the failure report."""
    LOGS.mkdir(parents=True, exist_ok=True)
    kubectl = [cluster.kubectl_bin, f"--kubeconfig={cluster.kubeconfig}"]
    listing = subprocess.run(
        [
            *kubectl,
            "get",
            "pods",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.metadata.namespace} {.metadata.name}{'\\n'}{end}",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    for line in listing.splitlines():
        namespace, name = line.split()
        for previous in ("", "--previous"):
            out = subprocess.run(
                [
                    *kubectl,
                    "-n",
                    namespace,
                    "logs",
                    name,
                    "--all-containers",
                    "--prefix",
                    *([previous] if previous else []),
                ],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            if out:
                (LOGS / f"{namespace}.{name}{previous}.log").write_text(out)
    described = subprocess.run(
        [*kubectl, "get", "pods,durableagents,events", "-A", "-o", "wide"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    (LOGS / "objects.txt").write_text(described)
    print(f"pod logs and objects in {LOGS}")


def test_the_user_path(cluster: Cluster) -> None:
    report = Report()
    try:
        run_all(cluster, report)
    except BaseException:
        dump_logs(cluster)
        raise
    finally:
        REPORT.write_text(report.as_json())

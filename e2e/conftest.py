"""The real-node e2e (`make e2e`): preflight, images, and the node they run on.

It needs Linux, root and a Docker engine (installed from Debian's packages and started when
missing); without them it fails at once, saying what is missing. Everything slow is cached
outside the repository: the Go-built binaries, the Debian root filesystem, Docker's layers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import Cluster
from tests.kube.controlplane import bin_dir
from tests.kube.host import HostError
from tests.kube.node import PACKAGES, KubeNode, check_host, install_packages

ROOT = Path(__file__).resolve().parents[1]
DOCKERD_LOG = Path("/tmp/tether-e2e-dockerd.log")


def pytest_sessionstart(session: pytest.Session) -> None:
    problems = check_host()
    if problems:
        pytest.exit(f"make e2e needs {' and '.join(problems)}; nothing was run", returncode=2)


def _docker_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def _dockerd_log_tail() -> str:
    try:
        lines = DOCKERD_LOG.read_text(errors="replace").splitlines()[-20:]
    except OSError:
        return " (no dockerd was started here: another process runs the engine)"
    return "; the end of " + str(DOCKERD_LOG) + ":\n" + "\n".join(lines)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[None]:
    """A Docker engine: the one that runs, or dockerd started here (and stopped after)."""
    try:
        install_packages({**PACKAGES, "debootstrap": "debootstrap"})  # and the images' root
    except HostError as error:
        pytest.exit(f"make e2e: {error}", returncode=2)
    if _docker_answers():
        yield
        return
    if not shutil.which("dockerd"):
        pytest.exit("make e2e needs a Docker engine: dockerd is not installed", returncode=2)
    log = open(DOCKERD_LOG, "wb")  # noqa: SIM115  (kept open while it runs)
    # It only builds images (with the host's network) and runs no container: no bridge, no
    # iptables rule and no forwarding policy of Docker's to leave on the host after it.
    dockerd = subprocess.Popen(
        ["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not _docker_answers():
        if dockerd.poll() is not None or time.monotonic() > deadline:
            pytest.exit(f"dockerd did not start: see {DOCKERD_LOG}", returncode=2)
        time.sleep(0.2)
    try:
        yield
    finally:
        dockerd.terminate()
        dockerd.wait(timeout=60)
        log.close()
    left = docker_leftovers()
    if left:
        pytest.fail(f"the dockerd started here left {', '.join(left)} on the host")


def docker_leftovers() -> list[str]:
    """What a Docker engine leaves on a host when it is let set up its networking."""
    left = ["the docker0 link"] if Path("/sys/class/net/docker0").exists() else []
    for table in ("filter", "nat"):
        saved = subprocess.run(
            ["iptables-save", "-t", table], capture_output=True, text=True, check=False
        ).stdout
        if "DOCKER" in saved or "docker0" in saved:
            left.append(f"rules in iptables' {table} table")
    return left


@pytest.fixture(scope="session")
def images(docker_engine: None) -> dict[str, str]:
    """Every image of the e2e, built locally (`scripts/build-images.sh`), by role."""
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-images.sh")],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        # Once the build failed with the engine gone: say whether it still answers, and why not.
        engine = "answers" if _docker_answers() else f"does not answer{_dockerd_log_tail()}"
        pytest.fail(
            f"scripts/build-images.sh failed (its log is above); the Docker engine {engine}"
        )
    print(f"\nimages ready in {time.monotonic() - started:.1f} s")
    return dict(line.split("=", 1) for line in result.stdout.split())


@pytest.fixture(scope="session")
def helm_path() -> Path:
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-helm.sh")], stdout=subprocess.PIPE, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def node(images: dict[str, str]) -> Iterator[KubeNode]:
    """The real node, with every e2e image loaded."""
    bin_dir()  # the control plane's binaries, built first if missing
    cluster = KubeNode(images)
    started = time.monotonic()
    cluster.start()
    print(f"\nreal node up in {time.monotonic() - started:.1f} s")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def cluster(node: KubeNode, images: dict[str, str], helm_path: Path) -> Cluster:
    """The real node as the steps see it: its kubeconfig, tools and images."""
    plane = node.control_plane
    return Cluster(
        name="real node",
        kubeconfig=plane.kubeconfig,
        tether_image=images["tether"],
        prometheus_image=images["prometheus"],
        restate_image=images["restate"],
        mcp_image=images["mcp"],
        mcp_stdio_image=images["mcp_stdio"],
        kubectl_bin=str(plane.bin_dir / "kubectl"),
        helm_bin=str(helm_path),
        outside_attempts=node.outside_attempts,
        kill_container=node.kill_container,
    )


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

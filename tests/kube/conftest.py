"""Session fixtures that run a real Kubernetes control plane on loopback.

``kube_apiserver``: tier 1, etcd + kube-apiserver (no controllers; patch statuses yourself).
``kube_cluster``: tier 2, + kube-controller-manager, kube-scheduler and kwok with one fake Node,
so Deployments get Pods that become Ready.

Both yield a :class:`~.controlplane.ControlPlane` (``kubeconfig``, ``server``, ``bin_dir``, ...).
The binaries are built on first use by ``scripts/build-control-plane.sh`` into a cache outside
the repository (``$TETHER_CACHE``, default ``~/.cache/tether``); ``$TETHER_K8S_BIN_DIR`` points
at prebuilt ones instead. ``TETHER_KUBE_KEEP=1`` keeps logs and data after the session.

Tests outside ``tests/kube`` get the fixtures by re-exporting them from a conftest above them,
e.g. ``from kube.conftest import kube_apiserver, kube_cluster`` in ``tests/conftest.py``. pytest
then holds two definitions of each fixture; both share one running control plane per tier.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from .controlplane import ControlPlane, KubeAPIServer, KubeCluster

# One running control plane per tier and process, with the number of fixture definitions using it.
_running: dict[type[KubeAPIServer], tuple[KubeAPIServer, int]] = {}


@contextmanager
def _shared(kind: type[KubeAPIServer]) -> Iterator[ControlPlane]:
    if kind in _running:
        server, users = _running[kind]
    else:
        server, users = kind(), 0
        server.start()
    _running[kind] = (server, users + 1)
    try:
        yield server.control_plane
    finally:
        server, users = _running.pop(kind)
        if users > 1:
            _running[kind] = (server, users - 1)
        else:
            server.stop()


@pytest.fixture(scope="session")
def kube_apiserver() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver, shared by the whole session."""
    with _shared(KubeAPIServer) as control_plane:
        yield control_plane


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + controller-manager + scheduler + kwok, shared by the session."""
    with _shared(KubeCluster) as control_plane:
        yield control_plane

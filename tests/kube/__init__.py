"""A Docker-free Kubernetes control plane for tests (see controlplane.py and conftest.py)."""

"""Names, labels and the version hash shared by everything the operator creates."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tether.spec.crd import GROUP, PLURAL, VERSION

__all__ = ["GROUP", "PLURAL", "VERSION"]

FIELD_MANAGER = "tether-operator"
SCALE_FIELD_MANAGER = "tether-operator-scale"
"""Owns a version Deployment's `spec.replicas` once the operator scaled it to zero (and back):
the objects' own apply (`FIELD_MANAGER`) never sends a partial Deployment."""
FINALIZER = f"{GROUP}/finalizer"
ANNOTATION_PREFIX = GROUP

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
AGENT_LABEL = f"{GROUP}/agent"
VERSION_LABEL = f"{GROUP}/version"
SCALED_TO_ZERO_ANNOTATION = f"{GROUP}/scaled-to-zero-at"
"""On a version Deployment at zero replicas: when the operator scaled it there (RFC 3339)."""
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
"""On the sidecar's pod template: the hash of its spec document and pod spec."""
REPLICAS_ANNOTATION = f"{GROUP}/replicas"
"""On a version Deployment at zero replicas: how many it had, to scale it back to."""
RUN_NOW_ANNOTATION = f"{GROUP}/run-now"
"""On a DurableAgent, set by a person: `<schedule>@<anything new>` starts a run of the schedule
at once, once per value (`schedules.run_now`)."""

WORKER_PORT = 9080
"""The Restate endpoint of a worker pod and of a sidecar pod's index container."""
SIDECAR_PORT = 8000
WORKER_METRICS_PORT = 9090
"""A worker pod's own `/metrics` (its sidecar is in another pod)."""
SPEC_DIR = "/etc/tether"
SPEC_FILE = "agent.yaml"
METRICS_DIR = "/var/run/tether/metrics"
WORKSPACE_DIR = "/workspace"
HASH_LENGTH = 10


def version_name(agent: str, version_hash: str) -> str:
    """ConfigMap, Deployment and Service of one version: `<agent>-<hash>`."""
    return f"{agent}-{version_hash}"


def sidecar_name(agent: str) -> str:
    """The agent's sidecar ConfigMap, Deployment, Service and PodDisruptionBudget: stable across
    versions (webhooks, metrics, and the index of parked calls and live events on Restate)."""
    return f"{agent}-sidecar"


SIDECAR_VERSION = "sidecar"
"""The `{hash}` of the sidecar's URL template: its Restate deployment is no version."""


def agent_labels(agent: str) -> dict[str, str]:
    return {
        NAME_LABEL: "tether-agent",
        INSTANCE_LABEL: agent,
        MANAGED_BY_LABEL: FIELD_MANAGER,
        AGENT_LABEL: agent,
    }


def version_labels(agent: str, version_hash: str) -> dict[str, str]:
    return {**agent_labels(agent), VERSION_LABEL: version_hash}


def selector(agent: str, version_hash: str | None = None) -> dict[str, str]:
    labels = {AGENT_LABEL: agent}
    if version_hash is not None:
        labels[VERSION_LABEL] = version_hash
    return labels


RESTATE_AGENT_KEY = f"{GROUP}/agent"
RESTATE_VERSION_KEY = f"{GROUP}/version"
RESTATE_ROLE_KEY = f"{GROUP}/role"
"""`sidecar` on the sidecar's Restate deployment; versions have none."""


def restate_agent(namespace: str, agent: str) -> str:
    return f"{namespace}/{agent}"


def restate_metadata(namespace: str, agent: str, version_hash: str) -> dict[str, str]:
    """Attached to the Restate deployment, so orphans can be found after a crash."""
    return {
        RESTATE_AGENT_KEY: restate_agent(namespace, agent),
        RESTATE_VERSION_KEY: version_hash,
    }


def sidecar_metadata(namespace: str, agent: str) -> dict[str, str]:
    return {RESTATE_AGENT_KEY: restate_agent(namespace, agent), RESTATE_ROLE_KEY: SIDECAR_VERSION}


def content_hash(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]

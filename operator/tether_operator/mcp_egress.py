"""Egress to the in-cluster MCP servers an agent names, and to its trace collector.

An agent's pods may reach only DNS, Restate and the internet outside private ranges
(`render.egress_policy`), so an MCP server behind a Service of the cluster would be out of reach.
For each `mcp.url` that names a Service by its cluster DNS name, the policy gets one rule: the
Service's pods, on the port the URL reaches. Nothing else of the cluster opens up, and a URL
outside the cluster gets no rule (the internet rule covers public addresses). The agent's OTLP
collector (`spec.observability.otlpEndpoint`, or the operator's) gets a rule the same way.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from tether.spec import DurableAgent

from .kube import Kube

Manifest = dict[str, Any]
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def service_of(url: str, namespace: str) -> tuple[str, str, int] | None:
    """(namespace, Service, port) of a URL whose host is a Service's cluster DNS name (`svc`,
    `svc.ns`, `svc.ns.svc[.<cluster domain>]`); None for an address or any other name."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        return None
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    port = parts.port or (443 if parts.scheme == "https" else 80)
    labels = host.split(".")
    if len(labels) == 1:
        return namespace, labels[0], port
    if len(labels) == 2 or labels[2] == "svc":
        return labels[1], labels[0], port
    return None


def rule_for(service: Manifest, port: int) -> Manifest | None:
    """The egress rule to `service`'s pods behind its `port`; None without a selector or such a
    port (the connection could not succeed anyway)."""
    spec = service.get("spec") or {}
    selector = spec.get("selector")
    ports = [p for p in spec.get("ports") or [] if p.get("port") == port]
    if not selector or not ports:
        return None
    namespace = service["metadata"]["namespace"]
    return {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
                "podSelector": {"matchLabels": dict(selector)},
            }
        ],
        # A policy sees the pod's port (after the Service's translation): the target port.
        "ports": [
            {"protocol": p.get("protocol", "TCP"), "port": p.get("targetPort", p["port"])}
            for p in ports
        ],
    }


async def mcp_egress_rules(
    kube: Kube, agent: DurableAgent, namespace: str, extra_urls: Sequence[str] = ()
) -> list[Manifest]:
    """One rule per in-cluster MCP server of the agent (and per other URL of `extra_urls`, its
    trace collector) that exists now."""
    rules: list[Manifest] = []
    urls = [entry.mcp.url for entry in agent.spec.tools if entry.mcp is not None]
    for url in [*urls, *extra_urls]:
        if url is None:
            continue
        target = service_of(url, namespace)
        if target is None:
            continue
        service_namespace, name, port = target
        service = await kube.get("v1", "Service", service_namespace, name)
        rule = None if service is None else rule_for(service, port)
        if rule is not None and rule not in rules:
            rules.append(rule)
    return rules

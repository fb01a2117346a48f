"""A keep-alive is fenced (`peering.fenced_keep_alive`): sent on the condition that the peering
object is still at the version read just before it, on the real kube-apiserver through kopf's own
client. A write by another replica between the read and the patch (what a keep-alive landing late
meets: the heir has written by then) gets it refused, and while the lease holds it reads again
and goes through. The whole story, a leader blackholed and let back, is `test_ha.py`."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import auth as kopf_auth
from kopf._cogs.clients import errors as kopf_errors
from kopf._cogs.structs import credentials, references
from kopf._core.engines import peering as kopf_peering

from tests.kube.controlplane import ControlPlane
from tests.operator.op_harness import Cluster
from tether_operator.peering import fenced_keep_alive

PEERING = "fenced"
KOPF_PEERINGS = references.Resource(
    group="kopf.dev", version="v1", plural="kopfpeerings", namespaced=True
)


async def keep_alive_of_a(kube_cluster: ControlPlane, namespace: str) -> None:
    vault = credentials.Vault()
    await vault.populate(
        {
            "test": credentials.ConnectionInfo(
                server=kube_cluster.server,
                ca_path=str(kube_cluster.ca_file),
                scheme="Bearer",
                token=kube_cluster.token,
            )
        }
    )
    kopf_auth.vault_var.set(vault)
    settings = kopf.OperatorSettings()
    settings.peering.name = PEERING
    settings.peering.priority = 10
    settings.peering.lifetime = 15
    try:
        await fenced_keep_alive(
            identity=kopf_peering.Identity("replica-a"),
            settings=settings,
            resource=KOPF_PEERINGS,
            namespace=references.NamespaceName(namespace),
        )
    finally:
        await vault.close()


def test_a_keep_alive_after_another_replicas_write_is_refused_then_read_again(
    kube_cluster: ControlPlane,
    cluster: Cluster,
    peering_crds: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster.create_peering(PEERING)
    asyncio.run(keep_alive_of_a(kube_cluster, cluster.namespace))
    first = cluster.peers(PEERING)["replica-a"]

    # Replica b writes its record between a's read and a's patch, once.
    read, patched = kopf_api.get, kopf_api.patch
    outcomes: list[str] = []

    async def read_then_b_writes(url: str, **kwargs: Any) -> Any:
        body = await read(url, **kwargs)
        if not outcomes:
            b = {"priority": 5, "lifetime": 15, "lastseen": first["lastseen"]}
            cluster.objects.patch_namespaced_custom_object(
                "kopf.dev", "v1", cluster.namespace, "kopfpeerings", PEERING,
                {"status": {"replica-b": b}},
            )  # fmt: skip
        return body

    async def patch_recorded(url: str, **kwargs: Any) -> Any:
        try:
            answer = await patched(url, **kwargs)
        except kopf_errors.APIConflictError:
            outcomes.append("conflict")
            raise
        outcomes.append("ok")
        return answer

    monkeypatch.setattr(kopf_api, "get", read_then_b_writes)
    monkeypatch.setattr(kopf_api, "patch", patch_recorded)
    asyncio.run(keep_alive_of_a(kube_cluster, cluster.namespace))

    assert outcomes == ["conflict", "ok"]
    records = cluster.peers(PEERING)
    assert "replica-b" in records  # b's write stands
    assert records["replica-a"]["lastseen"] > first["lastseen"]  # a's went through on a new read

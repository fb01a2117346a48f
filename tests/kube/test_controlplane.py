"""The self-started control plane behaves like a real cluster (tier 1 and tier 2)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client import ApiClient, ApiException

from tether.testing import wait_until

from .controlplane import FAKE_NODE, ControlPlane, KubeAPIServer

APPLY = "application/apply-patch+yaml"
FIELD_MANAGER = "tether-tests"
CEL_MESSAGE = "spec.minReplicas must not exceed spec.maxReplicas"
GROUP, PLURAL = "test.tether.dev", "widgets"

WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {
            "plural": PLURAL,
            "singular": "widget",
            "kind": "Widget",
            "listKind": "WidgetList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["minReplicas", "maxReplicas"],
                                "properties": {
                                    "minReplicas": {"type": "integer", "minimum": 0},
                                    "maxReplicas": {"type": "integer", "minimum": 0},
                                },
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.minReplicas <= self.maxReplicas",
                                        "message": CEL_MESSAGE,
                                    }
                                ],
                            }
                        },
                    }
                },
            }
        ],
    },
}


def _api_client(plane: ControlPlane) -> Iterator[ApiClient]:
    api: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(plane.kubeconfig)
    )
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def api1(kube_apiserver: ControlPlane) -> Iterator[ApiClient]:
    yield from _api_client(kube_apiserver)


@pytest.fixture
def api2(kube_cluster: ControlPlane) -> Iterator[ApiClient]:
    yield from _api_client(kube_cluster)


def _namespace(api: ApiClient) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace.model_validate({"metadata": {"name": name}})
    )
    return name


def _true(conditions: list[dict[str, Any]] | None, kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in conditions or [])


def _widget(namespace: str, name: str, low: int, high: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minReplicas": low, "maxReplicas": high},
    }


# -- tier 1: etcd + kube-apiserver ------------------------------------------------------------


def test_namespace_and_configmap_round_trip(api1: ApiClient) -> None:
    core = client.CoreV1Api(api1)
    namespace = _namespace(api1)
    core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap.model_validate(
            {"metadata": {"name": "settings", "labels": {"app": "tether"}}, "data": {"k": "v"}}
        ),
    )

    assert core.read_namespace(namespace).to_dict()["status"]["phase"] == "Active"
    read = core.read_namespaced_config_map("settings", namespace).to_dict()
    assert read["data"] == {"k": "v"}
    assert read["metadata"]["namespace"] == namespace
    listed = core.list_namespaced_config_map(namespace, label_selector="app=tether").to_dict()
    assert [item["metadata"]["name"] for item in listed["items"]] == ["settings"]


def test_server_side_applied_crd_enforces_cel_rule(
    kube_apiserver: ControlPlane, api1: ApiClient
) -> None:
    crds = client.ApiextensionsV1Api(api1)
    crd_name = WIDGET_CRD["metadata"]["name"]
    crds.patch_custom_resource_definition(
        crd_name, WIDGET_CRD, field_manager=FIELD_MANAGER, force=True, _content_type=APPLY
    )

    def read_crd() -> dict[str, Any]:
        return crds.read_custom_resource_definition(crd_name).to_dict()

    def established() -> bool:
        return _true((read_crd()["status"] or {}).get("conditions"), "Established")

    wait_until(established, timeout=30, what="the Widget CRD to be Established")
    managers = read_crd()["metadata"]["managed_fields"]
    assert any(m["manager"] == FIELD_MANAGER and m["operation"] == "Apply" for m in managers)

    namespace = _namespace(api1)
    objects = client.CustomObjectsApi(api1)

    def apply(body: dict[str, Any]) -> None:
        # The return value is not used: kubernetes 37 maps only 200 for PATCH, and an apply that
        # creates the object answers 201, which the client turns into None.
        objects.patch_namespaced_custom_object(
            GROUP,
            "v1",
            namespace,
            PLURAL,
            body["metadata"]["name"],
            body,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=APPLY,
        )

    apply(_widget(namespace, "good", 1, 3))
    good: Any = objects.get_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, "good")
    assert good["spec"] == {"minReplicas": 1, "maxReplicas": 3}

    with pytest.raises(ApiException) as rejected:
        apply(_widget(namespace, "bad", 5, 2))
    assert rejected.value.status == 422
    status = json.loads(rejected.value.body or "{}")
    assert status["reason"] == "Invalid"
    assert CEL_MESSAGE in status["message"]

    # The same rule through the kubectl that was built alongside the server.
    result = kube_apiserver.kubectl(
        "apply",
        "--server-side",
        f"--field-manager={FIELD_MANAGER}",
        "-f",
        "-",
        input=json.dumps(_widget(namespace, "bad-too", 4, 1)),
        check=False,
    )
    assert result.returncode != 0
    assert CEL_MESSAGE in result.stderr

    listed: Any = objects.list_namespaced_custom_object(GROUP, "v1", namespace, PLURAL)
    assert [item["metadata"]["name"] for item in listed["items"]] == ["good"]


def test_stop_ends_every_process_and_removes_the_data_dir() -> None:
    server = KubeAPIServer(keep_data_dir=False)
    with server as plane:
        pids = server.pids
        assert len(pids) == 2  # etcd, kube-apiserver
        assert plane.kubectl("get", "--raw=/readyz").stdout == "ok"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    assert not plane.data_dir.exists()


def test_server_reports_the_built_version(kube_apiserver: ControlPlane) -> None:
    version = json.loads(kube_apiserver.kubectl("version", "--output=json").stdout)
    server, kubectl = version["serverVersion"], version["clientVersion"]
    assert server["gitVersion"].startswith("v1."), server
    assert server["gitVersion"] == kubectl["gitVersion"]
    assert server["minor"] == server["gitVersion"].split(".")[1]


# -- tier 2: + controller-manager, scheduler, kwok ----------------------------------------------


def test_deployment_becomes_available_on_kwok_node(api2: ApiClient) -> None:
    apps, core = client.AppsV1Api(api2), client.CoreV1Api(api2)
    namespace = _namespace(api2)
    labels = {"app": "echo"}
    deployment = {
        "metadata": {"name": "echo"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                # kwok never pulls or runs the image.
                "spec": {"containers": [{"name": "echo", "image": "example.invalid/echo:1"}]},
            },
        },
    }
    apps.create_namespaced_deployment(namespace, client.V1Deployment.model_validate(deployment))

    def available() -> bool:
        status = apps.read_namespaced_deployment_status("echo", namespace).to_dict()["status"]
        return status["available_replicas"] == 2 and _true(status["conditions"], "Available")

    wait_until(available, timeout=90, what="Deployment echo to have 2 available replicas")

    pods = core.list_namespaced_pod(namespace, label_selector="app=echo").to_dict()["items"]
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["node_name"] == FAKE_NODE
        assert pod["status"]["phase"] == "Running"
        assert _true(pod["status"]["conditions"], "Ready")
        # The ServiceAccount admission plugin is on in tier 2: the controller-manager made the SA.
        assert pod["spec"]["service_account_name"] == "default"
        (owner,) = pod["metadata"]["owner_references"]
        assert owner["kind"] == "ReplicaSet"

    # The garbage collector removes the ReplicaSet and its Pods with the Deployment.
    apps.delete_namespaced_deployment("echo", namespace, propagation_policy="Background")

    def gone() -> bool:
        return not core.list_namespaced_pod(namespace, label_selector="app=echo").items

    wait_until(gone, timeout=90, what="the Deployment's Pods to be garbage-collected")

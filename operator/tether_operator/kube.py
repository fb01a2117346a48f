"""A small async Kubernetes client for the operator's children: server-side apply, get, list,
delete and status patches, as plain dicts (the official `kubernetes.aio` client underneath, for
its kubeconfig, in-cluster and token-refresh handling)."""

from __future__ import annotations

import json
import os
from typing import Any

from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig

from .names import FIELD_MANAGER, GROUP, PLURAL, VERSION

Manifest = dict[str, Any]

_PLURALS = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "Secret"): "secrets",
    ("apps/v1", "Deployment"): "deployments",
    (f"{GROUP}/{VERSION}", "DurableAgent"): PLURAL,
}


class KubeError(Exception):
    """A request the API server refused; `status` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    plural = _PLURALS[(api_version, kind)]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


async def connect() -> kclient.ApiClient:
    """In a pod: the service account; elsewhere: `$KUBECONFIG` or ~/.kube/config."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        kconfig.load_incluster_config()  # type: ignore[no-untyped-call]
        return kclient.ApiClient()
    api: kclient.ApiClient = await kconfig.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=os.environ.get("KUBECONFIG")
    )
    return api


class Kube:
    def __init__(self, api: kclient.ApiClient) -> None:
        self._api = api

    async def close(self) -> None:
        await self._api.close()  # type: ignore[no-untyped-call]

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str | None = None,
    ) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            serialized = await self._api.param_serialize(
                method,
                path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = await self._api.call_api(*serialized, _request_timeout=30)
            raw = await response.read()  # type: ignore[no-untyped-call]
        except (OSError, TimeoutError) as error:
            raise KubeError(0, f"{method} {path}: the API server did not answer: {error}") from None
        data = json.loads(raw) if raw else None
        return response.status, data

    @staticmethod
    def _fail(status: int, data: Any, what: str) -> KubeError:
        message = data.get("message") if isinstance(data, dict) else None
        return KubeError(status, f"{what}: HTTP {status}: {message or data}")

    async def apply(self, manifest: Manifest) -> Manifest:
        """Server-side apply with the operator's field manager (forced: we own these objects)."""
        meta = manifest["metadata"]
        path = _path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        status, data = await self._request(
            "PATCH",
            path,
            body=manifest,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )
        if status not in (200, 201):
            raise self._fail(status, data, f"applying {manifest['kind']} {meta['name']}")
        result: Manifest = data
        return result

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Manifest | None:
        status, data = await self._request("GET", _path(api_version, kind, namespace, name))
        if status == 404:
            return None
        if status != 200:
            raise self._fail(status, data, f"reading {kind} {namespace}/{name}")
        result: Manifest = data
        return result

    async def list(
        self, api_version: str, kind: str, namespace: str, labels: dict[str, str]
    ) -> list[Manifest]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        path = _path(api_version, kind, namespace)
        status, data = await self._request("GET", path, query=[("labelSelector", selector)])
        if status != 200:
            raise self._fail(status, data, f"listing {kind} in {namespace}")
        items: list[Manifest] = data.get("items", [])
        return items

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete (background propagation); False if it was already gone."""
        status, data = await self._request(
            "DELETE",
            _path(api_version, kind, namespace, name),
            body={"propagationPolicy": "Background"},
            content_type="application/json",
        )
        if status == 404:
            return False
        if status not in (200, 202):
            raise self._fail(status, data, f"deleting {kind} {namespace}/{name}")
        return True

    async def patch_status(self, namespace: str, name: str, status_patch: Manifest) -> None:
        """Merge-patch the DurableAgent's status subresource."""
        path = _path(f"{GROUP}/{VERSION}", "DurableAgent", namespace, name) + "/status"
        status, data = await self._request(
            "PATCH",
            path,
            body={"status": status_patch},
            content_type="application/merge-patch+json",
        )
        if status == 404:
            return  # deleted meanwhile
        if status != 200:
            raise self._fail(status, data, f"writing the status of {namespace}/{name}")

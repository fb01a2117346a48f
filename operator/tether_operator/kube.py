"""A small async Kubernetes client for the operator's children: server-side apply, get, list,
delete and status patches, as plain dicts over aiohttp. Credentials come from kopf's own login
functions (the service account in a pod, a kubeconfig elsewhere), so the image carries no
generated API client (the official one is 128 MB)."""

from __future__ import annotations

import builtins
import json
import os
from typing import Any

import aiohttp
import kopf

from tether.errors import TetherError

from .lease import Guard
from .names import FIELD_MANAGER, GROUP, PLURAL, VERSION

Manifest = dict[str, Any]
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30)

_PLURALS = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "Secret"): "secrets",
    ("apps/v1", "Deployment"): "deployments",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    (f"{GROUP}/{VERSION}", "DurableAgent"): PLURAL,
}


class KubeError(TetherError):
    """A request the API server refused; `status` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    plural = _PLURALS[(api_version, kind)]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


def login() -> kopf.ConnectionInfo:
    """In a pod: the service account (its token read again at each login, as the kubelet
    rotates it); elsewhere: `$KUBECONFIG` or ~/.kube/config."""
    settings = kopf.OperatorSettings()
    in_pod = os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG")
    if in_pod:
        info = kopf.login_with_service_account(settings=settings)
    else:
        info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise KubeError(0, "no Kubernetes credentials: no service account and no kubeconfig")
    return info


class Kube:
    def __init__(self, guard: Guard | None = None) -> None:
        self._guard = guard
        """Asked before each write (`lease.Lease.check`): it raises to refuse it."""
        self._server = ""
        self._session: aiohttp.ClientSession | None = None
        self._retired: list[aiohttp.ClientSession] = []

    def _client(self, fresh: bool = False) -> tuple[str, aiohttp.ClientSession]:
        if self._session is not None and fresh:
            # Requests in flight on it may still finish; it is closed with the client.
            self._retired.append(self._session)
            self._session = None
        if self._session is None:
            info = login()
            self._server = info.server.rstrip("/")
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=info.as_ssl_context()),
                headers=info.as_http_headers(),
                timeout=REQUEST_TIMEOUT,
                trust_env=False,
            )
        return self._server, self._session

    async def close(self) -> None:
        for session in [*self._retired, *([self._session] if self._session else [])]:
            await session.close()
        self._session, self._retired = None, []

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str | None = None,
    ) -> tuple[int, Any]:
        if method != "GET" and self._guard is not None:
            self._guard(f"{method} {path}")
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        data = json.dumps(body) if body is not None else None
        for attempt in (1, 2):
            server, session = self._client(fresh=attempt == 2)
            try:
                async with session.request(
                    method, server + path, params=query or [], data=data, headers=headers
                ) as response:
                    raw = await response.read()
                    status = response.status
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                raise KubeError(
                    0, f"{method} {path}: the API server did not answer: {error}"
                ) from None
            if status != 401:  # 401: the token may have been rotated; log in once more
                break
        return status, json.loads(raw) if raw else None

    @staticmethod
    def _fail(status: int, data: Any, what: str) -> KubeError:
        message = data.get("message") if isinstance(data, dict) else None
        return KubeError(status, f"{what}: HTTP {status}: {message or data}")

    async def apply(self, manifest: Manifest, field_manager: str = FIELD_MANAGER) -> Manifest:
        """Server-side apply with the operator's field manager (forced: we own these objects);
        another `field_manager` owns only the fields of its own, partial, `manifest`."""
        meta = manifest["metadata"]
        path = _path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        status, data = await self._request(
            "PATCH",
            path,
            body=manifest,
            query=[("fieldManager", field_manager), ("force", "true")],
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

    async def list_named(self, path: str, name: str) -> builtins.list[Manifest] | None:
        """The objects at collection `path` named `name` (a list by field selector: no `get`
        needed); None if the API server does not serve that kind."""
        query = [("fieldSelector", f"metadata.name={name}")]
        status, data = await self._request("GET", path, query=query)
        if status == 404:
            return None
        if status != 200:
            raise self._fail(status, data, f"listing {path}")
        items: builtins.list[Manifest] = data.get("items", [])
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

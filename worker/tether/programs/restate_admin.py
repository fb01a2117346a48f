"""Restate's admin API, spoken once: the calls Tether makes and what their answers mean.

A call (`AdminCall`) is its method, path and body, and how to read the answer; how it travels is
the caller's. `RestateServer` (`tether dev`, `tether.testing`, the tests) sends calls with the
standard library, the operator (`tether_operator.restate_admin`) with aiohttp; both retry what
`retry_delay` says is worth retrying, and get the same values and the same `AdminRefused` errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import TetherError

T = TypeVar("T")

STILL_STARTING = "META0003"
"""Restate's code for a deployment whose endpoint refused the discovery connection (a worker that
is not listening yet): worth registering again shortly."""


class AdminRefused(TetherError):
    """The admin API answered, and did not do what was asked."""

    def __init__(self, call: AdminCall[Any], status: int, body: Any) -> None:
        detail = body.get("message", body) if isinstance(body, dict) else body
        self.status = status
        self.code = body.get("restate_code") if isinstance(body, dict) else None
        self.failure = call.failure
        super().__init__(f"{call.what} failed: HTTP {status}: {str(detail)[:2000]}")


@dataclass(frozen=True)
class AdminCall(Generic[T]):
    """One request to the admin API and how to read its answer."""

    method: str
    path: str
    payload: Any
    what: str
    """What the call does, for messages ("registering http://...")."""
    failure: str
    """What its refusal is, as a condition reason (`RegistrationFailed`, `QueryFailed`...)."""
    read: Callable[[Any], T]
    ok: frozenset[int] = frozenset({200})

    def answer(self, status: int, body: Any) -> T:
        """The value of an answer (its JSON `body`), or `AdminRefused`."""
        if status not in self.ok:
            raise AdminRefused(self, status, body)
        return self.read(body)


def register(uri: str, *, metadata: Mapping[str, str] | None = None) -> AdminCall[str]:
    """`POST /deployments` with `force`: a URI registered before (a restart, a rollback) is
    discovered again and becomes the latest deployment of its services. Its deployment id."""
    payload: dict[str, Any] = {"uri": uri, "force": True}
    if metadata:
        payload["metadata"] = dict(metadata)
    return AdminCall(
        "POST",
        "/deployments",
        payload,
        f"registering {uri}",
        "RegistrationFailed",
        lambda body: str(body["id"]),
        frozenset({200, 201}),
    )


def unregister(deployment_id: str) -> AdminCall[None]:
    """`DELETE /deployments/{id}?force=true`; an unknown id is fine (already gone)."""
    return AdminCall(
        "DELETE",
        f"/deployments/{deployment_id}?force=true",
        None,
        f"removing deployment {deployment_id}",
        "UnregistrationFailed",
        lambda _: None,
        frozenset({200, 202, 404}),
    )


def deployments() -> AdminCall[list[dict[str, Any]]]:
    """`GET /deployments`: every registered deployment, with its services."""
    return AdminCall(
        "GET",
        "/deployments",
        None,
        "listing deployments",
        "RestateError",
        lambda body: list(body.get("deployments", [])),
    )


def resume(invocation_id: str) -> AdminCall[None]:
    """`PATCH /invocations/{id}/resume`: a paused invocation tries its deployment again (the one
    it is pinned to). One that is not paused any more (running again, completed: 409) or gone
    (404) is fine."""
    return AdminCall(
        "PATCH",
        f"/invocations/{invocation_id}/resume",
        None,
        f"resuming invocation {invocation_id}",
        "ResumeFailed",
        lambda _: None,
        frozenset({200, 202, 404, 409}),
    )


def cancel(invocation_id: str) -> AdminCall[None]:
    """`PATCH /invocations/{id}/cancel`: the invocation's handler gets a cancellation where it
    waits, and cleans up (a parked call leaves the indexes) before it ends. One already done
    (409) or gone (404) is fine."""
    return AdminCall(
        "PATCH",
        f"/invocations/{invocation_id}/cancel",
        None,
        f"cancelling invocation {invocation_id}",
        "CancelFailed",
        lambda _: None,
        frozenset({200, 202, 404, 409}),
    )


def kill(invocation_id: str) -> AdminCall[None]:
    """`PATCH /invocations/{id}/kill`: the invocation ends at once, without running its handler
    further. One already done (409) or gone (404) is fine."""
    return AdminCall(
        "PATCH",
        f"/invocations/{invocation_id}/kill",
        None,
        f"killing invocation {invocation_id}",
        "KillFailed",
        lambda _: None,
        frozenset({200, 202, 404, 409}),
    )


def query(sql: str) -> AdminCall[list[dict[str, Any]]]:
    """`POST /query`: SQL introspection (`sys_invocation`, `state`, ...), the rows as dicts."""
    return AdminCall("POST", "/query", {"query": sql}, "SQL introspection", "QueryFailed", _rows)


def _rows(body: Any) -> list[dict[str, Any]]:
    return list(body.get("rows", []))


def parse_body(text: str | bytes) -> Any:
    """An answer's body: its JSON, or the text when it is not JSON (a proxy's error page)."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text.decode(errors="replace") if isinstance(text, bytes) else text


def retry_delay(status: int, headers: Mapping[str, str], default: float) -> float | None:
    """Seconds to wait before sending a call again that got `status` (Restate busy: 429, 503;
    its `Retry-After` if it says), or None when the answer stands."""
    if status not in (429, 503):
        return None
    retry_after = next((v for k, v in headers.items() if k.lower() == "retry-after"), "")
    return float(retry_after) if retry_after.isascii() and retry_after.isdigit() else default

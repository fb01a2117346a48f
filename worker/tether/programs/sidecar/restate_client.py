"""The sidecar's calls to Restate, all through the ingress (the sidecar has no access to the
admin API, which reads and kills every agent's runs): idempotent sends to the agent's handlers
(a run, a message, an answer to a parked call, the claim of a delivery id), an invocation's
output, the signed read of the agent's parked calls, and the ingress health check. Failures
become `Rejection`s (502/503).

The ingress is one URL or the comma-separated URLs of a cluster's nodes
(`tether.programs.restate_endpoints`): a call whose connection fails, or that gets no answer in
time, goes to the next one (or, with one URL, once more), on a new connection
(`tether.programs.renewable_session`), which every call here can afford.

Every call that acts is a send with an `Idempotency-Key`, so Restate, not this process, decides
whether it acts: a key it has seen (within the handler's idempotency retention) starts nothing
and answers `PreviouslyAccepted`.

aiohttp rather than httpx2: forwarding a resolution is the sidecar's hot path, and on these
machines an aiohttp request costs a fraction of the CPU of an httpx2 one (measured: ~10k vs
~1.7k requests/s from one process against the Restate ingress).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from ...errors import TetherError
from ...parked import INDEX_KEY
from ...spec import WATCHERS_KEY, restate_services
from ..renewable_session import NO_ANSWER, RenewableSession
from ..restate_endpoints import Endpoints
from .rejection import Outcome, Rejection

log = logging.getLogger("tether.programs.sidecar")
TIMEOUT = aiohttp.ClientTimeout(total=6.0, sock_connect=2.0)
"""Per attempt. A send is answered in milliseconds, in 2 to 3.5 s while its partition has no
leader (measured on a cluster losing a node); none by then is a node that is gone."""
LIST_TIMEOUT = aiohttp.ClientTimeout(total=3.0, sock_connect=1.0)
ACCEPTED = "Accepted"


JSON = "application/json"


def _key(text: str) -> str:
    """An object key or id as one path segment (keys the sidecar did not check may hold '/')."""
    return quote(text, safe=":")


class _Unhealthy(TetherError):
    """A node's ingress answered its health check with an error."""


def _message_of(answer: bytes) -> str:
    """The message of a terminal error as Restate's ingress answers it (`{"message": ...}`)."""
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(answer).get("message")
        if isinstance(message, str):
            return message[:300]
    return "the request was refused"


class RestateClient:
    def __init__(self, ingress_url: str, timeout: aiohttp.ClientTimeout = TIMEOUT) -> None:
        self._ingress = Endpoints(ingress_url)
        self._timeout = timeout

        def session() -> aiohttp.ClientSession:
            # No cookie jar: Restate sets no cookies, and a jar costs on every request.
            return aiohttp.ClientSession(
                timeout=timeout,
                connector=aiohttp.TCPConnector(limit=200, limit_per_host=200),
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )

        self._session = RenewableSession(session, grace=timeout.total or 0.0)

    async def close(self) -> None:
        await self._session.close()

    async def _request(
        self,
        method: str,
        path: str,
        what: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        limit: aiohttp.ClientTimeout | None = None,
    ) -> tuple[int, bytes]:
        """`method {ingress}{path}` through the first node that answers: its status and body,
        or a 503 `Rejection` when none does."""

        async def send(base: str) -> tuple[int, bytes]:
            url, timeout = f"{base}{path}", limit or self._timeout
            status, _, answer = await self._session.fetch(
                method, url, data=body, headers=headers, timeout=timeout
            )
            return status, answer

        try:
            return await self._ingress.call(send, NO_ANSWER)
        except (aiohttp.ClientError, TimeoutError) as error:
            log.warning("%s: Restate did not answer: %s", what, type(error).__name__)
            raise Rejection(503, "restate_unavailable", "Restate is not reachable") from None

    async def _post(
        self,
        path: str,
        body: bytes,
        content_type: str,
        what: str,
        extra_headers: dict[str, str] | None = None,
        limit: aiohttp.ClientTimeout | None = None,
    ) -> tuple[int, bytes]:
        headers = {"content-type": content_type, "accept": "application/json"}
        headers.update(extra_headers or {})
        return await self._request("POST", path, what, body, headers, limit)

    async def _call_json(
        self, path: str, body: bytes, what: str, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """POST JSON to a handler through the ingress; its JSON answer, or a 502 `Rejection`."""
        status, answer = await self._post(path, body, "application/json", what, headers)
        if not 200 <= status < 300:
            log.warning("%s: Restate answered HTTP %s: %s", what, status, answer[:300])
            raise Rejection(502, "restate_error", f"Restate answered HTTP {status}")
        result: dict[str, Any] = json.loads(answer)
        return result

    async def _send(
        self, target: str, body: bytes, idempotency_key: str, what: str
    ) -> dict[str, Any]:
        """`POST {ingress}/{target}/send` with `Idempotency-Key`: Restate's answer,
        `{"invocationId", "status"}`, where `status` is `Accepted` for a new invocation and
        `PreviouslyAccepted` (with the first one's id) when the key was seen before, through
        whichever client, replica or restart."""
        path = f"/{target}/send"
        return await self._call_json(path, body, what, {"idempotency-key": idempotency_key})

    async def send_run(
        self, agent: str, session: str, request_json: bytes, idempotency_key: str
    ) -> dict[str, Any]:
        """Start `{agent}/{session}/run`, once per `idempotency_key`."""
        target = f"{agent}/{_key(session)}/run"
        return await self._send(target, request_json, idempotency_key, f"run of {session}")

    async def send_message(
        self, agent: str, session: str, message_json: bytes, idempotency_key: str
    ) -> dict[str, Any]:
        """Post to `{agent}-inbox/{session}/post`, once per `idempotency_key`."""
        target = f"{restate_services(agent).inbox}/{_key(session)}/post"
        return await self._send(target, message_json, idempotency_key, f"message to {session}")

    async def send_answer(
        self, agent: str, answer_json: bytes, idempotency_key: str
    ) -> dict[str, Any]:
        """Send the answer to a parked call to the agent's index (`{agent}-parked/all/answer`,
        `tether.programs.worker.parked_index`), once per `idempotency_key`."""
        target = f"{restate_services(agent).parked}/{INDEX_KEY}/answer"
        return await self._send(target, answer_json, idempotency_key, "answer")

    async def send_claim(self, agent: str, idempotency_key: str, claim: Any) -> dict[str, Any]:
        """Claim a delivery id at the agent's index (`{agent}-parked/all/claim`) with `claim`,
        its output: Restate answers `Accepted` to the first send of `idempotency_key` only, and
        `PreviouslyAccepted` with the first one's invocation id after."""
        target = f"{restate_services(agent).parked}/{INDEX_KEY}/claim"
        body = json.dumps(claim).encode()
        return await self._send(target, body, idempotency_key, "claim of a delivery id")

    async def output(
        self, invocation_id: str, refusals: Mapping[int, Outcome] | None = None
    ) -> Any:
        """The output of an invocation, once it has one (`GET .../restate/invocation/{id}/attach`).
        If it failed: a `Rejection` of the same status and message when the status is one of
        `refusals` (the terminal errors with which its handler refuses what the caller sent:
        the caller's to mend, not Restate's fault), else a 502."""
        path = f"/restate/invocation/{_key(invocation_id)}/attach"
        what = f"output of {invocation_id}"
        status, answer = await self._request("GET", path, what, headers={"accept": JSON})
        if refusals and status in refusals:
            raise Rejection(status, refusals[status], _message_of(answer))
        if status != 200:
            log.warning("%s: Restate answered HTTP %s: %s", what, status, answer[:300])
            raise Rejection(502, "restate_error", f"Restate answered HTTP {status}")
        return json.loads(answer)

    async def parked_calls(self, agent: str, token: dict[str, Any]) -> list[dict[str, Any]]:
        """The records of the agent's parked calls, read from its index with a listing token
        (`tether.programs.worker.parked_index`); a 502 `Rejection` if the worker refuses it."""
        path = f"/{restate_services(agent).parked}/{INDEX_KEY}/calls"
        # Served by the worker: while it is down this fails fast, and the caller decides.
        status, raw = await self._post(
            path, json.dumps(token).encode(), "application/json", "list", limit=LIST_TIMEOUT
        )
        if status != 200:
            log.warning("parked calls: Restate answered HTTP %s: %s", status, raw[:300])
            raise Rejection(502, "restate_error", f"Restate answered HTTP {status}")
        answer = json.loads(raw)
        if not isinstance(answer, list):
            raise Rejection(502, "restate_error", "the parked calls came back malformed")
        return [record for record in answer if isinstance(record, dict)]

    async def watch(self, agent: str, request: dict[str, Any]) -> None:
        """Register the sessions clients stream, by their tags in a signed request
        (`webhooks.watch_request`), in `{agent}-watchers/all`, so the workers send their live
        events (`tether.programs.worker.live`). Answered once registered; best effort: a failure
        is logged, and the clients still get the durable events."""
        path = f"/{restate_services(agent).watchers}/{WATCHERS_KEY}/watch"
        try:
            body = json.dumps(request).encode()
            status, raw = await self._post(path, body, JSON, "watch", limit=LIST_TIMEOUT)
        except Rejection:
            return  # logged: Restate did not answer
        if status != 200:
            log.warning("watch: Restate answered HTTP %s: %s", status, raw[:300])

    async def session_events(self, agent: str, session: str, after: str) -> list[dict[str, Any]]:
        """The session's events after the id `after`: the durable ones from the agent's object,
        then the live ones from `<agent>-live`, each list in stream order."""
        body = json.dumps(after).encode()
        durable, live = await asyncio.gather(
            self._post(f"/{agent}/{_key(session)}/events", body, JSON, "events"),
            self._post(f"/{restate_services(agent).live}/{_key(session)}/read", body, JSON, "live"),
        )
        events: list[dict[str, Any]] = []
        for status, raw in (durable, live):
            if status == 200:
                events += json.loads(raw)
            elif status != 404:  # the live object answers 404 before its first event
                log.warning("session events: Restate answered HTTP %s: %s", status, raw[:300])
                raise Rejection(502, "restate_error", f"Restate answered HTTP {status}")
        return events

    async def ingress_healthy(self) -> bool:
        """Whether a node's ingress answers its health check."""

        async def health(base: str) -> bool:
            status, _, _ = await self._session.fetch("GET", f"{base}/restate/health")
            if status != 200:
                raise _Unhealthy(status)
            return True

        try:
            return await self._ingress.call(health, (*NO_ANSWER, _Unhealthy))
        except (aiohttp.ClientError, TimeoutError, _Unhealthy):
            return False

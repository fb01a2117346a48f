"""The sidecar app against a fake Restate (a real HTTP server on loopback that counts every
call), and the worker-side metric hooks. The real-server version is
`tests/restate/test_sidecar_restate.py`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from unittest.mock import ANY
from urllib.parse import urlencode, urljoin

import httpx2
import pytest
from aiohttp import web
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import calls
from tether import create_agent, tool
from tether.durable.memory import MemoryJournal, memory_runtime
from tether.parked import ParkedCall
from tether.programs.metrics import agent_hooks, parked_seconds
from tether.programs.sidecar import (
    SidecarConfigError,
    SidecarSettings,
    create_app,
    settings_from_env,
)
from tether.programs.sidecar.link_form import FORM_TOKEN_SECONDS, form_token
from tether.programs.webhooks import (
    TOLERANCE_SECONDS,
    link_signature,
    sign_request,
    signed_link,
    verify_answer_proof,
    verify_listing_token,
)
from tether.providers import Pricing, scripted
from tether.providers.base import ModelRequest, ModelResponse, TextCallback
from tether.providers.scripted import ScriptedProvider

SECRET = "s3cret-for-the-sidecar-tests"
AGENT = "triage"
ID_A = "sign_1gqTN3y9Wu3RzrA0hk07IPzadRDUONRZgAAAAEQ"
ID_B = "sign_1gqTN3y9Wu3T4gKaIN_iHuhD7oazR7WB-AAAAEQ"
UNKNOWN_ID = "sign_1zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"
LIMIT = 1024


def record(awakeable_id: str, session: str, kind: str = "approval") -> ParkedCall:
    return {
        "awakeable_id": awakeable_id,
        "kind": kind,  # type: ignore[typeddict-item]
        "agent": AGENT,
        "session": session,
        "tool": "restart_service",
        "call_id": f"call-{session}",
        "input_summary": '{"service":"api"}',
        "created_at": 1_700_000_000_000.0,
    }


@dataclass(frozen=True)
class Recorded:
    """A request the fake Restate received."""

    url: httpx2.URL
    content: bytes
    headers: dict[str, str]


@dataclass
class FakeRestate:
    """Restate's ingress (`/ingress`) on a loopback server; every request is kept."""

    sessions: dict[str, dict[str, ParkedCall]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    ingress_status: int = 202
    healthy: bool = True
    reachable: bool = True
    queries: int = 0
    base: str = ""
    accepted: dict[tuple[str, str], str] = field(default_factory=dict)
    """(target path, idempotency key) -> invocation id, like Restate's idempotency table."""
    outputs: dict[str, Any] = field(default_factory=dict)
    _runner: web.AppRunner | None = None

    @property
    def ingress(self) -> str:
        return f"{self.base}/ingress"

    async def start(self) -> FakeRestate:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def park(self, awakeable_id: str, session: str, kind: str = "approval") -> None:
        self.sessions.setdefault(session, {})[awakeable_id] = record(awakeable_id, session, kind)

    @property
    def completions(self) -> list[Recorded]:
        """The answers sent to the agent's `answer` handler (resolutions and rejections)."""
        return [r for r in self.requests if r.url.path.endswith("/answer/send")]

    def send(self, path: str, key: str | None, output: Any = None) -> web.Response:
        """A `/send` as Restate answers it: a known key is `PreviouslyAccepted` and starts
        nothing (`output` is the new invocation's output, for `attach`)."""
        if key is not None and (path, key) in self.accepted:
            invocation = self.accepted[(path, key)]
            return web.json_response({"invocationId": invocation, "status": "PreviouslyAccepted"})
        invocation = (
            f"inv_{key or 'x'}" if path.endswith("/run/send") else f"inv_{len(self.outputs)}"
        )
        self.outputs[invocation] = output
        if key is not None:
            self.accepted[(path, key)] = invocation
        return web.json_response({"invocationId": invocation, "status": "Accepted"})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {name.lower(): value for name, value in request.headers.items()}
        self.requests.append(Recorded(httpx2.URL(str(request.url)), body, headers))
        if not self.reachable:
            assert request.transport is not None
            request.transport.close()  # the client sees the connection drop
            return web.Response(status=500)
        path = request.path
        if path == f"/ingress/{AGENT}-parked/all/calls":
            self.queries += 1
            assert request.headers["accept"] == "application/json"
            verify_listing_token(SECRET.encode(), json.loads(body))  # the worker's check
            records = [call for calls in self.sessions.values() for call in calls.values()]
            return web.json_response(records)
        if path == "/ingress/restate/health":
            return web.Response(status=200 if self.healthy else 503)
        key = headers.get("idempotency-key")
        if path.startswith("/ingress/restate/invocation/") and path.endswith("/attach"):
            return web.json_response(self.outputs[path.split("/")[-2]])
        if path == f"/ingress/{AGENT}-parked/all/answer/send":
            if not 200 <= self.ingress_status < 300:
                return web.Response(status=self.ingress_status)
            answer = json.loads(body)  # the worker's check: proof made with the secret
            given = {k: answer[k] for k in ("value", "reject") if k in answer}
            verify_answer_proof(SECRET.encode(), answer["awakeable_id"], given, answer["proof"])
            return self.send(path, key, {"answered": True})
        if path.startswith(f"/ingress/{AGENT}-inbox/") and path.endswith("/post/send"):
            waiting = len([k for k in self.accepted if k[0] == path]) + 1
            return self.send(path, key, {"waiting": waiting})
        if path.startswith(f"/ingress/{AGENT}/") and path.endswith("/run/send"):
            return self.send(path, key)
        return web.Response(status=404)

    @property
    def messages(self) -> list[Recorded]:
        return [r for r in self.requests if r.url.path.startswith(f"/ingress/{AGENT}-inbox/")]

    @property
    def runs(self) -> list[Recorded]:
        return [r for r in self.requests if r.url.path.endswith("/run/send")]


def answer_value(answer: Recorded) -> Any:
    """The value an answer sent to the `answer` handler resolves its call with."""
    return answered(answer)["value"]


def answered(answer: Recorded) -> dict[str, Any]:
    """What an answer sent to the `answer` handler says, without its proof (checked by the fake
    Restate as the worker checks it)."""
    return {k: v for k, v in json.loads(answer.content).items() if k != "proof"}


def settings(**overrides: Any) -> SidecarSettings:
    values: dict[str, Any] = {
        "restate_ingress_url": "http://127.0.0.1:9/ingress",
        "agent": AGENT,
        "webhook_secret": SECRET,
        "max_body_bytes": LIMIT,
        "parked_cache_seconds": 60.0,
        **overrides,
    }
    return SidecarSettings(**values)


@dataclass
class Sidecar:
    client: httpx2.AsyncClient
    restate: FakeRestate

    async def post(
        self,
        awakeable_id: str,
        value: Any,
        *,
        verb: str = "resolve",
        secret: str = SECRET,
        timestamp: int | None = None,
        content_type: str | None = "application/json",
        raw: bytes | None = None,
        signed_body: bytes | None = None,
        headers: dict[str, str | bytes] | None = None,
    ) -> httpx2.Response:
        body = raw if raw is not None else json.dumps(value).encode()
        signed = sign_request(
            secret.encode(),
            body if signed_body is None else signed_body,
            path=f"/v1/awakeables/{awakeable_id}/{verb}",
            timestamp=timestamp,
        )
        all_headers: dict[str, str | bytes] = {
            **signed,
            **({"content-type": content_type} if content_type else {}),
        }
        all_headers.update(headers or {})
        raw_headers = [
            (name.encode(), value if isinstance(value, bytes) else value.encode())
            for name, value in all_headers.items()
        ]
        return await self.client.post(
            f"/v1/awakeables/{awakeable_id}/{verb}", content=body, headers=raw_headers
        )

    async def metric(self, name: str, **labels: str) -> float | None:
        text = (await self.client.get("/metrics")).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        return None


@pytest.fixture
async def sidecar() -> AsyncIterator[Sidecar]:
    restate = await FakeRestate().start()
    restate.park(ID_A, "session-1")
    restate.park(ID_B, "session-2", kind="ask_human")
    app = create_app(settings(restate_ingress_url=restate.ingress))
    try:
        async with httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://sidecar.test"
        ) as client:
            yield Sidecar(client, restate)
    finally:
        await app.state.sidecar.restate.close()
        await restate.stop()


def link(
    action: str,
    awakeable_id: str = ID_A,
    expires: int | None = None,
    recipient: str | None = None,
) -> str:
    exp = int(time.time()) + 600 if expires is None else expires
    to = {} if recipient is None else {"recipient": recipient}
    url = signed_link("http://sidecar.test", SECRET.encode(), action, awakeable_id, exp, **to)  # type: ignore[arg-type]
    return url.removeprefix("http://sidecar.test")


# --------------------------------------------------------------------------------------------
# Settings


def test_settings_from_env_reads_every_variable(tmp_path: Path) -> None:
    env = {
        "RESTATE_INGRESS_URL": "http://restate:8080/",
        "TETHER_AGENT": "triage",
        "TETHER_WEBHOOK_SECRET": SECRET,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "TETHER_SIDECAR_MAX_BODY_BYTES": "2048",
        "TETHER_SIDECAR_PARKED_CACHE_SECONDS": "0.5",
    }
    loaded = settings_from_env(env)
    assert loaded.restate_ingress_url == "http://restate:8080"
    assert loaded.secret == SECRET.encode()
    assert (loaded.prometheus_multiproc_dir, loaded.max_body_bytes) == (tmp_path, 2048)
    assert loaded.parked_cache_seconds == 0.5
    assert SECRET not in repr(loaded) and SECRET not in str(loaded.model_dump())


def test_settings_errors_name_the_variables(tmp_path: Path) -> None:
    with pytest.raises(SidecarConfigError) as missing:
        settings_from_env({})
    for name in ("RESTATE_INGRESS_URL", "TETHER_AGENT"):
        assert f"{name} is not set" in str(missing.value)
    assert "TETHER_WEBHOOK_SECRET is not set" in str(missing.value)

    with pytest.raises(SidecarConfigError) as wrong:
        settings_from_env(
            {
                "RESTATE_INGRESS_URL": "restate:8080",
                "TETHER_AGENT": "bad name'; DROP",
                "TETHER_WEBHOOK_SECRET": "short",
                "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "missing"),
                "TETHER_SIDECAR_MAX_BODY_BYTES": "lots",
            }
        )
    message = str(wrong.value)
    assert "RESTATE_INGRESS_URL: must be an http:// or https:// URL" in message
    assert "TETHER_AGENT must be the agent's Restate service name" in message
    assert "TETHER_WEBHOOK_SECRET must be at least 16 characters" in message
    assert "PROMETHEUS_MULTIPROC_DIR: is not a directory" in message
    assert "TETHER_SIDECAR_MAX_BODY_BYTES" in message
    assert "short" not in message  # the secret's value is never echoed


# --------------------------------------------------------------------------------------------
# Resolving


async def test_signed_post_resolves_once(sidecar: Sidecar) -> None:
    resp = await sidecar.post(ID_A, {"approved": True, "note": "go"})
    assert resp.status_code == 202, resp.text
    [forwarded] = sidecar.restate.completions
    assert str(forwarded.url) == f"{sidecar.restate.ingress}/{AGENT}-parked/all/answer/send"
    assert answered(forwarded) == {
        "awakeable_id": ID_A, "value": {"approved": True, "note": "go"}
    }  # fmt: skip
    assert forwarded.headers["content-type"] == "application/json"
    assert forwarded.headers["idempotency-key"] == f"tether-answer:{ID_A}"

    again = await sidecar.post(ID_A, {"approved": False})  # a new, valid signature
    assert again.status_code == 409
    assert again.json()["outcome"] == "already_resolved"
    assert len(sidecar.restate.completions) == 1


async def test_signed_post_rejects_with_a_reason(sidecar: Sidecar) -> None:
    resp = await sidecar.post(ID_B, {"reason": "not now"}, verb="reject")
    assert resp.status_code == 202, resp.text
    [forwarded] = sidecar.restate.completions
    assert str(forwarded.url) == f"{sidecar.restate.ingress}/{AGENT}-parked/all/answer/send"
    assert answered(forwarded) == {"awakeable_id": ID_B, "reject": "not now"}
    assert forwarded.headers["idempotency-key"] == f"tether-answer:{ID_B}"
    assert (await sidecar.post(ID_B, {"ok": 1})).status_code == 409


async def test_a_call_parked_after_the_last_read_is_found(sidecar: Sidecar) -> None:
    assert (await sidecar.post(UNKNOWN_ID, 1)).status_code == 404
    sidecar.restate.park(UNKNOWN_ID, "session-3")
    deadline = time.monotonic() + 10
    while (resp := await sidecar.post(UNKNOWN_ID, 1)).status_code == 404:
        assert time.monotonic() < deadline, "the new parked call was never read"
    assert resp.status_code == 202
    assert len(sidecar.restate.completions) == 1


SUPERSCRIPT = "\u00b9\u00b2".encode("latin-1")  # str.isdigit() is true, int() fails


@dataclass(frozen=True)
class Bad:
    status: int
    outcome: str
    awakeable_id: str = ID_A
    kwargs: dict[str, Any] = field(default_factory=dict)
    value: Any = field(default_factory=lambda: {"approved": True})


def bad_posts() -> dict[str, Bad]:
    """Built when a test runs: the timestamps are relative to the clock then."""
    now = int(time.time())
    return {
        "no signature": Bad(401, "bad_signature", kwargs={"headers": {"x-tether-signature": ""}}),
        "wrong secret": Bad(401, "bad_signature", kwargs={"secret": "another-secret-of-16+"}),
        "tampered body": Bad(401, "bad_signature", kwargs={"signed_body": b'{"approved": false}'}),
        "unknown scheme": Bad(
            401, "bad_signature", kwargs={"headers": {"x-tether-signature": "v2=abc"}}
        ),
        "non-ascii digits": Bad(
            401,
            "bad_signature",
            kwargs={"headers": {"x-tether-timestamp": "\u00b9\u00b2".encode("latin-1")}},
        ),
        "expired timestamp": Bad(401, "expired", kwargs={"timestamp": now - 2 * TOLERANCE_SECONDS}),
        "future timestamp": Bad(401, "expired", kwargs={"timestamp": now + 2 * TOLERANCE_SECONDS}),
        "oversized body": Bad(413, "too_large", value="x" * (LIMIT + 1)),
        "lying content-length": Bad(
            413, "too_large", kwargs={"headers": {"content-length": str(LIMIT + 10)}}
        ),
        "text/plain": Bad(415, "unsupported_media_type", kwargs={"content_type": "text/plain"}),
        "no content type": Bad(415, "unsupported_media_type", kwargs={"content_type": None}),
        "form": Bad(
            415,
            "unsupported_media_type",
            kwargs={"content_type": "application/x-www-form-urlencoded"},
        ),
        "malformed id": Bad(400, "bad_id", awakeable_id="not%20an%20id"),
        "encoded traversal": Bad(400, "bad_id", awakeable_id="..%2F..%2Fadmin"),
        "encoded slash": Bad(400, "bad_id", awakeable_id="sign_1abc%2Fresolve"),
        "too long id": Bad(400, "bad_id", awakeable_id="a" * 257),
        "not json": Bad(400, "bad_body", kwargs={"raw": b"approve it"}),
        "nan": Bad(400, "bad_body", kwargs={"raw": b"NaN"}),
        "empty body": Bad(400, "bad_body", kwargs={"raw": b""}),
        "unknown id": Bad(404, "unknown_id", awakeable_id=UNKNOWN_ID),
        "reject without reason": Bad(400, "bad_body", kwargs={"verb": "reject"}),
        "reject with empty reason": Bad(
            400, "bad_body", kwargs={"verb": "reject"}, value={"reason": " "}
        ),
    }


@pytest.mark.parametrize("case", list(bad_posts()), ids=list(bad_posts()))
async def test_bad_posts_are_refused_before_restate(
    sidecar: Sidecar, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    bad = bad_posts()[case]
    before = await sidecar.metric("tether_webhook_requests_total", outcome=bad.outcome) or 0.0
    with caplog.at_level(logging.INFO, logger="tether.programs.sidecar"):
        resp = await sidecar.post(bad.awakeable_id, bad.value, **bad.kwargs)
    assert resp.status_code == bad.status, resp.text
    assert resp.json()["outcome"] == bad.outcome
    assert sidecar.restate.completions == []
    after = await sidecar.metric("tether_webhook_requests_total", outcome=bad.outcome)
    assert after == before + 1
    logged = caplog.text
    route = f"/v1/awakeables/{{awakeable_id:path}}/{bad.kwargs.get('verb', 'resolve')}"
    assert f"refused POST {route}: {bad.status} {bad.outcome}" in logged
    assert SECRET not in logged and "v1=" not in logged


async def test_a_replayed_request_is_refused(sidecar: Sidecar) -> None:
    body = json.dumps({"approved": True}).encode()
    path = f"/v1/awakeables/{ID_A}/resolve"
    headers = {**sign_request(SECRET.encode(), body, path=path), "content-type": "application/json"}
    first = await sidecar.client.post(
        f"/v1/awakeables/{ID_A}/resolve", content=body, headers=headers
    )
    assert first.status_code == 202
    replay = await sidecar.client.post(
        f"/v1/awakeables/{ID_A}/resolve", content=body, headers=headers
    )
    assert (replay.status_code, replay.json()["outcome"]) == (409, "replayed")
    assert len(sidecar.restate.completions) == 1


async def test_a_chunked_body_over_the_limit_is_refused(sidecar: Sidecar) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b" " * (LIMIT // 2)

    path = f"/v1/awakeables/{ID_A}/resolve"
    headers = {
        **sign_request(SECRET.encode(), b"{}", path=path),
        "content-type": "application/json",
    }
    resp = await sidecar.client.post(
        f"/v1/awakeables/{ID_A}/resolve", content=chunks(), headers=headers
    )
    assert (resp.status_code, resp.json()["outcome"]) == (413, "too_large")
    assert "content-length" not in resp.request.headers
    assert sidecar.restate.completions == []


async def test_restate_failures_leave_the_call_answerable(sidecar: Sidecar) -> None:
    sidecar.restate.reachable = False
    body = json.dumps("yes").encode()
    url = f"/v1/awakeables/{ID_A}/resolve"
    headers = {**sign_request(SECRET.encode(), body, path=url), "content-type": "application/json"}
    down = await sidecar.client.post(url, content=body, headers=headers)
    assert (down.status_code, down.json()["outcome"]) == (503, "restate_unavailable")
    assert down.headers["retry-after"] == "1"

    sidecar.restate.reachable, sidecar.restate.ingress_status = True, 500
    refused = await sidecar.client.post(url, content=body, headers=headers)
    assert (refused.status_code, refused.json()["outcome"]) == (502, "restate_error")

    sidecar.restate.ingress_status = 202
    retried = await sidecar.client.post(url, content=body, headers=headers)  # same signature
    assert retried.status_code == 202, retried.text
    # Each try reached for the answer handler (with Restate down the parked calls could not be
    # read: the answer is still sent, and Restate decides); only the last one was taken. The
    # first, whose connection failed, was sent once more on a new one (restate_endpoints).
    assert len(sidecar.restate.completions) == 4
    assert len(sidecar.restate.accepted) == 1


# --------------------------------------------------------------------------------------------
# Links: opening one shows the call; only the page's form decides


BROWSER = {"origin": "http://sidecar.test", "sec-fetch-site": "same-origin"}
"""What a browser sends with the form of a page it got from http://sidecar.test."""


class FormParser(HTMLParser):
    """The form of a link's page: its action, hidden fields and buttons (in page order)."""

    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self.buttons: list[tuple[str, str]] = []
        self._button: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "form":
            self.action = attributes.get("action")
        elif tag == "input" and attributes.get("type") == "hidden":
            self.fields[str(attributes["name"])] = str(attributes["value"])
        elif tag == "button":
            self._button = attributes.get("value")

    def handle_data(self, data: str) -> None:
        if self._button is not None:
            self.buttons.append((self._button, data))
            self._button = None


@dataclass
class Page:
    """A link's page as a browser gets it, and where its form posts."""

    response: httpx2.Response
    post_to: str
    fields: dict[str, str]
    buttons: list[tuple[str, str]]

    @property
    def text(self) -> str:
        return self.response.text


async def open_link(sidecar: Sidecar, url: str) -> Page:
    response = await sidecar.client.get(url)
    assert response.status_code == 200, response.text
    form = FormParser()
    form.feed(response.text)
    assert form.action is not None
    post_to = urljoin(f"http://sidecar.test{url}", form.action).removeprefix("http://sidecar.test")
    return Page(response, post_to, form.fields, form.buttons)


async def press(
    sidecar: Sidecar,
    page: Page,
    decision: str,
    *,
    headers: dict[str, str] | None = None,
    **fields: str | None,
) -> httpx2.Response:
    """Post the page's form as its `decision` button does (`fields` change, or drop with None,
    form fields)."""
    form = {**page.fields, "decision": decision, **fields}
    data = {name: value for name, value in form.items() if value is not None}
    return await sidecar.client.post(
        page.post_to, data=data, headers=BROWSER if headers is None else headers
    )


def security_headers_of(response: httpx2.Response) -> None:
    headers = response.headers
    assert headers["content-type"].startswith("text/html")
    assert headers["cache-control"] == "no-store"
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
    policy = [part.strip() for part in headers["content-security-policy"].split(";")]
    for directive in (
        "default-src 'none'",
        "style-src 'unsafe-inline'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ):
        assert directive in policy
    assert not [part for part in policy if part.startswith("script-src")]


async def listed_ids(sidecar: Sidecar) -> list[str]:
    headers = sign_request(SECRET.encode(), b"", path="/v1/approvals")
    listed = (await sidecar.client.get("/v1/approvals", headers=headers)).json()["parked"]
    return [p["awakeable_id"] for p in listed]


async def test_opening_a_link_shows_the_call_and_decides_nothing(sidecar: Sidecar) -> None:
    shown = await sidecar.metric("tether_webhook_requests_total", outcome="shown") or 0.0
    expires = int(time.time()) + 600
    url = link("approve", ID_A, expires)
    head = await sidecar.client.head(url)  # a link checker
    assert head.status_code != 200 and sidecar.restate.completions == []

    page = await open_link(sidecar, url)
    security_headers_of(page.response)
    text = unescape(page.text)
    assert "<script" not in page.text
    link_expiry = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expires))
    for shown_text in (AGENT, "session-1", "restart_service", "call-session-1", link_expiry):
        assert shown_text in text
    assert '{\n  "service": "api"\n}' in text  # the input, pretty-printed
    assert page.buttons == [("approve", "Approve"), ("deny", "Deny")]  # the link's decision first
    assert set(page.fields) == {"exp", "sig", "token"}
    assert page.post_to == f"/v1/awakeables/{ID_A}/approve"

    again = await open_link(sidecar, url)  # a preview, then the person: still the page
    assert again.fields["token"] != page.fields["token"]  # one token per rendering
    assert sidecar.restate.completions == []
    assert ID_A in await listed_ids(sidecar)
    assert await sidecar.metric("tether_webhook_requests_total", outcome="shown") == shown + 2


async def test_the_pages_button_approves_once(sidecar: Sidecar) -> None:
    page = await open_link(sidecar, link("approve", ID_A))
    before = int(time.time() * 1000)
    approved = await press(sidecar, page, "approve")
    after = int(time.time() * 1000)
    assert approved.status_code == 200, approved.text
    assert "<h1>Approved</h1>" in approved.text
    security_headers_of(approved)
    [forwarded] = sidecar.restate.completions
    assert forwarded.url.path == f"/ingress/{AGENT}-parked/all/answer/send"
    value = answer_value(forwarded)
    assert value == {"approved": True, "by": "link", "approver": None, "decided_at": ANY}
    assert before <= value["decided_at"] <= after
    assert ID_A not in await listed_ids(sidecar)

    twice = await press(sidecar, page, "approve")
    assert twice.status_code == 409 and "already answered" in twice.text
    reopened = await sidecar.client.get(link("approve", ID_A))
    assert reopened.status_code == 409 and "already answered" in reopened.text
    assert len(sidecar.restate.completions) == 1


async def test_a_deny_link_denies_and_cannot_approve(sidecar: Sidecar) -> None:
    page = await open_link(sidecar, link("deny", ID_A))
    assert page.buttons == [("deny", "Deny")]
    assert "<h1>Deny this call?</h1>" in page.text
    forged = await press(sidecar, page, "approve")
    assert forged.status_code == 403 and sidecar.restate.completions == []
    denied = await press(sidecar, page, "deny")
    assert denied.status_code == 200 and "<h1>Denied</h1>" in denied.text
    # An approve link's page may deny too (its second button).
    other = await open_link(sidecar, link("approve", ID_B))
    assert (await press(sidecar, other, "deny")).status_code == 200
    values = [answer_value(r) for r in sidecar.restate.completions]
    assert [(v["approved"], v["by"]) for v in values] == [(False, "link"), (False, "link")]


async def test_a_link_minted_for_a_recipient_records_the_approver(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    alice = "Alice <alice@example.com>"
    url = link("approve", ID_A, recipient=alice)
    assert "to=Alice+%3Calice%40example.com%3E" in url
    page = await open_link(sidecar, url)
    assert "<tr><th>Link sent to</th><td>Alice &lt;alice@example.com&gt;</td></tr>" in page.text
    assert page.fields["to"] == alice
    # The recipient is signed: changed or dropped, the link and the form are refused.
    for tampered in (
        url.replace("to=Alice", "to=Mallory"),
        url.replace("to=Alice+%3Calice%40example.com%3E&", ""),
    ):
        assert (await sidecar.client.get(tampered)).status_code == 401
    assert (await press(sidecar, page, "approve", to="mallory")).status_code == 401
    assert (await press(sidecar, page, "approve", to=None)).status_code == 401
    assert sidecar.restate.completions == []

    with caplog.at_level(logging.INFO, logger="tether.programs.sidecar"):
        assert (await press(sidecar, page, "approve")).status_code == 200
    [forwarded] = sidecar.restate.completions
    assert answer_value(forwarded)["approver"] == alice
    assert f"approved by link (approver {alice!r})" in caplog.text


def bad_forms() -> dict[str, tuple[dict[str, Any], int, str]]:
    """Built when a test runs: the expiries and tokens are relative to the clock then.
    Each case: what `press` gets (fields to change or drop; `headers`; `raw` for a raw body;
    `expired`: the form of a link that has expired), the status and the outcome."""
    stale = time.time() - 2 * FORM_TOKEN_SECONDS
    future = time.time() + 2 * FORM_TOKEN_SECONDS
    evil = {"origin": "https://evil.example", "sec-fetch-site": "cross-site"}
    return {
        "no token": ({"token": None}, 403, "bad_token"),
        "empty token": ({"token": ""}, 403, "bad_token"),
        "malformed token": ({"token": "abc"}, 403, "bad_token"),
        "forged token": ({"token": "1.2." + "0" * 64}, 403, "bad_token"),
        "token of another link's page": ({"other_token": True}, 403, "bad_token"),
        "stale token": ({"token_at": stale}, 403, "bad_token"),
        "token from the future": ({"token_at": future}, 403, "bad_token"),
        "from another site": ({"headers": evil}, 403, "cross_site"),
        "from another origin, no fetch metadata": (
            {"headers": {"origin": "https://evil.example"}},
            403,
            "cross_site",
        ),
        "from another port of the host": (
            {"headers": {"origin": "http://sidecar.test:8080"}},
            403,
            "cross_site",
        ),
        "opaque origin, cross-site": (
            {"headers": {"origin": "null", "sec-fetch-site": "cross-site"}},
            403,
            "cross_site",
        ),
        "same site, not same origin": (
            {"headers": {"sec-fetch-site": "same-site"}},
            403,
            "cross_site",
        ),
        "typed in (sec-fetch-site none)": (
            {"headers": {"sec-fetch-site": "none"}},
            403,
            "cross_site",
        ),
        "tampered sig": ({"sig_suffix": "0"}, 401, "bad_signature"),
        "no sig": ({"sig": None}, 401, "bad_signature"),
        "moved expiry": ({"exp_plus": 1000}, 401, "bad_signature"),
        "expired link": ({"expired": True}, 401, "expired"),
        "deny link's form posted to approve": ({"deny_form": True}, 401, "bad_signature"),
        "another call's form": ({"other_call": True}, 401, "bad_signature"),
        "json": (
            {"raw": b'{"decision": "approve"}', "type": "application/json"},
            415,
            "unsupported_media_type",
        ),
        "unknown field": ({"extra": "1"}, 400, "bad_body"),
        "repeated field": ({"raw_repeat": True}, 400, "bad_body"),
        "too large": ({"raw": b"x=" + b"a" * 5000}, 413, "too_large"),
        "no decision": ({"decision": None}, 400, "bad_body"),
        "odd decision": ({"decision": "maybe"}, 400, "bad_body"),
    }


@pytest.mark.parametrize("case", list(bad_forms()), ids=list(bad_forms()))
async def test_bad_form_posts_are_refused_and_leave_the_call_parked(
    sidecar: Sidecar, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    change, status, outcome = bad_forms()[case]
    change = dict(change)
    page = await open_link(sidecar, link("approve", ID_A))
    fields: dict[str, str | None] = {**page.fields, "decision": "approve"}
    sig = page.fields["sig"]
    if "token_at" in change:
        fields["token"] = form_token(SECRET.encode(), "approve", ID_A, sig, now=change["token_at"])
    if change.pop("other_token", False):
        fields["token"] = (await open_link(sidecar, link("approve", ID_B))).fields["token"]
    if "sig_suffix" in change:
        fields["sig"] = sig[:-1] + ("1" if sig.endswith("0") else "0")
    if "exp_plus" in change:
        fields["exp"] = str(int(page.fields["exp"]) + change["exp_plus"])
    if change.pop("expired", False):
        exp = int(time.time()) - 1
        expired_sig = link_signature(SECRET.encode(), "approve", ID_A, exp)
        fields |= {
            "exp": str(exp),
            "sig": expired_sig,
            "token": form_token(SECRET.encode(), "approve", ID_A, expired_sig),
        }
    if change.pop("deny_form", False):
        deny_page = await open_link(sidecar, link("deny", ID_A))
        fields = {**deny_page.fields, "decision": "deny"}
    if change.pop("other_call", False):
        fields = {**(await open_link(sidecar, link("approve", ID_B))).fields, "decision": "approve"}
    for name in ("token", "sig", "decision", "extra"):
        if name in change:
            fields[name] = change[name]
    data = {name: value for name, value in fields.items() if value is not None}
    headers = change.get("headers", BROWSER)
    with caplog.at_level(logging.INFO, logger="tether.programs.sidecar"):
        if "raw" in change or change.get("raw_repeat"):
            raw = change.get("raw") or (urlencode(data) + "&decision=deny").encode()
            content_type = change.get("type", "application/x-www-form-urlencoded")
            response = await sidecar.client.post(
                page.post_to, content=raw, headers={**headers, "content-type": content_type}
            )
        else:
            response = await sidecar.client.post(page.post_to, data=data, headers=headers)
    assert response.status_code == status, response.text
    security_headers_of(response)
    assert sidecar.restate.completions == []
    route = "/v1/awakeables/{awakeable_id:path}/approve"
    assert f"refused POST {route}: {status} {outcome}" in caplog.text
    assert sig not in caplog.text and page.fields["token"] not in caplog.text
    # Nothing was used up: the page's own form still decides.
    assert (await press(sidecar, page, "approve")).status_code == 200
    assert len(sidecar.restate.completions) == 1


ACCEPTED_HEADERS: dict[str, dict[str, str]] = {
    "a browser": BROWSER,
    "a browser sending Origin null (no-referrer)": {
        "origin": "null",
        "sec-fetch-site": "same-origin",
    },
    "behind a proxy that ends TLS": {
        "origin": "https://sidecar.test",
        "sec-fetch-site": "same-origin",
    },
    "a client without Origin or fetch metadata": {},
}


@pytest.mark.parametrize("case", list(ACCEPTED_HEADERS), ids=list(ACCEPTED_HEADERS))
async def test_the_form_is_accepted_from_its_own_page(sidecar: Sidecar, case: str) -> None:
    page = await open_link(sidecar, link("approve", ID_A))
    response = await press(sidecar, page, "approve", headers=ACCEPTED_HEADERS[case])
    assert response.status_code == 200, response.text
    assert len(sidecar.restate.completions) == 1


async def test_the_page_escapes_the_calls_input(sidecar: Sidecar) -> None:
    """The input (and the tool and session names) are model output or came from outside."""
    attack = {
        "cmd": "</pre><script>alert(1)</script>",
        "q": "'><img src=x onerror=alert(2)>",
        "u": '"><a href="javascript:alert(3)">x</a>',
    }
    call = sidecar.restate.sessions["session-1"][ID_A]
    call["input_summary"] = json.dumps(attack)
    call["tool"] = "<b>restart</b>"
    sidecar.restate.sessions["session-<i>2</i>"] = {
        ID_B: {  # a summary cut to a few hundred characters is not JSON any more
            **record(ID_B, "session-<i>2</i>"),
            "input_summary": '{"x":"<script>alert(4)</script>' + "y" * 300 + "...",
        }
    }
    del sidecar.restate.sessions["session-2"]
    page = await open_link(sidecar, link("approve", ID_A))
    security_headers_of(page.response)
    lowered = page.text.lower()
    for raw in ("<script", "<img", "<a ", "<b>restart", 'javascript:alert(3)"'):
        assert raw not in lowered, raw
    assert "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "&lt;b&gt;restart&lt;/b&gt;" in page.text
    shown = unescape(page.text.split("<pre>", 1)[1].split("</pre>", 1)[0])
    assert json.loads(shown) == attack  # all of it, readable
    cut = await open_link(sidecar, link("approve", ID_B))
    assert "<script" not in cut.text.lower() and "<i>" not in cut.text
    assert "&lt;script&gt;alert(4)" in cut.text and "session-&lt;i&gt;2&lt;/i&gt;" in cut.text
    assert "The input is cut to its first 300 characters" in cut.text
    assert "is cut" not in page.text
    assert sidecar.restate.completions == []


async def test_a_webhook_resolution_records_its_approver(sidecar: Sidecar) -> None:
    for bad in (7, "", "x" * 257, "bob\nINFO forged line", ["bob"]):
        refused = await sidecar.post(ID_A, {"approved": True, "approver": bad})
        assert (refused.status_code, refused.json()["outcome"]) == (400, "bad_body"), bad
    assert sidecar.restate.completions == []
    before = int(time.time() * 1000)
    resolved = await sidecar.post(ID_A, {"approved": True, "approver": "bob@example.com"})
    assert resolved.status_code == 202, resolved.text
    answered = await sidecar.post(ID_B, {"answer": "yes", "approver": "carol", "decided_at": 5})
    assert answered.status_code == 202, answered.text
    first, second = (answer_value(r) for r in sidecar.restate.completions)
    assert first == {"approved": True, "approver": "bob@example.com", "decided_at": ANY}
    assert before <= first["decided_at"] <= int(time.time() * 1000)
    assert second == {"answer": "yes", "approver": "carol", "decided_at": 5}  # the sender's own


def _wrong_sig(url: str) -> str:
    return url.replace("sig=", "sig=0")


def bad_links() -> dict[str, tuple[str, int, str]]:
    """Built when a test runs: the expiries are relative to the clock then."""
    now = int(time.time())
    return {
        "expired": (link("approve", expires=now - 1), 401, "expired"),
        "wrong sig": (_wrong_sig(link("approve")), 401, "bad_signature"),
        "deny link used to approve": (
            link("deny").replace("/deny?", "/approve?"),
            401,
            "bad_signature",
        ),
        "link of another id": (link("approve", ID_B).replace(ID_B, ID_A), 401, "bad_signature"),
        "moved expiry": (
            f"/v1/awakeables/{ID_A}/approve?exp={now + 9999}&sig="
            + link_signature(SECRET.encode(), "approve", ID_A, now + 600),
            401,
            "bad_signature",
        ),
        "no sig": (f"/v1/awakeables/{ID_A}/approve?exp={now + 600}", 401, "bad_signature"),
        "no exp": (f"/v1/awakeables/{ID_A}/approve?sig=abc", 401, "bad_signature"),
        "non-ascii sig": (
            f"/v1/awakeables/{ID_A}/approve?exp={now + 600}&sig=%C3%A9",
            401,
            "bad_signature",
        ),
        "malformed id": (link("approve", "bad.id"), 400, "bad_id"),
        "traversal": ("/v1/awakeables/..%2F..%2Fmetrics/approve?exp=1&sig=x", 400, "bad_id"),
        "unknown id": (link("approve", UNKNOWN_ID), 404, "unknown_id"),
    }


@pytest.mark.parametrize("case", list(bad_links()), ids=list(bad_links()))
async def test_bad_links_are_refused_before_restate(
    sidecar: Sidecar, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    url, status, outcome = bad_links()[case]
    with caplog.at_level(logging.INFO, logger="tether.programs.sidecar"):
        resp = await sidecar.client.get(url)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("text/html")
    assert sidecar.restate.completions == []
    assert f"{status} {outcome}" in caplog.text
    sig = url.partition("sig=")[2]
    assert not sig or len(sig) < 8 or sig not in caplog.text


# --------------------------------------------------------------------------------------------
# Listing, health, metrics


async def test_approvals_list_is_signed_and_reads_restate(sidecar: Sidecar) -> None:
    unsigned = await sidecar.client.get("/v1/approvals")
    assert unsigned.status_code == 401
    resp = await sidecar.client.get(
        "/v1/approvals", headers=sign_request(SECRET.encode(), b"", path="/v1/approvals")
    )
    assert resp.status_code == 200
    listed = resp.json()
    assert listed["agent"] == AGENT
    assert {(p["awakeable_id"], p["session"], p["kind"]) for p in listed["parked"]} == {
        (ID_A, "session-1", "approval"),
        (ID_B, "session-2", "ask_human"),
    }
    assert (await sidecar.post(ID_A, True)).status_code == 202
    resp = await sidecar.client.get(
        "/v1/approvals", headers=sign_request(SECRET.encode(), b"", path="/v1/approvals")
    )
    assert [p["awakeable_id"] for p in resp.json()["parked"]] == [ID_B]


async def test_health_and_readiness(sidecar: Sidecar) -> None:
    assert (await sidecar.client.get("/healthz")).status_code == 200
    assert (await sidecar.client.get("/readyz")).status_code == 200
    sidecar.restate.healthy = False
    assert (await sidecar.client.get("/readyz")).status_code == 503
    sidecar.restate.reachable = False
    assert (await sidecar.client.get("/readyz")).status_code == 503
    assert (await sidecar.client.get("/healthz")).status_code == 200


async def test_metrics_count_outcomes_and_parked_calls(sidecar: Sidecar) -> None:
    resolved = await sidecar.metric("tether_webhook_requests_total", outcome="resolved") or 0.0
    await sidecar.post(ID_A, True)
    await sidecar.post(ID_A, True, secret="another-secret-of-16+")
    assert await sidecar.metric("tether_webhook_requests_total", outcome="resolved") == resolved + 1
    assert await sidecar.metric("tether_parked_calls", agent=AGENT, kind="ask_human") == 1.0
    assert await sidecar.metric("tether_parked_calls", agent=AGENT, kind="approval") in (0.0, 1.0)
    text = (await sidecar.client.get("/metrics")).text
    assert text.count("# TYPE tether_parked_calls gauge") == 1
    assert text.count("# TYPE tether_parked_oldest_seconds gauge") == 1


async def test_the_oldest_parked_calls_age_is_read_at_scrape_time() -> None:
    restate = await FakeRestate().start()
    app = create_app(settings(restate_ingress_url=restate.ingress, parked_cache_seconds=0.0))
    try:
        async with httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://sidecar.test"
        ) as client:
            scraper = Sidecar(client, restate)
            # Nothing parked: 0, not absent (an alert on the age sees the agent).
            assert await scraper.metric("tether_parked_oldest_seconds", agent=AGENT) == 0.0
            now = time.time()
            restate.park(ID_A, "session-1")
            restate.park(ID_B, "session-2", kind="ask_human")
            restate.sessions["session-1"][ID_A]["created_at"] = (now - 30) * 1000
            restate.sessions["session-2"][ID_B]["created_at"] = (now - 7200) * 1000
            before = time.time()
            oldest = await scraper.metric("tether_parked_oldest_seconds", agent=AGENT)
            assert oldest is not None
            assert before - now + 7200 <= oldest <= time.time() - now + 7200
            # The oldest is answered: the next one's age, and it keeps growing.
            del restate.sessions["session-2"]
            await asyncio.sleep(0.05)
            oldest = await scraper.metric("tether_parked_oldest_seconds", agent=AGENT)
            assert oldest is not None and 30.05 <= oldest < 60
            text = (await client.get("/metrics")).text
            assert text.count("# TYPE tether_parked_oldest_seconds gauge") == 1
    finally:
        await app.state.sidecar.restate.close()
        await restate.stop()


WORKER_PROGRAM = textwrap.dedent(
    """
    from tether.programs.metrics import agent_hooks, multiprocess_enabled, observe_parked
    assert multiprocess_enabled()
    hooks = agent_hooks("triage", provider="anthropic", model="claude")
    hooks["turn:after"]({"usage": {"input": 10, "output": 5}, "cost": 0.25, "latency_ms": 7})
    hooks["tool:after"]({"name": "fetch", "outcome": "ok", "duration_s": 0.2, "is_error": False})
    hooks["tool:after"]({"name": "fetch", "outcome": "interrupted", "duration_s": 0.0})
    observe_parked("triage", "approval", 90.0)
    """
)


async def test_metrics_merge_the_worker_process_files(tmp_path: Path) -> None:
    subprocess.run(  # noqa: ASYNC221 (a short child process; the test has nothing else to do)
        [sys.executable, "-c", WORKER_PROGRAM],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
        check=True,
        timeout=120,
    )
    restate = await FakeRestate().start()
    restate.park(ID_A, "s1")
    app = create_app(
        settings(
            prometheus_multiproc_dir=tmp_path,
            restate_ingress_url=restate.ingress,
        )
    )

    async def scrape() -> str:
        async with httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://sidecar.test"
        ) as client:
            await client.post(f"/v1/awakeables/{ID_A}/resolve", content=b"1")  # 415
            return (await client.get("/metrics")).text

    try:
        text = await scrape()
    finally:
        await app.state.sidecar.restate.close()
        await restate.stop()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    worker = (("agent", "triage"),)
    assert (
        samples[
            (
                "tether_model_calls_total",
                (*worker, ("model", "claude"), ("outcome", "ok"), ("provider", "anthropic")),
            )
        ]
        == 1
    )
    model = (*worker, ("model", "claude"), ("provider", "anthropic"))
    assert samples[("tether_model_call_duration_seconds_count", model)] == 1
    assert samples[("tether_model_call_duration_seconds_sum", model)] == pytest.approx(0.007)
    tokens = (*worker, ("kind", "input"), ("model", "claude"), ("provider", "anthropic"))
    assert samples[("tether_model_tokens_total", tokens)] == 10
    assert samples[("tether_cost_usd_total", model)] == 0.25
    approvals = (*worker, ("kind", "approval"))
    assert samples[("tether_parked_duration_seconds_count", approvals)] == 1
    assert samples[("tether_parked_duration_seconds_sum", approvals)] == 90
    assert samples[("tether_parked_duration_seconds_bucket", (*approvals, ("le", "60.0")))] == 0
    assert samples[("tether_parked_duration_seconds_bucket", (*approvals, ("le", "120.0")))] == 1
    assert (
        samples[("tether_tool_calls_total", (*worker, ("outcome", "ok"), ("tool", "fetch")))] == 1
    )
    assert samples[("tether_interrupted_tool_calls_total", (*worker, ("tool", "fetch")))] == 1
    assert samples[("tether_tool_duration_seconds_count", (*worker, ("tool", "fetch")))] == 1
    assert samples[("tether_parked_calls", (*worker, ("kind", "approval")))] == 1
    assert samples[("tether_webhook_requests_total", (("outcome", "unsupported_media_type"),))] >= 1
    assert text.count("# TYPE tether_webhook_requests_total counter") == 1


# --------------------------------------------------------------------------------------------
# The worker's hooks


class Crash(BaseException):
    """The worker process dying mid-run."""


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_agent_hooks_count_live_work_only() -> None:
    runs: list[str] = []

    @tool
    async def restart(service: str) -> str:
        """Restart a service."""
        runs.append(service)
        return "restarted"

    script = [
        {**calls("restart", restart={"service": "api"}), "usage": {"input": 100, "output": 20}},
        {"text": "done", "usage": {"input": 150, "output": 10}},
    ]
    pricing = Pricing(input_per_mtok=3, output_per_mtok=15)
    agent_name = f"hooks-{time.monotonic_ns()}"
    labels = {"agent": agent_name}
    journal = MemoryJournal()

    class CrashingProvider(ScriptedProvider):
        async def complete(
            self, request: ModelRequest, on_text: TextCallback | None = None
        ) -> ModelResponse:
            if request.assistant_turns == 1:
                raise Crash
            return await super().complete(request, on_text)

    first = memory_runtime(journal=journal, id_seed="seed")
    agent = create_agent(
        provider=CrashingProvider(script, pricing=pricing, model="m"),
        tools=[restart],
        durable=first,
        hooks=agent_hooks(agent_name, provider="scripted", model="m", durable=first),
    )
    with pytest.raises(Crash):
        await agent.run("restart the api")
    model_calls = {**labels, "provider": "scripted", "model": "m", "outcome": "ok"}
    assert sample("tether_model_calls_total", **model_calls) == 1
    assert sample("tether_tool_calls_total", **labels, tool="restart", outcome="ok") == 1
    assert sample("tether_runs_total", **labels, status="completed") == 0

    second = memory_runtime(journal=journal, id_seed="seed")
    agent = create_agent(
        provider=scripted(script, pricing=pricing, model="m"),
        tools=[restart],
        durable=second,
        hooks=agent_hooks(agent_name, provider="scripted", model="m", durable=second),
    )
    stats = await agent.run("restart the api")
    assert stats.status == "completed" and runs == ["api"]
    assert sample("tether_model_calls_total", **model_calls) == 2  # the replay did not count
    by_model = {**labels, "provider": "scripted", "model": "m"}
    assert sample("tether_model_call_duration_seconds_count", **by_model) == 2
    assert sample("tether_model_tokens_total", **by_model, kind="input") == 250
    assert sample("tether_model_tokens_total", **by_model, kind="output") == 30
    assert sample("tether_cost_usd_total", **by_model) == pytest.approx(stats.cost_usd)
    assert sample("tether_tool_calls_total", **labels, tool="restart", outcome="ok") == 1
    assert sample("tether_tool_duration_seconds_count", **labels, tool="restart") == 1
    assert sample("tether_runs_total", **labels, status="completed") == 1
    assert sample("tether_replays_total", **labels) == 1
    replayed = {kind: n for kind, n in second.counters.replayed.items() if n}
    assert replayed
    for kind, steps in replayed.items():
        assert sample("tether_replayed_steps_total", **labels, kind=kind) == steps


PARKED = {"created_at": 1_000_000.0, "expires_at": 1_000_000.0 + 3_600_000}
PARKED_SECONDS: dict[str, tuple[dict[str, Any], float]] = {
    # how the park ended -> seconds parked, the clock now at 1_000_000 + 100 s
    "answered through Restate's API: until now": ({"timed_out": False}, 100.0),
    "answered through the sidecar: until decided_at": (
        {"timed_out": False, "approved": True, "decided_at": 1_000_000 + 40_000},
        40.0,
    ),
    "decided_at before the park: until now": ({"decided_at": 999_000}, 100.0),
    "decided_at after now: until now": ({"decided_at": 1_200_000}, 100.0),
    "decided_at not a number: until now": ({"decided_at": "soon"}, 100.0),
    "timed out: until the deadline": ({"timed_out": True}, 3600.0),
    "rejected: until now": ({"rejected": True}, 100.0),
}


@pytest.mark.parametrize("case", list(PARKED_SECONDS), ids=list(PARKED_SECONDS))
def test_how_long_a_call_was_parked(case: str) -> None:
    ended, seconds = PARKED_SECONDS[case]
    assert parked_seconds(PARKED, ended, 1_000_000 + 100_000) == seconds


def test_interrupted_and_spawned_counts() -> None:
    agent_name = f"spawns-{time.monotonic_ns()}"
    hooks = agent_hooks(agent_name)

    @dataclass
    class Stats:
        status: str

    hooks["tool:after"]({"name": "charge", "outcome": "interrupted", "duration_s": 0.0})
    hooks["spawn:complete"]({"call_id": "a", "stats": Stats("completed")})
    hooks["spawn:complete"]({"call_id": "b", "stats": Stats("error")})
    hooks["turn:before"]({"turn": 2})
    hooks["agent:done"]({"stats": Stats("completed")})
    labels = {"agent": agent_name}
    assert sample("tether_interrupted_tool_calls_total", **labels, tool="charge") == 1
    assert sample("tether_tool_calls_total", **labels, tool="charge", outcome="interrupted") == 1
    assert sample("tether_tool_duration_seconds_count", **labels, tool="charge") == 0
    assert sample("tether_children_total", **labels, status="completed") == 1
    assert sample("tether_children_total", **labels, status="error") == 1
    assert sample("tether_child_fanout_count", **labels) == 1
    assert sample("tether_child_fanout_sum", **labels) == 2


async def test_a_signature_made_for_another_awakeable_is_refused(sidecar: Sidecar) -> None:
    body = json.dumps({"approved": True}).encode()
    made_for_b = sign_request(SECRET.encode(), body, path=f"/v1/awakeables/{ID_B}/resolve")
    headers = {**made_for_b, "content-type": "application/json"}
    resp = await sidecar.client.post(
        f"/v1/awakeables/{ID_A}/resolve", content=body, headers=headers
    )
    assert (resp.status_code, resp.json()["outcome"]) == (401, "bad_signature")
    assert sidecar.restate.completions == []


async def test_only_signed_posts_take_the_webhook_path(sidecar: Sidecar) -> None:
    """Other methods and verbs under /v1/awakeables/ fall through to the FastAPI routes."""
    assert (await sidecar.client.get(f"/v1/awakeables/{ID_A}/resolve")).status_code == 404
    assert (await sidecar.client.put(f"/v1/awakeables/{ID_A}/resolve")).status_code == 404
    assert (await sidecar.client.post(f"/v1/awakeables/{ID_A}/approve")).status_code == 415
    assert (await sidecar.client.post(f"/v1/awakeables/{ID_A}/cancel")).status_code == 404
    assert sidecar.restate.completions == []


# --------------------------------------------------------------------------------------------
# Runs started by webhook


def signed_run(
    body: bytes,
    path: str,
    timestamp: int | None = None,
    idempotency_key: str | None = None,
    **extra: str,
) -> dict[str, str]:
    signed = sign_request(
        SECRET.encode(), body, path=path, timestamp=timestamp, idempotency_key=idempotency_key
    )
    return {**signed, "content-type": "application/json", **extra}


async def test_a_signed_webhook_starts_a_run_once(sidecar: Sidecar) -> None:
    path = "/v1/sessions/ticket-42/runs"
    body = json.dumps({"prompt": "triage ticket 42"}).encode()
    started = await sidecar.client.post(
        path, content=body, headers=signed_run(body, path, idempotency_key="delivery-7")
    )
    assert started.status_code == 202, started.text
    assert started.json() == {
        "session": "ticket-42", "invocation_id": "inv_delivery-7", "status": "Accepted"
    }  # fmt: skip
    [sent] = sidecar.restate.runs
    assert sent.url.path == f"/ingress/{AGENT}/ticket-42/run/send"
    assert json.loads(sent.content) == {"prompt": "triage ticket 42"}
    assert sent.headers["idempotency-key"] == "delivery-7"
    # The sender retries the delivery a second later (a fresh signature, the same key): one run.
    retry = signed_run(body, path, int(time.time()) + 1, idempotency_key="delivery-7")
    again = await sidecar.client.post(path, content=body, headers=retry)
    assert again.status_code == 202, again.text
    assert again.json() == {**started.json(), "status": "PreviouslyAccepted"}
    assert await sidecar.metric("tether_webhook_requests_total", outcome="run_started") == 2


async def test_the_idempotency_key_of_a_run_must_be_signed(sidecar: Sidecar) -> None:
    """The key decides which run a request is: a key the signature does not cover (dropped,
    added or changed by whoever replays the request) is refused."""
    path = "/v1/sessions/ticket-43/runs"
    body = json.dumps({"prompt": "triage ticket 43"}).encode()
    keyed = signed_run(body, path, idempotency_key="delivery-8")
    for headers in (
        signed_run(body, path, **{"idempotency-key": "delivery-8"}),  # signed without its key
        {**keyed, "idempotency-key": "delivery-9"},  # the key changed
        {k: v for k, v in keyed.items() if k != "idempotency-key"},  # the key dropped
    ):
        refused = await sidecar.client.post(path, content=body, headers=headers)
        assert (refused.status_code, refused.json()["outcome"]) == (401, "bad_signature")
    old_client = signed_run(body, path, **{"idempotency-key": "delivery-8"})
    told = await sidecar.client.post(path, content=body, headers=old_client)
    assert "does not cover the Idempotency-Key header" in told.json()["error"]
    assert sidecar.restate.runs == []
    assert (await sidecar.client.post(path, content=body, headers=keyed)).status_code == 202


async def test_a_run_without_a_key_runs_under_its_signatures_key(sidecar: Sidecar) -> None:
    path = "/v1/sessions/ticket-44/runs"
    body = json.dumps({"prompt": "triage ticket 44"}).encode()
    headers = signed_run(body, path)
    started = await sidecar.client.post(path, content=body, headers=headers)
    assert started.status_code == 202, started.text
    [sent] = sidecar.restate.runs
    digest = hashlib.sha256(headers["x-tether-signature"].encode()).hexdigest()[:32]
    assert sent.headers["idempotency-key"] == f"tether-sig-{digest}"
    assert headers["x-tether-signature"].removeprefix("v1=") not in str(sent.headers)


BAD_RUNS: dict[str, tuple[str, bytes, dict[str, str], int, str]] = {
    "unsigned": ("ok", b'{"prompt": "x"}', {"x-tether-signature": ""}, 401, "bad_signature"),
    "bad session id": ("a%20b", b'{"prompt": "x"}', {}, 400, "bad_id"),
    "no prompt": ("ok", b'{"task": "x"}', {}, 400, "bad_body"),
    "empty prompt": ("ok", b'{"prompt": " "}', {}, 400, "bad_body"),
    "extra keys": ("ok", b'{"prompt": "x", "model": "y"}', {}, 400, "bad_body"),
    "not json": ("ok", b"prompt=x", {}, 400, "bad_body"),
    "form": (
        "ok",
        b'{"prompt": "x"}',
        {"content-type": "text/plain"},
        415,
        "unsupported_media_type",
    ),
    "bad key": ("ok", b'{"prompt": "x"}', {"idempotency-key": "a b"}, 400, "bad_body"),
    "fork not an object": ("ok", b'{"prompt": "x", "fork": "s1"}', {}, 400, "bad_body"),
    "fork of a bad id": ("ok", b'{"prompt": "x", "fork": {"session": "a b"}}', {}, 400, "bad_body"),
    "fork of no turns": (
        "ok",
        b'{"prompt": "x", "fork": {"session": "s1", "turns": 0}}',
        {},
        400,
        "bad_body",
    ),
    "fork with more": (
        "ok",
        b'{"prompt": "x", "fork": {"session": "s1", "at": 2}}',
        {},
        400,
        "bad_body",
    ),
}


async def test_a_signed_run_may_fork_another_session(sidecar: Sidecar) -> None:
    path = "/v1/sessions/ticket-46/runs"
    body = json.dumps({"prompt": "again", "fork": {"session": "ticket-45", "turns": 2}}).encode()
    started = await sidecar.client.post(path, content=body, headers=signed_run(body, path))
    assert started.status_code == 202, started.text
    [sent] = sidecar.restate.runs
    assert sent.url.path == f"/ingress/{AGENT}/ticket-46/run/send"
    assert sent.content == body  # as signed: the worker forks, refusing a cut inside an exchange


@pytest.mark.parametrize("case", list(BAD_RUNS), ids=list(BAD_RUNS))
async def test_bad_run_requests_start_nothing(sidecar: Sidecar, case: str) -> None:
    session, body, headers, status, outcome = BAD_RUNS[case]
    path = f"/v1/sessions/{session}/runs"
    signed = {**signed_run(body, path.replace("%20", " ")), **headers}
    response = await sidecar.client.post(path, content=body, headers=signed)
    assert (response.status_code, response.json()["outcome"]) == (status, outcome), response.text
    assert sidecar.restate.runs == []


async def test_a_run_request_is_not_replayed_and_survives_restate_being_down(
    sidecar: Sidecar,
) -> None:
    path = "/v1/sessions/s9/runs"
    body = b'{"prompt": "go"}'
    headers = signed_run(body, path)
    sidecar.restate.reachable = False
    down = await sidecar.client.post(path, content=body, headers=headers)
    assert (down.status_code, down.json()["outcome"]) == (503, "restate_unavailable")
    sidecar.restate.reachable = True
    sent = await sidecar.client.post(path, content=body, headers=headers)  # the same signature
    assert sent.status_code == 202, sent.text
    replayed = await sidecar.client.post(path, content=body, headers=headers)
    assert (replayed.status_code, replayed.json()["outcome"]) == (409, "replayed")
    # down (its connection failed, so it was sent once more on a new one) + sent
    assert len([r for r in sidecar.restate.runs if r.content == body]) == 3


async def test_a_signed_message_goes_to_the_sessions_inbox(sidecar: Sidecar) -> None:
    path = "/v1/sessions/ticket-42/messages"
    body = json.dumps({"text": "the customer called back"}).encode()
    headers = signed_run(body, path)
    posted = await sidecar.client.post(path, content=body, headers=headers)
    assert posted.status_code == 202, posted.text
    assert posted.json() == {"session": "ticket-42", "waiting": 1}
    [sent] = sidecar.restate.messages
    assert sent.url.path == f"/ingress/{AGENT}-inbox/ticket-42/post/send"
    assert json.loads(sent.content) == {"text": "the customer called back"}
    assert sent.headers["idempotency-key"].startswith("tether-sig-")
    replayed = await sidecar.client.post(path, content=body, headers=headers)  # the same bytes
    assert (replayed.status_code, replayed.json()["outcome"]) == (409, "replayed")
    unsigned = await sidecar.client.post(
        path, content=body, headers={"content-type": "application/json"}
    )
    assert unsigned.status_code == 401
    for bad in (b'{"text": ""}', b'{"text": "x", "to": "y"}', b'{"prompt": "x"}'):
        refused = await sidecar.client.post(path, content=bad, headers=signed_run(bad, path))
        assert (refused.status_code, refused.json()["outcome"]) == (400, "bad_body")
    assert len(sidecar.restate.messages) == 1
    assert await sidecar.metric("tether_webhook_requests_total", outcome="message_posted") == 1


# --------------------------------------------------------------------------------------------
# Replicas: what one sidecar did, another one (or the same one restarted) does not do again


@pytest.fixture
async def replicas(sidecar: Sidecar) -> AsyncIterator[tuple[Sidecar, Sidecar]]:
    """A second sidecar app (its own replay guard and ledger, as another replica or a restarted
    process has) in front of the same fake Restate."""
    restate = sidecar.restate
    app = create_app(settings(restate_ingress_url=restate.ingress))
    try:
        async with httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://sidecar.test"
        ) as client:
            yield sidecar, Sidecar(client, restate)
    finally:
        await app.state.sidecar.restate.close()


async def test_another_replica_acts_on_nothing_a_replica_did(
    replicas: tuple[Sidecar, Sidecar],
) -> None:
    one, other = replicas
    run_path = "/v1/sessions/ticket-45/runs"
    run = json.dumps({"prompt": "go"}).encode()
    run_headers = signed_run(run, run_path)
    assert (await one.client.post(run_path, content=run, headers=run_headers)).status_code == 202
    replayed = await other.client.post(run_path, content=run, headers=run_headers)
    assert (replayed.status_code, replayed.json()["outcome"]) == (409, "replayed")
    assert "invocation_id" not in replayed.json()

    keyed_headers = signed_run(run, run_path, idempotency_key="delivery-45")
    first = await one.client.post(run_path, content=run, headers=keyed_headers)
    again = await other.client.post(run_path, content=run, headers=keyed_headers)
    assert again.status_code == 202
    assert again.json() == {**first.json(), "status": "PreviouslyAccepted"}

    message_path = "/v1/sessions/ticket-45/messages"
    message = json.dumps({"text": "hello"}).encode()
    message_headers = signed_run(message, message_path)
    posted = await one.client.post(message_path, content=message, headers=message_headers)
    assert posted.status_code == 202
    again = await other.client.post(message_path, content=message, headers=message_headers)
    assert (again.status_code, again.json()["outcome"]) == (409, "replayed")

    assert (await one.post(ID_A, {"approved": True})).status_code == 202
    answered = await other.post(ID_A, {"approved": False})  # another approver, the same call
    assert (answered.status_code, answered.json()["outcome"]) == (409, "already_resolved")
    keys = {r.headers["idempotency-key"] for r in one.restate.completions}
    assert keys == {f"tether-answer:{ID_A}"}  # both reached Restate: it said no to the second
    assert ID_A not in await listed_ids(other)
    page = await other.client.get(link("approve", ID_A))
    assert page.status_code == 409 and "already answered" in page.text


def test_the_sidecar_checks_the_inboxs_message_limit() -> None:
    from tether.programs.sidecar.sessions import MAX_MESSAGE_CHARS
    from tether.programs.worker.inbox import MAX_MESSAGE_CHARS as INBOX_LIMIT

    assert MAX_MESSAGE_CHARS == INBOX_LIMIT


def test_the_page_of_a_request_for_more_budget_says_what_approving_does() -> None:
    from tether.programs.sidecar.pages import LinkView, confirmation_page

    asked = {**record(ID_A, "session-1"), "tool": "budget", "call_id": "budget:2:0"}
    view = LinkView("approve", asked, int(time.time()) + 600, "sig", None, "token")  # type: ignore[arg-type]
    text = unescape(bytes(confirmation_page(view, 600).body).decode())
    assert "<h1>Approve more budget?</h1>" in text and "ran out of budget" in text
    assert "before it runs this tool call" not in text
    tool = LinkView("deny", record(ID_A, "session-1"), int(time.time()) + 600, "s", None, "t")
    assert "<h1>Deny this call?</h1>" in bytes(confirmation_page(tool, 600).body).decode()

"""The sidecar as a real process (`python -m tether.programs.sidecar`) against the real
restate-server.

`ParkAgent` (tests/restate/services/parking_service.py, served by hypercorn) parks calls the way
the worker does, and answers them with the worker's `answer` handler. The sidecar reaches
Restate's ingress through a counting proxy, so a test can prove that a refused request never got
to Restate; the parked invocation staying suspended (and listed) proves it again. Worker and
sidecar share one `PROMETHEUS_MULTIPROC_DIR`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.restate.support import (
    HypercornWorker,
    Response,
    decide_by_link,
    free_port,
    http,
    open_link,
    press,
    service_app,
    wait_until,
)
from tether.programs.restate_server import RestateServer
from tether.programs.sidecar.link_form import form_token
from tether.programs.webhooks import TOLERANCE_SECONDS, link_signature, sign_request, signed_link

AGENT = "ParkAgent"
SECRET = "the-sidecar-secret-of-the-restate-tests"
BODY_LIMIT = 4096
DEADLINE = 120.0  # generous: other suites share the two cores


# --------------------------------------------------------------------------------------------
# A counting proxy in front of Restate's ingress


class CountingProxy:
    """Forwards every request to `target` and records the paths (and bodies) it forwarded;
    `unavailable[suffix] = n` answers the next `n` requests to a path ending so with a 503
    instead (Restate down for them), forwarding and recording nothing."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.paths: list[str] = []
        self.bodies: list[bytes] = []
        self.unavailable: dict[str, int] = {}
        self._lock = threading.Lock()
        proxy = self
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy._lock:
                    refused = next(
                        (s for s, n in proxy.unavailable.items() if n and self.path.endswith(s)),
                        None,
                    )
                    if refused is not None:
                        proxy.unavailable[refused] -= 1
                    else:
                        proxy.paths.append(self.path)
                        proxy.bodies.append(body or b"")
                if refused is not None:
                    self.send_response(503)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                forwarded = ("content-type", "accept", "idempotency-key")
                headers = {k: v for k, v in self.headers.items() if k.lower() in forwarded}
                request = urllib.request.Request(
                    proxy.target + self.path, data=body, method=self.command, headers=headers
                )
                try:
                    with opener.open(request, timeout=60) as resp:
                        status, payload = resp.status, resp.read()
                except urllib.error.HTTPError as err:
                    status, payload = err.code, err.read()
                self.send_response(status)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _answers(self) -> list[tuple[str, dict[str, Any]]]:
        """The forwarded answers (sends to the `answer` handler): (awakeable id, answer)."""
        with self._lock:
            sent = list(zip(self.paths, self.bodies, strict=True))
        answers = [json.loads(body) for path, body in sent if path.endswith("/answer/send")]
        return [(answer.pop("awakeable_id"), answer) for answer in answers]

    def completions(self, awakeable_id: str) -> list[str]:
        """The forwarded answers to one awakeable: "resolve" or "reject" each."""
        return [
            "reject" if "reject" in answer else "resolve"
            for answered, answer in self._answers()
            if answered == awakeable_id
        ]

    def all_completions(self) -> list[str]:
        return [awakeable_id for awakeable_id, _ in self._answers()]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


# --------------------------------------------------------------------------------------------
# The sidecar process


class SidecarProcess:
    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        port = str(self.port)
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tether.programs.sidecar",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    port,
                ],
                env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the sidecar exited: {self.log()[-4000:]}")
            return http("GET", f"{self.url}/readyz", timeout=5).status == 200

        wait_until(ready, timeout=DEADLINE, what="the sidecar's /readyz")

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=20)


@dataclass
class Stack:
    server: RestateServer
    sidecar: SidecarProcess
    proxy: CountingProxy
    metrics_dir: Path

    # -- Restate --------------------------------------------------------------------------

    def park(self, kind: str = "approval") -> tuple[str, str, str]:
        """Start a parked call; return (session, invocation id, awakeable id)."""
        session = uuid.uuid4().hex
        payload = {"tool": "restart_service", "kind": kind, "input": {"service": "api"}}
        resp = http("POST", f"{self.server.ingress_url}/{AGENT}/{session}/park/send", payload)
        assert resp.status == 202, resp.text
        invocation_id: str = resp.json()["invocationId"]
        parked = wait_until(
            lambda: next((p for p in self.list_parked() if p["session"] == session), None),
            timeout=DEADLINE,
            what=f"the parked call of {session} in /v1/approvals",
        )
        return session, invocation_id, str(parked["awakeable_id"])

    def status(self, invocation_id: str) -> str:
        rows = self.server.query(f"SELECT status FROM sys_invocation WHERE id = '{invocation_id}'")
        return str(rows[0]["status"])

    def result(self, invocation_id: str) -> Any:
        url = f"{self.server.ingress_url}/restate/invocation/{invocation_id}/attach"
        resp = http("GET", url, timeout=DEADLINE)
        assert resp.status == 200, resp.text
        return resp.json()

    # -- sidecar --------------------------------------------------------------------------

    def list_parked(self) -> list[dict[str, Any]]:
        headers = sign_request(SECRET.encode(), b"", path="/v1/approvals")
        resp = http("GET", f"{self.sidecar.url}/v1/approvals", headers=headers)
        assert resp.status == 200, resp.text
        parked: list[dict[str, Any]] = resp.json()["parked"]
        return parked

    def post(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str],
        *,
        chunked: bool = False,
    ) -> Response:
        """A raw request to the sidecar (http.client: no normalization of the path)."""
        conn = HTTPConnection("127.0.0.1", self.sidecar.port, timeout=DEADLINE)
        try:
            if chunked:
                conn.request("POST", path, body=iter([body]), headers=headers, encode_chunked=True)
            elif "content-length" in headers:
                conn.putrequest("POST", path, skip_accept_encoding=True)
                for name, value in headers.items():
                    conn.putheader(name, value)
                conn.endheaders(body)
            else:
                conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            return Response(resp.status, resp.read())
        finally:
            conn.close()

    def signed_post(
        self,
        awakeable_id: str,
        value: Any,
        *,
        verb: str = "resolve",
        secret: str = SECRET,
        timestamp: int | None = None,
    ) -> Response:
        body = json.dumps(value).encode()
        path = f"/v1/awakeables/{awakeable_id}/{verb}"
        signed = sign_request(secret.encode(), body, path=path, timestamp=timestamp)
        return self.post(path, body, {**signed, "content-type": JSON})

    def get(self, path: str) -> Response:
        return http("GET", f"{self.sidecar.url}{path}")

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = self.get("/metrics").text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


JSON = "application/json"


def link(
    action: str, awakeable_id: str, expires: int | None = None, recipient: str | None = None
) -> str:
    exp = int(time.time()) + 3600 if expires is None else expires
    to = {} if recipient is None else {"recipient": recipient}
    url = signed_link("http://x", SECRET.encode(), action, awakeable_id, exp, **to)  # type: ignore[arg-type]
    return url.removeprefix("http://x")


@pytest.fixture(scope="module")
def stack(restate_server: RestateServer) -> Iterator[Stack]:
    base = Path(tempfile.mkdtemp(prefix="tether-sidecar-"))
    metrics_dir = base / "metrics"
    metrics_dir.mkdir()
    worker = HypercornWorker(
        service_app("parking_service"),
        env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "TETHER_WEBHOOK_SECRET": SECRET},
    )
    proxy = CountingProxy(restate_server.ingress_url)
    sidecar: SidecarProcess | None = None
    deployment_id: str | None = None
    try:
        worker.start()
        deployment_id = restate_server.register(worker.url)
        sidecar = SidecarProcess(
            {
                "RESTATE_INGRESS_URL": proxy.url,
                "TETHER_AGENT": AGENT,
                "TETHER_WEBHOOK_SECRET": SECRET,
                "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
                "TETHER_SIDECAR_MAX_BODY_BYTES": str(BODY_LIMIT),
                "TETHER_SIDECAR_PARKED_CACHE_SECONDS": "0.5",
            },
            base / "sidecar.log",
        )
        sidecar.wait_ready()
        yield Stack(restate_server, sidecar, proxy, metrics_dir)
    except BaseException:
        if sidecar is not None:
            sys.stderr.write(f"\n----- sidecar log -----\n{sidecar.log()[-8000:]}\n")
        sys.stderr.write(f"\n----- worker log -----\n{worker.log_tail(8000)}\n")
        raise
    finally:
        if sidecar is not None:
            sidecar.close()
        proxy.close()
        worker.close()
        if deployment_id is not None and restate_server.is_running():
            with contextlib.suppress(Exception):
                restate_server.unregister(deployment_id)
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------------------------


def test_a_signed_post_resolves_the_parked_call(stack: Stack) -> None:
    session, invocation_id, awakeable_id = stack.park()
    assert awakeable_id.startswith("sign_1")
    [listed] = [p for p in stack.list_parked() if p["session"] == session]
    assert listed["agent"] == AGENT and listed["kind"] == "approval"
    assert listed["tool"] == "restart_service" and json.loads(listed["input_summary"]) == {
        "service": "api"
    }

    resp = stack.signed_post(awakeable_id, {"approved": True, "by": "ops"})
    assert resp.status == 202, resp.text
    assert stack.result(invocation_id) == {"value": {"approved": True, "by": "ops"}}
    assert stack.proxy.completions(awakeable_id) == ["resolve"]
    wait_until(
        lambda: all(p["session"] != session for p in stack.list_parked()),
        timeout=DEADLINE,
        what="the record to leave the list",
    )


def test_signed_reject_fails_the_wait_with_the_reason(stack: Stack) -> None:
    _, invocation_id, awakeable_id = stack.park(kind="ask_human")
    resp = stack.signed_post(awakeable_id, {"reason": "not during the freeze"}, verb="reject")
    assert resp.status == 202, resp.text
    assert stack.result(invocation_id) == {"rejected": "not during the freeze"}


def test_a_link_shows_the_call_and_only_its_form_decides(stack: Stack) -> None:
    session, approved_invocation, approved_id = stack.park()
    _, denied_invocation, denied_id = stack.park()
    posted = stack.sidecar.url + link("approve", approved_id)  # as the notification has it
    assert http("HEAD", posted).status == 405  # a link checker
    preview = open_link(posted)  # a chat's link preview
    assert "restart_service" in preview.text and session in preview.text
    assert "{\n  &quot;service&quot;: &quot;api&quot;\n}" in preview.text
    assert preview.buttons == ["approve", "deny"]
    assert stack.proxy.completions(approved_id) == []
    assert stack.status(approved_invocation) in ("running", "suspended")
    assert any(p["awakeable_id"] == approved_id for p in stack.list_parked())
    page = open_link(
        stack.sidecar.url + link("approve", approved_id, recipient="alice@example.com")
    )
    assert "alice@example.com" in page.text

    done = press(page, "approve")
    assert done.status == 200 and "Approved" in done.text
    assert stack.result(approved_invocation) == {
        "value": {
            "approved": True, "by": "link", "approver": "alice@example.com", "decided_at": ANY
        }
    }  # fmt: skip
    denied = decide_by_link(stack.sidecar.url + link("deny", denied_id), "deny")
    assert denied.status == 200 and "Denied" in denied.text
    value = stack.result(denied_invocation)["value"]
    assert (value["approved"], value["by"], value["approver"]) == (False, "link", None)
    assert abs(value["decided_at"] / 1000 - time.time()) < DEADLINE

    assert stack.get(link("approve", approved_id)).status == 409
    assert press(page, "approve").status == 409
    assert len(stack.proxy.completions(approved_id)) == 1


def test_a_webhook_approver_reaches_restate_with_the_decision_time(stack: Stack) -> None:
    _, invocation_id, awakeable_id = stack.park()
    before = int(time.time() * 1000)  # the sidecar's decided_at is whole milliseconds
    resp = stack.signed_post(awakeable_id, {"approved": True, "approver": "bob@example.com"})
    assert resp.status == 202, resp.text
    value = stack.result(invocation_id)["value"]
    assert value == {"approved": True, "approver": "bob@example.com", "decided_at": ANY}
    assert before <= value["decided_at"] <= time.time() * 1000


def test_bad_requests_never_reach_restate(stack: Stack) -> None:
    session, invocation_id, target = stack.park()
    _, other_invocation, other = stack.park()
    forwarded_before = len(stack.proxy.all_completions())
    now = int(time.time())
    value = json.dumps({"approved": True}).encode()
    resolve = f"/v1/awakeables/{target}/resolve"
    good = {**sign_request(SECRET.encode(), value, path=resolve), "content-type": JSON}
    big = json.dumps("x" * BODY_LIMIT).encode()
    unknown = "sign_1" + "A" * 38

    def signed(body: bytes, path: str = resolve, **extra: str) -> dict[str, str]:
        return {**sign_request(SECRET.encode(), body, path=path), "content-type": JSON, **extra}

    posts: dict[str, tuple[str, bytes, dict[str, str], int]] = {
        "no signature": (resolve, value, {"content-type": JSON}, 401),
        "wrong secret": (
            resolve,
            value,
            {**sign_request(b"not-the-secret-at-all", value, path=resolve), "content-type": JSON},
            401,
        ),
        "tampered body": (resolve, b'{"approved": false}', good, 401),
        "expired timestamp": (
            resolve,
            value,
            {
                **sign_request(
                    SECRET.encode(), value, path=resolve, timestamp=now - 2 * TOLERANCE_SECONDS
                ),
                "content-type": JSON,
            },
            401,
        ),
        "timestamp from the future": (
            resolve,
            value,
            {
                **sign_request(
                    SECRET.encode(), value, path=resolve, timestamp=now + 2 * TOLERANCE_SECONDS
                ),
                "content-type": JSON,
            },
            401,
        ),
        "unknown signature scheme": (
            resolve,
            value,
            {**good, "x-tether-signature": "v2=" + good["x-tether-signature"][3:]},
            401,
        ),
        "oversized body": (resolve, big, signed(big), 413),
        "declared oversized": (
            resolve,
            value,
            {**signed(value), "content-length": str(BODY_LIMIT * 10)},
            413,
        ),
        "wrong content type": (resolve, value, {**good, "content-type": "text/plain"}, 415),
        "no content type": (
            resolve,
            value,
            sign_request(SECRET.encode(), value, path=resolve),
            415,
        ),
        "signed for another awakeable": (
            resolve,
            value,
            signed(value, path=f"/v1/awakeables/{other}/resolve"),
            401,
        ),
        "malformed id": ("/v1/awakeables/not.an.id/resolve", value, signed(value), 400),
        "space in id": ("/v1/awakeables/sign%201/resolve", value, signed(value), 400),
        "path traversal": ("/v1/awakeables/..%2F..%2Frestate/resolve", value, signed(value), 400),
        "dot segments": ("/v1/awakeables/../../restate/resolve", value, signed(value), 400),
        "id too long": (f"/v1/awakeables/{'a' * 300}/resolve", value, signed(value), 400),
        "not json": (resolve, b"approve!", signed(b"approve!"), 400),
        "reject without reason": (
            f"/v1/awakeables/{target}/reject",
            value,
            signed(value, path=f"/v1/awakeables/{target}/reject"),
            400,
        ),
        "unknown id": (
            f"/v1/awakeables/{unknown}/resolve",
            value,
            signed(value, path=f"/v1/awakeables/{unknown}/resolve"),
            404,
        ),
    }
    statuses = {
        case: stack.post(path, body, headers).status
        for case, (path, body, headers, _) in posts.items()
    }
    statuses["chunked oversized body"] = stack.post(
        resolve, b" " * (BODY_LIMIT + 1), signed(b"{}"), chunked=True
    ).status
    expected = {case: status for case, (_, _, _, status) in posts.items()}
    expected["chunked oversized body"] = 413

    links = {
        "expired link": (link("approve", target, expires=now - 1), 401),
        "link with a wrong sig": (link("approve", target).replace("sig=", "sig=f"), 401),
        "deny link used to approve": (link("deny", target).replace("/deny?", "/approve?"), 401),
        "link of another id": (link("approve", other).replace(other, target), 401),
        "link without sig": (f"/v1/awakeables/{target}/approve?exp={now + 60}", 401),
        "link with a malformed id": (link("approve", "a/b"), 400),
        "link of an unknown id": (link("approve", unknown), 404),
    }
    for case, (path, status) in links.items():
        statuses[case] = stack.get(path).status
        expected[case] = status
    page = open_link(stack.sidecar.url + link("approve", target))
    expired_sig = link_signature(SECRET.encode(), "approve", target, now - 1)
    expired = {"exp": str(now - 1), "sig": expired_sig}
    expired["token"] = form_token(SECRET.encode(), "approve", target, expired_sig)
    forms: dict[str, tuple[dict[str, str], dict[str, str], int]] = {
        "form without its page's token": ({**page.fields, "token": ""}, {}, 403),
        "form from another site": (
            page.fields,
            {"origin": "http://evil.example", "sec-fetch-site": "cross-site"},
            403,
        ),
        "form of an expired link": ({**page.fields, **expired}, {}, 401),
        "form with a tampered sig": ({**page.fields, "sig": "0" * 64}, {}, 401),
    }
    for case, (fields, headers, status) in forms.items():
        statuses[case] = press(dataclasses.replace(page, fields=fields), "approve", headers).status
        expected[case] = status
    statuses["unsigned list"] = stack.get("/v1/approvals").status
    expected["unsigned list"] = 401

    assert statuses == expected
    assert len(expected) >= 20
    assert stack.proxy.all_completions()[forwarded_before:] == []
    assert stack.status(invocation_id) in ("running", "suspended")
    assert any(p["session"] == session for p in stack.list_parked())

    # Now the real answer goes through once; its replay and a second answer do not.
    first = stack.post(resolve, value, good)
    assert first.status == 202, first.text
    assert stack.result(invocation_id) == {"value": {"approved": True}}
    replayed = stack.post(resolve, value, good)
    second = stack.signed_post(target, {"approved": False})
    used_link = stack.get(link("approve", target))
    assert (replayed.status, second.status, used_link.status) == (409, 409, 409)
    assert replayed.json()["outcome"] == "replayed"
    assert second.json()["outcome"] == "already_resolved"
    assert stack.proxy.completions(target) == ["resolve"]
    assert stack.status(other_invocation) in ("running", "suspended")
    assert stack.proxy.completions(other) == []

    assert decide_by_link(stack.sidecar.url + link("deny", other), "deny").status == 200
    assert stack.result(other_invocation)["value"]["approved"] is False


def test_metrics_merge_worker_and_sidecar(stack: Stack) -> None:
    session, invocation_id, awakeable_id = stack.park(kind="ask_human")
    assert stack.signed_post(awakeable_id, 1, secret="a-wrong-secret-for-metrics").status == 401

    samples = stack.metrics()
    parked = samples[("tether_parked_calls", (("agent", AGENT), ("kind", "ask_human")))]
    assert parked >= 1
    assert ("tether_parked_calls", (("agent", AGENT), ("kind", "approval"))) in samples
    webhook = {
        dict(labels)["outcome"]: v
        for (name, labels), v in samples.items()
        if name == "tether_webhook_requests_total"
    }
    assert webhook["bad_signature"] >= 1 and webhook["listed"] >= 1
    # Written by the worker process (a journaled step of the parking service).
    parked_tool_calls = (("agent", AGENT), ("outcome", "parked"), ("tool", "restart_service"))
    assert samples[("tether_tool_calls_total", parked_tool_calls)] >= 1
    assert any(p.name.startswith("counter_") for p in stack.metrics_dir.iterdir())

    assert stack.signed_post(awakeable_id, "done").status == 202
    assert stack.result(invocation_id) == {"value": "done"}
    gauge = ("tether_parked_calls", (("agent", AGENT), ("kind", "ask_human")))
    wait_until(
        lambda: stack.metrics().get(gauge) == parked - 1,
        timeout=DEADLINE,
        what="the parked gauge to drop",
    )
    assert session


def test_the_log_holds_no_secret_or_signature(stack: Stack) -> None:
    _, invocation_id, awakeable_id = stack.park()
    approve = link("approve", awakeable_id)
    signature = approve.partition("sig=")[2]
    assert stack.get(approve.replace("/approve?", "/deny?")).status == 401
    page = open_link(stack.sidecar.url + approve)
    assert press(page, "approve", {"sec-fetch-site": "cross-site"}).status == 403
    assert press(page, "approve").status == 200
    assert stack.result(invocation_id)["value"]["approved"] is True
    log = stack.sidecar.log()
    assert "refused GET /v1/awakeables/{awakeable_id:path}/deny: 401 bad_signature" in log
    assert "refused POST /v1/awakeables/{awakeable_id:path}/approve: 403 cross_site" in log
    assert SECRET not in log and signature not in log and "v1=" not in log
    assert page.fields["token"] not in log

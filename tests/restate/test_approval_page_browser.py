"""A person approves a parked call in a real browser: Debian's chromium, headless, driven by
Playwright (never a browser download of its own), against the `tether dev` stack (restate-server,
`tether worker`, `tether sidecar`).

Opening the signed link shows the page and decides nothing; a page of another site that posts
the same form is refused by the sidecar; pressing Approve on the page runs the tool once.
`make unit` installs chromium (`make chromium`); without /usr/bin/chromium this module skips.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import httpx2
import pytest

from tests.restate.support import approval_manifest, wait_until
from tether.programs.dev import DevStack
from tether.programs.webhooks import sign_request, signed_link

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        f"no {CHROMIUM}: the browser test needs Debian's chromium (`make chromium` installs it; "
        "`make unit` does too)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the Python package playwright (a dev dependency) is missing"
)

#: The machine has no network but loopback: without these, chromium tries to reach out.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
AGENT = "browser-clerk"
RECIPIENT = "alice@example.com"
INPUT = {"path": "out.txt", "content": "yes <script>alert(1)</script>"}
SCRIPT = [{"tool_calls": [{"name": "write_file", "input": INPUT}]}, {"text": "done"}]


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DevStack]:
    (tmp_path / "workspace").mkdir()
    monkeypatch.setenv("TETHER_WORKSPACE", str(tmp_path / "workspace"))
    monkeypatch.delenv("TETHER_WEBHOOK_SECRET", raising=False)
    with DevStack(approval_manifest(tmp_path, AGENT, SCRIPT), tmp_path / "dev") as running:
        yield running


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A headless chromium with a fresh profile."""
    profile = tmp_path / "chromium-profile"
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield context
        finally:
            context.close()
    shutil.rmtree(profile, ignore_errors=True)


class OtherSite:
    """A page of another site (http://localhost:<port>, the sidecar is http://127.0.0.1:...)
    with a form that posts the fields of a real page, its token included, to the sidecar."""

    def __init__(self, action: str, fields: dict[str, str]) -> None:
        inputs = "".join(
            f"<input type='hidden' name='{escape(k)}' value='{escape(v)}'>"
            for k, v in fields.items()
        )
        page = (
            f"<!doctype html><title>win a prize</title><form method='post' "
            f"action='{escape(action)}'>{inputs}"
            "<button name='decision' value='approve'>Claim the prize</button></form>"
        ).encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://localhost:{self._server.server_address[1]}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def approvals(stack: DevStack) -> list[dict[str, Any]]:
    headers = sign_request(stack.secret.encode(), b"", path="/v1/approvals")
    response = httpx2.get(f"{stack.sidecar_url}/v1/approvals", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    parked: list[dict[str, Any]] = response.json()["parked"]
    return parked


def call_agent(stack: DevStack, session: str, handler: str) -> Any:
    url = f"{stack.server.ingress_url}/{AGENT}/{session}/{handler}"
    response = httpx2.post(url, json=None, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def status(stack: DevStack, invocation: str) -> str:
    rows = stack.server.query(f"SELECT status FROM sys_invocation WHERE id = '{invocation}'")
    return str(rows[0]["status"])


def journal(stack: DevStack, invocation: str) -> list[tuple[str, str, dict[str, Any]]]:
    rows = stack.server.query(
        f"SELECT entry_type, name, entry_json FROM sys_journal WHERE id = '{invocation}' "
        "ORDER BY index"
    )
    return [(r["entry_type"], r.get("name") or "", json.loads(r["entry_json"])) for r in rows]


def decisions(stack: DevStack, invocation: str) -> tuple[list[Any], list[Any]]:
    """The values the journal holds for the awakeables (what Restate got from the sidecar) and
    for the `park:end` steps (the run's record of the decision)."""
    entries = journal(stack, invocation)
    signals = [
        json.loads(bytes(e["Notification"]["Signal"]["result"]["Success"]))
        for kind, _, e in entries
        if kind == "Notification: Signal"
    ]
    park_ends = {
        e["Command"]["Run"]["completion_id"]
        for kind, name, e in entries
        if kind == "Command: Run" and name.endswith("/park:end")
    }
    runs = [
        e["Notification"]["Completion"]["Run"]
        for kind, _, e in entries
        if kind == "Notification: Run"
    ]
    ended = [
        json.loads(bytes(run["result"]["Success"]))
        for run in runs
        if run["completion_id"] in park_ends
    ]
    return signals, ended


def tool_calls(stack: DevStack) -> float:
    text = httpx2.get(f"{stack.sidecar_url}/metrics", timeout=30).text
    wanted = f'tether_tool_calls_total{{agent="{AGENT}",outcome="ok",tool="write_file"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted))


def test_a_person_approves_a_parked_call_in_a_real_browser(
    stack: DevStack, browser: Any, tmp_path: Path
) -> None:
    out = tmp_path / "workspace" / "out.txt"
    started = httpx2.post(
        f"{stack.server.ingress_url}/{AGENT}/s1/run/send", json={"prompt": "write it"}, timeout=30
    )
    assert started.status_code == 202, started.text
    invocation = started.json()["invocationId"]
    [call] = wait_until(lambda: approvals(stack), timeout=120, what="the parked call")
    expires = int(time.time()) + 600
    secret = stack.secret.encode()
    posted_link = signed_link(stack.sidecar_url, secret, "approve", call["awakeable_id"], expires)

    # The link is posted in a chat: its link preview and a mail scanner fetch it first.
    assert httpx2.head(posted_link, timeout=30).status_code == 405
    assert httpx2.get(posted_link, timeout=30).status_code == 200
    time.sleep(1)  # (a wrongly forwarded resolution would have reached the worker by now)
    assert approvals(stack) == [call]
    assert status(stack, invocation) in ("running", "suspended")
    assert not out.exists()

    # The person opens the link minted for them.
    link = signed_link(
        stack.sidecar_url, secret, "approve", call["awakeable_id"], expires, recipient=RECIPIENT
    )
    page = browser.new_page()
    posted: list[dict[str, str]] = []
    page.on("request", lambda r: posted.append(r.all_headers()) if r.method == "POST" else None)
    shown = page.goto(link)
    assert shown is not None and shown.status == 200
    headers = shown.all_headers()
    assert "form-action 'self'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY" and headers["referrer-policy"] == "no-referrer"
    assert page.locator("h1").inner_text() == "Approve this call?"
    table = page.locator("table").inner_text()
    for text in (AGENT, "s1", "write_file", RECIPIENT):
        assert text in table
    assert json.loads(page.locator("pre").inner_text()) == INPUT  # escaped, so shown as text
    assert page.locator("script").count() == 0
    buttons = page.locator("button")
    assert [buttons.nth(i).inner_text() for i in range(buttons.count())] == ["Approve", "Deny"]

    # Opening the link decided nothing either: the call is still parked.
    assert approvals(stack) == [call]
    listed = {k: v for k, v in call.items() if k != "awakeable_id"}  # the ingress hides ids
    assert call_agent(stack, "s1", "pending") == [listed]
    assert status(stack, invocation) in ("running", "suspended")
    assert not out.exists()

    # Another site's page posting the same form, token and all, is refused.
    fields = {
        name: page.locator(f"input[name={name}]").get_attribute("value") or ""
        for name in ("exp", "sig", "to", "token")
    }
    action = f"{stack.sidecar_url}/v1/awakeables/{call['awakeable_id']}/approve"
    other_site = OtherSite(action, fields)
    try:
        attack = browser.new_page()
        attack.goto(other_site.url)
        with attack.expect_navigation():
            attack.get_by_role("button", name="Claim the prize").click()
        assert attack.locator("h1").inner_text() == "Not done"
        assert "not posted from its own page" in attack.locator("p").inner_text()
    finally:
        other_site.close()
    assert approvals(stack) == [call] and not out.exists()

    # The person presses Approve.
    with page.expect_navigation():
        page.get_by_role("button", name="Approve").click()
    assert page.locator("h1").inner_text() == "Approved"
    sent_from_page = posted[-1]
    assert sent_from_page.get("sec-fetch-site") == "same-origin", sent_from_page
    result = httpx2.get(
        f"{stack.server.ingress_url}/restate/invocation/{invocation}/attach", timeout=120
    ).json()
    assert result["status"] == "completed", result
    assert out.read_text() == INPUT["content"]

    # The tool ran once, and the run's record of the decision names the approver.
    wait_until(lambda: tool_calls(stack) == 1, timeout=30, what="the tool call to be counted")
    turns = call_agent(stack, "s1", "session")["turns"]
    results = [
        block
        for turn in turns
        for block in (turn["content"] if isinstance(turn["content"], list) else [])
        if block.get("type") == "tool_result"
    ]
    assert len(results) == 1 and not results[0].get("is_error"), results
    [resolution], [ended] = decisions(stack, invocation)
    decided = {"approved": True, "by": "link", "approver": RECIPIENT, "decided_at": ANY}
    assert resolution == decided
    assert ended == {"timed_out": False, **decided, "decided_at": resolution["decided_at"]}
    assert approvals(stack) == [] and call_agent(stack, "s1", "pending") == []
    again = page.goto(link)
    assert again is not None and again.status == 409  # the link is used up
    assert page.locator("h1").inner_text() == "Not done"
    assert "already answered" in page.locator("p").inner_text()

"""The small HTML pages of approval links: the page a link opens (what the call is, who asks,
until when the link works, and the buttons), and the page that answers a button or a refusal.

Everything shown is escaped: a call's input is model output. The pages need no script, load
nothing and may not be framed; the headers say so to the browser (`PAGE_HEADERS`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from html import escape

from starlette.responses import HTMLResponse

from ...parked import SUMMARY_CHARS, ParkedCall, asks_for_budget
from ..webhooks import LinkAction

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
PAGE_HEADERS = {
    # A link carries its signature in the URL: keep it out of caches and Referer headers.
    "cache-control": "no-store",
    "referrer-policy": "no-referrer",
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
}

STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:46rem;padding:0 1rem;"
    "color:#222}th{text-align:left;padding:.2rem 1rem .2rem 0;vertical-align:top}"
    "pre{background:#f4f4f4;padding:.8rem;overflow:auto;white-space:pre-wrap;"
    "word-break:break-all}button{font-size:1rem;padding:.5rem 1.4rem;margin-right:.8rem}"
    ".note{color:#555;font-size:.9rem}"
)


def _document(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<meta name='robots' content='noindex, nofollow'>"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
        f"<body><main>{body}</main></body></html>"
    )


def link_page(status: int, title: str, message: str) -> HTMLResponse:
    """A page that says what happened (or why nothing did)."""
    body = f"<h1>{escape(title)}</h1><p>{escape(message)}</p>"
    return HTMLResponse(_document(title, body), status_code=status, headers=PAGE_HEADERS)


def utc(epoch_seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_seconds))


def pretty_input(summary: str) -> str:
    """A call's input for a person: indented JSON, or the text as it is (a summary cut to a
    few hundred characters is no longer JSON)."""
    try:
        return json.dumps(json.loads(summary), indent=2, ensure_ascii=False, sort_keys=True)
    except ValueError:
        return summary


@dataclass(frozen=True)
class LinkView:
    """A verified link and the call it is for."""

    action: LinkAction
    record: ParkedCall
    expires: int
    signature: str
    recipient: str | None
    token: str


def _hidden(name: str, value: str) -> str:
    return f"<input type='hidden' name='{name}' value='{escape(value)}'>"


def confirmation_page(view: LinkView, token_seconds: int) -> HTMLResponse:
    """The page a link opens: the call, and the buttons that decide it (the link's first)."""
    record = view.record
    rows: list[tuple[str, str]] = [
        ("Agent", record.get("agent", "")),
        ("Session", record.get("session", "")),
        ("Tool", record.get("tool", "")),
        ("Call", f"{record.get('call_id', '')} ({record.get('kind', 'approval')})"),
    ]
    if isinstance(record.get("created_at"), int | float):
        rows.append(("Waiting since", utc(record["created_at"] / 1000)))
    if isinstance(record.get("expires_at"), int | float):
        rows.append(("Call times out", utc(record["expires_at"] / 1000)))
    if view.recipient is not None:
        rows.append(("Link sent to", view.recipient))
    rows.append(("Link expires", utc(view.expires)))
    table = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    fields = _hidden("exp", str(view.expires)) + _hidden("sig", view.signature)
    if view.recipient is not None:
        fields += _hidden("to", view.recipient)
    fields += _hidden("token", view.token)
    approve = "<button type='submit' name='decision' value='approve'>Approve</button>"
    deny = "<button type='submit' name='decision' value='deny'>Deny</button>"
    if view.action == "approve":
        buttons, only = approve + deny, ""
    else:
        buttons = deny
        only = (
            "<p class='note'>This link can deny the call only; approving it needs its approve "
            "link.</p>"
        )
    summary = str(record.get("input_summary", ""))
    cut = ""
    if len(summary) >= SUMMARY_CHARS and summary.endswith("..."):
        cut = (
            f"<p class='note'><b>The input is cut to its first {SUMMARY_CHARS} characters</b>; "
            "the call runs with all of it.</p>"
        )
    verb = "Approve" if view.action == "approve" else "Deny"
    agent = f"The agent <b>{escape(str(record.get('agent', '')))}</b>"
    if asks_for_budget(str(record.get("tool", "")), str(record.get("call_id", ""))):
        title = heading = f"{verb} more budget?"
        why = (
            f"{agent} ran out of budget. Approving raises it as the input says (raise_to), "
            "and the run goes on; denying stops the run."
        )
    else:
        title, heading = f"{verb} {record.get('tool', 'this call')}?", f"{verb} this call?"
        why = f"{agent} waits for a person's decision before it runs this tool call."
    body = (
        f"<h1>{escape(heading)}</h1><p>{why}</p>"
        f"<table>{table}</table>"
        f"<h2>Input</h2><pre>{escape(pretty_input(summary))}</pre>{cut}"
        f"<form method='post' action='{escape(view.action)}'>{fields}{buttons}</form>{only}"
        "<p class='note'>Nothing is decided until you press a button. They work for "
        f"{token_seconds // 60} minutes; after that, open the link again.</p>"
    )
    return HTMLResponse(_document(title, body), status_code=200, headers=PAGE_HEADERS)

"""The Slack messages of an approval, in Block Kit (https://api.slack.com/block-kit):

- `approval_message`: what the worker posts to the incoming webhook when a call parks: the
  agent, the tool, the session, the call's input (pretty JSON in a code block, cut to Slack's
  3000 characters of a section), when it times out, and the Approve (primary) and Deny (danger)
  buttons, each with a signed token (`signing.button_token`);
- `decided_message`: what the sidecar puts in its place through the click's `response_url`:
  the same message with the buttons replaced by "Approved by @x" or "Denied by @x";
- `reply`: a message only the person who clicked sees (a click that changed nothing).

Slack reads `&`, `<` and `>` in text as markup: everything that comes from the agent, the model
or a person is escaped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ...parked import ParkedCall, asks_for_budget
from ..webhooks import LinkAction
from .signing import MAX_TOKEN_CHARS, button_token

ACTION_IDS: dict[LinkAction, str] = {"approve": "tether:approve", "deny": "tether:deny"}
"""The `action_id` of each button; the decision is in the signed token too."""
DECISION_OF_ACTION: dict[str, LinkAction] = {v: k for k, v in ACTION_IDS.items()}
BUTTONS: tuple[tuple[LinkAction, str, str], ...] = (
    ("approve", "Approve", "primary"),
    ("deny", "Deny", "danger"),
)
"""Each button: its decision, its label and its style."""
ACTIONS_BLOCK_ID = "tether:decision"
SECTION_TEXT_LIMIT = 3000
FIELD_TEXT_LIMIT = 2000
HEADER_TEXT_LIMIT = 150
MAX_BLOCKS = 50
NAME_CHARS = 200
"""How much of a session id, tool name or agent name a field shows."""
DEFAULT_EXPIRY_MS = 86_400_000
"""A park without a deadline: its buttons work this long (as its links do)."""

Message = dict[str, Any]


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _units(text: str) -> int:
    """Length as Slack counts it (UTF-16 code units: an emoji may count two)."""
    return len(text.encode("utf-16-le")) // 2


def _fit(text: str, budget: int) -> str:
    """The longest start of `text` that is at most `budget` units."""
    used = 0
    for index, char in enumerate(text):
        used += 2 if ord(char) > 0xFFFF else 1
        if used > budget:
            return text[:index]
    return text


def _short(text: str, limit: int = NAME_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def code_section(label: str, text: str, limit: int = SECTION_TEXT_LIMIT) -> str:
    """`*label*` and `text` in a code block, escaped, cut to fit `limit` (with a note that
    says so and how long the whole was)."""
    # Three backticks inside would end the block: a zero-width space breaks them up.
    body = escape(text).replace("```", "`\u200b``")
    head, tail = f"*{label}*\n```\n", "\n```"
    whole = head + body + tail
    if _units(whole) <= limit:
        return whole
    note = f"\n_cut to fit Slack's limit: {len(text)} characters in all_"
    cut = _fit(body, limit - _units(head + "…" + tail + note))
    entity = cut.rfind("&")
    if entity != -1 and ";" not in cut[entity:]:  # never half an escape such as `&am`
        cut = cut[:entity]
    return head + cut + "…" + tail + note


def _field(label: str, text: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": _fit(f"*{label}*\n{text}", FIELD_TEXT_LIMIT)}


def _when(epoch_ms: float) -> str:
    """A time Slack shows in the reader's own time zone (UTC where it cannot)."""
    seconds = int(epoch_ms / 1000)
    fallback = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{seconds}^{{date_short_pretty}} at {{time}}|{fallback}>"


def _buttons(record: ParkedCall, secret: bytes) -> dict[str, Any] | None:
    """The actions block, or None if a token would not fit in a button."""
    expires = int(record.get("expires_at", record["created_at"] + DEFAULT_EXPIRY_MS) / 1000)
    elements = []
    for decision, label, style in BUTTONS:
        token = button_token(
            secret,
            record["awakeable_id"],
            session=record["session"],
            call_id=record["call_id"],
            decision=decision,
            expires=expires,
        )
        if len(token) > MAX_TOKEN_CHARS:
            return None
        elements.append(
            {
                "type": "button",
                "action_id": ACTION_IDS[decision],
                "text": {"type": "plain_text", "text": label},
                "style": style,
                "value": token,
            }
        )
    return {"type": "actions", "block_id": ACTIONS_BLOCK_ID, "elements": elements}


def _note(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}


def approval_message(record: ParkedCall, arguments: Any, secret: bytes | None) -> Message:
    """The message announcing the parked call `record` (whose input is `arguments`). Without
    the webhook secret, or for `ask_human` (which wants a value, not a yes or no), it has no
    buttons and says how to answer instead."""
    agent, tool, session = record["agent"], record["tool"], record["session"]
    asks = record["kind"] == "ask_human"
    budget = asks_for_budget(tool, record["call_id"])
    wanted = "more budget" if budget else tool
    title = f"{agent} asks a question" if asks else f"Approval needed: {wanted}"
    fields = [
        _field("Agent", escape(_short(agent))),
        _field("Tool", f"`{escape(_short(tool))}`"),
        _field("Session", f"`{escape(_short(session))}`"),
        _field(
            "Times out",
            _when(record["expires_at"]) if "expires_at" in record else "never",
        ),
    ]
    pretty = json.dumps(arguments, indent=2, ensure_ascii=False, default=str)
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": _short(title, HEADER_TEXT_LIMIT)},
        },
        {"type": "section", "fields": fields},
        {"type": "section", "text": {"type": "mrkdwn", "text": code_section("Input", pretty)}},
    ]
    actions = _buttons(record, secret) if secret and not asks else None
    if actions is not None:
        blocks.append(actions)
    else:
        why = (
            "It wants an answer, not a yes or no"
            if asks
            else "No buttons (no webhook secret, or the call's name is too long for one)"
        )
        blocks.append(
            _note(
                f"{why}: answer with `tether approvals` and `tether resolve`, or a signed webhook."
            )
        )
    blocks.append(
        _note(f"Call `{escape(_short(record['call_id']))}`, parked {_when(record['created_at'])}")
    )
    verb = "asks a question" if asks else f"waits for approval to call {tool}"
    if budget:
        verb = "ran out of budget and waits for approval to raise it"
    text = escape(_short(f"{agent} {verb} (session {session})", 500))
    return {"text": text, "blocks": blocks}


def decision_line(approved: bool, who: str) -> str:
    return f"{'Approved' if approved else 'Denied'} by @{who}"


def decided_message(original: object, *, approved: bool, who: str) -> Message:
    """The approval message `original` (the `blocks` of the click's `message`, as Slack sent
    them) with its buttons replaced by who decided; just that line if `original` is not a list
    of blocks."""
    line = decision_line(approved, who)
    mark = ":white_check_mark:" if approved else ":no_entry_sign:"
    decided = {"type": "section", "text": {"type": "mrkdwn", "text": f"{mark} *{escape(line)}*"}}
    kept: list[Any] = []
    if isinstance(original, list) and all(isinstance(block, Mapping) for block in original):
        kept = [decided if block.get("type") == "actions" else block for block in original]
    if decided not in kept:
        kept.append(decided)
    return {"replace_original": True, "text": escape(line), "blocks": kept[-MAX_BLOCKS:]}


def reply(text: str) -> Message:
    """A message only the person who clicked sees; the original stays as it is."""
    return {"response_type": "ephemeral", "replace_original": False, "text": escape(text)}

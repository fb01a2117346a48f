"""The log redaction of every Tether process (`tether.programs.redact`): realistic lines in, the
scheme and host of each URL out, no token, path, query, user information or known secret value."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from tether.programs import redact
from tether.programs.redact import REDACTED, Redactor, secret_values

SLACK_PATH = "services/T0AAAAAAA/B0BBBBBBB/xoxT0kenT0kenT0kenT0ken"
SLACK_URL = f"https://hooks.slack.com/{SLACK_PATH}"
WEBHOOK_SECRET = "hmac-key-0f1e2d3c"
API_KEY = "sk-ant-api03-Zm9vYmFyYmF6cXV4cXV1eA"
SIGNATURE = "v1=" + "ab" * 32
ENV = {
    "TETHER_WEBHOOK_SECRET": WEBHOOK_SECRET,
    "ANTHROPIC_API_KEY": API_KEY,
    "TETHER_NOTIFY_URL": SLACK_URL,
    "MY_LLM_CREDENTIAL": "c0rp-llm-credential",
    "HOME": "/home/app",
    "SHORT_SECRET": "1",
}
SECRETS = [
    SLACK_PATH,
    "xoxT0kenT0ken",
    WEBHOOK_SECRET,
    API_KEY,
    "c0rp-llm-credential",
    "hunter22",
    "Zm9vOmJhcg",
    "xoxb-2211",
    "ghp_",
    "prom_1abc",
    "sig=9f8e",
    SIGNATURE,
    "eyJhbGci",
]

# (line as a program wrote it, what of it must stay readable)
LINES: list[tuple[str, list[str]]] = [
    (  # the worker's notification failure before this fix
        f"approval notification to {SLACK_URL} failed: [Errno 111] Connection refused",
        ["approval notification to https://hooks.slack.com/", "Connection refused"],
    ),
    (  # httpx's message for an error status
        f"Client error '404 Not Found' for url '{SLACK_URL}'",
        ["'404 Not Found' for url 'https://hooks.slack.com/"],
    ),
    (  # a provider SDK's debug line
        "Request options: {'method': 'post', 'url': 'https://api.anthropic.com/v1/messages', "
        f"'headers': {{'X-Api-Key': '{API_KEY}', 'authorization': 'Bearer eyJhbGciOiJIUzI1NiJ9."
        "eyJzdWIiOiJhZ2VudCJ9.c2lnbmF0dXJlc2ln'}}",
        ["'url': 'https://api.anthropic.com/", "'method': 'post'", "Bearer "],
    ),
    (
        'HTTP Request: POST https://api.anthropic.com/v1/messages "HTTP/1.1 500 Internal"',
        ["POST https://api.anthropic.com/", '"HTTP/1.1 500 Internal"'],
    ),
    (  # an approval link, as a careless log line would print it
        "approve at http://triage-sidecar.ops.svc:8000/v1/awakeables/prom_1abc/approve?exp="
        "1700000000&sig=9f8e7d6c5b4a.",
        ["approve at http://triage-sidecar.ops.svc:8000/", "."],
    ),
    (
        f"webhook refused: X-Tether-Signature: {SIGNATURE} from 10.0.0.7",
        ["webhook refused: X-Tether-Signature: ", "from 10.0.0.7"],
    ),
    (
        "connecting to postgresql://app:hunter22@db.internal:5432/agents",
        ["postgresql://", "@db.internal:5432/"],
    ),
    ("proxy https://user:Zm9vOmJhcg@proxy.corp:3128 refused", ["https://", "@proxy.corp:3128"]),
    (
        "slack said invalid_auth for xoxb-2211-3344-aAbBcCdDeEfF and ghp_0123456789abcdefghijAB",
        ["slack said invalid_auth for "],
    ),
    (
        f"signing with {WEBHOOK_SECRET} for {API_KEY[:3]}... and c0rp-llm-credential",
        ["signing with ", " for sk-... and "],
    ),
    ("login password=hunter22 token: abcdef123456", ["login password=", " token: "]),
]

# Lines that carry nothing secret come out as they went in.
UNCHANGED = [
    "Running on http://127.0.0.1:9080 (CTRL + C to quit)",
    "Handler 'rollout' failed temporarily: Secret ops/slack named by "
    "spec.approvals.notify.urlSecretRef does not exist; create it with `kubectl -n ops create "
    "secret generic slack --from-literal=url=...` (trying again in 2s)",
    "refused POST /v1/awakeables/prom_1/approve: 403 bad signature",
    "awakeable prom_1 approved by link (approver 'alice@example.com')",
    "registration of http://triage-0a1b2c3d4e.ops.svc:9080/ failed; next attempt in 2s",
    "the worker did not stop within its graceful timeout; killing it",
    "task-abcdefghijk, risk-assessment-tool and desk-organizer are not tokens",
]


def _redactor() -> Redactor:
    return Redactor(secret_values(ENV))


@pytest.mark.parametrize(("line", "kept"), LINES, ids=[f"line{i}" for i in range(len(LINES))])
def test_a_line_keeps_scheme_and_host_and_loses_every_secret(line: str, kept: list[str]) -> None:
    redacted = _redactor()(line)
    for secret in SECRETS:
        assert secret not in redacted, (secret, redacted)
    for part in kept:
        assert part in redacted, (part, redacted)
    assert REDACTED in redacted
    assert _redactor()(redacted) == redacted  # redacting twice changes nothing


@pytest.mark.parametrize("line", UNCHANGED)
def test_a_line_without_secrets_is_left_alone(line: str) -> None:
    assert _redactor()(line) == line


def test_the_secrets_come_from_the_environment_by_name() -> None:
    values = secret_values(ENV, names=["CUSTOM"])
    assert {WEBHOOK_SECRET, API_KEY, SLACK_URL, "c0rp-llm-credential"} <= set(values)
    assert "/home/app" not in values
    assert "mine" in secret_values({"CUSTOM": "mine"}, names=["CUSTOM"])
    # A value too short to hide everywhere is left (it would mangle every line).
    assert _redactor()("exit status 1") == "exit status 1"
    # The notify URL from the environment keeps its host, wherever it shows up.
    assert _redactor()(f"POST {SLACK_URL}") == f"POST https://hooks.slack.com/{REDACTED}"
    assert _redactor()(f"path {SLACK_PATH}") == f"path {REDACTED}"


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """`redact.install(ENV)` in this process for the test, with a handler writing to a buffer."""
    factory = logging.getLogRecordFactory()
    monkeypatch.setattr(redact, "_installed", False)
    monkeypatch.setattr(redact, "_redactor", Redactor())
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("tether.test_redact")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        redact.install(ENV, names=["MY_LLM_CREDENTIAL"])
        yield stream
    finally:
        logging.setLogRecordFactory(factory)
        logger.removeHandler(handler)
        logger.propagate = True


def test_install_redacts_every_record_the_process_logs(installed: io.StringIO) -> None:
    log = logging.getLogger("tether.test_redact")
    log.warning("approval notification to %s failed: %s", SLACK_URL, OSError(111, "refused"))
    log.info("key %(key)s, secret %(secret)s", {"key": API_KEY, "secret": WEBHOOK_SECRET})
    log.info(f"an f-string with {SLACK_URL} in it")  # what careless code does
    log.info("https://hooks.slack.com/%s", SLACK_PATH)  # the secret split over msg and args
    try:
        raise RuntimeError(f"POST {SLACK_URL} with Authorization: Bearer abcdef0123456789")
    except RuntimeError:
        log.exception("the notification failed")
    text = installed.getvalue()
    for secret in SECRETS:
        assert secret not in text, (secret, text)
    assert "approval notification to https://hooks.slack.com/[redacted] failed:" in text
    assert "RuntimeError: POST https://hooks.slack.com/[redacted] with Authorization: " in text
    assert "Traceback (most recent call last)" in text


def test_arguments_stay_arguments_for_formatters_that_read_them(installed: io.StringIO) -> None:
    """An access log's formatter unpacks `record.args`: they are redacted one by one."""
    seen: list[Any] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.args)

    log = logging.getLogger("tether.test_redact")
    capture = Capture()
    log.addHandler(capture)
    try:
        log.info('%s - "%s %s HTTP/%s" %d', "10.0.0.7:5050", "GET", f"/{SLACK_PATH}", "1.1", 200)
    finally:
        log.removeHandler(capture)
    [args] = seen
    assert args == ("10.0.0.7:5050", "GET", f"/{REDACTED}", "1.1", 200)

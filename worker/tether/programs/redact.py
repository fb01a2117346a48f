"""Secrets out of log lines: URLs keep their scheme and host, the rest of a credential goes.

`redact(text)` replaces, in this order:

- the values of secrets the process knows (`install` reads them from its environment: the
  webhook secret, the API keys, the notify URL, any variable named like a secret); a URL value
  loses its user information, path and query, its scheme and host stay;
- URLs: user information, path, query and fragment (`https://user:pw@host:8443/a?b` becomes
  `https://[redacted]@host:8443/[redacted]`), so a Slack incoming-webhook URL, a signed link or a
  `?token=` shows only where it pointed;
- `Bearer ...` / `Basic ...` credentials, `authorization: ...`, `token=...`, `password: ...`
  and similar key-value pairs;
- strings shaped like provider tokens: `sk-...` (OpenAI, Anthropic), `xoxb-...` and the other
  Slack prefixes, GitHub and GitLab tokens, AWS access key ids, JWTs.

`install()` puts it on every log record the process makes, through the log record factory: the
filter runs whatever handlers kopf, uvicorn or hypercorn configure, and before any of them. Each
program calls it first: the worker (`tether.programs.worker.asgi` and
`tether.programs.worker.hypercorn_config`), the sidecar (`tether.programs.sidecar.server.serve`),
the CLI (`tether.programs.cli.main`) and the operator (`tether_operator.main`, and its start-up
handler for `kopf run`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..secret_env import WORKER_SECRET_ENV

REDACTED = "[redacted]"

SECRET_ENV = WORKER_SECRET_ENV
"""Variables that hold a secret in every Tether process that has them."""

_SECRET_NAME = re.compile(
    r"SECRET|TOKEN|PASSWORD|PASSWD|API_?KEY|(^|_)KEY$|CREDENTIAL|WEBHOOK_URL|NOTIFY_URL",
    re.IGNORECASE,
)
"""Other variables whose values are taken for secrets, by their name."""

MIN_SECRET_LENGTH = 6
"""Shorter values are not redacted wherever they appear (`1`, `true` would mangle every line)."""

_URL = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*)://"
    r"(?P<userinfo>[^\s/?#@'\"<>`]*@)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s/?#:@'\"<>`]+)"
    r"(?P<port>:[0-9]+)?"
    r"(?P<rest>[/?#][^\s'\"<>`]*)?"
)
_PUNCTUATION = re.compile(r"[.,;:!?)\]}]*")
"""What may end a sentence after a URL: kept after the redacted path."""
_SCHEME_CREDENTIAL = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{6,}", re.IGNORECASE)
_KEY_VALUE = re.compile(
    r"(?P<key>\b(?:authorization|proxy-authorization|x-api-key|api[-_]?key|access[-_]?token|"
    r"refresh[-_]?token|id[-_]?token|token|secret|client[-_]?secret|password|passwd|sig|"
    r"signature|x-tether-signature)[\"']?\s*[:=]\s*[\"']?)"
    r"(?!\[redacted\]|(?:Bearer|Basic)\s)(?P<value>[^\s\"',;&}\]]+)",
    re.IGNORECASE,
)
_TOKEN = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"
    r"sk-[A-Za-z0-9_-]{8,}"  # OpenAI, Anthropic (sk-ant-...)
    r"|xox[abposr]-[A-Za-z0-9-]{8,}|xapp-[A-Za-z0-9-]{8,}"  # Slack
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|AKIA[0-9A-Z]{16}"  # AWS access key id
    r"|v1=[0-9a-f]{64}"  # an X-Tether-Signature
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JWT
    r")"
)


def _url(match: re.Match[str]) -> str:
    userinfo = f"{REDACTED}@" if match["userinfo"] else ""
    rest = match["rest"] or ""
    body = rest[1:]
    if body.startswith(REDACTED):  # redacted before: keep it so (idempotent)
        tail = body[len(REDACTED) :]
        rest = rest[0] + REDACTED + (tail if _PUNCTUATION.fullmatch(tail) else "")
    elif body.rstrip(".,;:!?)]}"):  # more than the punctuation that ends a sentence
        stripped = body.rstrip(".,;:!?)]}")
        rest = rest[0] + REDACTED + body[len(stripped) :]
    return f"{match['scheme']}://{userinfo}{match['host']}{match['port'] or ''}{rest}"


def _secret_parts(value: str) -> list[str]:
    """What of a secret value to hide: a URL's user information, path and query (its scheme
    and host stay readable); anything else whole."""
    parts = urlsplit(value) if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", value) else None
    if parts is not None and parts.netloc:
        hidden = [parts.netloc.rpartition("@")[0]]
        hidden.append(value.split(parts.netloc, 1)[1].lstrip("/"))
        return [part for part in hidden if len(part) >= MIN_SECRET_LENGTH]
    return [value] if len(value) >= MIN_SECRET_LENGTH else []


class Redactor:
    """Redacts text: known secret values, then URLs, credentials and token-shaped strings."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        self._known: re.Pattern[str] | None = None
        self.add(*secrets)

    def add(self, *values: str | None) -> None:
        """Hide these values (and a URL's secret parts) wherever they appear."""
        with self._lock:
            for value in values:
                if value:
                    self._secrets.update(_secret_parts(value.strip()))
            ordered = sorted(self._secrets, key=len, reverse=True)
            self._known = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, text: str) -> str:
        if self._known is not None:
            text = self._known.sub(REDACTED, text)
        text = _URL.sub(_url, text)
        text = _SCHEME_CREDENTIAL.sub(lambda m: f"{m[1]} {REDACTED}", text)
        text = _KEY_VALUE.sub(lambda m: m["key"] + REDACTED, text)
        return _TOKEN.sub(REDACTED, text)


_redactor = Redactor()


def redact(text: str) -> str:
    """`text` without the secrets this process knows, URL paths and queries, and tokens."""
    return _redactor(text)


def secret_values(env: Mapping[str, str], names: Iterable[str] = ()) -> list[str]:
    """The values of `env` that are secrets: `SECRET_ENV`, `names` and secret-like names."""
    wanted = {*SECRET_ENV, *names}
    return [v for k, v in env.items() if v and (k in wanted or _SECRET_NAME.search(k))]


def _redacted_arg(arg: Any) -> Any:
    if isinstance(arg, str):
        return redact(arg)
    if isinstance(arg, int | float | bool) or arg is None:
        return arg
    text = str(arg)
    cleaned = redact(text)
    return arg if cleaned == text else cleaned


class RedactingFilter(logging.Filter):
    """Rewrites a record's message, arguments, traceback and stack without secrets; never drops
    a record. Arguments are redacted one by one, so formatters that read `record.args` (an
    access log's) keep working; a message still holding a secret after that is redacted whole."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        # A record that cannot be formatted is logging's to report (as it does), not ours.
        with contextlib.suppress(Exception):
            self._redact(record)
        return True

    def _redact(self, record: logging.LogRecord) -> None:
        original = record.getMessage()
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, Mapping):
            record.args = {k: _redacted_arg(v) for k, v in record.args.items()}
        elif isinstance(record.args, tuple):
            record.args = tuple(_redacted_arg(a) for a in record.args)
        try:
            message: str | None = record.getMessage()
        except (TypeError, ValueError):  # a placeholder went with a redacted URL
            message = None
        if message is None or redact(message) != message:
            record.msg, record.args = redact(original), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(self._formatter.formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)


_installed = False
_install_lock = threading.Lock()


def install(env: Mapping[str, str] | None = None, names: Iterable[str] = ()) -> None:
    """Redact every log record of this process from now on, and the secret values of `env`
    (default: the process environment) with them; `names` adds variables to take for secrets
    (a spec's `apiKeyEnv`). Calling it again adds secrets; the filter is installed once."""
    global _installed
    _redactor.add(*secret_values(os.environ if env is None else env, names))
    with _install_lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()
        redacting = RedactingFilter()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            redacting.filter(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = True

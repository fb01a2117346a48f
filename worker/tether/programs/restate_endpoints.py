"""Restate's URLs as Tether's clients of it take them: one URL, or several separated by commas
(`RESTATE_INGRESS_URL=http://n1:8080,http://n2:8080,http://n3:8080`), the nodes of one cluster.

A call whose connection fails (refused, reset, closed before the answer, no connection within
the connect timeout) is sent again, to the next URL; the one that answered last is tried first
the next time. With one URL the call is sent once more, on a new connection: behind a
Kubernetes Service (the chart's Restate) that reaches a ready node, since the Service sends each
connection to one. Every call Tether makes to Restate can be sent twice: its sends carry an
idempotency key, its admin calls are idempotent (registration with `force`), the rest read.

The sidecar and the operator (aiohttp) and the worker (httpx2, `worker.ingress`) call Restate
through `Endpoints.call`, each saying which of its client's errors mean "the connection failed".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger("tether.programs.restate")


def split_urls(value: str | Sequence[str]) -> tuple[str, ...]:
    """The URLs of a comma-separated list (or a sequence), without a trailing `/`; `ValueError`
    if there is none or one is not an http:// or https:// URL."""
    parts = value.split(",") if isinstance(value, str) else list(value)
    urls = tuple(part.strip().rstrip("/") for part in parts if part.strip())
    if not urls:
        raise ValueError("no URL given")
    for url in urls:
        if not url.startswith(("http://", "https://")) or len(url) < 8:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
    return urls


class Endpoints:
    """The base URLs of one Restate API (ingress or admin) of one cluster, tried in turn."""

    def __init__(self, urls: str | Sequence[str]) -> None:
        self.urls = split_urls(urls)
        self._current = 0

    @property
    def primary(self) -> str:
        """The first URL (what a message or a status names)."""
        return self.urls[0]

    def __str__(self) -> str:
        return ",".join(self.urls)

    def attempts(self) -> list[str]:
        """The URLs to send a call to, in turn: the one that answered last first, then the
        others in their order; one URL twice (a second connection)."""
        if len(self.urls) == 1:
            return [self.urls[0]] * 2
        return [*self.urls[self._current :], *self.urls[: self._current]]

    def answered(self, url: str) -> None:
        """`url` answered: try it first from now on."""
        self._current = self.urls.index(url)

    async def call(
        self, send: Callable[[str], Awaitable[T]], failed: tuple[type[BaseException], ...]
    ) -> T:
        """`send(base_url)`'s value from the first URL whose connection does not fail (raises
        one of `failed`); the last such error when every URL's fails."""
        attempts = self.attempts()
        for i, url in enumerate(attempts):
            try:
                value = await send(url)
            except failed as problem:
                if i == len(attempts) - 1:
                    raise
                log.warning(
                    "Restate at %s did not answer (%s): trying %s",
                    url, type(problem).__name__, attempts[i + 1],
                )  # fmt: skip
                continue
            self.answered(url)
            return value
        raise AssertionError("unreachable")  # pragma: no cover

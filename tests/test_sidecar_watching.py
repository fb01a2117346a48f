"""The sidecar's registrations of the sessions its clients stream (`sidecar.watching`): one at
once per stream that opens, then every open session's together, in one call per renewal (the
registry is one exclusive key). Against the registry itself: `tests/restate/test_events.py`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from tether.programs.sidecar import watching
from tether.programs.sidecar.watching import Watching
from tether.programs.webhooks import watch_signature, watch_tag

SECRETS = (b"current" * 4, b"previous" * 4)


class Registry:
    """The slice of `RestateClient` that `Watching` uses: the calls it got."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def watch(self, agent: str, request: dict[str, Any]) -> None:
        assert agent == "clerk"
        tags, stamp = request["tags"], request["stamp"]
        assert request["sig"] == watch_signature(SECRETS[0], tags, stamp)  # the current key's
        assert abs(stamp - time.time() * 1000) < 5_000
        self.calls.append(tags)


def tags(*sessions: str) -> list[str]:
    return [watch_tag(secret, s) for s in sessions for secret in SECRETS]


async def eventually(condition: Callable[[], bool], what: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        await asyncio.sleep(0.01)


async def test_streams_register_at_once_and_renew_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watching, "WATCH_RENEW_SECONDS", 0.05)
    registry = Registry()
    watched = Watching(registry, "clerk", SECRETS)  # type: ignore[arg-type]
    await watched.start("s1")
    await watched.start("s2")
    await watched.start("s2")  # a second client of s2
    assert registry.calls == [tags("s1"), tags("s2"), tags("s2")]  # each as its stream opens

    await eventually(lambda: len(registry.calls) >= 4, "a renewal")
    assert registry.calls[3] == tags("s1", "s2")  # every open session in one call

    watched.stop("s1")
    watched.stop("s2")  # one of s2's two streams
    renewed = len(registry.calls)
    await eventually(lambda: len(registry.calls) > renewed, "the next renewal")
    assert registry.calls[-1] == tags("s2")

    watched.stop("s2")  # nothing open: the renewals stop
    await eventually(lambda: watched._renewing is not None and watched._renewing.done(), "stop")
    await watched.close()


async def test_a_renewal_is_split_into_calls_of_at_most_tags_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watching, "WATCH_RENEW_SECONDS", 0.05)
    monkeypatch.setattr(watching, "TAGS_PER_CALL", 4)
    registry = Registry()
    watched = Watching(registry, "clerk", SECRETS)  # type: ignore[arg-type]
    for session in ("a", "b", "c"):
        await watched.start(session)
    await eventually(lambda: len(registry.calls) >= 5, "a renewal in two calls")
    assert registry.calls[3:5] == [tags("a", "b"), tags("c")]
    await watched.close()


async def test_a_stream_gone_before_its_registration_answered_leaves_nothing() -> None:
    class Stuck(Registry):
        async def watch(self, agent: str, request: dict[str, Any]) -> None:
            await super().watch(agent, request)
            await asyncio.Event().wait()  # Restate does not answer; the client leaves

    watched = Watching(Stuck(), "clerk", SECRETS)  # type: ignore[arg-type]
    starting = asyncio.ensure_future(watched.start("s1"))
    await asyncio.sleep(0.01)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert not watched._open and watched._renewing is None  # nothing to renew, for ever
    await watched.close()

"""The agent's spend caps without Restate: the windows' rules, a provider held to them, a run that
ends when its call does not fit, and the spec that sets them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.helpers import FlakyProvider, RecordingProvider
from tests.test_events import collect
from tether import create_agent
from tether.budget import Limits, Spend
from tether.durable import sqlite_runtime
from tether.periods import UTC_NAMES, zone_problem
from tether.programs.worker.spend_client import RestateSpendGate
from tether.providers import (
    Limited,
    LocalSpendGate,
    ModelRequest,
    Pricing,
    ProviderError,
    SpendCapReached,
    spend,
)
from tether.spec import SpecError, parse_agent
from tether.spec.assemble import (
    fallbacks_from_spec,
    local_spend_gate,
    provider_from_spec,
    spend_caps_of,
)
from tether.spend_caps import HOLD_SECONDS, REPLAYABLE_SECONDS, SpendCap, SpendWindows, Window


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_a_window_is_the_calendar_period_in_utc_that_holds_the_time() -> None:
    t = at("2026-12-31T23:59:30")
    assert Window.of("hour", t) == Window(
        "hour:2026-12-31T23", at("2026-12-31T23:00"), at("2027-01-01T00:00")
    )
    assert Window.of("day", t) == Window("day:2026-12-31", at("2026-12-31"), at("2027-01-01"))
    assert Window.of("month", t) == Window("month:2026-12", at("2026-12-01"), at("2027-01-01"))
    assert Window.of("month", at("2027-02-10")).end == at("2027-03-01")


def test_a_window_in_a_time_zone_follows_its_calendar_and_its_clock_changes() -> None:
    tokyo = Window.of("day", at("2026-12-06T20:00"), "Asia/Tokyo")  # 05:00 on the 7th there
    assert tokyo == Window(
        "day:2026-12-07@Asia/Tokyo", at("2026-12-06T15:00"), at("2026-12-07T15:00")
    )
    assert Window.zone_of(tokyo.id) == "Asia/Tokyo" and Window.zone_of("day:2026-12-06") is None
    assert Window.of("hour", at("2026-12-06T20:10"), "Asia/Kolkata") == Window(
        "hour:2026-12-07T01+0530@Asia/Kolkata", at("2026-12-06T19:30"), at("2026-12-06T20:30")
    )
    assert Window.of("month", at("2026-12-31T20:00"), "Asia/Tokyo").id == "month:2027-01@Asia/Tokyo"
    # New York's clocks go forward on 2026-03-08 and back on 2026-11-01.
    spring = Window.of("day", at("2026-03-08T12:00"), "America/New_York")
    autumn = Window.of("day", at("2026-11-01T12:00"), "America/New_York")
    assert (spring.end - spring.start, autumn.end - autumn.start) == (23 * 3600, 25 * 3600)
    first = Window.of("hour", at("2026-11-01T05:30"), "America/New_York")  # 01:30 EDT
    again = Window.of("hour", at("2026-11-01T06:30"), "America/New_York")  # 01:30 EST
    assert first.end == again.start and first.id != again.id
    assert Window.of("day", NOON_UTC, "UTC") == Window.of("day", NOON_UTC)  # the same id


@pytest.mark.parametrize("zone", ["Australia/Lord_Howe", "America/Havana", "Asia/Kathmandu"])
def test_a_zones_windows_tile_its_year_whatever_its_clocks_do(zone: str) -> None:
    """Lord Howe's clocks move by 30 minutes, Havana's go back over midnight, Kathmandu is
    UTC+5:45: every moment is in exactly one window of each period, one id one window."""
    for per, step in (("hour", 1200), ("day", 7200), ("month", 7200)):
        seen: dict[str, Window] = {}
        previous = None
        for t in range(int(at("2026-01-01")), int(at("2027-01-01")), step):
            window = Window.of(per, t, zone)
            assert window.start <= t < window.end, (window, t)
            assert seen.setdefault(window.id, window) == window
            if previous is not None and previous != window:
                assert previous.end == window.start, (previous, window)
            previous = window


def test_an_hour_cut_by_a_clock_change_and_a_day_of_two_midnights() -> None:
    # Lord Howe at 02:00+11 on 2026-04-05 goes back to 01:30+10:30: that hour is 30 minutes.
    back = Window.of("hour", at("2026-04-04T15:10"), "Australia/Lord_Howe")
    assert back == Window(
        "hour:2026-04-05T01+1030@Australia/Lord_Howe",
        at("2026-04-04T15:00"),
        at("2026-04-04T15:30"),
    )
    # Havana's first of two midnights on 2026-11-01 starts the day, in the second one too.
    assert Window.of("day", at("2026-11-01T05:30"), "America/Havana").start == at(
        "2026-11-01T04:00"
    )


def test_a_time_zone_is_one_of_the_iana_names_not_the_hosts() -> None:
    for name in (
        "localtime",
        "posixrules",
        "Factory",
        "posix/Europe/Paris",
        "../etc",
        "Asia/Tokyo ",
    ):
        assert zone_problem(name) is not None, name
    for name in ("UTC", "Etc/GMT+5", "America/Argentina/Buenos_Aires", "Asia/Kathmandu"):
        assert zone_problem(name) is None, name


NOON_UTC = at("2026-12-06T12:00")
DAY = SpendCap("day", Limits(tokens=1_000))
NOON = at("2026-12-06T12:00")


def test_a_cap_in_a_time_zone_counts_and_resets_by_its_calendar() -> None:
    tokyo = SpendCap("day", Limits(tokens=1_000), time_zone="Asia/Tokyo")
    windows = SpendWindows()
    early = at("2026-12-06T20:00")  # the 6th in UTC, the 7th in Tokyo
    assert windows.reserve([tokyo], "a", Spend(0, 600), early) is None
    stored = SpendWindows.of(windows.to_json())  # as Restate and the SQLite file keep it
    stored.settle("a", Spend(0, 600))
    assert stored.spent["day:2026-12-07@Asia/Tokyo"] == Spend(0, 600)
    assert stored.spent["day:2026-12-06"] == Spend(0, 600)  # UTC's count goes on beside it
    late = at("2026-12-07T14:00")  # a new day in UTC, still the 7th in Tokyo
    assert stored.reserve([DAY], "utc", Spend(0, 600), late) is None
    refusal = stored.reserve([tokyo], "b", Spend(0, 600), late)
    assert refusal is not None and refusal.spent == Spend(0, 600) and refusal.wait_seconds == 3600
    assert (
        "spend cap of 1,000 tokens a day (Asia/Tokyo) is reached" in refusal.message()
        and "resets at 2026-12-08T00:00:00+09:00 (2026-12-07T15:00:00Z)" in refusal.message()
    )
    assert refusal == type(refusal).of(refusal.to_json())
    assert stored.reserve([tokyo], "b", Spend(0, 600), at("2026-12-07T15:00")) is None  # the 8th
    shown = [w["window"] for w in stored.windows(at("2026-12-07T15:00"))]
    assert shown == [
        "hour:2026-12-07T15",
        "day:2026-12-07",
        "month:2026-12",
        "hour:2026-12-08T00+0900@Asia/Tokyo",
        "day:2026-12-08@Asia/Tokyo",
        "month:2026-12@Asia/Tokyo",
    ]


def test_a_zone_counts_every_call_once_a_version_named_it() -> None:
    """A version without the zone (an older one, during a rollout) counts in it too, so the
    zone's cap neither lets its calls through once settled nor forgets them."""
    tokyo = SpendCap("day", Limits(tokens=1_000), time_zone="Asia/Tokyo")
    windows = SpendWindows()
    assert windows.reserve([tokyo], "new", Spend(0, 100), NOON) is None
    windows.settle("new", Spend(0, 100))
    assert windows.reserve([DAY], "old", Spend(0, 800), NOON + 60) is None  # no zone of its own
    windows.settle("old", Spend(0, 800))
    assert windows.spent["day:2026-12-06@Asia/Tokyo"] == Spend(0, 900)
    assert windows.reserve([tokyo], "next", Spend(0, 200), NOON + 120) is not None


def test_a_caps_time_zone_is_an_iana_name() -> None:
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        SpendCap.of({"per": "day", "tokens": 10, "time_zone": "Mars/Olympus"})
    cap = SpendCap("day", Limits(tokens=10), time_zone="Europe/Paris")
    assert SpendCap.of(cap.to_json()) == cap


@pytest.mark.parametrize("zone", ["Etc/UTC", "Zulu", "GMT", "Etc/GMT-0"])
def test_a_cap_in_another_name_of_utc_counts_with_utcs(zone: str) -> None:
    """One count for UTC's day however a version names it: a version that says Etc/UTC and one
    that says nothing share the cap's 1,000 tokens."""
    assert all(zone_problem(name) is None for name in UTC_NAMES)  # each a real name of UTC
    named = SpendCap.of({"per": "day", "tokens": 1_000, "time_zone": zone})
    assert named == DAY and named.describe() == DAY.describe()
    windows = SpendWindows()
    assert windows.reserve([named], "a", Spend(0, 600), NOON) is None
    windows.settle("a", Spend(0, 600))
    assert list(windows.spent) == ["hour:2026-12-06T12", "day:2026-12-06", "month:2026-12"]
    assert windows.reserve([DAY], "b", Spend(0, 600), NOON + 60) is not None
    # Where the operator looks for the cap's count (it has the spec's name, not the cap's).
    assert Window.of("day", NOON, zone) == Window.of("day", NOON)
    # A hold an earlier version made in that name's windows too counts once when settled.
    before = windows.to_json()
    before["held"]["c"] = {"cost_usd": 0, "tokens": 100, "at": NOON, "zones": [zone]}
    restored = SpendWindows.of(before)
    restored.settle("c", Spend(0, 100))
    assert restored.spent["day:2026-12-06"] == Spend(0, 700)


def test_a_call_holds_its_worst_case_and_one_that_does_not_fit_is_refused() -> None:
    windows = SpendWindows()
    assert windows.reserve([DAY], "a", Spend(0, 600), NOON) is None
    refusal = windows.reserve([DAY], "b", Spend(0, 600), NOON + 1)  # 600 held + 600 > 1,000
    assert refusal is not None and refusal.held == Spend(0, 600) and refusal.spent == Spend()
    message = refusal.message()
    assert (
        "spend cap of 1,000 tokens a day" in message and "resets at 2026-12-07T00:00:00Z" in message
    )
    windows.settle("a", Spend(0, 100))  # spent 100 of its 600: room for b
    assert windows.reserve([DAY], "b", Spend(0, 600), NOON + 3) is None
    assert windows.windows(NOON + 3)[1] == {
        "window": "day:2026-12-06",
        "spent": {"cost_usd": 0.0, "tokens": 100},
        "held": {"cost_usd": 0.0, "tokens": 600},
    }


def test_a_settle_or_reserve_sent_again_counts_once() -> None:
    windows = SpendWindows()
    windows.reserve([DAY], "a", Spend(0, 600), NOON)
    assert windows.reserve([DAY], "a", Spend(0, 600), NOON + 1) is None  # again: no new hold
    restored = SpendWindows.of(windows.to_json())  # as Restate keeps it
    restored.settle("a", Spend(0, 500))
    restored.settle("a", Spend(0, 500))  # again: nothing, its hold is gone
    assert restored.reserve([DAY], "a", Spend(0, 600), NOON + 60) is None  # no new hold either
    assert restored.spent["day:2026-12-06"] == Spend(0, 500) and restored.held == {}
    # Remembered while its reserve could still be fresh, and no longer.
    assert "a" in SpendWindows.of(restored.to_json()).settled
    restored.reserve([DAY], "b", Spend(0, 1), NOON + REPLAYABLE_SECONDS)
    assert restored.settled == {}


def test_a_hold_never_settled_counts_at_its_worst_and_a_new_period_starts_afresh() -> None:
    windows = SpendWindows()
    windows.reserve([DAY], "dead", Spend(0, 700), NOON)  # its worker died mid-call
    assert windows.reserve([DAY], "b", Spend(0, 400), NOON + 60) is not None
    # No longer held, but spent: the provider may have charged the call.
    refusal = windows.reserve([DAY], "b", Spend(0, 400), NOON + HOLD_SECONDS)
    assert refusal is not None and (refusal.spent, refusal.held) == (Spend(0, 700), Spend())
    assert windows.reserve([DAY], "b", Spend(0, 200), NOON + HOLD_SECONDS) is None
    windows.settle("b", Spend(0, 200))
    windows.settle("dead", Spend(0, 10))  # its settle after all: counted already
    assert windows.spent["day:2026-12-06"] == Spend(0, 900)
    month = SpendCap("month", Limits(tokens=2_000))
    tomorrow = at("2026-12-07T00:00:01")
    assert windows.reserve([DAY], "c", Spend(0, 900), tomorrow) is None  # a new day
    refusal = windows.reserve([month], "d", Spend(0, 250), tomorrow)  # the month remembers
    assert refusal is not None and refusal.cap == month and refusal.spent == Spend(0, 900)
    assert "day:2026-12-06" not in windows.spent  # gone with its day


HOUR_WAITS = SpendCap("hour", Limits(tokens=1_000), "wait")


def test_a_cap_that_waits_says_how_long_unless_the_call_cannot_fit_one_period() -> None:
    windows, roomy_day = SpendWindows(), SpendCap("day", Limits(tokens=10_000))
    assert windows.reserve([HOUR_WAITS, roomy_day], "a", Spend(0, 900), NOON) is None
    refusal = windows.reserve([HOUR_WAITS, roomy_day], "b", Spend(0, 200), NOON + 600)
    assert refusal is not None and refusal.waits and refusal.wait_seconds == 3000
    assert "the run waits until it resets at 2026-12-06T13:00:00Z" in refusal.message()
    assert (
        SpendWindows.of(windows.to_json()).reserve([HOUR_WAITS], "b", Spend(0, 200), NOON + 600)
        == refusal
    )  # its JSON, as Restate's object answers it
    assert refusal == type(refusal).of(refusal.to_json())
    # Two waiting caps: the later reset, when both have room again.
    day_waits = SpendCap("day", Limits(tokens=1_000), "wait")
    both = windows.reserve([HOUR_WAITS, day_waits], "b", Spend(0, 200), NOON + 600)
    assert both is not None and both.cap == day_waits and both.wait_seconds == 12 * 3600 - 600
    # A cap that stops wins over one that waits; a call larger than the cap would wait forever.
    stopped = windows.reserve([HOUR_WAITS, DAY], "c", Spend(0, 150), NOON + 700)
    assert stopped is not None and stopped.cap == DAY and not stopped.waits
    too_big = SpendWindows().reserve([HOUR_WAITS], "d", Spend(0, 1_001), NOON)
    assert too_big is not None and not too_big.waits


def request(text: str = "hi") -> ModelRequest:
    return ModelRequest(
        messages=[{"role": "user", "content": [{"type": "text", "text": text}]}],
        max_output_tokens=100,
    )


PRICED = Pricing(input_per_mtok=1_000, output_per_mtok=1_000)  # $0.001 a token


async def test_a_provider_holds_each_call_and_counts_what_it_spent() -> None:
    model = RecordingProvider(
        [{"text": "ok", "usage": {"input": 50, "output": 50}}] * 5, pricing=PRICED
    )
    gate = LocalSpendGate([SpendCap("day", Limits(cost_usd=0.5))])
    capped = Limited(model, spend=gate)
    await capped.complete(request())  # holds ~$0.14, spends $0.10
    await capped.complete(request())
    await capped.complete(request())
    spent = gate.windows.spent
    assert spent[Window.of("day", gate._clock()).id].cost_usd == pytest.approx(0.3)
    with pytest.raises(SpendCapReached) as refused:  # $0.30 + ~$0.24 held > $0.50
        await capped.complete(request("x" * 100))
    assert len(model.requests) == 3 and not refused.value.retryable
    assert "spend cap of $0.5 a day" in str(refused.value)
    assert gate.windows.held == {}


@pytest.mark.parametrize(
    ("error", "counts"),
    [
        (ProviderError("overloaded", provider="p", status=529, retryable=True), False),
        (ProviderError("refused", provider="p", status=400), False),
        (ProviderError("unreachable", provider="p", code="connection_error"), False),
        (ProviderError("timed out", provider="p", code="timeout", retryable=True), True),
        (ProviderError("cut", provider="p", code="stream_incomplete", retryable=True), True),
        (ProviderError("overloaded mid-stream", provider="p", status=200), True),
    ],
    ids=["5xx", "4xx", "unreachable", "timeout", "stream-cut", "error-in-stream"],
)
async def test_a_failed_call_counts_its_worst_case_only_if_the_provider_may_have_charged_it(
    error: ProviderError, counts: bool
) -> None:
    """Refused with an error status or never reached: nothing. Timed out, cut off, or failed
    while it answered: the provider may have charged what it generated, so its worst case."""
    gate = LocalSpendGate([DAY])
    with pytest.raises(ProviderError):
        await Limited(FlakyProvider([{"text": "ok"}], 1, error), spend=gate).complete(request())
    spent = gate.windows.spent[Window.of("day", gate._clock()).id]
    assert gate.windows.held == {} and (spent.tokens > 100 if counts else spent == Spend())


async def test_a_call_aborted_counts_its_worst_case_once_sent_and_nothing_while_it_waits() -> None:
    class Hangs(RecordingProvider):
        async def complete(self, request: ModelRequest, on_text: Any = None) -> Any:
            await asyncio.Event().wait()

    gate = LocalSpendGate([DAY])
    day = Window.of("day", gate._clock()).id
    capped = Limited(Hangs([]), max_calls=1, spend=gate)
    answering = asyncio.create_task(capped.complete(request()))
    waiting = asyncio.create_task(capped.complete(request()))  # for the one slot
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert gate.windows.spent.get(day, Spend()) == Spend()
    answering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await answering
    assert gate.windows.held == {} and gate.windows.spent[day].tokens > 100


async def test_a_run_whose_call_passes_the_agents_cap_ends_with_budget_exceeded() -> None:
    gate = LocalSpendGate([SpendCap("hour", Limits(tokens=350))])
    model = RecordingProvider([{"text": "ok", "usage": {"input": 100, "output": 100}}] * 5)
    first = create_agent(provider=Limited(model, spend=gate), behavior={"max_output_tokens": 100})
    assert (await first.run("go")).status == "completed"
    again = create_agent(provider=Limited(model, spend=gate), behavior={"max_output_tokens": 100})
    stats = await again.run("go")  # 200 spent + its request's ~70 bytes + 100 > 350
    assert stats.status == "budget_exceeded" and len(model.requests) == 1
    assert "the agent's spend cap of 350 tokens an hour" in str(stats.error)


def capped(**extra: Any) -> dict[str, Any]:
    model = {"provider": "scripted", "name": "s", "script": [{"text": "ok"}], "maxTokens": 100}
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "capped"},
        "spec": {"model": model, "webhook": {"secretRef": {"name": "h", "key": "k"}}, **extra},
    }


def test_the_spec_builds_one_gate_for_all_the_agents_models() -> None:
    caps = [
        {"per": "day", "maxTokens": 5_000},
        {"per": "hour", "maxTokens": 500, "onReached": "wait"},
        {"per": "month", "maxTokens": 50_000, "timeZone": "America/Sao_Paulo"},
    ]
    gate = local_spend_gate(parse_agent(capped(limits={"spendCaps": caps})).spec)
    assert gate is not None and list(gate.caps) == [
        SpendCap("day", Limits(tokens=5_000)),
        SpendCap("hour", Limits(tokens=500), "wait"),
        SpendCap("month", Limits(tokens=50_000), time_zone="America/Sao_Paulo"),
    ]
    agent = parse_agent(capped(limits={"spendCaps": caps[:1]}))
    provider = provider_from_spec(agent.spec, "", spend=gate)
    assert isinstance(provider, Limited) and provider.spend is gate
    assert local_spend_gate(parse_agent(capped()).spec) is None


@pytest.mark.parametrize(
    ("caps", "extra", "says"),
    [
        ([{"per": "day"}], {}, "a spend cap needs maxCostUsd or maxTokens"),
        ([{"per": "week", "maxTokens": 5_000}], {}, "spec.limits.spendCaps[0].per"),
        ([{"per": "day", "maxTokens": 5_000}] * 2, {}, "one cap per period"),
        ([{"per": "day", "maxTokens": 100}], {}, "must be larger than one call's output"),
        ([{"per": "day", "maxCostUsd": 5}], {}, "maxCostUsd needs model.pricing"),
        ([{"per": "day", "maxTokens": 5_000}], {"webhook": None}, "needs spec.webhook"),
        ([{"per": "day", "maxTokens": 5_000, "onReached": "ask"}], {}, "[0].onReached"),
        (
            [{"per": "day", "maxTokens": 5_000, "timeZone": "Europe/Pariss"}],
            {},
            "unknown time zone 'Europe/Pariss'",
        ),
    ],
    ids=[
        "no-limit",
        "unknown-period",
        "twice",
        "below-one-output",
        "unpriced",
        "unsigned",
        "ask",
        "unknown-zone",
    ],
)
def test_the_spec_refuses_caps_that_cannot_work(
    caps: list[dict[str, Any]], extra: dict[str, Any], says: str
) -> None:
    document = capped(limits={"spendCaps": caps})
    document["spec"].update(extra)
    if document["spec"].get("webhook") is None:
        document["spec"].pop("webhook")
    with pytest.raises(SpecError) as refused:
        parse_agent(document)
    assert says in str(refused.value)


@pytest.mark.parametrize("runtime", ["memory", "sqlite"])
async def test_a_run_under_a_cap_that_waits_sleeps_until_the_next_period_then_goes_on(
    runtime: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a retry: a run allowed one still has it for the 429 that follows the wait."""
    monkeypatch.setattr(spend, "WAKE_SPREAD_SECONDS", 0.0)
    hour_ends_in_a_second = 3600 - time.time() % 3600 - 1.0
    gate = LocalSpendGate([HOUR_WAITS], clock=lambda: time.time() + hour_ends_in_a_second)
    gate.windows.reserve(gate.caps, "earlier", Spend(0, 900), gate._clock())  # in flight
    overloaded = ProviderError("429", provider="p", retryable=True, retry_after=0)
    model = FlakyProvider([{"text": "done", "usage": {"input": 10, "output": 10}}], 1, overloaded)
    with contextlib.ExitStack() as stack:
        durable = None
        if runtime == "sqlite":
            durable = stack.enter_context(sqlite_runtime(tmp_path / "runs.db", "r1"))
        agent = create_agent(
            provider=Limited(model, spend=gate),
            durable=durable,
            behavior={"max_output_tokens": 100, "max_retries": 1},
        )
        watcher = asyncio.create_task(collect(agent))
        started = time.monotonic()
        stats = await agent.run("go")
        waited = time.monotonic() - started
        events = await asyncio.wait_for(watcher, 5)
    assert stats.status == "completed" and model.attempts == 2
    assert 0.9 < waited < 5
    [waiting] = [e for e in events if e["type"] == "spend_cap_waiting"]
    assert waiting["until"] - waiting["at"] == pytest.approx(1000, abs=100)
    assert "the run waits until it resets" in waiting["reason"] and waiting["cap"] == "hour"
    if runtime == "sqlite":  # the sleep is named for the cap it waits for
        sleeps = sqlite3.connect(tmp_path / "runs.db").execute(
            "SELECT name FROM tether_steps WHERE kind = 'sleep' ORDER BY at"
        )
        assert [name for (name,) in sleeps] == ["spend-cap:0:0:hour", "backoff:0:1"]


async def test_a_wait_journaled_before_waits_named_their_cap_replays_as_it_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal of the version before: the refusal without `cap`, its wait named `backoff`."""
    monkeypatch.setattr(spend, "WAKE_SPREAD_SECONDS", 0.0)
    hour_ends_in_a_second = 3600 - time.time() % 3600 - 1.0
    gate = LocalSpendGate([HOUR_WAITS], clock=lambda: time.time() + hour_ends_in_a_second)
    gate.windows.reserve(gate.caps, "earlier", Spend(0, 900), gate._clock())
    db = tmp_path / "runs.db"

    async def run(model: FlakyProvider) -> str:
        with sqlite_runtime(db, "r1") as durable:
            agent = create_agent(
                provider=Limited(model, spend=gate),
                durable=durable,
                behavior={"max_output_tokens": 100},
            )
            return (await agent.run("go")).status

    never = ProviderError("not asked on a replay", provider="p")
    reply = [{"text": "done", "usage": {"input": 10, "output": 10}}]
    assert await run(FlakyProvider(reply, 0, never)) == "completed"
    with sqlite3.connect(db) as conn:  # as the version before journaled it
        for scope, seq, value in conn.execute(
            "SELECT scope, seq, value FROM tether_steps WHERE kind = 'model'"
        ).fetchall():
            older = json.loads(value)
            if older.pop("cap", None) is not None:
                conn.execute(
                    "UPDATE tether_steps SET value = ? WHERE scope = ? AND seq = ?",
                    (json.dumps(older).encode(), scope, seq),
                )
        renamed = conn.execute(
            "UPDATE tether_steps SET name = 'backoff:0:0' WHERE name = 'spend-cap:0:0:hour'"
        ).rowcount
    assert renamed == 1
    replayed = FlakyProvider(reply, 1, never)
    assert await run(replayed) == "completed" and replayed.attempts == 0
    sleeps = sqlite3.connect(db).execute("SELECT name FROM tether_steps WHERE kind = 'sleep'")
    assert [name for (name,) in sleeps] == ["backoff:0:0"]


# A model's own caps -----------------------------------------------------------------------

OPUS, HAIKU = "anthropic/claude-opus", "anthropic/claude-haiku"


def test_a_models_cap_counts_and_refuses_only_that_models_calls() -> None:
    opus_day = SpendCap("day", Limits(tokens=1_000), model=OPUS)
    caps, windows = [SpendCap("day", Limits(tokens=5_000)), opus_day], SpendWindows()
    assert windows.reserve(caps, "a", Spend(0, 600), NOON, OPUS) is None
    assert windows.reserve(caps, "b", Spend(0, 600), NOON + 1, HAIKU) is None  # not opus's
    refused = windows.reserve(caps, "c", Spend(0, 600), NOON + 2, OPUS)  # 600 held + 600
    assert refused is not None and refused.cap == opus_day and refused.held == Spend(0, 600)
    assert "1,000 tokens on anthropic/claude-opus a day" in refused.message()
    assert "its runs' calls to anthropic/claude-opus spent 0 tokens" in refused.message()
    windows = SpendWindows.of(windows.to_json())  # the holds keep their model
    windows.settle("a", Spend(0, 500))
    windows.settle("b", Spend(0, 3_000))
    day = Window.of("day", NOON)
    assert windows.spent[day.id] == Spend(0, 3_500)  # the agent's: every model's calls
    assert windows.spent[day.key(OPUS)] == Spend(0, 500)
    assert windows.spent[day.key(HAIKU)] == Spend(0, 3_000)
    assert windows.reserve(caps, "d", Spend(0, 400), NOON + 3, OPUS) is None
    [shown] = [w for w in windows.windows(NOON + 4) if w["window"] == day.id]
    assert shown["models"] == {OPUS: Spend(0, 500).to_json(), HAIKU: Spend(0, 3_000).to_json()}
    # The agent's cap refuses first: no other model would fit it either.
    refused = windows.reserve(caps, "e", Spend(0, 1_200), NOON + 5, OPUS)
    assert refused is not None and refused.cap.model is None
    # A model's counts go with their window.
    assert windows.reserve(caps, "f", Spend(0, 1), NOON + 86_400, OPUS) is None
    assert not any(key.startswith(day.id) for key in windows.spent)


def fallback_agent(primary_cap: dict[str, Any], **extra_limits: Any) -> dict[str, Any]:
    """A spec of two scripted models, `big` and its fallback `small`, under `primary_cap` on
    `big` alone."""
    document = capped(limits={"spendCaps": [primary_cap], **extra_limits})
    model = document["spec"]["model"]
    model |= {"name": "big", "script": [{"text": "from big", "usage": {"output": 90}}] * 9}
    model["fallbacks"] = [
        {
            "provider": "scripted",
            "name": "small",
            "script": [{"text": "from small", "usage": {"output": 90}}] * 9,
            "maxTokens": 100,
        }
    ]
    return document


async def test_a_run_whose_model_reached_its_own_cap_goes_on_with_its_fallback() -> None:
    """Each run asks the capped model first (its cap may have room again), then its fallback;
    a model's cap that refuses the last model stops the run as the agent's would."""
    document = fallback_agent({"per": "day", "maxTokens": 220, "model": "big"})
    spec = parse_agent(document).spec
    [cap] = spend_caps_of(spec)
    assert cap.model == "scripted/big"  # its name, resolved to provider/name
    gate = local_spend_gate(spec)
    assert gate is not None
    env: dict[str, str] = {}

    async def run() -> tuple[Any, list[dict[str, Any]]]:
        agent = create_agent(
            provider=provider_from_spec(spec, "", spend=gate),
            fallbacks=fallbacks_from_spec(spec, env, spend=gate),
            behavior={"max_output_tokens": 100},
        )
        watcher = asyncio.create_task(collect(agent))
        stats = await agent.run("go")
        return stats, await asyncio.wait_for(watcher, 5)

    first, _ = await run()  # big: ~50 + 100 held of 220, 100 spent
    assert first.status == "completed" and first.text == "from big"
    second, events = await run()  # big: 100 spent + its hold > 220: refused, small answers
    assert second.status == "completed" and second.text == "from small"
    [answered] = [e for e in events if e["type"] == "model_done"]
    assert answered["model"] == "small"
    assert not [e for e in events if e["type"] == "spend_cap_waiting"]
    day = Window.of("day", time.time())
    assert isinstance(gate, LocalSpendGate)
    assert gate.windows.spent[day.key("scripted/big")].tokens == 100  # input 10, output 90
    assert gate.windows.spent[day.key("scripted/small")].tokens == 100

    # The last model's own cap: the run ends as under the agent's cap.
    document = fallback_agent({"per": "day", "maxTokens": 150, "model": "scripted/small"})
    spec = parse_agent(document).spec
    gate = LocalSpendGate(spend_caps_of(spec))
    gate.windows.reserve(gate.caps, "earlier", Spend(0, 140), time.time(), "scripted/small")
    agent = create_agent(
        provider=FailingFirst(provider_from_spec(spec, "", spend=gate)),
        fallbacks=fallbacks_from_spec(spec, env, spend=gate),
        behavior={"max_output_tokens": 100},
    )
    stats = await agent.run("go")
    assert stats.status == "budget_exceeded" and "on scripted/small a day" in str(stats.error)


class FailingFirst:
    """The wrapped provider, refusing every call as unavailable: its run goes to its fallback."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.name, self.model = provider.name, provider.model
        self.pricing, self.context_window = provider.pricing, provider.context_window

    async def complete(self, request: ModelRequest, on_text: Any = None) -> Any:
        raise ProviderError("unavailable", provider=self.name, retryable=True)


@pytest.mark.parametrize(
    ("cap", "says"),
    [
        ({"model": "medium"}, "model 'medium' is none of the spec's models"),
        ({"model": "small", "maxCostUsd": 1}, "maxCostUsd needs model.fallbacks[0].pricing"),
        ({"model": "big", "maxTokens": 100}, "must be larger than one call's output"),
    ],
    ids=["unknown-model", "unpriced-model", "below-one-output"],
)
def test_the_spec_refuses_a_models_cap_that_cannot_work(cap: dict[str, Any], says: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_agent(fallback_agent({"per": "day", "maxTokens": 5_000} | cap))
    assert says in str(refused.value)


def test_a_models_cap_names_one_model_when_two_providers_share_its_name() -> None:
    document = fallback_agent({"per": "day", "maxTokens": 5_000, "model": "big"})
    model = document["spec"]["model"]
    model["fallbacks"].append({**model["fallbacks"][0], "provider": "openai", "name": "big"})
    model["fallbacks"][1]["apiKeySecretRef"] = {"name": "openai", "key": "key"}
    model["fallbacks"][1].pop("script")
    with pytest.raises(SpecError, match="'big' is more than one of the spec's models"):
        parse_agent(document)
    document["spec"]["limits"]["spendCaps"][0]["model"] = "openai/big"
    [cap] = spend_caps_of(parse_agent(document).spec)
    assert cap.model == "openai/big"


def test_the_spec_takes_one_cap_per_period_and_model() -> None:
    day = {"per": "day", "maxTokens": 5_000}
    caps = [day, day | {"model": "big"}, day | {"model": "scripted/small"}]
    document = fallback_agent(caps[0])
    document["spec"]["limits"]["spendCaps"] = caps
    assert [cap.model for cap in spend_caps_of(parse_agent(document).spec)] == [
        None,
        "scripted/big",
        "scripted/small",
    ]
    document["spec"]["limits"]["spendCaps"] = [*caps, day | {"model": "scripted/big"}]
    with pytest.raises(SpecError, match=r"one cap per period \(hour, day, month\), and per model"):
        parse_agent(document)


def test_of_caps_that_stop_the_one_whose_period_ends_last_refuses() -> None:
    """Its reset is when the call may fit again: not the hour's, while the month is spent."""
    hour, month = SpendCap("hour", Limits(tokens=1_000)), SpendCap("month", Limits(tokens=1_000))
    windows = SpendWindows()
    assert windows.reserve([hour, month], "a", Spend(0, 900), NOON) is None
    refusal = windows.reserve([hour, month], "b", Spend(0, 200), NOON + 1)
    assert refusal is not None and refusal.cap == month


def test_a_settle_before_its_reserve_leaves_the_reserve_nothing_to_hold() -> None:
    """A worker whose reserve got no answer gives it back; the reserve, come later, holds
    nothing (it is granted: its call was given up), and the settle counted nothing."""
    windows = SpendWindows()
    windows.settle("lost", Spend(), NOON)
    windows = SpendWindows.of(windows.to_json())
    assert windows.reserve([DAY], "lost", Spend(0, 900), NOON + 1) is None
    assert windows.held == {} and windows.spent == {}
    assert windows.reserve([DAY], "next", Spend(0, 900), NOON + 2) is None  # all the room


async def test_a_restate_reserve_whose_answer_is_lost_is_given_back() -> None:
    """The object made the hold, its answer never came: the worker settles it at nothing before
    its call is retried under a hold of its own (a stand-in ingress over real windows)."""
    windows, now = SpendWindows(), time.time()

    class LosesReserveAnswers:
        async def post(self, path: str, body: dict[str, Any], what: str) -> Any:
            amount = Spend.of(body["amount"])
            if body["op"] == "reserve":
                windows.reserve(caps, body["hold"], amount, now, body.get("model") or "")
                return None  # the answer is lost
            windows.settle(body["hold"], amount, now)
            return httpx2.Response(200, json=None)

    caps = [DAY]
    gate = RestateSpendGate("capped", caps, LosesReserveAnswers(), b"k")  # type: ignore[arg-type]
    with pytest.raises(ProviderError, match="could not hold the call"):
        await gate.reserve("h1", Spend(0, 900), "scripted/s")
    assert windows.held == {} and "h1" in windows.settled


async def test_a_call_the_agents_cap_refuses_goes_to_a_fallback_whose_call_fits() -> None:
    """The agent's cap refuses the large call; the fallback's smaller one fits in what is left."""
    document = fallback_agent({"per": "day", "maxTokens": 1_500})
    document["spec"]["model"]["maxTokens"] = 1_000
    spec = parse_agent(document).spec
    gate = LocalSpendGate(spend_caps_of(spec))
    gate.windows.reserve(gate.caps, "earlier", Spend(0, 500), time.time())
    gate.windows.settle("earlier", Spend(0, 500))
    agent = create_agent(
        provider=provider_from_spec(spec, "", spend=gate),
        fallbacks=fallbacks_from_spec(spec, {}, spend=gate),
        behavior={"max_output_tokens": 1_000},
    )
    stats = await agent.run("go")  # big holds ~1,050 of the 1,000 left; small ~150
    assert stats.status == "completed" and stats.text == "from small"

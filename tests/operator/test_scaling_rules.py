"""The scaler's idle rule and its bookkeeping, and a drain's, without a cluster
(`tether_operator.scaling`, `supervisor.drain_old`); tests/operator/test_scale_to_zero.py runs
them against the real components."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.operator.test_settings import agent
from tether.spec import ScalingSpec, SpecError, VersionStatus
from tether_operator import scaling as scaler
from tether_operator import supervisor
from tether_operator.children import WorkerDeployment, observed
from tether_operator.conditions import parse_rfc3339
from tether_operator.context import AgentMemory
from tether_operator.names import restate_metadata
from tether_operator.restate_admin import InFlight, Runs
from tether_operator.scaling import (
    Decision,
    autoscale,
    decide,
    restore_memory,
    restore_replicas,
    runs_of,
)

NOW = parse_rfc3339("2026-12-01T12:00:00Z")
SUSPENDED = Runs(suspended=1)
DEPLOYMENT = WorkerDeployment("abc", "triage-abc", available=True, replicas=2)


def draining(**fields: Any) -> VersionStatus:
    return VersionStatus(hash="abc", state="Draining", restate_deployment_id="dp_1", **fields)


def step(
    version: VersionStatus,
    runs: Runs = SUSPENDED,
    *,
    idle_after: float | None = 2.0,
    now: float = NOW,
    needed: bool = False,
    hold: bool = False,
) -> Decision:
    return decide(
        version,
        runs,
        needed=needed,
        idle_after=idle_after,
        deployment=DEPLOYMENT,
        restore=2,
        now=now,
        hold=hold,
    )


def test_a_draining_version_whose_runs_only_wait_goes_to_zero_after_idle_after() -> None:
    first = step(draining())
    assert first.replicas is None  # idle from now on
    assert first.version.idle_since == "2026-12-01T12:00:00.000Z"
    assert first.version.parked_runs == 1 and first.version.active_runs == 0
    assert first.version.replicas == 2

    early = step(first.version, now=NOW + 1.9)
    assert early.replicas is None and early.version.idle_since == first.version.idle_since

    due = step(early.version, now=NOW + 2.0)
    assert due.replicas == 0 and due.reason == "ScaledToZero"
    assert due.version.scaled_to_zero_at == "2026-12-01T12:00:02.000Z"
    assert due.version.replicas == 0 and due.version.woke_at is None
    assert "1 parked runs wait in Restate" in due.message

    # At zero, waiting runs keep it there: nothing to do, pass after pass.
    later = step(due.version, now=NOW + 60)
    assert later.replicas is None and later.version.replicas == 0


def test_activity_restarts_the_idle_clock() -> None:
    idle = step(draining(), now=NOW).version
    busy = step(idle, Runs(active=1), now=NOW + 1.5)
    assert busy.replicas is None and busy.version.idle_since is None
    again = step(busy.version, now=NOW + 3).version
    assert step(again, now=NOW + 4.9).replicas is None
    assert step(again, now=NOW + 5).replicas == 0


@pytest.mark.parametrize(
    ("runs", "text"),
    [
        (Runs(active=1, suspended=2), "1 runs need it (1 active, 0 paused)"),
        (Runs(paused=1), "1 runs need it (0 active, 1 paused)"),
    ],
)
def test_a_version_at_zero_wakes_when_a_run_has_work_or_is_paused(runs: Runs, text: str) -> None:
    asleep = draining(scaled_to_zero_at="2026-12-01T11:00:00.000Z", replicas=0)
    woken = step(asleep, runs, now=NOW)
    assert woken.replicas == 2 and woken.reason == "WokeUp" and text in woken.message
    assert woken.version.scaled_to_zero_at is None and woken.version.replicas == 2
    assert woken.version.woke_at == "2026-12-01T12:00:00.000Z"
    # A woken version is idle again only from its wake-up: it stays up at least idleAfter.
    if runs.active:
        assert woken.version.idle_since is None
    else:
        assert woken.version.idle_since == woken.version.woke_at
        assert step(woken.version, runs, now=NOW + 1).replicas is None


@pytest.mark.parametrize(
    ("needed", "idle_after", "why"),
    [
        (True, 2.0, "it is the spec's version, registered only once it has pods"),
        (False, None, "spec.scaling.idleAfter is no longer set"),
    ],
)
def test_a_version_at_zero_wakes_when_it_must_keep_its_replicas(
    needed: bool, idle_after: float | None, why: str
) -> None:
    asleep = draining(scaled_to_zero_at="2026-12-01T11:00:00.000Z", replicas=0)
    woken = step(asleep, Runs(), needed=needed, idle_after=idle_after)
    assert woken.replicas == 2 and why in woken.message


@pytest.mark.parametrize(
    ("needed", "idle_after", "hold"),
    [(True, 2.0, False), (False, None, False), (False, 2.0, True)],
    ids=["the-spec-s-version-to-register", "no-idle-after", "paused-runs-to-resume"],
)
def test_never_to_zero(needed: bool, idle_after: float | None, hold: bool) -> None:
    version = draining(idle_since="2026-12-01T11:00:00.000Z")
    decision = step(version, needed=needed, idle_after=idle_after, hold=hold)
    assert decision.replicas is None and decision.version.scaled_to_zero_at is None


def test_the_active_version_counts_the_runs_no_deployment_has_yet() -> None:
    """Restate sends a new run to the latest deployment, and pins it only once a worker
    answers: while the active version is at zero, its new runs are unpinned, backing off."""
    in_flight = InFlight(
        pinned={"dp_1": 1},
        unpinned={},
        statuses={"dp_1": {"suspended": 1}},
        unpinned_statuses={
            # queued behind the suspended run of its session (Restate's `pending`): it waits too
            "triage": {"backing-off": 1, "scheduled": 4, "pending": 8, "paused": 1},
            "triage-inbox": {"pending": 2},  # the sidecar's, as the next two
            "triage-parked": {"backing-off": 16},
            "other": {"backing-off": 32},
        },
    )
    active = VersionStatus(hash="abc", state="Active", restate_deployment_id="dp_1")
    assert runs_of("triage", active, in_flight) == Runs(active=1, suspended=1, paused=1)
    assert runs_of("triage", draining(), in_flight) == Runs(suspended=1)
    # So the active version goes to zero when idle, and a new run wakes it.
    idle = step(active, Runs(suspended=1), now=NOW).version
    asleep = step(idle, Runs(suspended=1), now=NOW + 2)
    assert asleep.replicas == 0
    woken = step(asleep.version, runs_of("triage", active, in_flight), now=NOW + 3)
    assert woken.replicas == 2 and "(1 active, 1 paused)" in woken.message


def test_paused_runs_keep_a_version_up_they_would_wake_it_at_once() -> None:
    version = draining(idle_since="2026-12-01T11:00:00.000Z")
    decision = step(version, Runs(suspended=1, paused=1))
    assert decision.replicas is None and decision.version.idle_since == version.idle_since
    unknown = version.model_copy(update={"restate_deployment_id": None})
    assert step(unknown, Runs()).replicas is None  # Restate does not know it: no runs to see


def test_in_flight_counts_by_status_unknown_ones_as_active() -> None:
    counts = {"running": 1, "backing-off": 2, "suspended": 3, "paused": 4, "someday": 5}
    in_flight = InFlight(pinned={"dp_1": 15}, unpinned={}, statuses={"dp_1": counts})
    assert in_flight.runs("dp_1") == Runs(active=8, suspended=3, paused=4)
    assert in_flight.runs("dp_1").parked == 7
    assert in_flight.runs(None) == Runs() == in_flight.runs("dp_2")


def test_a_woken_version_gets_the_replicas_it_had_within_the_bounds() -> None:
    assert restore_replicas(agent(), None) == 1
    assert restore_replicas(agent(), 3) == 3
    assert restore_replicas(agent(worker={"replicas": 0}), None) == 1
    bounded = agent(scaling={"idleAfter": "5m", "minReplicas": 2, "maxReplicas": 4})
    assert [restore_replicas(bounded, n) for n in (None, 1, 3, 9)] == [2, 2, 3, 4]
    assert restore_replicas(agent(scaling={"maxReplicas": 2}), 5) == 2


@pytest.mark.parametrize(
    ("scaling", "problem"),
    [
        ({"idleAfter": "0s"}, "spec.scaling.idleAfter: must be longer than zero"),
        ({"idleAfter": "soon"}, "spec.scaling.idleAfter"),
        ({"minReplicas": 3, "maxReplicas": 2}, "minReplicas must not be greater than maxReplicas"),
        ({"minReplicas": 0}, "spec.scaling.minReplicas"),
        ({"idleAfter": "5m", "replicas": 0}, "spec.scaling.replicas: unknown field"),
    ],
)
def test_the_spec_refuses_bad_scaling(scaling: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError, match=problem.replace(".", r"\.")):
        agent(scaling=scaling)


def test_after_a_restart_the_scaler_finds_what_it_did() -> None:
    """A version the status lost at zero is read from its Deployment's annotations; a version
    woken before the restart has its paused runs resumed once it has pods."""
    at_zero = observed(
        "abc",
        "triage-abc",
        {"replicas": 0},
        {},
        {"annotations": {"tether.dev/scaled-to-zero-at": "2026-12-01T11:00:00.000Z",
                         "tether.dev/replicas": "3"}},
    )  # fmt: skip
    assert at_zero.replicas == 0 and at_zero.replicas_before_zero == 3 and not at_zero.available
    woken = VersionStatus(hash="def", state="Draining", woke_at="2026-12-01T11:30:00.000Z")
    versions = {"abc": draining(), "def": woken}
    mem = AgentMemory()
    restore_memory(mem, versions, {"abc": at_zero})
    assert versions["abc"].scaled_to_zero_at == "2026-12-01T11:00:00.000Z"
    assert mem.resume_due == {"def"} and mem.scaling_restored


def scaling(per: int = 10, low: int = 1, high: int = 4, down: str = "60s") -> ScalingSpec:
    return ScalingSpec(
        active_runs_per_replica=per, min_replicas=low, max_replicas=high, scale_down_after=down
    )


def test_autoscaling_adds_pods_at_once_and_removes_them_after_the_window() -> None:
    window: list[tuple[float, int]] = []
    version = draining(replicas=1)

    def tick(active: int, current: int, at: float) -> Decision:
        return autoscale(
            version,
            Runs(active=active),
            scaling=scaling(),
            current=current,
            recommended=window,
            now=NOW + at,
        )

    assert tick(10, 1, 0).replicas is None  # 10 runs at 10 per pod: the one it has
    up = tick(25, 1, 1)
    assert up.replicas == 3 and up.reason == "ScaledUp"
    assert up.message == (
        "version abc scaled from 1 to 3 replicas: 25 active runs, 10 per replica "
        "(spec.scaling.activeRunsPerReplica)"
    )
    assert up.version.replicas == 3
    assert tick(500, 3, 2).replicas == 4  # maxReplicas
    assert tick(0, 4, 3).replicas is None  # 4 were needed within the window
    assert tick(12, 4, 61).replicas is None  # the 500 runs' need at 2 s is still in it
    down = tick(12, 4, 62.5)  # gone: the most needed since 2.5 s is 2 (12 runs)
    assert down.replicas == 2 and down.reason == "ScaledDown"
    assert "for at least 60s (spec.scaling.scaleDownAfter)" in down.message
    assert tick(0, 2, 200).replicas == 1  # minReplicas, when nothing ran for a window


def test_an_autoscaler_that_just_started_keeps_the_pods_for_a_window() -> None:
    """A new memory (an operator that took over) starts from the replicas the version has."""
    window: list[tuple[float, int]] = []

    def tick(at: float) -> int | None:
        decided = autoscale(
            draining(),
            Runs(),
            scaling=scaling(),
            current=4,
            recommended=window,
            now=NOW + at,
        )
        return decided.replicas

    assert tick(0) is None and tick(59) is None
    assert tick(61) == 1


@pytest.mark.parametrize(("active", "replicas"), [(0, 2), (1, 2), (30, 3), (31, 4), (900, 5)])
def test_the_replicas_runs_need_are_within_the_bounds(active: int, replicas: int) -> None:
    assert scaling(low=2, high=5).autoscaled(active) == replicas


def test_autoscaling_needs_max_replicas() -> None:
    with pytest.raises(ValueError, match="activeRunsPerReplica needs maxReplicas"):
        ScalingSpec(active_runs_per_replica=10)


def test_the_window_keeps_only_the_needs_that_can_still_be_the_most() -> None:
    window: list[tuple[float, int]] = []
    for second, active in enumerate([35, 10, 20, 5, 0, 12]):
        autoscale(
            draining(),
            Runs(active=active),
            scaling=scaling(),
            current=4,
            recommended=window,
            now=NOW + second,
        )
    # 4 (35 runs) at 0 s; of the later needs only the last 2 (12 runs, at 5 s): each earlier
    # one is matched or exceeded by a later one, so it can no longer be the window's most
    assert window == [(NOW, 4), (NOW + 5, 2)]


async def test_a_version_goes_to_zero_only_on_counts_read_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass's counts may be seconds old: a run that started since would lose its pod."""
    idle = draining(idle_since="2026-12-01T11:00:00.000Z")  # idle for long
    stale = InFlight(pinned={"dp_1": 1}, unpinned={}, statuses={"dp_1": {"suspended": 1}})
    now = InFlight(
        pinned={"dp_1": 2}, unpinned={}, statuses={"dp_1": {"suspended": 1, "running": 1}}
    )
    applied: list[int] = []

    async def apply(kube: Any, namespace: str, name: str, replicas: int, **_: Any) -> None:
        applied.append(replicas)

    counted: list[InFlight] = []

    async def in_flight(max_age: float | None = None) -> InFlight:
        assert max_age == 0.0
        return counted[-1]

    monkeypatch.setattr(scaler, "apply_replicas", apply)
    monkeypatch.setattr(scaler.kopf, "info", lambda *args, **kwargs: None)
    op: Any = SimpleNamespace(observer=SimpleNamespace(in_flight=in_flight), kube=None)
    body = {"metadata": {"namespace": "ns", "name": "triage"}}
    spec = agent(scaling={"idleAfter": "2s"})
    for current, replicas in ((now, []), (stale, [0])):
        counted.append(current)
        versions = {"abc": idle}
        await scaler.scale(op, body, spec, AgentMemory(), versions, "new", [DEPLOYMENT], stale)
        assert applied == replicas
        assert (versions["abc"].scaled_to_zero_at is None) == (not replicas)


async def test_a_draining_version_whose_id_the_status_lost_is_found_not_retired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Registered, then the status write failed and the spec changed: Restate has it, and its
    runs are pinned to it, so it drains instead of being retired as never registered."""
    retired: list[str] = []

    async def retire(op: Any, body: Any, version: VersionStatus, why: str, **_: Any) -> None:
        retired.append(f"{version.hash}: {why}")

    async def deployments() -> list[dict[str, Any]]:
        ours = restate_metadata("ns", "triage", "abc")
        others = restate_metadata("ns", "other", "xyz")
        return [{"id": "dp_lost", "metadata": ours}, {"id": "dp_other", "metadata": others}]

    async def in_flight(max_age: float | None = None) -> InFlight:
        return InFlight(pinned={"dp_lost": 1}, unpinned={})

    monkeypatch.setattr(supervisor, "retire", retire)
    op: Any = SimpleNamespace(
        observer=SimpleNamespace(in_flight=in_flight),
        restate=SimpleNamespace(deployments=deployments),
    )
    body = {"metadata": {"namespace": "ns", "name": "triage"}}
    mem = AgentMemory()
    mem.synced = True
    since = "2026-12-07T00:00:00Z"
    lost = VersionStatus(hash="abc", state="Draining", draining_since=since)
    never = VersionStatus(hash="def", state="Draining", draining_since=since)
    versions = {"abc": lost, "def": never}
    spec = agent(drain={"delay": "0s", "timeout": "100000h"})
    await supervisor.drain_old(op, body, spec, mem, versions, "new")
    assert retired == ["def: never registered"]
    assert versions["abc"].restate_deployment_id == "dp_lost"
    assert versions["abc"].in_flight == 1

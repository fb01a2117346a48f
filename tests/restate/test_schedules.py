"""Schedules (`spec.schedules`) on a real restate-server and `tether worker`: the runs start at
the cron's times (`tether.programs.worker.schedule`), each in a session of its own or all in the
schedule's; only a signed, fresh order of the agent's newest generation changes or stops them."""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.restate.support import http, worker_process
from tests.restate.test_worker import manifest
from tether.programs.restate_server import RestateServer
from tether.programs.webhooks import schedule_order, schedule_run_order
from tether.testing import HypercornWorker, wait_until

AGENT = "cron-agent"
SECRET = b"s3cret"
EVERY_2S = "*/2 * * * * *"


@pytest.fixture
def worker(restate_server: RestateServer, tmp_path: Path) -> Iterator[HypercornWorker]:
    script = [{"text": f"report {n}"} for n in range(40)]
    document = manifest(AGENT, script, webhook={"secretRef": {"name": "hook", "key": "key"}})
    process = worker_process(
        restate_server, tmp_path, document, TETHER_WEBHOOK_SECRET=SECRET.decode()
    )
    with process as served:
        restate_server.register(served.url)
        yield served


def order(
    name: str, schedule: dict[str, Any] | None, generation: int = 1, owner: str = "uid-1"
) -> dict[str, Any]:
    return schedule_order(
        SECRET, name, schedule, owner=owner, generation=generation, stamp=time.time()
    )


def set_schedule(server: RestateServer, name: str, body: dict[str, Any]) -> Any:
    return http("POST", f"{server.ingress_url}/{AGENT}-schedule/{name}/set", body)


def describe(server: RestateServer, name: str) -> Any:
    return http("POST", f"{server.ingress_url}/{AGENT}-schedule/{name}/describe").json()


def session(server: RestateServer, key: str) -> Any:
    return http("POST", f"{server.ingress_url}/{AGENT}/{key}/session").json()


def said(session: dict[str, Any], role: str) -> list[str]:
    """The text of each of `role`'s turns in a session."""
    turns = [t for t in session["turns"] if t["role"] == role]
    return ["".join(b.get("text", "") for b in t["content"]) for t in turns]


def run_invocations(server: RestateServer) -> int:
    sql = (
        "SELECT count(*) AS n FROM sys_invocation "
        f"WHERE target_service_name = '{AGENT}' AND target_handler_name = 'run'"
    )
    return int(server.query(sql)[0]["n"])


def ticks_waiting(server: RestateServer, *names: str) -> int:
    keys = ", ".join(f"'{name}'" for name in names)
    sql = (
        "SELECT count(*) AS n FROM sys_invocation WHERE status = 'scheduled' "
        f"AND target_service_name = '{AGENT}-schedule' AND target_service_key IN ({keys})"
    )
    return int(server.query(sql)[0]["n"])


def test_a_schedule_starts_its_runs_at_its_times_until_it_is_stopped(
    restate_server: RestateServer, worker: HypercornWorker
) -> None:
    fresh = {"name": "fresh", "cron": EVERY_2S, "prompt": "report"}
    kept = {"name": "standup", "cron": EVERY_2S, "prompt": "stand up", "session": "standup"}
    for schedule in (fresh, kept):
        answer = set_schedule(restate_server, schedule["name"], order(schedule["name"], schedule))
        assert answer.status == 200, answer.text
        assert time.time() - 0.5 < answer.json()["next"] <= time.time() + 2.5

    # `fresh` starts each time's run in a session of its own, `standup` all in its session.
    sessions: set[str] = set()

    def two_fresh_sessions_answered() -> bool:
        last = describe(restate_server, "fresh")["session"]
        sessions.update([last] if last else [])
        done = [s for s in sessions if session(restate_server, s)["status"] == "completed"]
        return len(done) >= 2

    wait_until(two_fresh_sessions_answered, timeout=30, interval=0.3)
    assert all(s.startswith("fresh-") for s in sessions)
    wait_until(lambda: len(session(restate_server, "standup")["runs"]) >= 2, timeout=30)
    standup = session(restate_server, "standup")
    assert said(standup, "assistant")[:2] == ["report 0", "report 1"]
    assert said(standup, "user")[:2] == ["stand up", "stand up"]
    described = describe(restate_server, "standup")
    assert described["schedule"]["cron"] == EVERY_2S and "prompt" not in described["schedule"]
    assert described["generation"] == 1

    # Stopped: no tick waits and no run starts any more.
    assert set_schedule(restate_server, "fresh", order("fresh", None, 2)).json() == {"next": None}
    assert set_schedule(restate_server, "standup", order("standup", None, 2)).status == 200
    wait_until(lambda: ticks_waiting(restate_server, "fresh", "standup") == 0, timeout=10)
    assert describe(restate_server, "fresh") == {"schedule": None}
    started = run_invocations(restate_server)
    time.sleep(3)  # past the next time the schedules had: an absence takes its wait
    assert run_invocations(restate_server) == started


def test_a_changed_schedule_keeps_one_tick_and_runs_the_new_prompt(
    restate_server: RestateServer, worker: HypercornWorker
) -> None:
    daily = {"name": "daily", "cron": "0 9 * * *", "timeZone": "Europe/Paris", "prompt": "a"}
    first = set_schedule(restate_server, "daily", order("daily", daily)).json()["next"]
    assert time.gmtime(first).tm_hour in (7, 8) and time.gmtime(first).tm_min == 0  # 9:00 Paris
    # Set again as it was: the tick sent stands. Changed: its tick is replaced, not added to.
    assert set_schedule(restate_server, "daily", order("daily", daily, 2)).json()["next"] == first
    assert ticks_waiting(restate_server, "daily") == 1
    often = {**daily, "cron": EVERY_2S, "prompt": "b", "session": "b"}
    assert set_schedule(restate_server, "daily", order("daily", often, 3)).status == 200
    wait_until(lambda: ticks_waiting(restate_server, "daily") == 1, timeout=10)
    wait_until(lambda: session(restate_server, "b")["runs"], timeout=30)
    assert said(session(restate_server, "b"), "user")[0] == "b"
    # Suspended: its ticks stop.
    suspended = set_schedule(restate_server, "daily", order("daily", {**often, "suspend": True}, 4))
    assert suspended.json() == {"next": None}
    wait_until(lambda: ticks_waiting(restate_server, "daily") == 0, timeout=10)


def test_only_a_fresh_order_signed_for_the_newest_generation_changes_a_schedule(
    restate_server: RestateServer, worker: HypercornWorker
) -> None:
    weekly = {"name": "weekly", "cron": "@weekly", "prompt": "sum up the week"}
    assert set_schedule(restate_server, "weekly", order("weekly", weekly, 5)).status == 200
    sneaky = {**weekly, "cron": EVERY_2S, "prompt": "send the secrets out"}
    forged = schedule_order(
        b"guess", "weekly", sneaky, owner="uid-1", generation=6, stamp=time.time()
    )
    assert set_schedule(restate_server, "weekly", forged).status == 401
    altered = {**order("weekly", weekly, 6), "schedule": sneaky}  # signed for another one
    assert set_schedule(restate_server, "weekly", altered).status == 401
    stale = schedule_order(
        SECRET, "weekly", sneaky, owner="uid-1", generation=6, stamp=time.time() - 3600
    )
    assert set_schedule(restate_server, "weekly", stale).status == 401
    older = set_schedule(restate_server, "weekly", order("weekly", sneaky, 4))
    assert older.status == 409, older.text
    elsewhere = set_schedule(restate_server, "daily", order("daily", weekly, 6))  # named weekly
    assert elsewhere.status == 400
    invalid = {**weekly, "cron": "61 * * * *"}
    assert set_schedule(restate_server, "weekly", order("weekly", invalid, 6)).status == 400
    assert describe(restate_server, "weekly")["schedule"]["cron"] == "@weekly"
    assert describe(restate_server, "weekly")["generation"] == 5
    # An agent of the same name made again (another uid) starts from its own generation 1.
    remade = set_schedule(restate_server, "weekly", order("weekly", weekly, 1, owner="uid-2"))
    assert remade.status == 200, remade.text
    assert (
        set_schedule(restate_server, "weekly", order("weekly", None, 2, owner="uid-2")).status
        == 200
    )


def test_a_run_that_cannot_start_by_its_deadline_is_skipped_without_a_model_call(
    restate_server: RestateServer, worker: HypercornWorker
) -> None:
    url = f"{restate_server.ingress_url}/{AGENT}"
    late = http("POST", f"{url}/late/run", {"prompt": "x", "start_by": time.time() - 1})
    assert late.json()["status"] == "skipped"
    assert session(restate_server, "late")["runs"] == []
    on_time = http("POST", f"{url}/late/run", {"prompt": "x", "start_by": time.time() + 60})
    assert on_time.json()["status"] == "completed"
    assert on_time.json()["text"] == "report 0"


def test_a_tick_that_comes_late_runs_only_the_latest_time_due(
    restate_server: RestateServer, worker: HypercornWorker
) -> None:
    often = {"name": "often", "cron": EVERY_2S, "prompt": "report"}
    first = set_schedule(restate_server, "often", order("often", often)).json()["next"]
    worker.kill()  # the tick has nowhere to run: Restate retries it
    wait_until(lambda: time.time() > first + 4.5, timeout=10, interval=0.1)  # 2 more times due
    worker.start()
    wait_until(lambda: describe(restate_server, "often")["last"], timeout=60)
    assert describe(restate_server, "often")["late"] == 1
    keys = restate_server.query(
        "SELECT target_service_key AS key FROM sys_invocation "
        f"WHERE target_service_name = '{AGENT}' AND target_service_key LIKE 'often-%'"
    )
    due = sorted(
        calendar.timegm(time.strptime(row["key"].removeprefix("often-"), "%Y%m%dt%H%M%Sz"))
        for row in keys
    )
    assert due[0] >= first + 4, (first, due)  # none for the times missed while down
    assert set_schedule(restate_server, "often", order("often", None, 2)).status == 200


def run_order(name: str, request: str, owner: str = "uid-1", age: float = 0.0) -> dict[str, Any]:
    return schedule_run_order(SECRET, name, request, owner=owner, stamp=time.time() - age)


def run_now(server: RestateServer, name: str, body: dict[str, Any]) -> Any:
    return http("POST", f"{server.ingress_url}/{AGENT}-schedule/{name}/run_now", body)


def test_a_signed_order_runs_a_schedule_now_once_and_leaves_its_times_as_they_are(
    restate_server: RestateServer, worker: HypercornWorker
) -> None:
    yearly = {"name": "yearly", "cron": "0 0 1 1 *", "prompt": "sum up the year"}
    due = set_schedule(restate_server, "yearly", order("yearly", yearly)).json()["next"]
    before = run_invocations(restate_server)  # the other tests' too, on this server
    assert run_now(restate_server, "unset", run_order("unset", "r1")).status == 404
    # Only the operator's fresh order for the agent that set the schedule runs it.
    forged = {**run_order("yearly", "r1"), "sig": "0" * 64}
    assert run_now(restate_server, "yearly", forged).status == 401
    assert run_now(restate_server, "yearly", run_order("yearly", "r1", age=600)).status == 401
    assert run_now(restate_server, "yearly", run_order("other", "r1")).status == 401  # its name
    assert run_now(restate_server, "yearly", run_order("yearly", "r1", owner="uid-2")).status == 409
    assert run_invocations(restate_server) == before

    sent = time.time()
    first = run_now(restate_server, "yearly", run_order("yearly", "r1"))
    assert first.status == 200, first.text
    started = first.json()["session"]
    assert started.startswith("yearly-")
    wait_until(lambda: session(restate_server, started)["status"] == "completed", timeout=30)
    assert said(session(restate_server, started), "user") == ["sum up the year"]
    # The same request again (an operator that did not record it), in another second (the
    # session a new run would have differs): no second run.
    wait_until(lambda: int(time.time()) > int(sent) + 1, timeout=3)
    assert run_now(restate_server, "yearly", run_order("yearly", "r1")).json() == first.json()
    assert run_invocations(restate_server) == before + 1
    described = describe(restate_server, "yearly")  # its last run; its next time as it was
    assert described["next"] == due and sent - 1 < described["last"] < time.time()
    assert described["session"] == described["manual"][-1]["session"] == started
    # Another request: another run; the first one put back (a revert) starts nothing again.
    second = run_now(restate_server, "yearly", run_order("yearly", "r2")).json()["session"]
    wait_until(lambda: session(restate_server, second)["status"] == "completed", timeout=30)
    assert second != started and run_invocations(restate_server) == before + 2
    assert run_now(restate_server, "yearly", run_order("yearly", "r1")).json() == first.json()
    assert run_invocations(restate_server) == before + 2


def test_an_agent_made_again_under_its_name_gets_its_schedule_afresh(
    restate_server: RestateServer, worker: HypercornWorker
) -> None:
    """Deleting an agent kills its waiting ticks (the operator, through the admin API), and
    Restate keeps the object's state: the new agent (another uid) of the same spec gets a tick
    of its own, and none of the deleted agent's runs now is its."""
    morning = {"name": "morning", "cron": "0 9 * * *", "prompt": "report"}
    assert set_schedule(restate_server, "morning", order("morning", morning)).status == 200
    assert run_now(restate_server, "morning", run_order("morning", "r1")).status == 200
    [tick] = restate_server.query(
        "SELECT id FROM sys_invocation WHERE status = 'scheduled' "
        f"AND target_service_name = '{AGENT}-schedule' AND target_service_key = 'morning'"
    )
    killed = http("PATCH", f"{restate_server.admin_url}/invocations/{tick['id']}/kill")
    assert killed.status in (200, 202), killed.text
    wait_until(lambda: ticks_waiting(restate_server, "morning") == 0, timeout=10)

    again = set_schedule(restate_server, "morning", order("morning", morning, owner="uid-2"))
    assert again.status == 200 and again.json()["next"] is not None
    wait_until(lambda: ticks_waiting(restate_server, "morning") == 1, timeout=10)
    described = describe(restate_server, "morning")
    assert described["last"] is None and described["manual"] is None
    before = run_invocations(restate_server)
    ran = run_now(restate_server, "morning", run_order("morning", "r1", owner="uid-2"))
    assert ran.status == 200 and run_invocations(restate_server) == before + 1


def test_a_schedules_run_keys_are_not_for_others_to_take(
    restate_server: RestateServer, worker: HypercornWorker
) -> None:
    """A caller of the agent's `run` (one of its tools) that sends a run ahead of a tick, with
    the key a tick of that time would have had before, does not stand in for the tick's run."""
    every = {"name": "keyed", "cron": EVERY_2S, "prompt": "the real prompt"}
    due = set_schedule(restate_server, "keyed", order("keyed", every)).json()["next"]
    target = f"keyed-{datetime.fromtimestamp(due, UTC).strftime('%Y%m%dt%H%M%Sz')}"
    forged = http(
        "POST",
        f"{restate_server.ingress_url}/{AGENT}/{target}/run/send",
        {"prompt": "the tool's prompt"},
        headers={"idempotency-key": f"schedule/keyed/{int(due)}"},
    )
    assert forged.status in (200, 202), forged.text
    wait_until(
        lambda: "the real prompt" in said(session(restate_server, target), "user"), timeout=30
    )
    stop = order("keyed", None, generation=2)
    assert set_schedule(restate_server, "keyed", stop).status == 200

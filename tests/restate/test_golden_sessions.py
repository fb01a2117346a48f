"""What an agent keeps in Restate outlives the versions that wrote it: a session's state stays
across every rollout and its next run reads it with the new code; a run parked for a person
waits through rollouts, and the new sidecar lists and answers its call from the index the old
one kept. Each golden (`tests/golden/*.json`, see `tests/golden/record.py`) is such state as a
released Tether left it, written into a real restate-server through its admin API."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tether.programs.local_http import request_json
from tether.programs.restate_server import RestateServer
from tether.spec import restate_services
from tether.testing import AgentHarness, wait_until

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def goldens(recipe: str) -> list[Path]:
    return sorted(GOLDEN.glob(f"*-{recipe}.json"))


def restore(server: RestateServer, service: str, key: str, state: dict[str, str]) -> None:
    """Write `state` as the object's whole state (`POST /services/<service>/state`), and wait
    until Restate has applied it (it answers 202 and applies it asynchronously)."""
    new_state = {name: list(value.encode()) for name, value in state.items()}
    response = request_json(
        "POST",
        f"{server.admin_url}/services/{service}/state",
        {"object_key": key, "new_state": new_state},
        timeout=30.0,
    )
    assert response.status == 202, response.body

    def stored() -> bool:
        rows = server.query(
            f"SELECT key FROM state WHERE service_name = '{service}' AND service_key = '{key}'"
        )
        return {row["key"] for row in rows} == set(state)

    wait_until(stored, what=f"the restored state of {service}/{key}")


@contextlib.contextmanager
def restored(golden: Path, workspace: Path) -> Iterator[tuple[AgentHarness, dict[str, Any]]]:
    """The golden's agent on a new stack, its objects' state restored; what the golden expects."""
    recorded: dict[str, Any] = json.loads(golden.read_text())
    manifest = yaml.safe_load(golden.with_suffix(".yaml").read_text())
    with AgentHarness(manifest, workspace=workspace) as agent:
        for service, objects in recorded["state"].items():
            for key, state in objects.items():
                restore(agent.restate.server, service, key, state)
        yield agent, recorded["expected"]


@pytest.mark.parametrize(
    "recipe",
    [
        "restate-session-of-two-runs",
        "restate-parked-for-an-approval",
        "restate-parked-for-more-budget",
    ],
)
def test_there_are_goldens(recipe: str) -> None:
    assert goldens(recipe), f"no golden of {recipe} in {GOLDEN}"


@pytest.mark.parametrize("golden", goldens("restate-session-of-two-runs"), ids=lambda p: p.stem)
def test_a_session_an_earlier_version_wrote_goes_on(tmp_path: Path, golden: Path) -> None:
    with restored(golden, tmp_path) as (agent, expected):
        key, following = expected["session"], expected["next_run"]
        before = agent.session(key)
        assert before is not None
        assert (len(before.turns), len(before.runs)) == (expected["turns"], expected["runs"])

        # The scripted model answers by the session's assistant turns: the run counted them all,
        # and its answer's boundary took the message waiting in the inbox (a follow-up turn).
        result = agent.run(key, following["prompt"])
        assert (result["status"], result["text"]) == ("completed", following["answer"]), result
        after = agent.session(key)
        assert after is not None
        assert after.turns[: len(before.turns)] == before.turns
        new = after.turns[len(before.turns) :]
        assert [t.role for t in new] == ["user", "assistant", "user", "assistant"]
        assert new[2].content == [{"type": "text", "text": expected["posted"]}]
        assert after.runs[: len(before.runs)] == before.runs
        assert [r.status for r in after.runs] == ["completed"] * (len(before.runs) + 1)
        inbox = restate_services(agent.agent).inbox
        assert (
            agent.restate.server.query(
                f"SELECT key FROM state WHERE service_name = '{inbox}' AND service_key = '{key}' "
                "AND key = 'messages'"
            )
            == []
        )  # taken once


@pytest.mark.parametrize("golden", goldens("restate-parked-for-an-approval"), ids=lambda p: p.stem)
def test_a_call_parked_under_an_earlier_version_is_listed_and_answered(
    tmp_path: Path, golden: Path
) -> None:
    with restored(golden, tmp_path) as (agent, expected):
        [call] = agent.parked()
        assert {k: call[k] for k in expected["parked"]} == expected["parked"]
        session = agent.session(expected["session"])
        assert session is not None
        [record] = session.runs
        assert record.status == "running"
        # Approved through the new sidecar: the index it keeps takes the old record's answer.
        agent.approve(call)
        index = restate_services(agent.agent).parked
        [answer] = wait_until(
            lambda: agent.restate.server.query(
                f"SELECT id FROM sys_invocation WHERE target_service_name = '{index}' "
                "AND target_handler_name = 'answer' AND status = 'completed'"
            ),
            what="the index's answer",
        )
        assert agent.restate.result(answer["id"]) == {"answered": True}


@pytest.mark.parametrize("golden", goldens("restate-parked-for-more-budget"), ids=lambda p: p.stem)
def test_a_run_parked_for_more_budget_keeps_its_ledger_and_is_answered(
    tmp_path: Path, golden: Path
) -> None:
    with restored(golden, tmp_path) as (agent, expected):
        [call] = agent.parked()
        assert {k: call[k] for k in expected["parked"]} == expected["parked"]
        # The new worker reads the ledger the old one kept, as it was.
        ledger = expected["ledger"]
        status = agent.restate.call(f"{agent.agent}-budget/{ledger['key']}/status")
        assert status == ledger["status"]
        agent.approve(call)
        index = restate_services(agent.agent).parked
        wait_until(
            lambda: agent.restate.server.query(
                f"SELECT id FROM sys_invocation WHERE target_service_name = '{index}' "
                "AND target_handler_name = 'answer' AND status = 'completed'"
            ),
            what="the index's answer",
        )

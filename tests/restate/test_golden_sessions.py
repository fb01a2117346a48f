"""A session outlives the worker versions that wrote it: its state stays in Restate across every
rollout, and the next run reads it with the new code. Each golden (`tests/golden/*.json`, see
`tests/golden/record.py`) is a session's state as a released Tether left it, and its inbox's
(a message waiting), written into a real restate-server through its admin API; a run on it must
see the session whole, take the message, and go on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tether.programs.local_http import request_json
from tether.programs.restate_server import RestateServer
from tether.spec import restate_services
from tether.testing import AgentHarness, wait_until

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SESSIONS = sorted(GOLDEN.glob("*-restate-session-*.json"))


def restore(server: RestateServer, agent: str, session: str, state: dict[str, str]) -> None:
    """Write `state` as the object's whole state (`POST /services/<agent>/state`), and wait until
    Restate has applied it (it answers 202 and applies it asynchronously)."""
    new_state = {key: list(value.encode()) for key, value in state.items()}
    response = request_json(
        "POST",
        f"{server.admin_url}/services/{agent}/state",
        {"object_key": session, "new_state": new_state},
        timeout=30.0,
    )
    assert response.status == 202, response.body

    def stored() -> bool:
        rows = server.query(
            f"SELECT key FROM state WHERE service_name = '{agent}' AND service_key = '{session}'"
        )
        return {row["key"] for row in rows} == set(state)

    wait_until(stored, what="the restored state")


def test_there_is_a_golden_session() -> None:
    assert SESSIONS, f"no golden session in {GOLDEN}"


@pytest.mark.parametrize("golden", SESSIONS, ids=lambda p: p.stem)
def test_a_session_an_earlier_version_wrote_goes_on(tmp_path: Path, golden: Path) -> None:
    recorded: dict[str, Any] = json.loads(golden.read_text())
    manifest = yaml.safe_load(golden.with_suffix(".yaml").read_text())
    agent_name, key, following = recorded["agent"], recorded["session"], recorded["next_run"]
    with AgentHarness(manifest, workspace=tmp_path) as agent:
        server = agent.restate.server
        for service, state in recorded["state"].items():
            restore(server, service, key, state)
        before = agent.session(key)
        assert before is not None
        assert (len(before.turns), len(before.runs)) == (recorded["turns"], recorded["runs"])

        # The scripted model answers by the session's assistant turns: the run counted them all,
        # and its answer's boundary took the message waiting in the inbox (a follow-up turn).
        result = agent.run(key, following["prompt"])
        assert (result["status"], result["text"]) == ("completed", following["answer"]), result
        after = agent.session(key)
        assert after is not None
        assert after.turns[: len(before.turns)] == before.turns
        new = after.turns[len(before.turns) :]
        assert [t.role for t in new] == ["user", "assistant", "user", "assistant"]
        assert new[2].content == [{"type": "text", "text": recorded["posted"]}]
        assert after.runs[: len(before.runs)] == before.runs
        assert [r.status for r in after.runs] == ["completed"] * (len(before.runs) + 1)
        inbox = restate_services(agent_name).inbox
        assert (
            server.query(
                f"SELECT key FROM state WHERE service_name = '{inbox}' AND service_key = '{key}' "
                "AND key = 'messages'"
            )
            == []
        )  # taken once

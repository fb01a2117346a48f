"""A long session on a real stack (restate-server, a worker process, its sidecar): with tail
compaction a run reads the turns its model can see, not the whole session, and never lists the
object's keys (that compaction of them is compaction of the whole session:
`test_restate_session_store`), and what it reads came with the invocation: Restate sends state
up to its eager limit shortest key first, then in byte order, and the keys are named for it."""

from __future__ import annotations

from typing import Any

from tether.testing import AgentHarness

AGENT = "long-session"
RUNS = 200
PROMPT = "tell me more " * 20


def manifest(context_window: int) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": AGENT},
        "spec": {
            "model": {
                "provider": "scripted",
                "name": "s",
                "contextWindow": context_window,
                "script": [{"text": f"answer {n}"} for n in range(RUNS + 2)],
            },
            "behavior": {"compactStrategy": "tail"},
        },
    }


def quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def test_a_run_reads_the_turns_its_model_sees_not_the_whole_session() -> None:
    with AgentHarness(manifest(context_window=1000)) as agent:
        for n in range(RUNS):
            assert agent.run("long", f"{n}: {PROMPT}")["text"] == f"answer {n}"
        invocation = agent.start_run("long", "and now?")
        result = agent.result(invocation)
        # the scripted model picks its answer by the session's assistant turns, which the
        # run counts without reading them
        assert result["status"] == "completed" and result["text"] == f"answer {RUNS}"

        server = agent.restate.server
        state = server.query(
            "SELECT SUM(value_length) AS bytes FROM state "
            f"WHERE service_name = {quoted(AGENT)} AND service_key = 'long'"
        )[0]["bytes"]
        journal = server.query(
            f"SELECT entry_type, raw_length FROM sys_journal WHERE id = {quoted(invocation)}"
        )
        # the state reads (with the values read) among the run's journal entries
        read = sum(
            int(e["raw_length"])
            for e in journal
            if "GetEagerState" in str(e["entry_type"]) or "GetLazyState" in str(e["entry_type"])
        )
        assert int(state) > 200_000
        assert read < int(state) / 10, (read, state)
        assert not [e for e in journal if "StateKeys" in str(e["entry_type"])]
        # the state is over the eager limit (200 KB > 64 KiB), yet no read waited for Restate
        assert not [e for e in journal if "GetLazyState" in str(e["entry_type"])], journal

        session = agent.session("long")
        assert session is not None and len(session.turns) == 2 * RUNS + 2
        assert [r.status for r in session.runs] == ["completed"] * (RUNS + 1)

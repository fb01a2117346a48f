"""The SQLite runtime and stores, in process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import RecordingProvider, calls
from tether import create_agent, tool
from tether.durable import JournalMismatchError, RunLeasedError, journal_steps, sqlite_runtime
from tether.session import create_session, load_session, sqlite_store


@tool(replay="safe")
async def noop() -> str:
    """Noop."""
    return "ok"


async def run_once(path: Path, script: list[dict[str, object]], run_id: str = "r") -> object:
    with sqlite_runtime(path, run_id) as durable:
        store = durable.stores.session
        assert store is not None
        session = await load_session(store, "s") or await create_session(id="s", store=store)
        provider = RecordingProvider(script)
        agent = create_agent(provider=provider, tools=[noop], durable=durable, session=session)
        stats = await agent.run("go")
        durable.close(stats.status)
        return stats, provider, durable.counters


async def test_a_second_open_of_a_finished_run_replays_everything(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    script = [calls("noop"), {"text": "done"}]
    first, _, _ = await run_once(db, script)  # type: ignore[misc]
    second, provider, counters = await run_once(db, script)  # type: ignore[misc]
    assert second.to_json() == first.to_json()
    assert provider.requests == [] and counters.live.total() == 0


async def test_the_session_is_committed_with_the_journal(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await run_once(db, [calls("noop"), {"text": "done"}])
    session = await load_session(sqlite_store(db), "s")
    assert session is not None
    assert [t.role for t in session.turns] == ["user", "assistant", "user", "assistant"]
    assert session.runs[0].status == "completed"
    assert session.runs[0].stats is not None and session.runs[0].stats["turns"] == 2


async def test_a_new_run_continues_the_session(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await run_once(db, [{"text": "one"}, {"text": "two"}], run_id="r1")
    stats, _, _ = await run_once(db, [{"text": "one"}, {"text": "two"}], run_id="r2")  # type: ignore[misc]
    assert stats.text == "two"
    session = await load_session(sqlite_store(db), "s")
    assert session is not None and len(session.turns) == 4 and len(session.runs) == 2


def test_a_run_held_by_a_live_process_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from tether.durable import sqlite_runtime\n"
            f"rt = sqlite_runtime({str(db)!r}, 'busy')\n"
            "print('held', flush=True)\n"
            "sys.stdin.readline()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLeasedError, match=r"run 'busy' is already running in pid \d+"):
            sqlite_runtime(db, "busy")
        sqlite_runtime(db, "other").close()  # other runs in the same file are free
    finally:
        holder.kill()
        holder.wait()
    sqlite_runtime(db, "busy").close()  # a dead holder releases the run at once


async def test_a_changed_program_fails_with_a_mismatch(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await run_once(db, [calls("noop"), {"text": "done"}])
    with sqlite_runtime(db, "r") as durable:
        store = durable.stores.session
        assert store is not None
        # This program forgot to load the session: the first step differs.
        agent = create_agent(provider=RecordingProvider([]), durable=durable)
        with pytest.raises(JournalMismatchError, match="step 0"):
            await agent.run("go")


async def test_steps_are_committed_in_order(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await run_once(db, [calls("noop"), {"text": "done"}])
    names = [name for _, _, _, name in journal_steps(db, "r")]
    assert names[0] == "session-load:s"
    assert names.index("model:0:0") < names.index("tool:call_0_0") < names.index("model:1:0")
    assert names[-1] == "model:1:0"  # the answer's step: its time is the run's end


async def test_a_standalone_store_heals_interrupted_tool_calls(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "s.db")
    session = await create_session(id="s", store=store)
    from tether.session import SessionTurn

    await session.append_turns(
        [
            SessionTurn(
                id="t1", role="user", content=[{"type": "text", "text": "hi"}], created_at=1.0
            ),
            SessionTurn(
                id="t2",
                role="assistant",
                content=[
                    {"type": "tool_use", "id": "a", "name": "x", "input": {}},
                    {"type": "tool_use", "id": "b", "name": "x", "input": {}},
                ],
                created_at=2.0,
            ),
        ]
    )
    reloaded = await load_session(store, "s")
    assert reloaded is not None
    assert await reloaded.heal_interrupted_tool_calls() == 2
    healed = await load_session(store, "s")
    assert healed is not None
    results = healed.turns[2].content
    assert [b["tool_use_id"] for b in results if b["type"] == "tool_result"] == ["a", "b"]
    assert all(b.get("is_error") for b in results if b["type"] == "tool_result")
    assert await healed.heal_interrupted_tool_calls() == 0

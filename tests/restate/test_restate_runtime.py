"""`restate_runtime` on the real restate-server: the reference example works as written."""

from __future__ import annotations

import gc
import os
import uuid
import weakref
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.restate.support import ServedApp, attach, http, wait_until
from tether import jsoncodec
from tether.messages import text_block
from tether.programs.restate_server import RestateServer
from tether.restate import restate_runtime, restate_session_store
from tether.session.types import SessionRun, SessionTurn

ALL_CALLS = [f"call_{t}_{i}" for t, n in enumerate([1, 1, 3, 1, 2, 1, 1]) for i in range(n)]


def call(server: RestateServer, handler: str, key: str, payload: Any = None) -> Any:
    url = f"{server.ingress_url}/CrashAgent/{key}/{handler}"
    response = http("POST", url, payload)
    assert response.status == 200, response.text
    return response.json()


def check_transcript(turns: list[dict[str, Any]]) -> None:
    seen: list[str] = []
    for i, turn in enumerate(turns):
        uses = [b["id"] for b in turn["content"] if b["type"] == "tool_use"]
        if uses:
            results = [b["tool_use_id"] for b in turns[i + 1]["content"]]
            assert results == uses
            seen += uses
    assert seen == ALL_CALLS


def test_the_reference_example_runs_on_a_real_server(serve_app: Any, tmp_path: Path) -> None:
    served: ServedApp = serve_app("agent_service")
    effects = tmp_path / "effects"
    key = f"s-{uuid.uuid4().hex[:8]}"
    result = call(served.server, "run", key, {"effects": str(effects)})
    assert result["status"] == "completed" and result["turns"] == 8
    assert result["tool_calls"] == len(ALL_CALLS)
    lines = effects.read_text().splitlines()
    assert Counter(line.split()[1] for line in lines) == Counter(ALL_CALLS)
    check_transcript(call(served.server, "transcript", key))


def test_every_await_suspending_gives_the_same_run(
    serve_app: Any, restate_server_always_suspend: RestateServer, tmp_path: Path
) -> None:
    """The determinism check: with the inactivity timeout at 0 every await suspends and the
    handler replays its journal from the top; a non-deterministic step would fail the run."""
    served: ServedApp = serve_app("agent_service", server=restate_server_always_suspend)
    effects = tmp_path / "effects"
    key = f"d-{uuid.uuid4().hex[:8]}"
    result = call(served.server, "run", key, {"effects": str(effects)})
    assert result["status"] == "completed"
    assert result["replayed"], "the forced suspensions should have replayed steps"
    lines = effects.read_text().splitlines()
    assert Counter(line.split()[1] for line in lines) == Counter(ALL_CALLS)
    check_transcript(call(served.server, "transcript", key))


def test_tools_holding_every_thread_of_the_pool_stall_no_other_run(
    serve_app: Any, tmp_path: Path
) -> None:
    """Tool bodies blocked in threads (`asyncio.to_thread`) fill the event loop's default
    executor, where the SDK runs `ctx.time()`'s action. The runtime's clock reads do not use it
    (`journaled_time`), so a run that needs no thread goes on while they are held."""
    served: ServedApp = serve_app("agent_service")
    server = served.server
    gate = tmp_path / "gate"
    hold = {"path": str(gate), "calls": ["call_0_0"]}
    threads = min(32, (os.cpu_count() or 1) + 4)  # the default executor's size
    held = []
    for i in range(threads):
        effects = tmp_path / f"held-{i}"
        url = f"{server.ingress_url}/CrashAgent/held-{i}-{uuid.uuid4().hex[:6]}/run/send"
        response = http("POST", url, {"effects": str(effects), "tool_gate": hold})
        assert response.status == 202, response.text
        held.append((response.json()["invocationId"], effects))
    wait_until(
        lambda: all(e.exists() and e.read_text().strip() for _, e in held),
        timeout=120,
        what="every held body to take its thread",
    )
    free = tmp_path / "free"
    url = f"{server.ingress_url}/CrashAgent/free-{uuid.uuid4().hex[:6]}/run/send"
    response = http("POST", url, {"effects": str(free)})
    assert response.status == 202, response.text
    invocation_id = response.json()["invocationId"]

    def done(invocation: str) -> bool:
        rows = server.query(f"SELECT status FROM sys_invocation WHERE id = '{invocation}'")
        return bool(rows) and rows[0]["status"] == "completed"

    try:
        wait_until(lambda: done(invocation_id), timeout=60, what="the run that holds no thread")
        assert not any(done(i) for i, _ in held)
    finally:
        gate.touch()
    wait_until(lambda: all(done(i) for i, _ in held), timeout=120, what="the held runs")


def writes_per_turn(server: RestateServer, invocation_id: str) -> list[tuple[int, bool]]:
    """For each stretch of the journal from one model step to the next: its state writes, and
    whether it parked or called another service (each of which sends the writes held so far)."""
    rows = server.query(
        f"SELECT entry_type, name FROM sys_journal WHERE id = '{invocation_id}' ORDER BY index"
    )
    turns: list[tuple[int, bool]] = []
    for row in rows:
        kind, name = row["entry_type"], row.get("name") or ""
        if kind == "Command: Run" and name.startswith("model:"):
            turns.append((0, False))
        elif turns and kind == "Command: SetState":
            turns[-1] = (turns[-1][0] + 1, turns[-1][1])
        elif turns and (kind == "Command: Call" or "-notify:" in name):
            turns[-1] = (turns[-1][0], True)
    return turns


def start_run(server: RestateServer, key: str, payload: dict[str, Any]) -> str:
    """Send `CrashAgent/<key>/run` without waiting for it; its invocation id."""
    response = http("POST", f"{server.ingress_url}/CrashAgent/{key}/run/send", payload)
    assert response.status == 202, response.text
    invocation: str = response.json()["invocationId"]
    return invocation


def run_to_the_end(server: RestateServer, key: str, payload: dict[str, Any]) -> str:
    invocation = start_run(server, key, payload)
    assert attach(server.ingress_url, invocation, timeout=120)["status"] == "completed"
    return invocation


def test_quick_turns_share_their_writes_and_a_slow_turn_is_stored_before_the_next_model_call(
    serve_app: Any, tmp_path: Path
) -> None:
    """Held writes go before a model call once the steps since they last went span
    `checkpoint_every_ms` (500 ms): quick turns are stored together at the run's end, a turn
    whose tools take 0.6 s is stored before the next model call, as each turn was before."""
    server = serve_app("agent_service").server
    quick = run_to_the_end(server, f"q-{uuid.uuid4().hex[:8]}", {"effects": str(tmp_path / "q")})
    turns = writes_per_turn(server, quick)
    assert len(turns) == 8 and all(writes == 0 for writes, _ in turns[:-1]), turns
    # the end: the head (the meta and the tails), and a segment each the turns and the events
    # sealed on the way (16 records)
    assert 1 <= turns[-1][0] <= 3, turns
    slow = run_to_the_end(
        server, f"s-{uuid.uuid4().hex[:8]}", {"effects": str(tmp_path / "s"), "tool_seconds": 0.6}
    )
    turns = writes_per_turn(server, slow)
    # each turn: the head (and a segment when one seals)
    assert len(turns) == 8 and all(1 <= writes <= 3 for writes, _ in turns[:-1]), turns


def test_a_turn_stores_the_head_once_and_a_parked_run_has_stored_its_turns(
    serve_app: Any, tmp_path: Path
) -> None:
    """The stores' writes are held back and sent together before a model step: a turn
    rewrites the head (the session's meta and tails, the event log's tail) at most once,
    however often the loop appends to them. Before a park they go out too, so a shared handler
    shows the parked call."""
    served: ServedApp = serve_app("agent_service")
    server = served.server
    effects = tmp_path / "effects"
    key = f"w-{uuid.uuid4().hex[:8]}"
    invocation = start_run(server, key, {"effects": str(effects), "matrix": True})

    def parked_line() -> str | None:
        lines = [x for x in effects.read_text().splitlines() if x.startswith("awakeable ")]
        return lines[0] if lines else None

    _, call_id, awakeable = wait_until(parked_line, what="the approval's park").split()

    def shows_the_parked_call() -> bool:
        uses = [b.get("id") for t in call(server, "transcript", key) for b in t["content"]]
        return call_id in uses

    wait_until(shows_the_parked_call, what="the parked call in the stored session", timeout=20)
    resolve = f"{server.ingress_url}/restate/awakeables/{awakeable}/resolve"
    assert http("POST", resolve, {"answer": "yes", "id": awakeable}).status in (200, 202)
    result = attach(server.ingress_url, invocation, timeout=120)
    assert result["status"] == "completed", result
    # per model step: the head (the session's meta and tails, the event log's tail), once,
    # however often the loop appended; a turn that waits sends it before the wait too, and a
    # spawn adds the child's run
    turns = writes_per_turn(server, invocation)
    assert len(turns) == result["turns"] and any(waited for _, waited in turns), turns
    assert all(writes <= (3 if waited else 1) for writes, waited in turns[:-1]), turns
    # A new session reads its state once (no head yet) and lists its keys once (nothing of an
    # older layout to move), and the run's end is the answer's journaled time, not a step.
    rows = server.query(
        f"SELECT index, entry_type, name FROM sys_journal WHERE id = '{invocation}'"
    )
    kinds = [r["entry_type"] for r in rows]
    assert sum("StateKeys" in k for k in kinds) == 1, rows
    assert sum(k in ("Command: GetEagerState", "Command: GetLazyState") for k in kinds) == 1, rows
    assert not [r for r in rows if r.get("name") == "run:end"], rows
    # The session's creation and the run's start read the clock once: no step between them.
    names = [r.get("name") or "" for r in sorted(rows, key=lambda r: int(r["index"]))]
    before_the_first_step = names[: next(i for i, n in enumerate(names) if n.startswith("model:"))]
    assert before_the_first_step.count("timestamp") == 1, names


def test_a_session_an_older_version_wrote_is_read_and_moved_into_the_head(
    serve_app: Any, tmp_path: Path
) -> None:
    """Before the head, the session's meta and the tails of its turns, runs and events had keys
    of their own. Such a session reads back whole, lazily too, and its next run moves them into
    the head: the old keys go, nothing is lost, the events go on counting."""
    server = serve_app("agent_service").server
    key = f"old-{uuid.uuid4().hex[:8]}"
    turns = [
        SessionTurn(id=f"old{i}", role="user", content=[text_block(f"note {i}")], created_at=i)
        for i in range(3)
    ]
    runs = [SessionRun(id="r-old", status="completed", started_at=0.0)]
    events = [{"type": "note", "id": str(i + 1)} for i in range(3)]

    def tail(records: list[Any]) -> str:
        return jsoncodec.dumps({"n": 0, "first": 0, "marked": 0, "v": records}).decode()

    meta = {"id": key, "created_at": 0.0, "metadata": {}, "layout": 4}
    older = {
        "tether:session": jsoncodec.dumps(meta).decode(),
        "tether:turns/tail": tail([t.to_json() for t in turns]),
        "tether:run-records/tail": tail([r.to_json() for r in runs]),
        "tether:events/tail": tail(events),
    }
    call(server, "seed_state", key, older)
    before = call(server, "stored", key)
    assert before["turns"] == [t.to_json() for t in turns] and before["events"] == events
    assert before["runs"] == [r.to_json() for r in runs]

    run_to_the_end(server, key, {"effects": str(tmp_path / "effects")})
    after = call(server, "stored", key)
    assert after["turns"][:3] == before["turns"] and len(after["turns"]) > 3
    assert after["runs"][0] == before["runs"][0] and after["runs"][1]["status"] == "completed"
    assert after["events"][:3] == events
    assert [int(e["id"]) for e in after["events"]] == list(range(1, len(after["events"]) + 1))
    rows = server.query(
        f"SELECT key FROM state WHERE service_name = 'CrashAgent' AND service_key = '{key}'"
    )
    assert "tether:session" in {r["key"] for r in rows}
    assert not {r["key"] for r in rows} & set(older) - {"tether:session"}, rows


def test_a_runtime_goes_when_dropped() -> None:
    # Nothing of the runtime refers back to it (its stores read its clock, not it), so an
    # invocation's runtime goes when the handler returns, without the cyclic collector.
    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    ctx = SimpleNamespace(
        key=lambda: "s1",
        request=lambda: SimpleNamespace(id="inv_1"),
        get=nothing,
        set=nothing,
        clear=nothing,
    )
    runtime = restate_runtime(ctx, id_seed="s1")
    assert runtime.stores.session is not None and runtime.stores.events is not None
    store = restate_session_store(ctx)  # a shared handler's, on the context's own clock
    gone = [weakref.ref(runtime), weakref.ref(store)]
    gc.disable()
    try:
        del runtime, store
        assert [ref() for ref in gone] == [None, None]
    finally:
        gc.enable()

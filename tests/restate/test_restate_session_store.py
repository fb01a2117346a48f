"""`RestateSessionStore` on an in-memory stand-in of a virtual object's state (no server): turns
and run records in segments and ring slots, values split over parts, a healed transcript, a run
record rewritten in a sealed segment, sessions an older version wrote."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tether import jsoncodec
from tether.messages import Role, ToolUseBlock, text_block, tool_result
from tether.restate.session import (
    LAYOUT,
    META_KEY,
    PER_SEGMENT,
    RUNS,
    TURNS,
    ReadOnlySessionStoreError,
    RestateSessionStore,
)
from tether.session import INTERRUPTED_RESULT, Session, create_session, load_session
from tether.session.types import SessionRun, SessionTurn

S = PER_SEGMENT
CALL: ToolUseBlock = {"type": "tool_use", "id": "c1", "name": "echo", "input": {}}
SEGMENT_KEY, SLOT_KEY = TURNS


class ObjectState:
    """The state calls of a virtual object's context, counted."""

    def __init__(self, state: dict[str, bytes] | None = None) -> None:
        self.state: dict[str, bytes] = state if state is not None else {}
        self.gets = 0
        self.listings = 0

    def key(self) -> str:
        return "s1"

    async def get(self, name: str, serde: Any = None, type_hint: Any = None) -> bytes | None:
        self.gets += 1
        return self.state.get(name)

    def set(self, name: str, value: bytes, serde: Any = None) -> None:
        assert isinstance(value, bytes)
        self.state[name] = value

    def clear(self, name: str) -> None:
        self.state.pop(name, None)

    async def state_keys(self) -> list[str]:
        self.listings += 1
        return list(self.state)


def assert_no_stray_parts(ctx: ObjectState) -> None:
    """Every split value has exactly its parts, and no part outlives its value."""
    parts = {k for k in ctx.state if k.count(":") == 3}
    wanted = set()
    for key, value in ctx.state.items():
        if value.startswith(b'{"__parts__":'):
            wanted |= {f"{key}:{i}" for i in range(jsoncodec.loads(value)["__parts__"])}
    assert parts == wanted


async def clock() -> float:
    return 1000.0


def turn(i: int, text: str | None = None) -> SessionTurn:
    role: Role = "user" if i % 2 == 0 else "assistant"
    return SessionTurn(
        id=f"t{i}", role=role, content=[text_block(text or f"turn {i}")], created_at=float(i)
    )


def store(ctx: ObjectState, **options: Any) -> RestateSessionStore:
    return RestateSessionStore(ctx, clock=clock, **options)  # type: ignore[arg-type]


async def new_session(ctx: ObjectState, **options: Any) -> Session:
    return await create_session(id="s1", store=store(ctx, **options))


async def reloaded(ctx: ObjectState, **options: Any) -> Session:
    session = await load_session(store(ctx, **options), "s1")
    assert session is not None
    return session


def ids(turns: list[SessionTurn]) -> list[str]:
    return [t.id for t in turns]


async def test_turns_go_to_segments_and_a_ring_and_load_back_in_order() -> None:
    ctx = ObjectState()
    session = await new_session(ctx)
    batches = [1, 2, 7, S - 10, 1, S, 3 * S + 5]
    n = 0
    for size in batches:
        await session.append_turns([turn(n + i) for i in range(size)])
        n += size
        again = await reloaded(ctx)
        assert ids(again.turns) == [f"t{i}" for i in range(n)]
        assert again.turns == session.turns
    segments = sorted(k for k in ctx.state if k.startswith(SEGMENT_KEY))
    assert segments == sorted(f"{SEGMENT_KEY}{k}" for k in range(n // S))
    assert not [k for k in ctx.state if k.startswith("tether:turn:")]
    assert jsoncodec.loads(ctx.state[META_KEY])["layout"] == LAYOUT


async def test_a_load_reads_segments_and_the_tail_not_every_turn() -> None:
    ctx = ObjectState()
    session = await new_session(ctx)
    await session.append_turns([turn(i) for i in range(5000)])
    ctx.gets = ctx.listings = 0
    again = await reloaded(ctx)
    assert len(again.turns) == 5000
    # meta; the turns' segments and the missing one after them, the tail's slots and the one
    # that ends it; the same for the (no) run records; and no listing of the state's keys
    assert ctx.gets == 1 + (5000 // S + 1) + (5000 % S + 1) + 2
    assert ctx.listings == 0


async def test_appending_after_a_load_continues_the_open_segment() -> None:
    ctx = ObjectState()
    session = await new_session(ctx)
    await session.append_turns([turn(i) for i in range(S - 3)])
    again = await reloaded(ctx)
    await again.append_turns([turn(i) for i in range(S - 3, S + 2)])
    final = await reloaded(ctx)
    assert ids(final.turns) == [f"t{i}" for i in range(S + 2)]
    assert f"{SEGMENT_KEY}0" in ctx.state


async def test_values_over_budget_are_split_and_sealed_slots_leave_no_parts() -> None:
    ctx = ObjectState()
    session = await new_session(ctx, max_value_bytes=256)
    big = [turn(i, "x" * (300 + i)) for i in range(S + 3)]
    await session.append_turns(big[:5])
    assert f"{SLOT_KEY}0:1" in ctx.state  # a slot split over parts
    assert (await reloaded(ctx, max_value_bytes=256)).turns == big[:5]
    await session.append_turns(big[5:])
    assert all(len(value) <= 256 for value in ctx.state.values())
    assert (await reloaded(ctx, max_value_bytes=256)).turns == big
    # the sealed turns' slots and their parts are gone; the open segment's are there
    slots = {k.split(":")[2] for k in ctx.state if k.startswith(SLOT_KEY)}
    assert slots == {"0", "1", "2"}
    assert_no_stray_parts(ctx)


async def test_a_healed_transcript_is_rewritten_through_the_segments() -> None:
    ctx = ObjectState()
    session = await new_session(ctx, max_value_bytes=512)
    turns = [turn(i) for i in range(2 * S + 10)]
    turns[S - 3].content = [CALL]  # an assistant turn whose call got no result
    turns[S - 3].role = "assistant"
    turns[S - 2].role = "assistant"
    await session.append_turns(turns)
    await session.save_run(SessionRun(id="r1", status="running", started_at=1.0))
    assert await session.heal_interrupted_tool_calls() == 1
    again = await reloaded(ctx, max_value_bytes=512)
    assert len(again.turns) == len(turns) + 1
    assert again.turns == session.turns
    assert again.turns[S - 2].content == [tool_result("c1", INTERRUPTED_RESULT, is_error=True)]
    assert again.runs[0].status == "interrupted"
    await again.append_turns([turn(1000)])
    assert ids((await reloaded(ctx, max_value_bytes=512)).turns) == [*ids(session.turns), "t1000"]
    assert_no_stray_parts(ctx)


async def test_run_records_are_a_sequence_too_and_are_rewritten_where_they_are() -> None:
    ctx = ObjectState()
    session = await new_session(ctx, max_value_bytes=512)
    parent = SessionRun(id="parent", status="running", started_at=0.0)
    await session.save_run(parent)
    for i in range(2 * S + 5):  # e.g. sub-agents' runs merged while the parent runs on
        run = SessionRun(id=f"r{i}", status="running", started_at=float(i))
        await session.save_run(run)
        run.status, run.stats = "completed", {"note": "z" * (600 if i == 3 else 1)}
        await session.save_run(run)
    parent.decisions.append({"call": "c1", "decision": "approved"})  # its segment is sealed
    await session.save_run(parent)
    again = await reloaded(ctx, max_value_bytes=512)
    assert [r.id for r in again.runs] == ["parent", *(f"r{i}" for i in range(2 * S + 5))]
    assert again.runs == session.runs
    assert again.runs[0].decisions == [{"call": "c1", "decision": "approved"}]
    assert {r.status for r in again.runs[1:]} == {"completed"}
    runs_segment = RUNS[0]
    assert f"{runs_segment}1" in ctx.state and f"{runs_segment}2" not in ctx.state
    meta = jsoncodec.loads(ctx.state[META_KEY])
    assert meta.keys() == {"id", "created_at", "metadata", "layout"}  # no list of run ids
    parent.status = "completed"
    await again.save_run(parent)
    assert (await reloaded(ctx, max_value_bytes=512)).runs[0].status == "completed"
    assert_no_stray_parts(ctx)


async def test_a_value_written_again_smaller_leaves_no_parts_behind() -> None:
    ctx = ObjectState()
    session = await new_session(ctx, max_value_bytes=256)
    run = SessionRun(id="r", status="running", started_at=0.0, prompt="p" * 600)
    await session.save_run(run)
    assert f"{RUNS[1]}0:2" in ctx.state
    run.prompt = "short"
    await session.save_run(run)
    assert [k for k in ctx.state if k.startswith(RUNS[1])] == [f"{RUNS[1]}0"]
    # a healed transcript moves a large turn out of a sealed segment, which gets smaller
    turns = [turn(i) for i in range(S + 2)]
    turns[S - 4].role, turns[S - 3].role = "assistant", "assistant"
    turns[S - 4].content = [CALL]
    turns[S - 1] = turn(S - 1, "q" * 2000)
    turns[S + 1] = turn(S + 1, "r" * 1000)  # the open segment's, split: its slot moves too
    await session.append_turns(turns)

    def parts_of_segment_0() -> int:
        return sum(1 for k in ctx.state if k.startswith(f"{SEGMENT_KEY}0:"))

    before = parts_of_segment_0()
    assert await session.heal_interrupted_tool_calls() == 1
    assert 0 < parts_of_segment_0() < before
    assert_no_stray_parts(ctx)
    assert (await reloaded(ctx, max_value_bytes=256)).turns == session.turns


def legacy_state(turns: list[SessionTurn], limit: int) -> dict[str, bytes]:
    """A session as the one-key-per-turn store kept it."""
    state: dict[str, bytes] = {}
    meta = {"id": "s1", "created_at": 1.0, "metadata": {}, "runs": ["r1"]}
    state[META_KEY] = jsoncodec.dumps(meta)
    run = SessionRun(id="r1", status="completed", started_at=1.0, stats={"x": "w" * limit})
    data = jsoncodec.dumps(run.to_json())
    state["tether:run:r1"] = jsoncodec.dumps({"__parts__": 2})
    state["tether:run:r1:0"], state["tether:run:r1:1"] = data[:limit], data[limit:]
    for i, t in enumerate(turns):
        data = jsoncodec.dumps(t.to_json())
        if len(data) <= limit:
            state[f"tether:turn:{i}"] = data
            continue
        parts = [data[p : p + limit] for p in range(0, len(data), limit)]
        for p, part in enumerate(parts):
            state[f"tether:turn:{i}:{p}"] = part
        state[f"tether:turn:{i}"] = jsoncodec.dumps({"__parts__": len(parts)})
    return state


async def test_a_session_of_the_older_layout_loads_and_moves_to_segments_on_its_next_write() -> (
    None
):
    turns = [turn(i, "y" * (400 if i == 3 else 1)) for i in range(S + 5)]
    ctx = ObjectState(legacy_state(turns, 256))
    session = await reloaded(ctx, max_value_bytes=256)
    assert session.turns == turns and [r.id for r in session.runs] == ["r1"]
    await session.save_run(SessionRun(id="r2", status="running", started_at=2.0))
    await session.append_turns([turn(S + 5)])
    assert not [k for k in ctx.state if k.startswith(("tether:turn:", "tether:run:"))]
    assert jsoncodec.loads(ctx.state[META_KEY]) == {
        "id": "s1",
        "created_at": 1.0,
        "metadata": {},
        "layout": LAYOUT,
    }
    again = await reloaded(ctx, max_value_bytes=256)
    assert again.turns == [*turns, turn(S + 5)]
    assert again.runs == session.runs and [r.id for r in again.runs] == ["r1", "r2"]
    assert_no_stray_parts(ctx)


async def test_a_read_only_store_loads_and_refuses_writes() -> None:
    ctx = ObjectState()
    session = await new_session(ctx)
    await session.append_turns([turn(i) for i in range(3)])
    read_only = await load_session(store(ctx, read_only=True), "s1")
    assert read_only is not None and read_only.turns == session.turns
    with pytest.raises(ReadOnlySessionStoreError):
        await read_only.append_turns([turn(3)])


async def test_turns_are_written_without_gaps() -> None:
    ctx = ObjectState()
    session = await new_session(ctx)
    with pytest.raises(ValueError, match="in order"):
        await session.store.write_turns("s1", 2, [turn(2)])


def test_a_load_is_the_same_from_a_fresh_event_loop() -> None:
    """The store awaits only its context (as `RestateHarness.session` relies on)."""
    ctx = ObjectState()
    asyncio.run(new_session(ctx))
    assert asyncio.run(reloaded(ctx)).turns == []

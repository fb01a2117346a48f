"""`RestateSessionStore` and `RestateEventLog` on an in-memory stand-in of a virtual object's state
(no server): turns, run records and events as chains (a tail and sealed segments), a session read
from its end, values split over parts, a healed transcript, a run record rewritten in a sealed
segment, sessions and streams that older versions wrote."""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

import pytest

from tether import jsoncodec
from tether.agent.compaction import ContextCovered, compact_tail
from tether.messages import Role, ToolUseBlock, text_block, tool_result
from tether.restate.chain import PER_SEGMENT, READ_AHEAD, SEGMENT_BYTES, Chain, Values
from tether.restate.events import RestateEventLog, read_events
from tether.restate.keys import HEAD
from tether.restate.session import (
    COUNTING_UP,
    LAYOUT,
    META_KEY,
    RUNS,
    TURNS,
    ReadOnlySessionStoreError,
    RestateSessionStore,
)
from tether.session import INTERRUPTED_RESULT, Session, create_session, load_session
from tether.session.events import Cursor
from tether.session.store import every_turn
from tether.session.types import SessionRun, SessionTurn

S = PER_SEGMENT
CALL: ToolUseBlock = {"type": "tool_use", "id": "c1", "name": "echo", "input": {}}
SEGMENT_KEY, TAIL_KEY = f"{TURNS}seg:", f"{TURNS}tail"


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


def segment(prefix: str, k: int) -> str:
    return Chain(Values(ObjectState()), prefix).segment_key(k)  # type: ignore[arg-type]


def stored(ctx: ObjectState, key: str) -> Any:
    """What `key` holds: in the head (`keys.HEAD`), or under its own key; parts joined."""
    name = HEAD[0] if key in HEAD else key
    data = ctx.state[name]
    if data.startswith(b'{"__parts__":'):
        count = jsoncodec.loads(data)["__parts__"]
        data = b"".join(ctx.state[f"{name}:{i}"] for i in range(count))
    value = jsoncodec.loads(data)
    return value["__head__"][key] if key in HEAD else value


def assert_no_stray_parts(ctx: ObjectState) -> None:
    """Every split value has exactly its parts, and no part outlives its value."""
    parts = {k for k in ctx.state if re.fullmatch(r".+(tail|seg:\d+|session):\d+", k)}
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


async def test_turns_go_to_segments_and_a_tail_and_load_back_in_order() -> None:
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
    assert segments == sorted(segment(TURNS, k) for k in range(n // S))
    assert stored(ctx, TAIL_KEY)["first"] == n // S * S
    assert not [k for k in ctx.state if k.startswith(("tether:turn:", "tether:turns:"))]
    assert stored(ctx, META_KEY)["layout"] == LAYOUT


async def test_a_load_reads_the_segments_at_once_and_never_lists_the_keys() -> None:
    ctx = ObjectState()
    session = await new_session(ctx)
    await session.append_turns([turn(i) for i in range(5000)])
    ctx.gets = ctx.listings = 0
    again = await reloaded(ctx)
    assert len(again.turns) == 5000
    # the head (the meta and the tails), then every segment
    assert ctx.gets == 1 + 5000 // S
    assert ctx.listings == 0


async def test_a_load_from_the_end_reads_only_what_is_enough_and_counts_the_rest() -> None:
    ctx = ObjectState()
    session = await new_session(ctx)
    for r in range(40):  # runs of 5 turns; every other one a sub-agent's
        parent = "p" if r % 2 else None
        await session.save_run(
            SessionRun(id=f"r{r}", status="completed", started_at=r, parent_run_id=parent)
        )
        await session.append_turns([turn(5 * r + i) for i in range(5)])
    ctx.gets = 0
    newest = await load_session(store(ctx), "s1", enough=lambda turns: len(turns) >= 30)
    # the head, then segments back from the tail a few at a time
    assert newest is not None and ctx.gets == 1 + READ_AHEAD
    assert 30 <= len(newest.turns) < 30 + S and newest.turns == session.turns[-len(newest.turns) :]
    assert newest.earlier.turns == 200 - len(newest.turns)
    assert newest.turn_count == 200
    assert newest.assistant_turns == session.assistant_turns == 100
    assert newest.runs == session.runs[newest.earlier.runs :] and 0 < len(newest.runs) < S
    assert newest.earlier.runs == 40 - len(newest.runs)
    assert newest.child_runs == session.child_runs == 20
    # what it appends goes where it belongs
    await newest.save_run(SessionRun(id="r40", status="running", started_at=40.0))
    await newest.append_turns([turn(200), turn(201)])
    whole = await reloaded(ctx)
    assert ids(whole.turns) == [f"t{i}" for i in range(202)]
    assert [r.id for r in whole.runs] == [f"r{r}" for r in range(41)]


@pytest.mark.parametrize("seed", range(20))
async def test_compaction_of_the_turns_read_from_the_end_is_compaction_of_them_all(
    seed: int,
) -> None:
    rng = random.Random(seed)
    ctx = ObjectState()
    session = await new_session(ctx)
    turns: list[SessionTurn] = []
    for i in range(rng.randrange(1, 400)):
        role: Role = "user" if rng.random() < 0.3 else "assistant"
        text = "w" * rng.choice([1, 10, 100, 1000, 5000])
        turns.append(SessionTurn(id=f"t{i}", role=role, content=[text_block(text)], created_at=i))
    await session.append_turns(turns)
    budget = rng.choice([50, 500, 5000, 50_000])
    newest = await load_session(store(ctx), "s1", enough=ContextCovered(budget))
    assert newest is not None
    whole = [{"role": t.role, "content": t.content} for t in turns]
    assert compact_tail(newest.messages(), budget, omitted=newest.earlier.turns) == compact_tail(
        whole, budget
    )
    assert newest.assistant_turns == sum(1 for t in turns if t.role == "assistant")


async def test_appending_after_a_load_continues_the_tail() -> None:
    ctx = ObjectState()
    session = await new_session(ctx)
    await session.append_turns([turn(i) for i in range(S - 3)])
    again = await reloaded(ctx)
    await again.append_turns([turn(i) for i in range(S - 3, S + 2)])
    final = await reloaded(ctx)
    assert ids(final.turns) == [f"t{i}" for i in range(S + 2)]
    assert segment(TURNS, 0) in ctx.state


async def test_values_over_budget_are_split_and_a_large_turn_seals_its_segment() -> None:
    ctx = ObjectState()
    session = await new_session(ctx, max_value_bytes=256)
    big = [turn(i, "x" * (300 + i)) for i in range(S + 3)]
    await session.append_turns(big[:1])
    assert f"{META_KEY}:1" in ctx.state  # the head (with the tail) split over parts
    assert (await reloaded(ctx, max_value_bytes=256)).turns == big[:1]
    await session.append_turns(big[1:])
    assert all(len(value) <= 256 for value in ctx.state.values())
    assert (await reloaded(ctx, max_value_bytes=256)).turns == big
    assert_no_stray_parts(ctx)
    # a turn over a segment's bytes is a segment of its own
    huge = turn(S + 3, "y" * SEGMENT_BYTES)
    await session.append_turns([huge, turn(S + 4)])
    assert (await reloaded(ctx, max_value_bytes=256)).turns == [*big, huge, turn(S + 4)]
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
    assert segment(RUNS, 1) in ctx.state and segment(RUNS, 2) not in ctx.state
    meta = stored(ctx, META_KEY)
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
    assert f"{META_KEY}:2" in ctx.state  # the head, with the runs' tail
    run.prompt = "short"
    await session.save_run(run)
    assert f"{META_KEY}:2" not in ctx.state and not [k for k in ctx.state if k.startswith(RUNS)]
    assert_no_stray_parts(ctx)
    # a healed transcript moves a large turn out of a sealed segment, which gets smaller
    turns = [turn(i) for i in range(S + 2)]
    turns[S - 4].role, turns[S - 3].role = "assistant", "assistant"
    turns[S - 4].content = [CALL]
    turns[S - 1] = turn(S - 1, "q" * 2000)
    turns[S + 1] = turn(S + 1, "r" * 1000)  # the tail's, split
    await session.append_turns(turns)

    def parts_of_segment_0() -> int:
        return sum(1 for k in ctx.state if k.startswith(f"{segment(TURNS, 0)}:"))

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
    assert ctx.listings == 1  # for the load, the move and the head alike
    assert stored(ctx, META_KEY) == {
        "id": "s1",
        "created_at": 1.0,
        "metadata": {},
        "layout": LAYOUT,
    }
    again = await reloaded(ctx, max_value_bytes=256)
    assert again.turns == [*turns, turn(S + 5)]
    assert again.runs == session.runs and [r.id for r in again.runs] == ["r1", "r2"]
    assert_no_stray_parts(ctx)


def ring_state(turns: list[SessionTurn], runs: list[SessionRun]) -> dict[str, bytes]:
    """A session as layout 2 kept it: 64-record segments and a ring of 64 slots."""
    state = {
        META_KEY: jsoncodec.dumps({"id": "s1", "created_at": 1.0, "metadata": {}, "layout": 2})
    }
    for (segment, slot), records in (
        (("tether:turns:", "tether:turn-slot:"), [t.to_json() for t in turns]),
        (("tether:runs:", "tether:run-slot:"), [r.to_json() for r in runs]),
    ):
        sealed = len(records) // 64
        for k in range(sealed):
            state[f"{segment}{k}"] = jsoncodec.dumps(records[k * 64 : (k + 1) * 64])
        for i, record in enumerate(records):
            if i >= (sealed - 1) * 64:  # the ring: the open segment over the last sealed one
                state[f"{slot}{i % 64}"] = jsoncodec.dumps({"i": i, "v": record})
    return state


async def test_a_session_of_layout_2_loads_and_moves_on_its_next_write() -> None:
    turns = [turn(i) for i in range(64 * 2 + 5)]
    runs = [SessionRun(id=f"r{i}", status="completed", started_at=float(i)) for i in range(3)]
    ctx = ObjectState(ring_state(turns, runs))
    session = await reloaded(ctx)
    assert session.turns == turns and session.runs == runs
    await session.append_turns([turn(len(turns))])
    assert not [k for k in ctx.state if k.startswith(("tether:turns:", "tether:turn-slot:"))]
    assert not [k for k in ctx.state if k.startswith(("tether:runs:", "tether:run-slot:"))]
    assert stored(ctx, META_KEY)["layout"] == LAYOUT
    again = await reloaded(ctx)
    assert again.turns == [*turns, turn(len(turns))] and again.runs == runs


async def test_a_session_of_layout_3_loads_and_moves_on_its_next_write() -> None:
    """Layout 3: the same chains, their segments counting up under other names."""
    turns = [turn(i) for i in range(3 * S + 5)]
    runs = [SessionRun(id=f"r{i}", status="completed", started_at=float(i)) for i in range(S + 1)]
    meta = {"id": "s1", "created_at": 1.0, "metadata": {}, "layout": 3}
    ctx = ObjectState({META_KEY: jsoncodec.dumps(meta)})
    for prefix, records in ((COUNTING_UP[0], turns), (COUNTING_UP[1], runs)):
        chain = Chain(Values(ctx), prefix, counting_up=True)  # type: ignore[arg-type]
        chain.write_all([record.to_json() for record in records])
    assert f"{COUNTING_UP[0]}seg:2" in ctx.state and f"{COUNTING_UP[1]}seg:0" in ctx.state
    session = await reloaded(ctx)
    assert session.turns == turns and session.runs == runs
    await session.append_turns([turn(len(turns))])
    assert not [k for k in ctx.state if k.startswith(COUNTING_UP)]
    assert stored(ctx, META_KEY)["layout"] == LAYOUT
    again = await reloaded(ctx)
    assert again.turns == [*turns, turn(len(turns))] and again.runs == runs


def tail_value(records: list[Any]) -> bytes:
    return jsoncodec.dumps({"n": 0, "first": 0, "marked": 0, "v": records})


async def test_tails_under_keys_of_their_own_move_into_the_head_on_the_next_write() -> None:
    """Before the head, the meta and each tail had a key of their own (split over parts when
    large): read from there, they move into the head when it is next written, and their keys
    go. The keys are listed once, to read only the tails that are there."""
    turns = [turn(i, "x" * 200) for i in range(3)]
    runs = [SessionRun(id="r0", status="completed", started_at=0.0)]
    events = [{"type": "x", "id": str(i + 1)} for i in range(3)]
    meta = {"id": "s1", "created_at": 1.0, "metadata": {}, "layout": LAYOUT}
    split = tail_value([t.to_json() for t in turns])
    ctx = ObjectState(
        {
            META_KEY: jsoncodec.dumps(meta),
            TAIL_KEY: jsoncodec.dumps({"__parts__": 2}),
            f"{TAIL_KEY}:0": split[:400],
            f"{TAIL_KEY}:1": split[400:],
            f"{RUNS}tail": tail_value([r.to_json() for r in runs]),
            "tether:events/tail": tail_value(events),
        }
    )
    values = Values(ctx)  # type: ignore[arg-type]
    log = RestateEventLog(ctx, values=values)  # type: ignore[arg-type]
    session = await load_session(RestateSessionStore(ctx, clock=clock, values=values), "s1")  # type: ignore[arg-type]
    assert session is not None and session.turns == turns and session.runs == runs
    assert ctx.listings == 1
    await session.append_turns([turn(3)])
    await log.append("s1", [{"type": "y"}])
    assert log.position == 4 and set(ctx.state) == {META_KEY}
    assert stored(ctx, META_KEY) == meta
    ctx.gets = ctx.listings = 0
    again = await reloaded(ctx)
    assert again.turns == [*turns, turn(3)] and again.runs == runs
    assert (ctx.gets, ctx.listings) == (1, 0)  # the head alone
    assert [e["type"] for e in await read_events(ctx, Cursor(0))] == ["x", "x", "x", "y"]


async def test_a_new_session_reads_the_state_once_and_a_checkpoint_writes_it_once() -> None:
    ctx = CountedWrites()
    values = Values(ctx)  # type: ignore[arg-type]
    values.hold()
    sessions = RestateSessionStore(ctx, clock=clock, values=values)  # type: ignore[arg-type]
    log = RestateEventLog(ctx, values=values)  # type: ignore[arg-type]
    assert await load_session(sessions, "s1") is None
    session = await create_session(id="s1", store=sessions)
    await session.append_turns([turn(0)])
    await session.save_run(SessionRun(id="r0", status="running", started_at=0.0))
    await log.append("s1", [{"type": "run_started"}])
    assert (ctx.gets, ctx.listings) == (1, 1)  # the head (none yet), and the keys (none)
    values.flush()
    assert [key for key, _ in ctx.writes] == [META_KEY]
    assert stored(ctx, TAIL_KEY)["v"] == [turn(0).to_json()]
    assert stored(ctx, "tether:events/tail")["v"] == [{"type": "run_started", "id": "1"}]


async def test_keys_sort_as_restate_sends_them_the_hot_ones_first() -> None:
    """Restate sends eager state shortest key first, then in byte order: the head (the meta and
    the tails), then the turns' segments newest first, then the events', then the run
    records'."""
    ctx = ObjectState()
    session = await new_session(ctx)
    log = RestateEventLog(ctx)  # type: ignore[arg-type]
    for i in range(3 * S + 2):
        await session.append_turns([turn(i)])
        await session.save_run(SessionRun(id=f"r{i}", status="completed", started_at=float(i)))
        await log.append("s1", [{"type": "x"}])
    order = sorted(ctx.state, key=lambda key: (len(key), key))
    assert order[0] == META_KEY and not set(order) & {TAIL_KEY, f"{RUNS}tail"}
    cold = order[1:]
    assert cold[:3] == [segment(TURNS, k) for k in (2, 1, 0)]
    assert cold[3].startswith("tether:events/") and cold[-1] == segment(RUNS, 0)


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


# -- the event stream: a chain of events in the same object -----------------------------------


async def test_events_are_numbered_from_the_tail_and_read_back_to_a_cursor() -> None:
    ctx = ObjectState()
    log = RestateEventLog(ctx)  # type: ignore[arg-type]
    for n in range(40):
        await log.append("s1", [{"type": "x", "n": n}] * (n % 3 + 1))
    total = sum(n % 3 + 1 for n in range(40))
    assert log.position == total
    assert ctx.listings == 1  # the first append: no tail yet, an older stream is looked for

    again = RestateEventLog(ObjectState(ctx.state))  # type: ignore[arg-type]
    await again.append("s1", [{"type": "y"}])
    assert again.position == total + 1

    for after in (0, 1, total - 40, total - 5, total, total + 1):
        reader = ObjectState(ctx.state)
        events = await read_events(reader, Cursor(after))
        assert [int(e["id"]) for e in events] == list(range(after + 1, total + 2))
        assert reader.listings == 0
    # a reader close behind reads back a few segments, not the whole stream
    reader = ObjectState(ctx.state)
    await read_events(reader, Cursor(total - 5))
    assert reader.gets <= 1 + READ_AHEAD


async def test_a_new_streams_first_append_reads_its_tail_and_lists_the_keys_once() -> None:
    ctx = ObjectState()
    await RestateEventLog(ctx).append("s1", [{"type": "x"}])  # type: ignore[arg-type]
    assert (ctx.gets, ctx.listings) == (1, 1)  # no older form's tail is read: none is listed


async def test_a_stream_an_older_version_kept_moves_to_the_chain_on_its_next_append() -> None:
    batches = {
        "tether:events:000000000003:2": [{"type": "a", "id": "3"}, {"type": "b", "id": "4"}],
        "tether:events:000000000005:1": [{"type": "c", "id": "5"}],
    }
    ctx = ObjectState({key: jsoncodec.dumps(value) for key, value in batches.items()})
    assert [e["id"] for e in await read_events(ctx, Cursor(3))] == ["4", "5"]  # read as it is
    log = RestateEventLog(ctx)  # type: ignore[arg-type]
    await log.append("s1", [{"type": "d"}])
    assert log.position == 6
    assert not [k for k in ctx.state if k.startswith("tether:events:")]
    assert [e["id"] for e in await read_events(ctx, Cursor(0))] == ["3", "4", "5", "6"]


async def test_a_stream_whose_segments_count_up_moves_to_the_chain_on_its_next_append() -> None:
    ctx = ObjectState()
    events = [{"type": "x", "id": str(i)} for i in range(1, 2 * S + 4)]
    Chain(Values(ctx), "tether:events-", counting_up=True).write_all(events)  # type: ignore[arg-type]
    assert [e["id"] for e in await read_events(ctx, Cursor(2 * S))] == ["33", "34", "35"]
    log = RestateEventLog(ctx)  # type: ignore[arg-type]
    await log.append("s1", [{"type": "y"}])
    assert log.position == 2 * S + 4
    assert not [k for k in ctx.state if k.startswith("tether:events-")]
    numbers = [e["id"] for e in await read_events(ctx, Cursor(0))]
    assert numbers == [str(i) for i in range(1, 2 * S + 5)]


async def test_a_run_without_compaction_reads_every_turn_at_once_and_the_newest_runs() -> None:
    ctx = ObjectState()
    session = await new_session(ctx)
    for r in range(3 * S):
        await session.save_run(SessionRun(id=f"r{r}", status="completed", started_at=r))
        await session.append_turns([turn(2 * r), turn(2 * r + 1)])
    ctx.gets = 0
    whole = await load_session(store(ctx), "s1", enough=every_turn)
    assert whole is not None and whole.turns == session.turns and whole.earlier.turns == 0
    assert whole.runs == session.runs[whole.earlier.runs :] and len(whole.runs) < S
    assert whole.earlier.runs == 3 * S - len(whole.runs)
    assert ctx.gets == 1 + 2 * 3 * S // S  # the head, then every segment at once


class CountedWrites(ObjectState):
    """`ObjectState` that also logs its writes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, bytes | None]] = []

    def set(self, name: str, value: bytes, serde: Any = None) -> None:
        super().set(name, value, serde)
        self.writes.append((name, value))

    def clear(self, name: str) -> None:
        super().clear(name)
        self.writes.append((name, None))


async def test_held_writes_go_out_once_per_key_at_a_flush_and_reads_see_them() -> None:
    ctx = CountedWrites()
    session = await new_session(ctx)
    values: Values = session.store._values  # type: ignore[attr-defined]
    ctx.writes.clear()
    values.hold()
    for i in range(5):
        await session.append_turns([turn(i)])
    assert ctx.writes == []  # nothing sent yet...
    assert ids((await reloaded_from(values)).turns) == [f"t{i}" for i in range(5)]  # ...but read
    values.flush()
    assert [key for key, _ in ctx.writes] == [META_KEY]  # the head, once, as last written
    assert ids((await reloaded(ctx)).turns) == [f"t{i}" for i in range(5)]
    await session.append_turns([turn(5)])
    values.release(send=False)  # a failed attempt: its retry writes them again
    assert len(ctx.writes) == 1 and ids((await reloaded(ctx)).turns)[-1] == "t4"


async def test_a_key_found_empty_is_not_read_again() -> None:
    ctx = ObjectState()
    shared = Values(ctx)  # type: ignore[arg-type]
    assert await load_session(RestateSessionStore(ctx, clock=clock, values=shared), "s1") is None  # type: ignore[arg-type]
    reads = ctx.gets
    await create_session(id="s1", store=RestateSessionStore(ctx, clock=clock, values=shared))  # type: ignore[arg-type]
    assert ctx.gets == reads  # the create knew the session was not there
    shared.drop("x")
    assert await shared.get("x") is None and ctx.gets == reads
    shared.put("x", b"1")
    assert await shared.get("x") == b"1"


async def reloaded_from(values: Values) -> Session:
    session = await load_session(RestateSessionStore(values.ctx, clock=clock, values=values), "s1")  # type: ignore[arg-type]
    assert session is not None
    return session

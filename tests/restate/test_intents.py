"""The hand-over between two attempts of one invocation in one worker process (`restate.intents`):
a later attempt that replays an intent whose earlier attempt is still awaiting its
acknowledgement waits for it to settle, instead of reporting the bodies interrupted at once; a
body whose attempt ended while it ran runs on, and a later attempt journals its result instead
of running it again or reporting it interrupted.

On a stand-in context (no server): the earlier attempt is cut off (as a Restate partition whose
leader moved tears down the old stream) while it awaits the intent's acknowledgement, or while
its body runs. The real-stack side is `tests/restate/test_restate_cluster.py`,
`tests/restate/test_restate_crash_matrix.py` (a restate-server killed while bodies run) and
`e2e/test_restate_cluster.py`'s lost node."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from restate.exceptions import TerminalError

from tether.durable import StepCall
from tether.restate.intents import INTENTS, NOT_HERE, Intents
from tether.restate.runtime import restate_runtime


class Request:
    id = "inv_1"


class Attempt:
    """One attempt's context: the intent either journaled live (its acknowledgement awaited
    until `cut`) or replayed from `journal`; every other step runs."""

    def __init__(self, journal: dict[str, Any]) -> None:
        self.journal = journal
        self.journaled = asyncio.Event()
        self.cut = asyncio.Event()
        self.ran: list[str] = []

    def request(self) -> Request:
        return Request()

    def uuid(self) -> str:
        return "u"

    def run_typed(self, name: str, action: Any, options: Any = None) -> Any:
        return asyncio.ensure_future(self._run(name, action))

    async def _run(self, name: str, action: Any) -> Any:
        if name in self.journal:
            return self.journal[name]
        value = await action()
        if name.startswith("tool-start"):
            self.journal[name] = value
            self.journaled.set()
            await self.cut.wait()  # the acknowledgement never comes: the stream is torn down
            raise asyncio.CancelledError
        self.ran.append(name)
        return value


async def body() -> dict[str, Any]:
    return {"ok": True}


async def interrupted(index: int) -> dict[str, Any]:
    return {"interrupted": index}


CALLS = [StepCall("tool", "tool:c1", body)]


async def test_a_later_attempt_waits_for_the_earlier_one_and_runs_the_bodies_it_never_began() -> (
    None
):
    journal: dict[str, Any] = {}
    first, second = Attempt(journal), Attempt(journal)
    earlier = asyncio.create_task(
        restate_runtime(first).guarded("tool-start:c1", CALLS, interrupted)  # type: ignore[arg-type]
    )
    await first.journaled.wait()
    later = asyncio.create_task(
        restate_runtime(second).guarded("tool-start:c1", CALLS, interrupted)  # type: ignore[arg-type]
    )
    await asyncio.sleep(0.05)
    assert not later.done()  # waiting for the earlier attempt
    first.cut.set()
    assert await later == [{"ok": True}]
    assert second.ran == ["tool:c1"] and first.ran == []
    assert earlier.cancelled() or isinstance(earlier.exception(), asyncio.CancelledError)


class CutWhileBodiesRun(Attempt):
    """An attempt whose intent is acknowledged and whose bodies' results never are: its stream
    is torn down (`cut`) while they run; the SDK then cancels the run actions."""

    async def _run(self, name: str, action: Any) -> Any:
        if name in self.journal:
            return self.journal[name]
        if name.startswith("tool-start"):
            self.journal[name] = await action()
            return self.journal[name]
        work = asyncio.ensure_future(action())
        self.journaled.set()
        await self.cut.wait()
        work.cancel()
        raise asyncio.CancelledError


async def test_a_body_that_outlives_its_attempt_gives_its_result_to_the_next_and_runs_once() -> (
    None
):
    journal: dict[str, Any] = {}
    gate, started = asyncio.Event(), []

    async def held() -> dict[str, Any]:
        started.append(1)
        await gate.wait()
        return {"ok": "held"}

    calls = [StepCall("tool", "tool:c1", held)]
    first, second = CutWhileBodiesRun(journal), Attempt(journal)
    earlier = asyncio.create_task(
        restate_runtime(first).guarded("tool-start:c1", calls, interrupted)  # type: ignore[arg-type]
    )
    await first.journaled.wait()
    first.cut.set()  # the stream ends while the body runs
    with contextlib.suppress(asyncio.CancelledError):
        await earlier
    later = asyncio.create_task(
        restate_runtime(second).guarded("tool-start:c1", calls, interrupted)  # type: ignore[arg-type]
    )
    await asyncio.sleep(0.05)
    assert not later.done()  # awaiting the body the earlier attempt started
    gate.set()
    assert await later == [{"ok": "held"}]
    assert started == [1]  # never run again, never reported interrupted
    # acknowledged: the record is gone, a third attempt (another replica's) would report it
    third = Attempt(journal)
    journal.pop("tool:c1", None)
    assert await restate_runtime(third).guarded("tool-start:c1", calls, interrupted) == [  # type: ignore[arg-type]
        {"interrupted": 0}
    ]


class CancelledWhileBodiesRun(Attempt):
    """An attempt whose invocation is cancelled while its body runs: the SDK raises the
    cancellation where the bodies' results are awaited."""

    async def _run(self, name: str, action: Any) -> Any:
        if name.startswith("tool-start"):
            self.journal[name] = await action()
            return self.journal[name]
        self.action = asyncio.ensure_future(action())  # left to the SDK's attempt teardown
        self.journaled.set()
        await self.cut.wait()
        raise TerminalError("cancelled", 409)


async def test_a_cancelled_invocation_cancels_the_bodies_it_left_running() -> None:
    attempt, running = CancelledWhileBodiesRun({}), asyncio.Event()
    outcome: list[str] = []

    async def held() -> dict[str, Any]:
        running.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        return {}

    calls = [StepCall("tool", "tool:c1", held)]
    guarded = asyncio.create_task(
        restate_runtime(attempt).guarded("tool-start:c1", calls, interrupted)  # type: ignore[arg-type]
    )
    await running.wait()
    attempt.cut.set()
    with pytest.raises(TerminalError):
        await guarded
    await asyncio.sleep(0)
    assert outcome == ["cancelled"]


class Acknowledged(Attempt):
    """An attempt whose every step is journaled and acknowledged (or replayed)."""

    async def _run(self, name: str, action: Any) -> Any:
        if name not in self.journal:
            self.journal[name] = await action()
        return self.journal[name]


async def test_no_record_is_kept_once_the_results_are_acknowledged_or_replayed() -> None:
    journal: dict[str, Any] = {}
    kept = len(INTENTS._records)
    for _ in range(2):  # live, then replayed
        values = await restate_runtime(Acknowledged(journal)).guarded(  # type: ignore[arg-type]
            "tool-start:c1", CALLS, interrupted
        )
        assert values == [{"ok": True}] and len(INTENTS._records) == kept


async def test_without_a_record_a_started_body_is_reported_interrupted() -> None:
    journal = {"tool-start:c1": {"calls": ["tool:c1"], "nonce": "seen-elsewhere"}}
    attempt = Attempt(journal)
    values = await restate_runtime(attempt).guarded("tool-start:c1", CALLS, interrupted)  # type: ignore[arg-type]
    assert values == [{"interrupted": 0}] and attempt.ran == ["tool:c1"]


async def test_a_body_cancelled_unfinished_is_not_here() -> None:
    intents = Intents()
    intents.journaling("n1")
    intents.settle("n1", unstarted=False)
    blocked = asyncio.Event()
    run = asyncio.create_task(intents.body("n1", "tool:c1", blocked.wait)())
    await asyncio.sleep(0)
    next(iter(intents._records["n1"].bodies.values())).cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run
    assert await intents.result("n1", "tool:c1") is NOT_HERE
    assert await intents.result("n1", "tool:c2") is NOT_HERE


async def test_bodies_that_began_in_the_earlier_attempt_are_not_unstarted() -> None:
    intents = Intents()
    intents.journaling("n1")
    later = asyncio.create_task(intents.unstarted("n1"))
    await asyncio.sleep(0.01)
    intents.settle("n1", unstarted=False)  # acknowledged: the bodies started
    assert await later is False


async def test_an_earlier_attempt_that_never_settles_is_waited_for_a_bounded_time() -> None:
    intents = Intents()
    intents.journaling("n1")
    started = time.monotonic()
    assert await intents.unstarted("n1", wait=0.2) is False
    assert 0.2 <= time.monotonic() - started < 2


async def test_unstarted_is_taken_once_and_nothing_is_waited_for_without_an_attempt() -> None:
    intents = Intents()
    intents.journaling("n1")
    intents.settle("n1", unstarted=True)
    started = time.monotonic()
    assert await intents.unstarted("n1") is True
    assert await intents.unstarted("n1") is False
    assert await intents.unstarted(None) is False
    assert await intents.unstarted("never") is False
    assert time.monotonic() - started < 0.1


class Handoff:
    """A `tether.restate.intents.Handoff` in memory: what was handed over, what is asked."""

    def __init__(self, answer: Any = NOT_HERE) -> None:
        self.handed: dict[str, dict[str, asyncio.Task[Any]]] = {}
        self.asked: list[tuple[str, str]] = []
        self.answer = answer

    def hand_over(self, nonce: str, bodies: Any) -> None:
        self.handed[nonce] = dict(bodies)

    async def result(self, nonce: str, name: str) -> Any:
        self.asked.append((nonce, name))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_an_attempt_that_ends_while_its_body_runs_hands_the_body_over() -> None:
    journal: dict[str, Any] = {}
    gate = asyncio.Event()

    async def held() -> dict[str, Any]:
        await gate.wait()
        return {"ok": "held"}

    handoff = Handoff()
    attempt = CutWhileBodiesRun(journal)
    runtime = restate_runtime(attempt, handoff=handoff)  # type: ignore[arg-type]
    guarded = asyncio.create_task(
        runtime.guarded("tool-start:c1", [StepCall("tool", "tool:c1", held)], interrupted)
    )
    await attempt.journaled.wait()
    attempt.cut.set()
    with contextlib.suppress(asyncio.CancelledError):
        await guarded
    nonce = journal["tool-start:c1"]["nonce"]
    body = handoff.handed[nonce]["tool:c1"]
    assert not body.done()  # handed over running
    gate.set()
    assert await body == {"ok": "held"}
    INTENTS.forget(nonce)


async def test_a_replay_without_a_record_journals_what_was_handed_over() -> None:
    journal = {"tool-start:c1": {"calls": ["tool:c1"], "nonce": "not-of-this-process"}}
    ran: list[str] = []

    async def once() -> dict[str, Any]:
        ran.append("body")
        return {}

    handoff = Handoff(answer={"ok": "from replica a"})
    runtime = restate_runtime(Attempt(journal), handoff=handoff)  # type: ignore[arg-type]
    calls = [StepCall("tool", "tool:c1", once)]
    assert await runtime.guarded("tool-start:c1", calls, interrupted) == [{"ok": "from replica a"}]
    assert handoff.asked == [("not-of-this-process", "tool:c1")]
    assert ran == []  # never run again

    # nothing handed over, or asking fails: interrupted, as without a handoff
    for answer in (NOT_HERE, OSError("no answer")):
        runtime = restate_runtime(Attempt(dict(journal)), handoff=Handoff(answer))  # type: ignore[arg-type]
        assert await runtime.guarded("tool-start:c1", calls, interrupted) == [{"interrupted": 0}]
    assert ran == []

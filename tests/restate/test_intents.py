"""The hand-over between two attempts of one invocation in one worker process (`restate.intents`):
a later attempt that replays an intent whose earlier attempt is still awaiting its
acknowledgement waits for it to settle, instead of reporting the bodies interrupted at once.

On a stand-in context (no server): the earlier attempt journals the intent and is cut off while
it awaits (as a Restate partition whose leader moved tears down the old stream) only after the
later one, replaying the intent, has started. The real-stack side is
`e2e/test_restate_cluster.py`'s lost node."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tether.durable import StepCall
from tether.restate.intents import UnstartedBodies
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


async def test_bodies_that_began_in_the_earlier_attempt_are_reported_interrupted() -> None:
    bodies = UnstartedBodies()
    bodies.awaiting("n1")
    later = asyncio.create_task(bodies.take("n1"))
    await asyncio.sleep(0.01)
    bodies.settle("n1", unstarted=False)  # acknowledged: the bodies started
    assert await later is False


async def test_an_earlier_attempt_that_never_settles_is_waited_for_a_bounded_time() -> None:
    bodies = UnstartedBodies()
    bodies.awaiting("n1")
    started = time.monotonic()
    assert await bodies.take("n1", wait=0.2) is False
    assert 0.2 <= time.monotonic() - started < 2


async def test_a_record_is_taken_once_and_nothing_is_waited_for_without_an_attempt() -> None:
    bodies = UnstartedBodies()
    bodies.awaiting("n1")
    bodies.settle("n1", unstarted=True)
    started = time.monotonic()
    assert await bodies.take("n1") is True
    assert await bodies.take("n1") is False
    assert await bodies.take(None) is False
    assert time.monotonic() - started < 0.1

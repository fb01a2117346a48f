"""The session's event stream in process (`Agent.events`, `MemoryEventLog`): what a library user
watching a run on the embedded runtimes sees."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers import RecordingProvider
from tether import create_agent, jsoncodec, tool
from tether.durable import sqlite_runtime
from tether.programs.webhooks import watch_request, watch_tag
from tether.programs.worker import services, watchers
from tether.programs.worker.served import index_services
from tether.programs.worker.settings import WorkerSettings
from tether.programs.worker.watchers import WATCH_SECONDS
from tether.restate import restate_runtime
from tether.restate.chain import PER_SEGMENT
from tether.restate.events import RestateEventLog, read_events
from tether.session.events import DEFAULT_RETAIN, Cursor, MemoryEventLog
from tether.spec import API_VERSION, SpecError, parse_agent


@tool
async def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


SCRIPT = [
    {"tool_calls": [{"name": "add", "input": {"a": 1, "b": 2}}], "usage": {"input": 900}},
    {"text": "three"},
]
DURABLE = ["run_started", "model_done", "tool_finished", "model_done", "run_ended"]


async def collect(agent: Any, after: str | None = None) -> list[dict[str, Any]]:
    events = []
    async for event in agent.events(after):
        events.append(event)
        if event["type"] == "run_ended":
            return events
    raise AssertionError("the stream ended")


async def test_a_watcher_sees_the_run_step_by_step_with_live_text() -> None:
    agent = create_agent(provider=RecordingProvider(SCRIPT), tools=[add])
    watcher = asyncio.create_task(collect(agent))
    stats = await agent.run("add 1 and 2")
    events = await asyncio.wait_for(watcher, 5)

    assert stats.status == "completed"
    assert [e["type"] for e in events if "." not in e["id"]] == DURABLE
    assert [e["id"] for e in events if "." not in e["id"]] == ["1", "2", "3", "4", "5"]
    kinds = [e["type"] for e in events]
    assert kinds.index("tool_started") < kinds.index("tool_finished")
    assert "model_text" in kinds and kinds.index("model_text") < len(kinds) - 2
    finished = events[kinds.index("tool_finished")]
    assert (finished["tool"], finished["outcome"], finished["is_error"]) == ("add", "ok", False)
    assert [c.durable for c in map(Cursor.parse, (e["id"] for e in events))] == sorted(
        Cursor.parse(e["id"]).durable for e in events
    )

    # A reader that comes back after an event gets only what followed it.
    resumed = await asyncio.wait_for(collect(agent, after=events[2]["cursor"]), 5)
    assert resumed == events[3:]


async def test_a_run_past_80_percent_of_its_budget_warns_once_then_stops_on_it() -> None:
    # 900 of 1,000 tokens: the next call would send them all again, so it cannot start.
    agent = create_agent(
        provider=RecordingProvider(SCRIPT),
        tools=[add],
        behavior={"max_tokens": 1000, "max_output_tokens": 50},
    )
    watcher = asyncio.create_task(collect(agent))
    stats = await agent.run("add 1 and 2")
    events = [e for e in await asyncio.wait_for(watcher, 5) if "." not in e["id"]]
    assert stats.status == "budget_exceeded"
    kinds = [e["type"] for e in events]
    assert kinds == ["run_started", "model_done", "budget_warning", "tool_finished", "run_ended"]
    warning = events[kinds.index("budget_warning")]
    assert (warning["budget"], warning["spent"], warning["limit"]) == ("tokens", 901, 1000)
    assert events[-1]["status"] == "budget_exceeded"


async def test_a_resumed_sqlite_run_streams_its_replayed_steps_once_in_the_new_process(
    tmp_path: Path,
) -> None:
    database = tmp_path / "runs.db"
    for attempt in range(2):  # the second opens the finished run again: all from the journal
        with sqlite_runtime(database, "r1") as durable:
            agent = create_agent(provider=RecordingProvider(SCRIPT), tools=[add], durable=durable)
            assert isinstance(durable.stores.events, MemoryEventLog)
            await agent.run("add 1 and 2")
            log = durable.stores.events
            assert agent.session is not None
            durable_events = [e for e in log.read(agent.session.id) if "." not in e["id"]]
            kinds = [e["type"] for e in durable_events]
            assert kinds == [k for k in DURABLE if k != "budget_warning"], attempt


# -- spec.events: how much of a session's stream the Restate worker keeps ---------------------


class ObjectState:
    """A virtual object's key and state, as much of a Restate context as the event log and
    `<agent>-live` use."""

    def __init__(self, key: str) -> None:
        self._key = key
        self.state: dict[str, Any] = {}

    def key(self) -> str:
        return self._key

    def request(self) -> Any:
        return SimpleNamespace(id="inv_1")

    async def get(self, name: str, serde: Any = None, type_hint: Any = None) -> Any:
        return self.state.get(name)

    def set(self, name: str, value: Any, serde: Any = None) -> None:
        self.state[name] = value

    def clear(self, name: str) -> None:
        self.state.pop(name, None)

    async def state_keys(self) -> list[str]:
        return list(self.state)


SECRET = b"secret"


def worker_settings(
    tmp_path: Path, events: dict[str, Any] | None, secret: bytes | None = None
) -> WorkerSettings:
    model = {"provider": "scripted", "name": "s", "script": [{"text": "hi"}]}
    spec: dict[str, Any] = {"model": model}
    if events is not None:
        spec["events"] = events
    manifest = parse_agent(
        {"apiVersion": API_VERSION, "kind": "DurableAgent", "metadata": {"name": "kept"}}
        | {"spec": spec}
    )
    return WorkerSettings(
        manifest=manifest,
        spec_path=tmp_path / "agent.yaml",
        webhook_secret=secret,
        webhook_base_url=None,
        workspace=tmp_path,
        env={},
    )


class Built(Exception):
    """Stops the run handler once its runtime is built."""


async def runtime_of_a_run(settings: WorkerSettings, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The durable runtime the worker's `run` handler builds (its event log is what the test
    looks at)."""
    built: list[Any] = []

    def capture(*args: Any, **kwargs: Any) -> Any:
        built.append(restate_runtime(*args, **kwargs))
        raise Built

    monkeypatch.setattr(services, "restate_runtime", capture)
    objects = services.agent_services(settings)
    with pytest.raises(Built):
        await objects[0].handlers["run"].fn(ObjectState("s1"), services.RunRequest(prompt="hi"))
    return built[0]


async def test_spec_events_retain_is_the_retention_of_the_restate_event_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    durable = await runtime_of_a_run(worker_settings(tmp_path, {"retain": 150}), monkeypatch)
    log = durable.stores.events
    assert isinstance(log, RestateEventLog) and log.retain == 150
    for _ in range(3):
        await log.append("s1", [{"type": "x"}] * 100)
    kept = [int(e["id"]) for e in await read_events(durable.ctx, Cursor(0))]
    # the newest 150 at least, the oldest gone, in whole segments
    assert kept == list(range(kept[0], 301))
    assert 150 <= len(kept) <= 150 + 2 * PER_SEGMENT

    default = await runtime_of_a_run(worker_settings(tmp_path, None), monkeypatch)
    assert default.stores.events.retain == DEFAULT_RETAIN


async def test_spec_events_live_batches_is_what_the_live_object_keeps(tmp_path: Path) -> None:
    settings = worker_settings(tmp_path, {"liveBatches": 3})
    live = next(o for o in index_services(settings) if o.name == "kept-live")
    session = ObjectState("s1")
    for n in range(5):
        event = {"type": "model_text", "run": "r", "delta": str(n)}
        await live.handlers["push"].fn(session, {"events": [{"after": 0, "event": event}]})
    assert sorted(k for k in session.state if k.startswith("live:")) == [
        "live:3",
        "live:4",
        "live:5",
    ]
    read = await live.handlers["read"].fn(session, None)
    assert [e["delta"] for e in read] == ["2", "3", "4"]


class ClockedState(ObjectState):
    """`ObjectState` whose journaled steps return `now` (the registry's clock reads)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.now = 1_000_000.0

    async def run_typed(self, name: str, action: Any, options: Any = None, /, **kw: Any) -> Any:
        return self.now


async def test_the_watched_sessions_are_kept_by_tag_until_they_expire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = worker_settings(tmp_path, None, SECRET)
    registry_object = next(o for o in index_services(settings) if o.name == "kept-watchers")
    handlers = registry_object.handlers
    watched = handlers["watched"].fn
    registry = ClockedState("all")

    def kept() -> dict[str, float]:
        return jsoncodec.loads(registry.state["watched"])

    def watch(registry: ClockedState, tags: list[Any]) -> Any:
        return handlers["watch"].fn(registry, watch_request(SECRET, tags, round(registry.now)))

    tag = watch_tag(SECRET, "s1")
    other = watch_tag(SECRET, "s2")
    await watch(registry, [tag, "not-a-tag", "S1", 7, "0" * 33])  # only a tag is kept
    assert kept() == {tag: registry.now + WATCH_SECONDS * 1000}
    assert await watched(registry, [tag, other]) == {tag: registry.now + WATCH_SECONDS * 1000}
    assert await watched(registry, [other]) == {}  # only what is asked: not s1's

    registry.now += WATCH_SECONDS * 1000 + 1  # s1's registration expired
    await watch(registry, [other])
    assert list(kept()) == [other]

    monkeypatch.setattr(watchers, "MAX_WATCHED", 2)  # the latest to expire are kept
    tags = [watch_tag(SECRET, f"t{n}") for n in range(4)]
    for one in tags:
        registry.now += 1
        await watch(registry, [one])
    assert sorted(kept()) == sorted(tags[2:])


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ({"retain": 5}, "spec.events.retain: Input should be greater than or equal to 100"),
        ({"retain": 10**7}, "spec.events.retain: Input should be less than or equal to 1000000"),
        ({"liveBatches": 0}, "spec.events.liveBatches: Input should be greater than or equal to 1"),
        ({"keep": 10}, "spec.events.keep: unknown field"),
    ],
)
def test_an_event_retention_out_of_bounds_is_refused_with_the_field_named(
    tmp_path: Path, events: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as refused:
        worker_settings(tmp_path, events)
    assert message in str(refused.value)

"""A session's event stream through the sidecar (`GET /v1/sessions/{id}/events`), read by an SSE
client over real sockets, on the real Restate stack: a client that disconnects mid-run and comes
back with `Last-Event-ID`, a worker SIGKILLed mid-tool and mid-model-call, and two clients on two
sidecar replicas each see every event of every completed step exactly once, in order."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from tests.fakes.model_server import ModelServer, Reply, ToolCall
from tests.restate.support import approval_manifest
from tether.programs.dev import Process, wait_for
from tether.programs.restate_server import free_port
from tether.programs.watch import events_url, sse_events
from tether.programs.webhooks import events_token
from tether.programs.worker.live import (
    ASK_EVERY_SECONDS,
    FLUSH_SECONDS,
    LATE_WATCHER_SECONDS,
    RECHECK_SECONDS,
)
from tether.restate.chain import PER_SEGMENT
from tether.session.events import Cursor
from tether.testing import AgentHarness, wait_until

AgentFactory = Callable[..., AgentHarness]

HOLD_TOOL = '''
"""A tool that holds until the test releases it: the moment to kill the worker."""
import asyncio
import os
from pathlib import Path

from tether import tool


@tool
async def hold(name: str) -> str:
    """Hold until released."""
    workspace = Path(os.environ["TETHER_WORKSPACE"])
    (workspace / f"started-{name}").touch()
    while not (workspace / f"release-{name}").exists():
        await asyncio.sleep(0.02)
    return f"held {name}"
'''


class Stream:
    """An SSE client in a thread: the events it read, until closed or the stream ends."""

    def __init__(self, url: str, after: str | None = None) -> None:
        self.url, self.after = url, after
        self.events: list[dict[str, Any]] = []
        self.status: int | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        headers = {"last-event-id": self.after} if self.after else {}
        with (
            contextlib.suppress(httpx2.HTTPError),  # the sidecar stopped at the test's end
            httpx2.stream("GET", self.url, headers=headers, timeout=None) as response,
        ):
            self.status = response.status_code
            if response.status_code != 200:
                return
            for event in sse_events(response):
                if self._closed.is_set():
                    return  # the connection closes with the `with`
                self.events.append(event)

    def saw(self, kind: str) -> list[dict[str, Any]] | None:
        found = [e for e in self.events if e["type"] == kind]
        return found or None

    def close(self) -> None:
        self._closed.set()

    @property
    def cursor(self) -> str:
        """Where this client is: what it sends back as `Last-Event-ID`."""
        return str(self.events[-1]["cursor"])


def durable(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The durable events, without the cursor each came with (a reader's, not the event's)."""
    return [
        {k: v for k, v in e.items() if k != "cursor"} for e in events if "." not in str(e["id"])
    ]


ONE_TOOL_TURN = ["run_started", "model_done", "tool_finished", "model_done", "run_ended"]


def each_once_in_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The durable events of a run of one tool turn, checked to be each there once, in order."""
    seen = durable(events)
    assert [e["id"] for e in seen] == [str(n) for n in range(1, len(seen) + 1)]
    assert [e["type"] for e in seen] == ONE_TOOL_TURN
    return seen


def write_agent(directory: Path, model: dict[str, Any], **spec: Any) -> Path:
    directory.mkdir(exist_ok=True)
    (directory.parent / "ws").mkdir(exist_ok=True)
    (directory / "hold_tools.py").write_text(HOLD_TOOL)
    manifest = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "watched"},
        "spec": {"model": model, "tools": [{"name": "hold", "python": "hold_tools:hold"}], **spec},
    }
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


@pytest.fixture
def scripted_agent(tether_agent: AgentFactory, tmp_path: Path) -> AgentHarness:
    script = [{"tool_calls": [{"name": "hold", "input": {"name": "a"}}]}, {"text": "done"}]
    model = {"provider": "scripted", "name": "s", "script": script}
    return tether_agent(write_agent(tmp_path / "agent", model), workspace=tmp_path / "ws")


def url_of(agent: AgentHarness, session: str) -> str:
    return events_url(agent.sidecar_url, agent.agent, session, agent.secret.encode())


def test_a_client_sees_each_completed_step_once_across_a_disconnect_and_a_worker_kill(
    scripted_agent: AgentHarness, tmp_path: Path
) -> None:
    agent, workspace = scripted_agent, tmp_path / "ws"
    url = url_of(agent, "s1")
    first = Stream(url)
    invocation = agent.start_run("s1", "hold a")
    wait_until(lambda: first.saw("tool_started"), timeout=30, what="tool_started on the stream")
    assert (workspace / "started-a").exists()
    first.close()  # the client goes away mid-run...
    agent.restart_worker()  # ...and the worker dies mid-tool
    (workspace / "release-a").touch()
    assert agent.result(invocation)["status"] == "completed"

    second = Stream(url, after=first.cursor)  # back, with Last-Event-ID
    wait_until(lambda: second.saw("run_ended"), timeout=30, what="run_ended on the stream")
    second.close()
    seen = each_once_in_order(first.events + second.events)
    assert seen[2]["outcome"] == "interrupted"  # the unsafe call cut off by the kill
    assert seen[4]["status"] == "completed"
    live = [e for e in first.events if "." in str(e["id"])]
    assert [e["type"] for e in live] == ["model_started", "tool_started"]
    cursors = [Cursor.parse(e["cursor"]) for e in first.events + second.events]
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
    own = [e["id"] for e in first.events + second.events]
    assert len(set(own)) == len(own)  # no event twice

    # After the run, a new client reads the same durable events from the start.
    late = Stream(url)
    wait_until(lambda: late.saw("run_ended"), timeout=30, what="the stream after the run")
    late.close()
    assert durable(late.events) == seen


def live_kept(agent: AgentHarness, session: str) -> list[str]:
    """The kinds of the live events `<agent>-live` keeps for `session` (read through the
    ingress, as the sidecars do)."""
    url = f"{agent.ingress_url}/{agent.agent}-live/{session}/read"
    response = httpx2.post(url, json=None, timeout=10)
    assert response.status_code == 200, response.text
    return [event["type"] for event in response.json()]


def test_live_events_are_sent_for_the_sessions_a_client_watches_only(
    scripted_agent: AgentHarness, tmp_path: Path
) -> None:
    """Each batch of live events is an invocation of `<agent>-live`: a run nobody watches sends
    none, and one a client starts to watch as the run starts sends them all."""
    agent = scripted_agent
    (tmp_path / "ws" / "release-a").touch()
    assert agent.result(agent.start_run("quiet", "hold a"))["status"] == "completed"
    quiet_ended = time.monotonic()

    client = Stream(url_of(agent, "seen"))
    assert agent.result(agent.start_run("seen", "hold a"))["status"] == "completed"

    def live_seen() -> list[str] | None:  # live events travel apart from the durable ones
        live = [e["type"] for e in client.events if "." in str(e["id"])]
        return live if len(live) >= 3 and client.saw("run_ended") else None

    live = wait_until(live_seen, timeout=30, what="the live events on the stream")
    client.close()
    assert live[:3] == ["model_started", "tool_started", "model_started"], live
    assert live_kept(agent, "seen")[:3] == live[:3]

    # Had the worker sent the quiet run's events, it would have long before the watched run's
    # (within a flush); it drops them once it has read the watched set a while after they came.
    decided = LATE_WATCHER_SECONDS + RECHECK_SECONDS + 2 * ASK_EVERY_SECONDS + 2 * FLUSH_SECONDS
    time.sleep(max(0.0, decided - (time.monotonic() - quiet_ended)))
    assert live_kept(agent, "quiet") == []


def test_a_client_that_comes_as_a_run_goes_gets_the_live_events_of_the_second_before(
    tether_agent: AgentFactory, tmp_path: Path
) -> None:
    """A run's live events wait `LATE_WATCHER_SECONDS` for a client: one that opens its stream
    just after the run started (here: while its tool holds) still sees them all."""
    script = [{"tool_calls": [{"name": "hold", "input": {"name": "late"}}]}, {"text": "done"}]
    model = {"provider": "scripted", "name": "s", "script": script}
    agent = tether_agent(write_agent(tmp_path / "agent", model), workspace=tmp_path / "ws")
    invocation = agent.start_run("late", "hold")
    wait_until((tmp_path / "ws" / "started-late").exists, timeout=30, what="the held tool")
    client = Stream(url_of(agent, "late"))  # after model_started and tool_started came
    wait_until(lambda: client.saw("tool_started"), timeout=30, what="tool_started, sent late")
    (tmp_path / "ws" / "release-late").touch()
    assert agent.result(invocation)["status"] == "completed"
    client.close()
    assert [e["type"] for e in client.events if "." in str(e["id"])][:2] == [
        "model_started",
        "tool_started",
    ]


def test_past_spec_events_retain_the_oldest_events_of_a_session_are_cleared(
    tether_agent: AgentFactory, tmp_path: Path
) -> None:
    """A run of 167 durable events in a session that keeps 100 (`spec.events.retain`): a reader
    from the start gets the newest, from the oldest segment still kept, each once and in order."""
    turn = {"tool_calls": [{"name": "hold", "input": {"name": "x"}}] * 40}
    model = {"provider": "scripted", "name": "s", "script": [turn] * 4 + [{"text": "done"}]}
    path = write_agent(tmp_path / "agent", model, events={"retain": 100})
    agent = tether_agent(path, workspace=tmp_path / "ws")
    (tmp_path / "ws" / "release-x").touch()
    assert agent.result(agent.start_run("s3", "hold x"))["status"] == "completed"

    reader = Stream(url_of(agent, "s3"))
    wait_until(lambda: reader.saw("run_ended"), timeout=30, what="run_ended on the stream")
    reader.close()
    kept = [int(e["id"]) for e in durable(reader.events)]
    # run_started (1), per turn model_done and its 40 tool_finished (2-165), the last
    # model_done (166) and run_ended (167); the oldest go in whole segments while the rest
    # still holds 100
    assert kept == list(range(kept[0], 168))
    assert 100 <= len(kept) <= 100 + 2 * PER_SEGMENT


def test_a_run_parked_on_an_approval_has_stored_its_events_while_it_waits(
    tether_agent: AgentFactory, tmp_path: Path
) -> None:
    """A run's durable events are held back and stored together at its next wait: a park is
    one, so a client sees `approval_parked` (and the turn before it) while the run waits."""
    call = {"name": "write_file", "input": {"path": "a.txt", "content": "x"}}
    script = [{"tool_calls": [call]}, {"text": "done"}]
    agent = tether_agent(approval_manifest(tmp_path, "watched", script), workspace=tmp_path)
    reader = Stream(url_of(agent, "s4"))
    invocation = agent.start_run("s4", "write it")
    [parked] = agent.parked(at_least=1)
    wait_until(lambda: reader.saw("approval_parked"), timeout=20, what="approval_parked")
    assert [e["type"] for e in durable(reader.events)] == [
        "run_started",
        "model_done",
        "approval_parked",
    ]
    agent.approve(parked)
    assert agent.result(invocation)["status"] == "completed"
    wait_until(lambda: reader.saw("run_ended"), timeout=30, what="run_ended on the stream")
    reader.close()


def test_reading_needs_a_token_for_this_session_that_has_not_expired(
    scripted_agent: AgentHarness,
) -> None:
    agent = scripted_agent
    base = f"{agent.sidecar_url}/v1/sessions/s1/events"
    secret = agent.secret.encode()
    cases = {
        "none": base,
        "another session": f"{base}?token={events_token(secret, agent.agent, 's2')}",
        "expired": f"{base}?token={events_token(secret, agent.agent, 's1', expires=1)}",
        "another secret": f"{base}?token={events_token(b'x' * 32, agent.agent, 's1')}",
        "an expiry of 5,000 digits": f"{base}?token={'9' * 5000}.ab",  # int() of it raises
        "an expiry in other digits": f"{base}?token=%C2%B2%C2%B2.ab",  # "²".isdigit()
    }
    for case, url in cases.items():
        response = httpx2.get(url, timeout=10)
        assert response.status_code == 401, (case, response.text)
        assert response.json()["outcome"] == "bad_token"


def test_a_model_call_cut_off_by_a_crash_is_announced_as_restarted(
    tether_agent: AgentFactory,
    model_server: ModelServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two clients on two sidecar replicas; the worker is SIGKILLed while the model streams."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    held = Reply(text=["The ", "answer ", "is"], hold_after=6)
    model_server.script(
        held, Reply(tool_calls=[ToolCall("hold", {"name": "b"})]), Reply(text=["done"])
    )
    model = {"provider": "anthropic", "name": "claude-test", "baseUrl": model_server.anthropic_url}
    agent = tether_agent(write_agent(tmp_path / "agent", model), workspace=tmp_path / "ws")
    (tmp_path / "ws" / "release-b").touch()
    url = url_of(agent, "s2")
    with second_sidecar(agent, tmp_path) as other:
        clients = [Stream(url), Stream(url.replace(agent.sidecar_url, other))]
        run_and_crash_mid_model(agent, held, clients)


@contextmanager
def second_sidecar(agent: AgentHarness, tmp_path: Path) -> Iterator[str]:
    """Another `tether sidecar` process in front of the same Restate and agent: its URL."""
    port = free_port()
    command = [sys.executable, "-m", "tether", "sidecar", "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    second = Process("second sidecar", command, dict(agent.stack.sidecar.env), tmp_path / "s2.log")
    second.start()
    try:
        wait_for(f"http://127.0.0.1:{port}/readyz", "second sidecar", second)
        yield f"http://127.0.0.1:{port}"
    finally:
        second.kill(signal.SIGTERM)


def run_and_crash_mid_model(agent: AgentHarness, held: Reply, clients: list[Stream]) -> None:
    invocation = agent.start_run("s2", "answer")
    wait_until(
        lambda: all(c.saw("model_text") for c in clients), timeout=30, what="the streamed text"
    )
    agent.restart_worker()
    held.release.set()
    assert agent.result(invocation)["status"] == "completed"
    for client in clients:
        # Live events travel apart from durable ones (`tether.session.events`): the restart
        # may reach a client after `run_ended` (its poll read the durable events after the run
        # ended, the live ones before the new worker pushed them), in the next poll.
        wait_until(
            lambda c=client: c.saw("run_ended") and c.saw("model_restarted"),
            timeout=30,
            what="run_ended and model_restarted",
        )
        client.close()
        kinds = [e["type"] for e in client.events]
        restarted = kinds.index("model_restarted")
        assert "model_text" in kinds[:restarted]  # partial text, then the restart
        assert kinds[restarted + 1] == "model_started"
        each_once_in_order(client.events)

"""A browser's own SSE client follows a session: Debian's chromium, headless, with `EventSource`
on a page of the sidecar's origin. The sidecar is SIGKILLed and restarted mid-run, and the worker
SIGKILLed mid-tool: the browser reconnects by itself, sending `Last-Event-ID`, and has every
durable event once, in order."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.restate.test_approval_page_browser import browser  # noqa: F401 - a fixture
from tests.restate.test_events import each_once_in_order, url_of, write_agent
from tether.programs.dev import wait_for
from tether.testing import AgentHarness, wait_until

AgentFactory = Callable[..., AgentHarness]

FOLLOW = """url => {
  window.events = [];
  window.opened = 0;
  const source = new EventSource(url);
  source.onopen = () => { window.opened += 1; };
  const keep = e => window.events.push(JSON.parse(e.data));
  for (const kind of ["run_started", "model_started", "model_done", "tool_started",
                      "tool_finished", "run_ended"]) {
    source.addEventListener(kind, keep);
  }
}"""


def test_a_browser_follows_a_run_across_a_sidecar_restart_and_a_worker_kill(
    tether_agent: AgentFactory,
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    script = [{"tool_calls": [{"name": "hold", "input": {"name": "a"}}]}, {"text": "done"}]
    model = {"provider": "scripted", "name": "s", "script": script}
    agent = tether_agent(write_agent(tmp_path / "agent", model), workspace=tmp_path / "ws")
    page = browser.new_page()
    page.goto(f"{agent.sidecar_url}/healthz")  # the sidecar's origin: no CORS needed
    page.evaluate(FOLLOW, url_of(agent, "s1"))

    def seen(kind: str) -> bool:
        events: list[dict[str, Any]] = page.evaluate("window.events")
        return any(e["type"] == kind for e in events)

    invocation = agent.start_run("s1", "hold a")
    wait_until(lambda: seen("tool_started"), timeout=30, what="tool_started in the browser")
    sidecar = agent.stack.sidecar
    sidecar.kill(signal.SIGKILL)  # the browser's connection drops...
    agent.restart_worker()  # ...and the worker dies mid-tool
    (tmp_path / "ws" / "release-a").touch()
    sidecar.start()
    wait_for(f"{agent.sidecar_url}/healthz", "sidecar", sidecar)
    assert agent.result(invocation)["status"] == "completed"

    wait_until(lambda: seen("run_ended"), timeout=60, what="run_ended in the browser")
    assert page.evaluate("window.opened") >= 2  # it reconnected by itself
    events: list[dict[str, Any]] = page.evaluate("window.events")
    seen_once = each_once_in_order(events)
    assert seen_once[2]["outcome"] == "interrupted"

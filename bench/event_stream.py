"""The event stream's latency and its cost to a run, on a real local stack.

    .venv/bin/python bench/event_stream.py --turns 40 --repeat 3

A scripted agent (`--turns` tool turns, then an answer; the tool returns at once) runs on a
`tether.testing.AgentHarness` (restate-server, a worker process, its sidecar):
- latency: an SSE client on the sidecar's `GET /v1/sessions/{id}/events` stamps each event as it
  arrives; an event's latency is that stamp minus the event's own `at` (the journaled time of its
  step, or the moment a live event was sent), on one machine, so one clock. p50 and p99, durable
  and live apart;
- cost: the same run without a client, and with one attached, taking turns; the ratio of their
  wall times (the durable events are written either way: what a client adds is the sidecar's
  reads of Restate while the run goes on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import yaml
from scripted_agent import scripted_agent

from tether.programs.watch import events_url, sse_events
from tether.testing import AgentHarness

TOOL = '''
from tether import tool


@tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text
'''


def write_agent(directory: Path, turns: int) -> Path:
    (directory / "echo_tools.py").write_text(TOOL)
    call = {"tool_calls": [{"name": "echo", "input": {"text": "x"}}], "text": "echoing"}
    tools = [{"name": "echo", "python": "echo_tools:echo", "replay": "safe"}]
    manifest = scripted_agent("bench-events", [call] * turns + [{"text": "done"}], tools, turns + 5)
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


class Client(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.received: list[tuple[float, dict[str, Any]]] = []
        self.ended = threading.Event()

    def run(self) -> None:
        with httpx2.stream("GET", self.url, timeout=None) as response:
            for event in sse_events(response):
                self.received.append((time.time() * 1000, event))
                if event["type"] == "run_ended":
                    self.ended.set()
                    return


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    durable_ms: list[float] = []
    live_ms: list[float] = []
    ratios: list[float] = []
    with tempfile.TemporaryDirectory() as temp:
        manifest = write_agent(Path(temp), args.turns)
        with AgentHarness(manifest) as agent:
            secret = agent.secret.encode()
            agent.run("warm-up", "go", timeout=300)
            for repeat in range(args.repeat):
                times: dict[bool, float] = {}
                for watched in (False, True) if repeat % 2 == 0 else (True, False):
                    session = f"s{repeat}-{int(watched)}"
                    client = None
                    if watched:
                        client = Client(events_url(agent.sidecar_url, agent.agent, session, secret))
                        client.start()
                        time.sleep(0.3)  # connected before the run starts
                    started = time.monotonic()
                    agent.run(session, "go", timeout=300)
                    times[watched] = time.monotonic() - started
                    if client is not None:
                        client.ended.wait(60)
                        for arrived, event in client.received:
                            lag = arrived - float(event["at"])
                            (live_ms if "." in str(event["id"]) else durable_ms).append(lag)
                ratios.append(times[True] / times[False])
                print(
                    f"repeat {repeat + 1}: without a client {times[False]:.2f} s, with one "
                    f"{times[True]:.2f} s, ratio {ratios[-1]:.2f}",
                    flush=True,
                )
    result = {
        "turns": args.turns,
        "durable_events": len(durable_ms),
        "durable_p50_ms": round(percentile(durable_ms, 50), 1),
        "durable_p99_ms": round(percentile(durable_ms, 99), 1),
        "live_events": len(live_ms),
        "live_p50_ms": round(percentile(live_ms, 50), 1),
        "live_p99_ms": round(percentile(live_ms, 99), 1),
        "cost_ratio_median": round(statistics.median(ratios), 2),
        "cost_ratios": [round(r, 2) for r in ratios],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How long a run takes to start on a long session, on a real local stack.

    .venv/bin/python bench/long_sessions.py --sizes 10,500,5000 --repeat 5

A scripted agent on a `tether.testing.AgentHarness` (restate-server, a worker process, its
sidecar). Each session is built by real runs of the agent, n / 4 of them: each a prompt, an
instant tool turn (an assistant turn and its tool result) and the answer, so the state holds
what the worker itself writes (turns, run records, events), not a hand-made copy of it. The
agent compacts its requests to the model's context window (`--context-window`, tokens; 0: no
compaction, every turn goes to the model). Then each session gets `--repeat` more runs, the
sizes taking turns, after one warm-up run each. A run's start is the time from the client
sending the run request to the worker starting the run's first model call: the `at` of the run's
`model_started` live event, stamped by the worker just before it hands the request to the
provider (one machine, one clock); the scripted provider answers at once, so nothing after that
point is measured.

Printed per size: the median start (and the spread), the Restate state of the session (keys and
bytes, `SUM(value_length)` of the `state` table; the turns alone too), and the journal of one
measured run (entries and bytes, `sys_invocation`), and the median time of an events poll (the
sidecar's read of the session's durable events while a stream is open); then the ratios of the
medians to the smallest session's. Goal: the largest (5,000 turns) within 1.5x of the smallest
(10 turns), with compaction (without it every turn is read and sent: the work grows with the
session by design).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from tether.jsoncodec import loads
from tether.programs.local_http import request_json as http
from tether.programs.webhooks import watch_request, watch_tag
from tether.testing import AgentHarness, wait_until

AGENT = "bench-long"
TURNS_PER_RUN = 4
CALL = {"tool_calls": [{"name": "echo", "input": {"text": "x"}}], "text": "echoing"}
DONE = {"text": "done"}
TOOL = '''
from tether import tool


@tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text
'''


def write_agent(directory: Path, runs: int, context_window: int) -> Path:
    """An agent whose every run is a tool turn and an answer: the scripted model picks its
    response by the session's assistant turns so far, two per run."""
    (directory / "echo_tools.py").write_text(TOOL)
    model: dict[str, Any] = {"provider": "scripted", "name": "s", "script": [CALL, DONE] * runs}
    spec: dict[str, Any] = {
        "model": model,
        "tools": [{"name": "echo", "python": "echo_tools:echo", "replay": "safe"}],
        "limits": {"maxTurns": 5},
    }
    if context_window:
        model["contextWindow"] = context_window
        spec["behavior"] = {"compactStrategy": "tail"}
    manifest = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": AGENT},
        "spec": spec,
    }
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def state_size(agent: AgentHarness, session: str) -> dict[str, int]:
    rows = agent.restate.server.query(
        "SELECT key, value_length FROM state "
        f"WHERE service_name = {quoted(AGENT)} AND service_key = {quoted(session)}"
    )
    turns = [r for r in rows if str(r["key"]).startswith("tether:turn")]
    return {
        "keys": len(rows),
        "bytes": sum(int(r["value_length"]) for r in rows),
        "turn_keys": len(turns),
        "turn_bytes": sum(int(r["value_length"]) for r in turns),
    }


def journal_size(agent: AgentHarness, invocation: str) -> dict[str, int]:
    rows = agent.restate.server.query(
        f"SELECT journal_size FROM sys_invocation WHERE id = {quoted(invocation)}"
    )
    entries = agent.restate.server.query(
        f"SELECT entry_type, raw_length FROM sys_journal WHERE id = {quoted(invocation)}"
    )
    return {
        "entries": int(rows[0]["journal_size"]) if rows else -1,
        "bytes": sum(int(e["raw_length"]) for e in entries),
        # state reads that waited for a round trip (not sent with the invocation)
        "lazy_reads": sum(1 for e in entries if e["entry_type"] == "Command: GetLazyState"),
    }


def model_started(agent: AgentHarness, session: str, run_id: str) -> float:
    """The `at` (epoch ms) of the run's first `model_started` live event, as the worker stamped
    it (live events reach `<agent>-live` in batches, shortly after they happen)."""

    def found() -> float | None:
        rows = agent.restate.server.query(
            "SELECT value_utf8 FROM state "
            f"WHERE service_name = {quoted(AGENT + '-live')} AND service_key = {quoted(session)} "
            "AND key LIKE 'live:%'"
        )
        stamps = [
            float(e["at"])
            for row in rows
            for e in loads(str(row["value_utf8"]))
            if e.get("type") == "model_started" and e.get("run") == run_id
        ]
        return min(stamps) if stamps else None

    return wait_until(found, timeout=30, interval=0.05, what=f"model_started of {run_id}")


def watch(agent: AgentHarness, session: str) -> None:
    """Register `session` as watched, as the sidecar does for a client streaming it: the
    worker sends the live events (the `model_started` timed here) of watched sessions only."""
    url = f"{agent.ingress_url}/{AGENT}-watchers/all/watch"
    secret = agent.secret.encode()
    registration = watch_request(secret, [watch_tag(secret, session)])
    response = http("POST", url, registration)
    if response.status != 200:
        raise RuntimeError(f"watch {session}: HTTP {response.status}")


def timed_start(agent: AgentHarness, session: str) -> tuple[float, str]:
    """Milliseconds from sending a run request to its first model call; the invocation id."""
    watch(agent, session)
    sent = time.time() * 1000
    invocation = agent.start_run(session, "again")
    result = agent.result(invocation, timeout=300)
    if result["status"] != "completed":
        raise RuntimeError(f"run on {session}: {result}")
    return model_started(agent, session, result["run_id"]) - sent, invocation


def poll_ms(agent: AgentHarness, session: str, polls: int = 20) -> float:
    """The median time of the sidecar's poll of a session's durable events (the shared
    `events` handler, asked for those after the newest: an idle stream's poll)."""
    url = f"{agent.ingress_url}/{AGENT}/{session}/events"
    took = []
    for _ in range(polls):
        started = time.perf_counter()
        response = http("POST", url, str(10**9))
        if response.status != 200:
            raise RuntimeError(f"events of {session}: HTTP {response.status}")
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,500,5000", help="session sizes in turns")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--context-window",
        type=int,
        default=2_000,
        help="the model's context window in tokens, which requests are compacted to "
        "(0: no compaction)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line only")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if any(n % TURNS_PER_RUN for n in sizes):
        raise SystemExit(f"session sizes are built {TURNS_PER_RUN} turns a run: {sizes}")

    def say(text: str) -> None:
        if not args.json:
            print(text, flush=True)

    starts: dict[int, list[float]] = {n: [] for n in sizes}
    report: dict[str, Any] = {
        "sizes": sizes,
        "context_window": args.context_window or None,
        "repeat": args.repeat,
        "sessions": {},
    }
    with (
        tempfile.TemporaryDirectory() as temp,
        AgentHarness(
            write_agent(
                Path(temp), max(sizes) // TURNS_PER_RUN + args.repeat + 1, args.context_window
            )
        ) as agent,
    ):
        for n in sizes:
            began = time.monotonic()
            for _ in range(n // TURNS_PER_RUN):
                result = agent.run(f"s{n}", "more", timeout=60)
                if result["status"] != "completed":
                    raise RuntimeError(f"building s{n}: {result}")
            say(f"built s{n}: {n} turns in {time.monotonic() - began:.1f} s")
        for n in sizes:
            timed_start(agent, f"s{n}")  # warm-up
        invocations: dict[int, str] = {}
        for repeat in range(args.repeat):
            for n in sizes if repeat % 2 == 0 else reversed(sizes):
                took, invocations[n] = timed_start(agent, f"s{n}")
                starts[n].append(took)
            say(f"repeat {repeat + 1}: " + ", ".join(f"{n}: {starts[n][-1]:.1f} ms" for n in sizes))
        for n in sizes:
            median = statistics.median(starts[n])
            report["sessions"][str(n)] = {
                "start_ms_median": round(median, 1),
                "events_poll_ms": round(poll_ms(agent, f"s{n}"), 1),
                "start_ms": [round(s, 1) for s in starts[n]],
                "state": state_size(agent, f"s{n}"),
                "run_journal": journal_size(agent, invocations[n]),
            }
    base = statistics.median(starts[sizes[0]])
    report["ratios"] = {
        f"{n}/{sizes[0]}": round(statistics.median(starts[n]) / base, 2) for n in sizes[1:]
    }
    if not args.json:
        for n in sizes:
            s = report["sessions"][str(n)]
            state, journal = s["state"], s["run_journal"]
            say(
                f"{n:>6} turns: start {s['start_ms_median']:.1f} ms (min {min(starts[n]):.1f}, "
                f"max {max(starts[n]):.1f}); state {state['keys']} keys, {state['bytes']:,} B "
                f"(turns {state['turn_keys']} keys, {state['turn_bytes']:,} B); a run's journal "
                f"{journal['entries']} entries, {journal['bytes']:,} B, "
                f"{journal['lazy_reads']} lazy reads; an events poll "
                f"{s['events_poll_ms']:.1f} ms"
            )
        say("ratios: " + ", ".join(f"{k} {v}" for k, v in report["ratios"].items()))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

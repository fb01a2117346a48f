"""Cost per journaled step of the Restate runtime, as ratios against raw SDK steps measured in
the same run, on the same real restate-server and worker process.

    python bench/restate_steps.py [--steps 200] [--resume-steps 1000] [--repeat 5]

Starts a restate-server (`tether.programs.restate_server.RestateServer`, the pinned npm build) and
one hypercorn worker serving `bench/restate_bench_service.py` (h2c, as the tests and `tether worker`
do), then measures, alternating ours and the floor in every repetition:

(a) steps/s of a run: the floor is a raw handler doing N bare `ctx.run_typed` steps; ours is a
    scripted agent on `restate_runtime` whose every turn calls one tool (a decision, a model and
    a tool step per turn, plus the session writes they imply), sized to the same N. Goal: ours
    costs at most 1.25x the floor per step.
(b) resume after suspension: both handlers journal ~1,000 steps, then park on an awakeable and
    suspend (1 s inactivity timeout). The time from resolving the awakeable to the result is the
    cost of replaying the whole journal. Goal: ours at most 1.5x the raw handler. Split into
    the resumed attempt's time in its handler (the replay: the SDK hands the handler nothing
    before it has received the whole journal) and the rest (Restate reading and sending the
    journal, the worker receiving and decoding it, the answer).
(c) a run of `--tool-turns` tool turns (safe, then unsafe) against the floor's raw steps, and
    the journal entries of each.
(d) the journal entries per tool turn when each turn is stored before the next model call, as a
    slow model's turns are (the state writes of quick turns go together at the run's end).
(e) the Run commands of a run on Tether's worker (`tether worker`, with its session inbox) whose
    tool turns are a second apart, as real ones are (`--paced-turns` shell calls of `sleep 1.05`,
    unsafe, and an answer): the floor is 3 per tool turn and 1 for the answer; what it journals
    once per run (the start's clock read; a call to the inbox) comes on top.

Times are wall-clock at the client (a call through the ingress, or resolve -> attach result);
the fixed cost of a call is the same on both sides. Medians of `--repeat` repetitions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scripted_agent import scripted_agent

from tether.programs.local_http import Response
from tether.programs.local_http import request_json as http
from tether.programs.restate_install import DEFAULT_RESTATE_VERSION
from tether.programs.restate_server import RestateServer
from tether.testing import HypercornWorker, wait_until

SERVICE = Path(__file__).resolve().parent / "restate_bench_service.py"
DEADLINE = 300.0


# HTTP -----------------------------------------------------------------------------------------


def ok(resp: Response, *statuses: int) -> Response:
    if resp.status not in (statuses or (200,)):
        raise RuntimeError(f"HTTP {resp.status}: {resp.body[:2000]!r}")
    return resp


# The worker -----------------------------------------------------------------------------------


@contextlib.contextmanager
def hypercorn_worker(directory: Path) -> Iterator[str]:
    """`python -m hypercorn` serving the bench service (its own session, killed as a group)."""
    with HypercornWorker(f"{SERVICE}:app", log_dir=directory) as worker:
        yield worker.url


# Measurements ---------------------------------------------------------------------------------


def key(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def timed_call(server: RestateServer, path: str, payload: Any) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    resp = ok(http("POST", f"{server.ingress_url}/{path}", payload))
    return time.perf_counter() - started, resp.json()


def journal_entries(server: RestateServer, target: str) -> int:
    rows = server.query(
        "SELECT COUNT(*) AS n FROM sys_journal j JOIN sys_invocation i ON j.id = i.id "
        f"WHERE i.target = '{target}'"
    )
    return int(rows[0]["n"]) if rows else 0


def resume_seconds(
    server: RestateServer, service: str, payload: dict[str, Any], directory: Path
) -> tuple[float, dict[str, Any]]:
    """Park `service/<key>/park`, wait until it is suspended, then time resolve -> result.

    The invocation is sent with an idempotency key, so its result stays attachable after it
    completes: the attach right after the resolve returns as soon as the result exists."""
    path = directory / f"awakeable-{uuid.uuid4().hex[:8]}"
    url = f"{server.ingress_url}/{service}/{key(service)}/park/send"
    sent = http("POST", url, {**payload, "path": str(path)}, headers={"idempotency-key": key("k")})
    invocation_id = ok(sent, 202).json()["invocationId"]

    def awakeable_id() -> str | None:
        with contextlib.suppress(FileNotFoundError):
            return path.read_text().strip() or None
        return None

    awakeable = wait_until(awakeable_id, what=f"{service} to park", timeout=DEADLINE, interval=0.02)

    def suspended() -> bool:
        rows = server.query(f"SELECT status FROM sys_invocation WHERE id = '{invocation_id}'")
        return bool(rows) and rows[0]["status"] == "suspended"

    wait_until(suspended, what=f"{service} to suspend", timeout=DEADLINE, interval=0.02)
    started = time.perf_counter()
    resolve = f"{server.ingress_url}/restate/awakeables/{awakeable}/resolve"
    ok(http("POST", resolve, "go"), 200, 202)
    attached = ok(http("GET", f"{server.ingress_url}/restate/invocation/{invocation_id}/attach"))
    seconds = time.perf_counter() - started
    result: dict[str, Any] = attached.json()
    assert result["resolved"] == "go", result
    return seconds, result


def side_by_side(
    repeat: int, ours: Callable[[], float], raw: Callable[[], float]
) -> tuple[list[float], list[float], list[float]]:
    """Seconds of each side per repetition (the order alternates, so neither always goes first),
    and their ratios."""
    ours_seconds: list[float] = []
    raw_seconds: list[float] = []
    for i in range(repeat):
        if i % 2 == 0:
            ours_seconds.append(ours())
            raw_seconds.append(raw())
        else:
            raw_seconds.append(raw())
            ours_seconds.append(ours())
    ratios = [o / r for o, r in zip(ours_seconds, raw_seconds, strict=True)]
    return ours_seconds, raw_seconds, ratios


def measure_steps(server: RestateServer, steps: int, repeat: int) -> dict[str, Any]:
    turns = max(2, round(steps / 2))
    # Warm-up (not counted): first calls pay imports and connection set-up.
    _, warm = timed_call(server, f"BenchAgent/{key('warm')}/run", {"turns": turns})
    n = int(warm["steps"])
    timed_call(server, f"BenchRaw/{key('warm')}/steps", n)
    keys = {"ours": "", "raw": ""}

    def ours() -> float:
        keys["ours"] = key("ours")
        seconds, result = timed_call(server, f"BenchAgent/{keys['ours']}/run", {"turns": turns})
        assert int(result["steps"]) == n and int(result["replayed"]) == 0, result
        return seconds

    def raw() -> float:
        keys["raw"] = key("raw")
        return timed_call(server, f"BenchRaw/{keys['raw']}/steps", n)[0]

    ours_seconds, raw_seconds, ratios = side_by_side(repeat, ours, raw)
    return {
        "steps": n,
        "turns": turns,
        "ours": statistics.median(n / s for s in ours_seconds),
        "raw": statistics.median(n / s for s in raw_seconds),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "ours_entries": journal_entries(server, f"BenchAgent/{keys['ours']}/run"),
        "raw_entries": journal_entries(server, f"BenchRaw/{keys['raw']}/steps"),
    }


def median_difference(totals: list[float], parts: list[float]) -> float:
    return statistics.median(t - p for t, p in zip(totals, parts, strict=True))


def measure_resume(
    server: RestateServer, steps: int, repeat: int, directory: Path
) -> dict[str, Any]:
    turns = max(2, round(steps / 2))
    _, warm = timed_call(server, f"BenchAgent/{key('warm')}/run", {"turns": turns})
    n = int(warm["steps"])  # a model and a tool step per turn; the last: model, end
    handler: dict[str, list[float]] = {"ours": [], "raw": []}

    def ours() -> float:
        seconds, result = resume_seconds(server, "BenchAgent", {"turns": turns}, directory)
        # The resumed attempt replayed every step of the run, ran none live.
        assert result["replayed"] == n and result["live"] == 0, result
        handler["ours"].append(result["handler_ms"] / 1000)
        return seconds

    def raw() -> float:
        seconds, result = resume_seconds(server, "BenchRaw", {"steps": n}, directory)
        handler["raw"].append(result["handler_ms"] / 1000)
        return seconds

    ours_seconds, raw_seconds, ratios = side_by_side(repeat, ours, raw)
    return {
        "steps": n,
        "ours": statistics.median(ours_seconds),
        "raw": statistics.median(raw_seconds),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        # The resumed attempt's time in its handler: the replay, once the journal is received.
        "ours_handler": statistics.median(handler["ours"]),
        "raw_handler": statistics.median(handler["raw"]),
        "ours_rest": median_difference(ours_seconds, handler["ours"]),
        "raw_rest": median_difference(raw_seconds, handler["raw"]),
    }


def measure_tool_turns(
    server: RestateServer, tool_turns: int, repeat: int, *, unsafe: bool
) -> dict[str, Any]:
    """An agent's run of `tool_turns` tool turns and a final answer, against the floor: raw
    steps, as many as the guarantees need (per tool turn the model step and the tool body, and
    the intent before an unsafe one; the final answer's model step)."""
    payload = {"turns": tool_turns + 1, "unsafe": unsafe}
    floor = (3 if unsafe else 2) * tool_turns + 1
    timed_call(server, f"BenchAgent/{key('warm')}/run", payload)
    keys = {"ours": "", "raw": ""}

    def ours() -> float:
        keys["ours"] = key("ours")
        return timed_call(server, f"BenchAgent/{keys['ours']}/run", payload)[0]

    def raw() -> float:
        keys["raw"] = key("raw")
        return timed_call(server, f"BenchRaw/{keys['raw']}/steps", floor)[0]

    ours_seconds, raw_seconds, ratios = side_by_side(repeat, ours, raw)
    return {
        "floor": floor,
        "ours": statistics.median(ours_seconds),
        "raw": statistics.median(raw_seconds),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "ours_entries": journal_entries(server, f"BenchAgent/{keys['ours']}/run"),
        "raw_entries": journal_entries(server, f"BenchRaw/{keys['raw']}/steps"),
    }


def entries_per_stored_turn(server: RestateServer, *, unsafe: bool) -> float:
    """Journal entries per tool turn of a run that stores each turn before its next model call
    (`checkpoint_every_ms=0`, as a slow model's turns are): the difference between runs of 21
    and 11 turns, over 10, so what a run journals once is left out."""
    counts = []
    for turns in (11, 21):
        k = key("stored")
        payload = {"turns": turns, "unsafe": unsafe, "checkpoint_every_ms": 0}
        timed_call(server, f"BenchAgent/{k}/run", payload)
        counts.append(journal_entries(server, f"BenchAgent/{k}/run"))
    return (counts[1] - counts[0]) / 10


def paced_run_commands(server: RestateServer, directory: Path, tool_turns: int) -> list[str]:
    """The names of the Run commands of one run of (e), in journal order."""
    call = {"tool_calls": [{"name": "pause", "input": {"command": "sleep 1.05"}}]}
    script = [call] * tool_turns + [{"text": "done"}]
    tools = [{"name": "pause", "builtin": "shell"}]
    manifest = scripted_agent("paced", script, tools, tool_turns + 1)
    spec = directory / "paced.yaml"
    spec.write_text(json.dumps(manifest))
    env = {
        "TETHER_SPEC": str(spec),
        "TETHER_WORKSPACE": str(directory),
        "TETHER_WEBHOOK_SECRET": "bench",
        "TETHER_WEBHOOK_BASE_URL": "http://sidecar.invalid",
    }
    app = "tether.programs.worker.asgi:app"
    with HypercornWorker(app, log_dir=directory, env=env) as worker:
        server.register(worker.url)
        session = key("paced")
        ok(http("POST", f"{server.ingress_url}/paced/{session}/run", {"prompt": "go"}))
    rows = server.query(
        "SELECT j.name FROM sys_journal j JOIN sys_invocation i ON j.id = i.id "
        f"WHERE i.target = 'paced/{session}/run' AND j.entry_type = 'Command: Run' "
        "ORDER BY j.index"
    )
    return [str(row["name"]) for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="journaled steps per run in (a)")
    parser.add_argument("--resume-steps", type=int, default=1000, help="steps replayed in (b)")
    parser.add_argument("--tool-turns", type=int, default=100, help="tool turns per run in (c)")
    parser.add_argument("--paced-turns", type=int, default=4, help="tool turns in (e)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp, RestateServer() as server:
        directory = Path(tmp)
        with hypercorn_worker(directory) as worker_url:
            server.register(worker_url)
            print(
                f"Restate runtime vs raw SDK steps: restate-server {DEFAULT_RESTATE_VERSION}, "
                f"one hypercorn worker (h2c), median of {args.repeat}"
            )
            a = measure_steps(server, args.steps, args.repeat)
            print(
                f"  (a) {a['steps']} journaled steps per run ({a['turns']} turns): ours "
                f"{a['ours']:7.0f} steps/s, raw SDK {a['raw']:7.0f} steps/s, "
                f"ratio {a['ratio']:.2f} (goal <= 1.25)"
            )
            print(
                f"      ratios {', '.join(f'{r:.2f}' for r in a['ratios'])}; journal entries "
                f"per run: ours {a['ours_entries']}, raw {a['raw_entries']}"
            )
            b = measure_resume(server, args.resume_steps, args.repeat, directory)
            print(
                f"  (b) resume after suspension, {b['steps']} journaled steps replayed: ours "
                f"{b['ours'] * 1000:7.1f} ms, raw SDK {b['raw'] * 1000:7.1f} ms, "
                f"ratio {b['ratio']:.2f} (goal <= 1.5)"
            )
            print(f"      ratios {', '.join(f'{r:.2f}' for r in b['ratios'])}")
            print(
                f"      in the handler (the replay): ours {b['ours_handler'] * 1000:.1f} ms, raw "
                f"{b['raw_handler'] * 1000:.1f} ms; the rest (the journal sent, decoded, the "
                f"answer): ours {b['ours_rest'] * 1000:.1f} ms, raw {b['raw_rest'] * 1000:.1f} ms"
            )
            for unsafe in (True, False):
                c = measure_tool_turns(server, args.tool_turns, args.repeat, unsafe=unsafe)
                kind = "unsafe" if unsafe else "safe"
                per_turn = c["ours_entries"] / (args.tool_turns + 1)
                print(
                    f"  (c) {args.tool_turns} {kind} tool turns and an answer: ours "
                    f"{c['ours'] * 1000:7.1f} ms, the floor ({c['floor']} raw steps) "
                    f"{c['raw'] * 1000:7.1f} ms, ratio {c['ratio']:.2f} (goal <= 1.25)"
                )
                print(
                    f"      ratios {', '.join(f'{r:.2f}' for r in c['ratios'])}; journal entries "
                    f"per run: ours {c['ours_entries']} ({per_turn:.1f} per turn), floor "
                    f"{c['raw_entries']}"
                )
            for unsafe in (True, False):
                floor = 6 if unsafe else 4  # a command and its completion per step
                print(
                    f"  (d) journal entries per {'unsafe' if unsafe else 'safe'} tool turn when "
                    f"each turn is stored before the next model call (a slow model's): "
                    f"{entries_per_stored_turn(server, unsafe=unsafe):.1f} (floor {floor})"
                )
        runs = paced_run_commands(server, directory, args.paced_turns)
        others = [name for name in runs if not name.startswith(("model:", "tool"))]
        print(
            f"  (e) a worker's run of {args.paced_turns} unsafe tool turns a second apart: "
            f"{len(runs)} Run commands (floor {3 * args.paced_turns + 1}); besides the "
            f"floor's: {', '.join(others) or 'none'}"
        )


if __name__ == "__main__":
    main()

"""What a stopped worker costs its runs (a scale-down, a node drain, a deleted pod): model calls
cut off and paid for twice, and how long the stopped worker takes to leave.

    .venv/bin/python bench/worker_stop.py [--runs 20] [--turns 10] [--model-seconds 1.5]
        [--graceful-timeout 10|spec] [--rounds 2]

A real restate-server; two replicas of the agent's worker (hypercorn with
`tether.programs.worker.hypercorn_config` and the worker's app, index included) behind a
Kubernetes-like Service (`tether.testing.ServiceFront`); and a model that speaks OpenAI's wire
format (the tests' `tests/fakes/model_server.py`, through the real `openai` client), answering
each call after `--model-seconds` and counting the calls of each run's turns. `--runs` runs of
`--turns` turns (a safe tool call each but the last) start on replica a. Once each has had its
first answer, a gets SIGTERM, as the kubelet stops a pod, and the Service routes to b.

Two sides, a round of each per `--rounds` (fresh replicas each time):
- `leave`: the worker as shipped: each run ends its attempt before its next model step
  (`RestateRuntimeOptions.stopping`) and Restate resumes it on b at once;
- `stay`: the same worker with `stopping` switched off (`bench/worker_stop_app.py`): the runs
  stay on a until hypercorn's graceful timeout (`--graceful-timeout`) cuts them off.

`--graceful-timeout spec` takes the spec's, as `tether worker` and the operator do
(`tether.spec.stopping`: a model call of `maxTokens` and the longest tool call after it); with
`--model-seconds` longer than 20 s, it shows what hypercorn's 20 s cut off.

Per round: model calls paid for twice (a run's turn asked of the model more than once), runs
completed, and the time from SIGTERM to a's exit.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from scripted_agent import scripted_agent

from tether.programs.local_http import request_json as http
from tether.programs.restate_server import RestateServer, free_port
from tether.programs.worker import deadline
from tether.spec import parse_agent
from tether.spec.stopping import stop_grace_seconds
from tether.testing import HypercornWorker, ServiceFront, wait_until

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))  # the tests' model server
from tests.fakes.model_server import ModelServer, RecordedRequest, Reply, ToolCall  # noqa: E402

AGENT = "stop-bench"
APPS = {"leave": "tether.programs.worker.asgi:app", "stay": "worker_stop_app:app"}


class SlowModel(ModelServer):
    """Answers a run's turn `t` with a tool call (the last turn: "done") after `delay` seconds,
    counting the calls of each (run, turn); a run is named by its prompt."""

    def __init__(self, turns: int, delay: float) -> None:
        super().__init__()
        self.turns, self.delay = turns, delay
        self.calls: collections.Counter[tuple[str, int]] = collections.Counter()
        self.answered: collections.Counter[tuple[str, int]] = collections.Counter()

    def _take(self, request: RecordedRequest) -> Reply:
        messages = request.body.get("messages", [])
        run = next(str(m["content"]) for m in messages if m["role"] == "user")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        with self._lock:
            self.calls[(run, turn)] += 1
        time.sleep(self.delay)
        with self._lock:
            self.answered[(run, turn)] += 1
        if turn + 1 >= self.turns:
            return Reply(text=["done"])
        call = ToolCall("lookup", {"key": f"k{turn}"}, id=f"call_{turn}")
        return Reply(tool_calls=[call])


def replica(
    directory: Path, name: str, app: str, env: dict[str, str], graceful_timeout: float
) -> HypercornWorker:
    """A replica as `tether worker` runs it: hypercorn under `deadline.py`, which ends it soon
    after its graceful timeout."""
    port = free_port()
    command = [sys.executable, "-I", deadline.__file__, str(graceful_timeout)]
    command += [sys.executable, "-m", "hypercorn", "--config"]
    command += ["python:tether.programs.worker.hypercorn_config", app]
    bind = {"TETHER_WORKER_BIND": f"127.0.0.1:{port}"}
    return HypercornWorker(
        "", port=port, command=command, env={**env, **bind}, log_dir=directory / name
    )


def graceful_timeout(given: str, manifest: dict[str, Any]) -> float:
    return stop_grace_seconds(parse_agent(manifest).spec) if given == "spec" else float(given)


def one_round(
    server: RestateServer, side: str, args: argparse.Namespace, round_no: int
) -> dict[str, float]:
    with (
        tempfile.TemporaryDirectory(prefix="tether-stop-") as tmp,
        SlowModel(args.turns, args.model_seconds) as model,
    ):
        directory = Path(tmp)
        tools = [{"name": "lookup", "python": "restate_bench_service:lookup"}]
        manifest = scripted_agent(AGENT, [{"text": "unused"}], tools, args.turns)
        manifest["spec"]["model"] = {"provider": "openai", "name": "m", "baseUrl": model.openai_url}
        spec = directory / "agent.yaml"
        spec.write_text(yaml.safe_dump(manifest))
        graceful = graceful_timeout(args.graceful_timeout, manifest)
        env = {
            "TETHER_SPEC": str(spec),
            "TETHER_WORKSPACE": str(directory),
            "OPENAI_API_KEY": "bench",
            "TETHER_WEBHOOK_SECRET": "bench",
            "RESTATE_INGRESS_URL": server.ingress_url,
            "TETHER_WORKER_GRACEFUL_TIMEOUT": str(graceful),
            "PYTHONPATH": str(BENCH),
        }
        for name in ("a", "b"):
            (directory / name).mkdir()
        with (
            replica(directory, "a", APPS[side], env, graceful) as a,
            replica(directory, "b", APPS[side], env, graceful) as b,
        ):
            ports = {"a": a.port, "b": b.port}
            route = ["a"]
            with ServiceFront(lambda: ports[route[0]]) as front:
                server.register(front.url)
                runs = [f"go {side} {round_no} {i}" for i in range(args.runs)]
                ids = []
                for i, prompt in enumerate(runs):
                    resp = http(
                        "POST",
                        f"{server.ingress_url}/{AGENT}/s-{side}-{round_no}-{i}/run/send",
                        {"prompt": prompt},
                    )
                    assert resp.status == 202, resp.body
                    ids.append(resp.json()["invocationId"])
                wait_until(
                    lambda: all(model.answered[(r, 0)] for r in runs),
                    timeout=120,
                    what="every run's first answer",
                )
                route[0] = "b"
                stopped = time.monotonic()
                a.terminate()
                exited: list[float] = []

                def watch_exit() -> None:
                    wait_until(lambda: a.returncode() is not None, timeout=300, what="a's exit")
                    exited.append(time.monotonic() - stopped)

                watcher = threading.Thread(target=watch_exit)
                watcher.start()
                completed = 0
                for invocation in ids:
                    resp = http(
                        "GET",
                        f"{server.ingress_url}/restate/invocation/{invocation}/attach",
                        timeout=600.0,
                    )
                    completed += resp.status == 200 and resp.json()["status"] == "completed"
                watcher.join()
                twice = sum(count - 1 for count in model.calls.values() if count > 1)
                return {"twice": twice, "completed": completed, "exit": exited[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--model-seconds", type=float, default=1.5)
    parser.add_argument("--graceful-timeout", default="10", help="seconds, or spec")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(
        f"{args.runs} runs of {args.turns} turns, {args.model_seconds:g} s a model call, on 2 "
        f"replicas; replica a stopped (SIGTERM) after each run's first answer; graceful "
        f"timeout {args.graceful_timeout} s"
    )
    with RestateServer() as server:
        for round_no in range(args.rounds):
            for side in ("leave", "stay") if round_no % 2 == 0 else ("stay", "leave"):
                result = one_round(server, side, args, round_no)
                print(
                    f"  {side:5}: {result['twice']:3.0f} model calls paid twice, "
                    f"{result['completed']:.0f}/{args.runs} runs completed, a exited "
                    f"{result['exit']:.1f} s after SIGTERM"
                )


if __name__ == "__main__":
    main()

"""An agent served by two `tether worker`s, as two Restate deployments: `--serve agent` (the runs)
and `--serve index` (the index of parked calls and the live events, which the sidecar uses), with
no model key; and the agent worker's own metrics port (`--metrics-port`, two processes). Real
processes: restate-server, both workers, `tether sidecar`, and a fake Anthropic API."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.model_server import ModelServer, Reply, ToolCall
from tests.restate.support import approval_manifest, attach, send_run
from tether.programs.dev import Process, wait_for
from tether.programs.restate_identity import IDENTITY_KEYS_ENV
from tether.programs.restate_server import RestateServer, free_port
from tether.programs.watch import events_url, sse_events
from tether.programs.webhooks import sign_request
from tether.testing import dump_logs_if_failed, wait_until

AGENT = "split-clerk"
SECRET = "split-clerk-webhook-secret"
MODEL_KEY = "test-key"
KEY_VARIABLE = "ANTHROPIC_API_KEY"
NOT_INHERITED = {
    KEY_VARIABLE,
    "OPENAI_API_KEY",
    "PROMETHEUS_MULTIPROC_DIR",
    "TETHER_WEBHOOK_SECRET",
    "TETHER_WORKER_SERVES",
    "TETHER_WORKER_METRICS_PORT",
}


@dataclass
class SplitStack:
    server: RestateServer
    model: ModelServer
    workspace: Path
    spec: Path
    agent: Process
    index: Process
    sidecar: Process
    ports: dict[str, int]
    deployments: dict[str, str]
    """Restate's deployment id of each worker, by role."""
    metrics_dir: Path

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"


def write_spec(directory: Path, model_url: str) -> Path:
    model = {"provider": "anthropic", "name": "claude-test", "baseUrl": model_url}
    return approval_manifest(directory, AGENT, [], model=model)


def tether(*args: str) -> list[str]:
    return [sys.executable, "-m", "tether", *args]


def worker(spec: Path, port: int, *args: str) -> list[str]:
    return tether("worker", "--spec", str(spec), "--host", "127.0.0.1", "--port", str(port), *args)


@pytest.fixture(scope="module")
def split(
    restate_server: RestateServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SplitStack]:
    """The index worker (no model key, `--serve index`), the agent worker (`TETHER_WORKER_SERVES
    =agent`, two processes, a metrics port), each registered with Restate, and a sidecar."""
    base = tmp_path_factory.mktemp("split")
    workspace, metrics_dir = base / "ws", base / "metrics"
    workspace.mkdir()
    metrics_dir.mkdir()
    ports = {name: free_port() for name in ("agent", "metrics", "index", "sidecar")}
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env |= {"TETHER_WEBHOOK_SECRET": SECRET, "RESTATE_INGRESS_URL": restate_server.ingress_url}
    signed_only = {**env, IDENTITY_KEYS_ENV: restate_server.identity_public_key}
    with ModelServer() as model:
        spec = write_spec(base, model.anthropic_url)
        index = Process(
            "index",
            worker(spec, ports["index"], "--serve", "index"),
            signed_only,
            base / "index.log",
        )
        agent = Process(
            "agent",
            worker(
                spec, ports["agent"], "--processes", "2", "--metrics-port", str(ports["metrics"])
            ),
            {
                **signed_only,
                "TETHER_WORKER_SERVES": "agent",
                KEY_VARIABLE: MODEL_KEY,
                "TETHER_WORKSPACE": str(workspace),
                "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            },
            base / "agent.log",
        )
        sidecar = Process(
            "sidecar",
            tether("sidecar", "--host", "127.0.0.1", "--port", str(ports["sidecar"])),
            {**env, "TETHER_AGENT": AGENT},
            base / "sidecar.log",
        )
        stack = SplitStack(
            restate_server, model, workspace, spec, agent, index, sidecar, ports, {}, metrics_dir
        )
        try:
            for process in (index, agent, sidecar):
                process.start()
            # The index first: the runs send to it.
            for role, process in (("index", index), ("agent", agent)):
                wait_for(f"{stack.url(role)}/health", role, process)
                stack.deployments[role] = restate_server.register(stack.url(role))
            wait_for(f"{stack.url('sidecar')}/healthz", "sidecar", sidecar)
            yield stack
        finally:
            for process in (sidecar, agent, index):
                process.kill()
            for deployment in stack.deployments.values():
                restate_server.unregister(deployment)


@pytest.fixture(autouse=True)
def logs_on_failure(split: SplitStack, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    logs = {f"{p.name} log": functools.partial(tail, p.log) for p in (split.agent, split.index)}
    logs["sidecar log"] = functools.partial(tail, split.sidecar.log)
    dump_logs_if_failed(request, logs)


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-8000:]


def signed(split: SplitStack, method: str, path: str, body: bytes = b"") -> httpx2.Response:
    headers = sign_request(SECRET.encode(), body, path=path)
    if body:
        headers["content-type"] = "application/json"
    url = f"{split.url('sidecar')}{path}"
    return httpx2.request(method, url, content=body, headers=headers, timeout=30)


def parked(split: SplitStack) -> list[dict[str, Any]]:
    response = signed(split, "GET", "/v1/approvals")
    assert response.status_code == 200, response.text
    calls: list[dict[str, Any]] = response.json()["parked"]
    return calls


def start_run(split: SplitStack, session: str, prompt: str) -> str:
    return send_run(split.server.ingress_url, AGENT, session, prompt)


def result_of(split: SplitStack, invocation: str) -> Any:
    return attach(split.server.ingress_url, invocation, 120)


def stream_to_end(url: str) -> list[dict[str, Any]]:
    """The session's event stream from the start, up to its run's end."""
    events: list[dict[str, Any]] = []
    with httpx2.stream("GET", url, timeout=30) as response:
        assert response.status_code == 200, response.read()
        for event in sse_events(response):
            events.append(event)
            if event["type"] == "run_ended":
                return events
    return events


def watch(url: str) -> None:
    """Open the session's stream until it starts: the sidecar has registered the session as
    watched (`<agent>-watchers`, for 30 s) before the stream's first line."""
    with httpx2.stream("GET", url, timeout=30) as response:
        assert response.status_code == 200, response.read()
        next(response.iter_lines())


def services_of(split: SplitStack) -> dict[str, set[str]]:
    """The services Restate lists under each worker's deployment, by role."""
    listed = {d["id"]: {s["name"] for s in d["services"]} for d in split.server.deployments()}
    return {role: listed[deployment] for role, deployment in split.deployments.items()}


def test_an_approval_is_listed_and_answered_through_the_index_apart_from_the_agent(
    split: SplitStack,
) -> None:
    assert services_of(split) == {
        "agent": {AGENT},
        "index": {
            f"{AGENT}-{name}"
            for name in (
                "parked",
                "live",
                "watchers",
                "inbox",
                "handoff",
                "pace",
                "schedule",
                "spend",
            )
        },
    }
    write = ToolCall("write_file", {"path": "a.txt", "content": "x"})
    split.model.script(Reply(text=["Writing ", "it"], tool_calls=[write]), Reply(text=["done"]))
    url = events_url(split.url("sidecar"), AGENT, "s1", SECRET.encode())
    watch(url)  # the run's live events are sent only for a session someone watches
    invocation = start_run(split, "s1", "write a.txt")
    [call] = wait_until(lambda: parked(split), timeout=60, what="the parked approval")
    assert (call["tool"], call["session"], call["agent"]) == ("write_file", "s1", AGENT)
    assert not (split.workspace / "a.txt").exists()

    # A message for the running session goes to its inbox, on the index's deployment too; the
    # run takes it at its next turn.
    message = signed(split, "POST", "/v1/sessions/s1/messages", b'{"text": "and keep it short"}')
    assert message.status_code == 202, message.text

    body = b'{"approved": true, "approver": "alice"}'
    answered = signed(split, "POST", f"/v1/awakeables/{call['awakeable_id']}/resolve", body)
    assert answered.status_code == 202, answered.text
    result = result_of(split, invocation)
    assert (result["status"], result["text"]) == ("completed", "done")
    assert "and keep it short" in json.dumps(split.model.requests[-1].body)
    assert (split.workspace / "a.txt").read_text() == "x"
    wait_until(lambda: parked(split) == [], timeout=30, what="the answered call to leave")

    # The live events (model text as it streamed, through `<agent>-live` on the index's
    # deployment) are on the sidecar's stream, with the durable ones of the agent's object.

    def live_kinds() -> list[str] | None:
        # both model calls': the second's may reach `<agent>-live` after the run has ended (the
        # live events are sent apart from the durable ones, by the process its attempt ran in)
        kinds = [e["type"] for e in stream_to_end(url) if "." in str(e["id"])]
        return kinds if kinds.count("model_started") == 2 and "model_text" in kinds else None

    wait_until(live_kinds, timeout=30, what="both model calls' live events on the stream")
    events = stream_to_end(url)
    assert [e["type"] for e in events if "." not in str(e["id"])] == [
        "run_started",
        "model_done",
        "approval_parked",
        "approval_resolved",
        "tool_finished",
        "model_done",
        "run_ended",
    ]


Sample = tuple[str, frozenset[tuple[str, str]]]


def scrape(url: str) -> dict[Sample, float]:
    response = httpx2.get(url, timeout=30)
    assert response.status_code == 200, response.text
    samples: dict[Sample, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def of_agent(samples: dict[Sample, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset({"agent": AGENT, **labels}.items())), 0.0)


def writers(directory: Path) -> set[str]:
    """The processes that wrote counters to a multiprocess directory (`counter_<pid>.db`)."""
    return {path.stem.removeprefix("counter_") for path in directory.glob("counter_*.db")}


def counts(samples: dict[Sample, float]) -> tuple[float, float, float]:
    """Completed runs, model calls and input tokens of the agent."""
    model = {"provider": "anthropic", "model": "claude-test"}
    return (
        of_agent(samples, "tether_runs_total", status="completed"),
        of_agent(samples, "tether_model_calls_total", **model, outcome="ok"),
        of_agent(samples, "tether_model_tokens_total", **model, kind="input"),
    )


def test_the_agent_workers_metrics_port_serves_its_metrics_and_nothing_else(
    split: SplitStack,
) -> None:
    metrics = f"{split.url('metrics')}/metrics"
    # Both hypercorn processes write to the directory (their series at zero, once started).
    wait_until(lambda: len(writers(split.metrics_dir)) == 2, timeout=60, what="two writers")
    runs, calls, tokens = counts(scrape(metrics))
    split.model.script(Reply(text=["hi"], input_tokens=7))
    assert result_of(split, start_run(split, "s2", "say hi"))["status"] == "completed"
    after = (runs + 1, calls + 1, tokens + 7)
    wait_until(lambda: counts(scrape(metrics)) == after, timeout=30, what="the run's counts")
    # One process ran it, and each scrape (on a new connection, to either process) merges the
    # files of both: every one gives the whole worker's counts.
    for _ in range(6):
        assert counts(scrape(metrics)) == after

    # The Restate port gives no metrics; the metrics port nothing but them.
    on_restate_port = httpx2.get(f"{split.url('agent')}/metrics", timeout=30)
    assert on_restate_port.status_code != 200 and "tether_" not in on_restate_port.text
    for method, path in [("GET", "/"), ("GET", "/health"), ("GET", "/discover")]:
        assert httpx2.request(method, f"{split.url('metrics')}{path}").status_code == 404, path
    assert httpx2.post(metrics, content=b"").status_code == 404


def test_an_index_worker_starts_without_the_model_key_and_an_agent_worker_does_not(
    split: SplitStack,
) -> None:
    assert KEY_VARIABLE not in split.index.env
    assert split.index.popen is not None and split.index.popen.poll() is None
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
    refused = "tether: ANTHROPIC_API_KEY is not set: the worker needs the model's API key"
    # The flag wins over TETHER_WORKER_SERVES.
    for args, serves in [
        (["--serve", "agent"], "all"),
        ([], "agent"),
        (["--serve", "agent"], "index"),
    ]:
        done = subprocess.run(
            tether("worker", "--spec", str(split.spec), *args),
            env={**env, "TETHER_WORKER_SERVES": serves},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (done.returncode, done.stderr.strip()) == (2, refused), (args, serves)

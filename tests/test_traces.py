"""OpenTelemetry traces of agent runs on the embedded runtimes, exported to a real collector
(`tests/otelcol.py`: the OpenTelemetry Collector built from its Go modules, OTLP in, a JSON-lines
file out): `tether run` killed with SIGKILL mid-tool, resumed, parked for an approval, answered,
resumed again and replayed once more is one trace with one span per live step; and, in process,
the spans of a failed model call, the rules for when tracing is on, the derived ids."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.otelcol import Collector, ExportedSpan
from tests.test_cli import NO_KEYS, runs_db, state_home, tether
from tether.durable.sqlite import journal_steps
from tether.errors import ConfigError
from tether.programs.trace_context import (
    TraceParent,
    child_traceparent,
    span_id_of,
    trace_exporters,
    trace_id_of,
    traces_endpoint,
    traces_wanted,
)
from tether.testing import wait_until

AGENT = "tracer"
PROMPT = "release 1.4.0"
SHIP = {"name": "ship", "input": {"path": "shipped.txt", "content": "1.4.0"}}
SCRIPT = {
    PROMPT: [
        {
            "tool_calls": [{"name": "read_file", "input": {"path": "CHANGELOG.md"}}],
            "usage": {"input": 100, "output": 10},
        },
        {"tool_calls": [{"name": "deploy", "input": {"version": "1.4.0"}}]},
        {"tool_calls": [{"name": "spawn", "input": {"task": "check health"}}]},
        {"tool_calls": [SHIP]},
        {"text": "released", "usage": {"input": 300, "output": 5}},
    ],
    "check health": [{"text": "healthy", "usage": {"input": 20, "output": 2}}],
}
TOOLS = '''\
import asyncio
from pathlib import Path

from tether import tool


@tool
async def deploy(version: str) -> str:
    """Deploy a version (slow, not safe to repeat)."""
    Path("deploy.started").write_text(version)
    await asyncio.sleep(3600)  # until the test kills the process
    return f"deployed {version}"
'''


def hexid(value: int, width: int) -> str:
    return f"{value:0{width}x}"


def write_agent(directory: Path) -> None:
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": AGENT},
        "spec": {
            "model": {"provider": "scripted", "name": "scripted-model", "script": SCRIPT},
            "tools": [
                {"name": "read_file", "builtin": "read_file"},
                {"name": "deploy", "python": "trace_tools:deploy"},
                {"name": "ship", "builtin": "write_file", "requireApproval": True},
            ],
            "subagents": {"maxDepth": 1},
        },
    }
    (directory / "agent.yaml").write_text(yaml.safe_dump(document))
    (directory / "trace_tools.py").write_text(TOOLS)
    (directory / "CHANGELOG.md").write_text("# 1.4.0\n- faster\n")


def by_name(spans: list[ExportedSpan]) -> Counter[str]:
    return Counter(span.name for span in spans)


def test_a_tether_run_killed_mid_tool_parked_and_resumed_is_one_trace_with_a_span_per_live_step(
    tmp_path: Path, collector: Collector
) -> None:
    write_agent(tmp_path)
    env = {**collector.env()}

    # Attempt 1: killed with SIGKILL while `deploy` runs, once what ran before it is exported.
    command = [sys.executable, "-m", "tether", "run", "agent.yaml", "--run-id", "r1"]
    first = subprocess.Popen(
        [*command, "--prompt", PROMPT],
        cwd=tmp_path,
        env={**NO_KEYS, "XDG_STATE_HOME": str(state_home(tmp_path)), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_until(lambda: (tmp_path / "deploy.started").exists(), what="deploy to start")
        # The model calls of turns 0 and 1, read_file and turn 0: exported before the kill.
        collector.wait_for(lambda spans: len(spans) == 4, what="the first attempt's spans")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    before_kill = by_name(collector.spans())
    assert before_kill == Counter(
        {"chat scripted-model": 2, "execute_tool read_file": 1, "turn 0": 1}
    )

    # Attempt 2: the replay reports deploy as interrupted, runs the sub-agent, parks on ship.
    parked = tether("run", "agent.yaml", "--run-id", "r1", cwd=tmp_path, env=env)
    assert parked.returncode == 3, parked.stdout + parked.stderr
    answered = tether("answer", "r1", "--approve", "--approver", "alice", cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr
    # Attempt 3: the approval is taken, ship runs, the run completes.
    done = tether("run", "agent.yaml", "--run-id", "r1", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "final answer: released" in done.stdout
    # Attempt 4: the finished run replays from its journal and runs nothing: no span either.
    again = tether("run", "agent.yaml", "--run-id", "r1", cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stdout + again.stderr

    expected = 19
    collector.wait_for(lambda s: len(s) >= expected, what=f"{expected} spans")
    time.sleep(0.5)  # a span emitted twice would land by now
    spans = collector.spans()
    assert len(spans) == expected, sorted(by_name(spans).items())
    assert len({span.span_id for span in spans}) == expected  # none twice

    # One trace, derived from the run's id; the service is the agent.
    [run] = [s for s in spans if s.name == f"invoke_agent {AGENT}" and not s.parent_id]
    run_id = run.attributes["tether.run.id"]
    assert {span.trace_id for span in spans} == {hexid(trace_id_of(run_id), 32)}
    assert run.span_id == hexid(span_id_of(run_id, "run"), 16)
    assert {span.service for span in spans} == {AGENT}
    assert run.attributes["tether.run.status"] == "completed"
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["tether.cli.run_id"] == "r1"

    # The parent: 5 turns, a model call each, 4 tool calls, one park.
    mine = [s for s in spans if s.attributes.get("tether.run.id") == run_id]
    turns = {s.attributes["tether.turn"]: s for s in mine if s.name.startswith("turn ")}
    assert sorted(turns) == [0, 1, 2, 3, 4]
    for turn in turns.values():
        assert turn.parent_id == run.span_id
        assert run.start_ns <= turn.start_ns <= turn.end_ns <= run.end_ns
    chats = [s for s in mine if s.name == "chat scripted-model"]
    assert sorted(s.attributes["tether.turn"] for s in chats) == [0, 1, 2, 3, 4]
    for chat in chats:
        assert chat.parent_id == turns[chat.attributes["tether.turn"]].span_id
        assert chat.kind == 3  # client
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.request.model"] == "scripted-model"
        assert chat.attributes["gen_ai.system"] == "scripted"
        assert chat.attributes["gen_ai.provider.name"] == "scripted"
        finish = "end_turn" if chat.attributes["tether.turn"] == 4 else "tool_use"
        assert chat.attributes["gen_ai.response.finish_reasons"] == [finish]
    first_chat = next(c for c in chats if c.attributes["tether.turn"] == 0)
    assert first_chat.attributes["gen_ai.usage.input_tokens"] == 100
    assert first_chat.attributes["gen_ai.usage.output_tokens"] == 10

    tools = {s.attributes["gen_ai.tool.name"]: s for s in mine if s.name.startswith("execute_tool")}
    assert sorted(tools) == ["deploy", "read_file", "ship", "spawn"]
    outcomes = {name: s.attributes["tether.tool.outcome"] for name, s in tools.items()}
    assert outcomes == {"read_file": "ok", "deploy": "interrupted", "spawn": "ok", "ship": "ok"}
    replay = {name: s.attributes["tether.tool.replay"] for name, s in tools.items()}
    assert replay["read_file"] == "safe" and replay["deploy"] == "unsafe"
    assert tools["deploy"].failed and not tools["ship"].failed
    for turn_number, name in enumerate(["read_file", "deploy", "spawn", "ship"]):
        assert tools[name].parent_id == turns[turn_number].span_id, name
        call_id = tools[name].attributes["gen_ai.tool.call.id"]
        assert tools[name].span_id == hexid(span_id_of(run_id, "tool", call_id), 16)
    # The ship call spans its park: from the call's start (attempt 2) to the answer (attempt 3).
    [park] = [s for s in spans if s.name == "park ship"]
    assert park.parent_id == tools["ship"].span_id
    assert park.attributes["tether.park.outcome"] == "approved"
    assert park.attributes["tether.park.approver"] == "alice"
    assert tools["ship"].start_ns <= park.start_ns <= park.end_ns <= tools["ship"].end_ns
    # Turn 1 started in attempt 1 (its model call) and ended in attempt 2 (deploy, interrupted).
    assert turns[1].start_ns < tools["deploy"].start_ns

    # The sub-agent: its run under the spawn call, in the same trace.
    [child] = [s for s in spans if s.parent_id == tools["spawn"].span_id]
    assert child.name == f"invoke_agent {AGENT}"
    child_id = child.attributes["tether.run.id"]
    assert by_name([s for s in spans if s.attributes.get("tether.run.id") == child_id]) == (
        Counter({f"invoke_agent {AGENT}": 1, "turn 0": 1, "chat scripted-model": 1})
    )

    # One span per live step: the journal's model steps and tool calls, each once.
    steps = journal_steps(runs_db(tmp_path), "r1")
    model_steps = [name for _, _, kind, name in steps if kind == "model"]
    assert len(model_steps) == len([s for s in spans if s.name.startswith("chat ")]) == 6
    journaled_calls = {
        name.partition(":")[2]
        for scope, _, _, name in steps
        if scope == "" and name.startswith(("tool:", "tool-check:"))
    }
    assert journaled_calls == {s.attributes["gen_ai.tool.call.id"] for s in tools.values()}


# In process ------------------------------------------------------------------------------------


def test_a_failed_model_call_and_its_retry_are_two_spans() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tether import create_agent
    from tether.durable import memory_runtime
    from tether.programs.tracing import AgentTracing
    from tether.providers.base import ModelResponse, ProviderError

    class Flaky:
        name, model, pricing, context_window = "flaky", "flaky-1", None, 100_000
        calls = 0

        async def complete(self, request: Any, on_text: Any = None) -> ModelResponse:
            self.calls += 1
            if self.calls == 1:
                raise ProviderError(
                    "overloaded", provider="flaky", status=529, retryable=True, retry_after=0.0
                )
            return ModelResponse(
                content=[{"type": "text", "text": "hi"}],
                usage={"input": 7, "output": 1},
                stop_reason="end_turn",
            )

    exporter = InMemorySpanExporter()
    tracing = AgentTracing([SimpleSpanProcessor(exporter)])
    durable = memory_runtime()
    provider = Flaky()
    hooks = tracing.hooks(agent="a", provider="flaky", model="flaky-1", durable=durable)
    agent = create_agent(
        provider=provider,  # type: ignore[arg-type]
        durable=durable,
        hooks=hooks,
        behavior={"max_retries": 2},
    )
    stats = asyncio.run(agent.run("hello"))
    assert stats.status == "completed"
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["chat flaky-1", "chat flaky-1", "turn 0", "invoke_agent a"]
    failed, answered, turn, run = spans
    assert failed.status.is_ok is False and "overloaded" in (failed.status.description or "")
    assert failed.attributes is not None and failed.attributes["tether.retry"] is True
    assert answered.status.is_ok
    assert failed.parent is not None and answered.parent is not None
    assert failed.parent.span_id == answered.parent.span_id == turn.context.span_id
    assert turn.start_time is not None and failed.start_time is not None
    assert turn.start_time <= failed.start_time  # the turn began with the failed attempt
    assert run.parent is None


def test_a_model_skipped_while_it_cools_down_has_no_span() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tether import create_agent
    from tether.durable import memory_runtime
    from tether.programs.tracing import AgentTracing
    from tether.providers import Cooldown, scripted

    exporter = InMemorySpanExporter()
    tracing = AgentTracing([SimpleSpanProcessor(exporter)])
    first, second = scripted([{"text": "first"}]), scripted([{"text": "second"}])
    second.model = "second-model"
    cooldown = Cooldown(failures=1)
    cooldown.failed(0)  # the first model is cooling down
    durable = memory_runtime()
    agent = create_agent(
        provider=first,
        fallbacks=[second],
        cooldown=cooldown,
        durable=durable,
        hooks=tracing.hooks(agent="a", provider="scripted", model=first.model, durable=durable),
    )
    stats = asyncio.run(agent.run("hello"))
    assert (stats.status, stats.text) == ("completed", "second")
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["chat second-model", "turn 0", "invoke_agent a"]


def test_traces_are_on_only_with_an_endpoint_and_a_known_exporter() -> None:
    assert not traces_wanted({})
    assert not traces_wanted({"OTEL_SERVICE_NAME": "x"})
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    assert trace_exporters(endpoint) == ["otlp"]
    assert traces_endpoint(endpoint) == "http://collector:4318/v1/traces"
    signal_endpoint = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom"}
    assert traces_endpoint(signal_endpoint) == "http://c:4318/custom"
    assert not traces_wanted({**endpoint, "OTEL_SDK_DISABLED": "true"})
    assert not traces_wanted({**endpoint, "OTEL_TRACES_EXPORTER": "none"})
    assert trace_exporters({"OTEL_TRACES_EXPORTER": "console"}) == ["console"]
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL=grpc"):
        traces_wanted({**endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER=zipkin"):
        traces_wanted({**endpoint, "OTEL_TRACES_EXPORTER": "zipkin"})


def test_the_ids_are_derived_from_the_run_and_the_call() -> None:
    assert trace_id_of("r1") == trace_id_of("r1") != trace_id_of("r2")
    assert span_id_of("r1", "tool", "c1") != span_id_of("r1", "tool", "c2")
    root = child_traceparent(None, "r1", "c1")
    parsed = TraceParent.parse(root)
    assert parsed == TraceParent(trace_id_of("r1"), span_id_of("r1", "tool", "c1"))
    # A grandchild stays in the root's trace, under its own parent's call.
    grandchild = TraceParent.parse(child_traceparent(parsed, "child-run", "c9"))
    assert grandchild == TraceParent(trace_id_of("r1"), span_id_of("child-run", "tool", "c9"))
    assert TraceParent.parse("nonsense") is None and TraceParent.parse(None) is None
    assert TraceParent.parse(f"00-{0:032x}-{1:016x}-01") is None


def test_a_tracing_failure_never_fails_the_run() -> None:
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

    from tether import create_agent
    from tether.durable import memory_runtime
    from tether.programs.tracing import AgentTracing
    from tether.providers import scripted

    class Broken(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            raise RuntimeError("the exporter broke")

    tracing = AgentTracing([Broken()])
    durable = memory_runtime()
    provider = scripted([{"text": "fine"}])
    hooks = tracing.hooks(agent="a", provider="scripted", model="m", durable=durable)
    stats = asyncio.run(create_agent(provider=provider, durable=durable, hooks=hooks).run("go"))
    assert (stats.status, stats.text) == ("completed", "fine")

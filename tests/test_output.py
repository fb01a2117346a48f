"""Structured output (`tether.Output`): a run that ends with a value of a JSON Schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

from tests.test_loop import every_call_has_one_result
from tether import ConfigError, Output, create_agent, tool
from tether.durable import sqlite_runtime
from tether.providers import scripted
from tether.session import create_session

TRIAGE = {
    "type": "object",
    "properties": {
        "severity": {"type": "string", "enum": ["low", "high"]},
        "summary": {"type": "string"},
    },
    "required": ["severity", "summary"],
    "additionalProperties": False,
}


def answer(value: Any, name: str = "final_answer") -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "input": value}]}


checked: list[str] = []


@tool(replay="safe")
async def check(host: str) -> str:
    """Checks a host."""
    checked.append(host)
    return f"{host} is down"


async def test_a_run_ends_with_the_first_value_that_matches_told_why_the_others_missed() -> None:
    provider = scripted(
        [
            {"text": "The database is down."},  # text only: reminded
            answer({"severity": "urgent", "summary": "db"}),  # refused: not in the enum
            answer({"severity": "high", "summary": "db down"}),
        ]
    )
    agent = create_agent(provider=provider, output=TRIAGE)
    stats = await agent.run("triage")
    assert (stats.status, stats.error) == ("completed", None)
    assert stats.output == {"severity": "high", "summary": "db down"}
    assert stats.text == '{"severity":"high","summary":"db down"}'
    assert stats.turns == 3
    assert agent.session is not None
    sent = [t.content[0] for t in agent.session.turns if t.role == "user"][1:]
    assert "by calling the `final_answer` tool" in sent[0]["text"]
    assert "'urgent' is not one of ['low', 'high']" in sent[1]["content"]
    assert sent[2]["content"] == "Final answer accepted."
    every_call_has_one_result(agent.session.turns)  # the session can go on with a next run
    assert agent.session.runs[0].stats["output"] == stats.output
    async for event in agent.events():
        if event["type"] == "run_ended":
            assert event["output"] == stats.output
            break


async def test_the_other_calls_of_the_answers_turn_run_before_the_run_ends() -> None:
    checked.clear()
    provider = scripted(
        [
            {
                "tool_calls": [
                    {"name": "check", "input": {"host": "db"}},
                    *answer(TRIAGE_VALUE)["tool_calls"],
                ]
            }
        ]
    )
    agent = create_agent(provider=provider, tools=[check], output=TRIAGE)
    stats = await agent.run("triage")
    assert (stats.status, stats.output, stats.tool_calls) == ("completed", TRIAGE_VALUE, 2)
    assert checked == ["db"]
    assert agent.session is not None
    every_call_has_one_result(agent.session.turns)


TRIAGE_VALUE = {"severity": "low", "summary": "fine"}


async def test_misses_past_the_retries_end_the_run_with_an_error_that_says_why() -> None:
    provider = scripted([{"text": "fine"}, answer({"severity": "low"})])
    agent = create_agent(provider=provider, output=Output(TRIAGE, retries=1))
    stats = await agent.run("triage")
    assert stats.status == "error" and stats.output is None
    assert stats.error is not None
    assert "did not match its schema 2 times" in stats.error
    assert "'summary' is a required property" in stats.error
    agent = create_agent(provider=scripted([{"text": t} for t in "abc"]), output=TRIAGE)
    stats = await agent.run("triage")
    assert stats.status == "error"
    assert stats.error == "the model answered in text 3 times, not with final_answer"


async def test_a_value_that_is_not_an_object_is_given_as_the_value_of_one() -> None:
    schema = {"type": "array", "items": {"type": "string"}, "minItems": 1}
    provider = scripted([answer({"items": ["a"]}), answer({"value": []}), answer({"value": ["a"]})])
    agent = create_agent(provider=provider, output=schema)
    stats = await agent.run("list")
    assert (stats.status, stats.output, stats.turns) == ("completed", ["a"], 3)
    assert agent.output is not None
    assert agent.output.tool.spec.input_schema["properties"] == {"value": schema}


async def test_a_pydantic_models_schema_and_value() -> None:
    class Triage(pydantic.BaseModel):
        severity: int
        summary: str

    provider = scripted([answer({"severity": 2, "summary": "ok"})])
    agent = create_agent(provider=provider, output=Output.of(Triage, retries=0))
    stats = await agent.run("triage")
    assert Triage.model_validate(stats.output) == Triage(severity=2, summary="ok")


def test_a_schema_that_is_not_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="the output schema is not a JSON Schema"):
        Output({"type": "nope"})
    with pytest.raises(ValueError, match="retries must not be negative"):
        Output(TRIAGE, retries=-1)


async def test_a_replay_ends_with_the_journals_output_and_asks_no_model(tmp_path: Path) -> None:
    script = [{"text": "it is fine"}, answer(TRIAGE_VALUE)]
    for provider in (scripted(script), scripted([])):  # the second would fail if asked
        with sqlite_runtime(tmp_path / "j.db", "run") as durable:
            assert durable.stores.session is not None
            session = await create_session(id="s", store=durable.stores.session)
            agent = create_agent(provider=provider, output=TRIAGE, durable=durable, session=session)
            stats = await agent.run("triage")
        assert (stats.status, stats.output, stats.turns) == ("completed", TRIAGE_VALUE, 2)


async def test_a_run_without_an_output_records_no_output_key() -> None:
    # Old journals' records and results have none: a replay must write the same values.
    stats = await create_agent(provider=scripted([{"text": "hi"}])).run("hi")
    assert "output" not in stats.to_json()


async def test_a_tool_of_the_outputs_name_is_refused() -> None:
    @tool
    async def final_answer() -> str:
        """Clashes."""
        return ""

    agent = create_agent(provider=scripted([{"text": "x"}]), tools=[final_answer], output=TRIAGE)
    stats = await agent.run("x")
    assert stats.status == "error" and "final_answer" in (stats.error or "")

"""How long a stopping worker lets its calls in flight finish, from its spec
(`tether.spec.stopping`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from tether.programs.worker.deadline import HARD_EXIT_MARGIN
from tether.spec import DurableAgentSpec, SpecError, parse_agent
from tether.spec.stopping import (
    LONGEST_STEP_SECONDS,
    MODEL_TOKENS_PER_SECOND,
    POD_MARGIN_SECONDS,
    SETTLE_SECONDS,
    TOOL_SECONDS,
    pod_grace_seconds,
    stop_grace_seconds,
)
from tether.tools.builtin.http import HttpRequestConfig
from tether.tools.builtin.shell import ShellConfig


def spec(tools: Sequence[dict[str, Any]] = (), **fields: Any) -> DurableAgentSpec:
    model = {"provider": "anthropic", "name": "c", "maxTokens": 4000, **fields.pop("model", {})}
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "triage"},
        "spec": {"model": model, "tools": list(tools), **fields},
    }
    return parse_agent(document).spec


MODEL = 4000 / MODEL_TOKENS_PER_SECOND


@pytest.mark.parametrize(
    ("tools", "tool"),
    [
        ([], 0.0),
        ([{"name": "read", "builtin": "read_file"}], TOOL_SECONDS),
        ([{"name": "sh", "builtin": "shell", "config": {"timeoutSeconds": 300}}], 300.0),
        (  # the shorter of the entry's timeout and the built-in's own
            [
                {
                    "name": "sh",
                    "builtin": "shell",
                    "timeout": "10s",
                    "config": {"timeoutSeconds": 300},
                }
            ],
            10.0,
        ),
        ([{"name": "gh", "mcp": {"url": "http://mcp.example/mcp"}}], 60.0),
        ([{"name": "gh", "mcp": {"url": "http://mcp.example/mcp"}, "timeout": "2m"}], 120.0),
        ([{"name": "slow", "python": "tools:slow", "timeout": "15m"}], 900.0),
        (  # the longest tool counts
            [
                {"name": "slow", "python": "tools:slow", "timeout": "90s"},
                {"name": "fast", "python": "tools:fast", "timeout": "1s"},
            ],
            90.0,
        ),
    ],
)
def test_the_grace_period_covers_a_model_call_and_the_longest_tool_call(
    tools: list[dict[str, Any]], tool: float
) -> None:
    agent = spec(tools)
    assert stop_grace_seconds(agent) == pytest.approx(MODEL + tool + SETTLE_SECONDS)
    assert pod_grace_seconds(agent) == math.ceil(stop_grace_seconds(agent)) + POD_MARGIN_SECONDS


def test_a_long_model_call_is_waited_for_up_to_restates_longest_step() -> None:
    assert stop_grace_seconds(spec(model={"maxTokens": 128_000})) == LONGEST_STEP_SECONDS


def test_the_spec_can_set_it() -> None:
    agent = spec(
        [{"name": "slow", "python": "t:slow", "timeout": "1h"}], worker={"stopGracePeriod": "90s"}
    )
    assert stop_grace_seconds(agent) == 90.0
    assert pod_grace_seconds(agent) == 95
    with pytest.raises(SpecError, match=r"worker\.stopGracePeriod.*longer than zero"):
        spec(worker={"stopGracePeriod": "0s"})


def test_the_defaults_it_counts_on_hold() -> None:
    """A built-in without `timeoutSeconds` is counted at `TOOL_SECONDS`: its own default must not
    be longer. The pod outlives the worker's own deadline, so the worker says what it cut off."""
    for config in (HttpRequestConfig, ShellConfig):
        assert config.model_fields["timeout_seconds"].default <= TOOL_SECONDS
    assert POD_MARGIN_SECONDS > HARD_EXIT_MARGIN
    described = DurableAgentSpec.model_json_schema()["$defs"]["WorkerSpec"]["properties"]
    text = described["stopGracePeriod"]["description"]
    for said in (
        f"{MODEL_TOKENS_PER_SECOND:g} tokens/s",
        f"{TOOL_SECONDS:g}s for a tool",
        f"and {SETTLE_SECONDS:g}s",
        f"at most {LONGEST_STEP_SECONDS / 60:g}m",
        f"{POD_MARGIN_SECONDS}s longer",
    ):
        assert said in text, said

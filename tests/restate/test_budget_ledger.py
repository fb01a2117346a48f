"""One budget across sub-agents that run at once, on a real restate-server with the worker and
the sidecar as real processes: a root run whose first call fans out to four children never
spends more than its budget, in USD or in tokens, even with the worker SIGKILLed mid-fan-out.
Without the ledger each child ran with the whole budget: $1.00 became $3.30."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from tests.restate.support import wait_until
from tests.restate.test_worker_metrics import (
    kill_and_restart_worker,
    outside,
    result_of,
    scrape,
    start_run,
    value,
    workspace,  # noqa: F401 (a fixture)
)
from tether.programs.dev import DevStack

AGENT = "fanout-clerk"  # the metrics helpers read this agent's series
PROMPT = "split the audit"
TASKS = [f"audit part {n}" for n in range(1, 5)]
OUTPUT = 1000
"""Output tokens per call: the most a call may answer (`model.maxTokens`), and what each does."""
PRICE = 100.0
"""USD per million output tokens (input is free): every call holds and spends $0.10."""
CHILD_CALLS = 8


def child_script(task: str) -> list[dict[str, Any]]:
    note = {"name": "write_file", "input": {"path": f"{task[-1]}.txt", "content": task}}
    calls = [{"tool_calls": [note], "usage": {"input": 30, "output": OUTPUT}}] * (CHILD_CALLS - 1)
    return [*calls, {"text": f"{task} done", "usage": {"input": 30, "output": OUTPUT}}]


SCRIPT: dict[str, list[dict[str, Any]]] = {
    PROMPT: [
        {"tool_calls": [{"name": "spawn", "input": {"tasks": TASKS}}], "usage": {"output": OUTPUT}},
        {"text": "audited", "usage": {"input": 30, "output": OUTPUT}},
    ],
    **{task: child_script(task) for task in TASKS},
}


def manifest(directory: Path, limits: dict[str, Any]) -> Path:
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": AGENT},
        "spec": {
            "model": {
                "provider": "scripted",
                "name": "s",
                "maxTokens": OUTPUT,
                "pricing": {"inputPerMTok": 0, "outputPerMTok": PRICE},
                "script": SCRIPT,
            },
            "tools": [{"name": "write_file", "builtin": "write_file"}],
            "subagents": {"maxDepth": 1, "maxConcurrent": len(TASKS)},
            "limits": limits,
        },
    }
    path = directory / f"{AGENT}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def ledger(stack: DevStack, root: str) -> dict[str, Any]:
    url = f"{stack.server.ingress_url}/{AGENT}-budget/{root}/status"
    response = httpx2.post(url, timeout=30)
    assert response.status_code == 200, response.text
    state: dict[str, Any] = response.json()
    return state


def ledgers(stack: DevStack) -> list[str]:
    rows = stack.server.query(
        f"SELECT service_key FROM state WHERE service_name = '{AGENT}-budget'"
    )
    return [row["service_key"] for row in rows]


@pytest.mark.parametrize(
    ("limits", "kill"),
    [
        pytest.param({"maxCostUsd": 1.0}, False, id="usd"),
        pytest.param({"maxTokens": 10_500}, True, id="tokens-with-a-sigkill"),
    ],
)
def test_parallel_children_never_spend_past_the_root_budget(
    workspace: Path,  # noqa: F811
    limits: dict[str, Any],
    kill: bool,
) -> None:
    with DevStack(manifest(workspace, limits), outside(workspace)) as stack:
        invocation = start_run(stack, "s1", PROMPT)
        if kill:  # once the children have spent some of it, with calls in flight
            [root] = wait_until(lambda: ledgers(stack), timeout=120, what="the run's ledger")
            wait_until(
                lambda: ledger(stack, root)["spent"]["tokens"] >= 3 * OUTPUT,
                timeout=120,
                what="children spending",
            )
            kill_and_restart_worker(stack)
        result = result_of(stack, invocation)
        state = ledger(stack, result["run_id"])
        metrics = scrape(stack)

    # The run saw its children stop on the budget, and stopped on it too.
    assert result["status"] == "budget_exceeded", result
    spent = state["spent"]
    # Within the budget, and every call settled to what it used (nothing held).
    if "maxCostUsd" in limits:
        assert spent["cost_usd"] <= limits["maxCostUsd"] + 1e-9
        assert spent["cost_usd"] >= limits["maxCostUsd"] - 0.1 - 1e-9  # no room for one more
    else:
        assert spent["tokens"] <= limits["maxTokens"]
    assert state["held"] == {} and state["holding"] == {"cost_usd": 0.0, "tokens": 0}
    # The run's own account (its children's included) agrees with the ledger.
    assert result["cost_usd"] == pytest.approx(spent["cost_usd"])
    # Metrics of what the ledger did.
    assert value(metrics, "tether_budget_denied_total") >= 1
    if not kill:  # a killed worker's file keeps what it held and counted (README, metrics)
        assert value(metrics, "tether_budget_held", unit="usd") == pytest.approx(0.0, abs=1e-9)
        assert value(metrics, "tether_budget_spent_total", unit="usd") == pytest.approx(
            spent["cost_usd"]
        )

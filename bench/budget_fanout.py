"""What a budgeted run whose first call fans out to parallel sub-agents spends, on a real stack.

    .venv/bin/python bench/budget_fanout.py --children 4 --calls 8

A scripted root run on a `tether.testing.AgentHarness` (restate-server, a worker process, its
sidecar) spawns `--children` sub-agents at once, each making `--calls` model calls of 1,000
output tokens at $100 per million ($0.10 each). It runs once with a cost budget and once with a
token budget, and prints what the whole tree spent against each budget (from the session's run
records: the root's and its children's). Before the budget ledger every child ran with the
whole budget; run this script on an older checkout to see that.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tether.testing import AgentHarness

OUTPUT = 1000


def manifest(children: int, calls: int, limits: dict[str, Any]) -> dict[str, Any]:
    tasks = [f"audit part {n}" for n in range(1, children + 1)]
    usage = {"input": 30, "output": OUTPUT}
    note = {"name": "write_file", "input": {"path": "note.txt", "content": "x"}}
    child = [{"tool_calls": [note], "usage": usage}] * (calls - 1) + [
        {"text": "ok", "usage": usage}
    ]
    script = {
        "split the audit": [
            {"tool_calls": [{"name": "spawn", "input": {"tasks": tasks}}], "usage": usage},
            {"text": "audited", "usage": usage},
        ],
        **{task: child for task in tasks},
    }
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "fanout"},
        "spec": {
            "model": {
                "provider": "scripted",
                "name": "s",
                "maxTokens": OUTPUT,
                "pricing": {"inputPerMTok": 0, "outputPerMTok": 100},
                "script": script,
            },
            "tools": [{"name": "write_file", "builtin": "write_file"}],
            "subagents": {"maxDepth": 1, "maxConcurrent": children},
            "limits": limits,
        },
    }


def own_totals(stats: dict[str, Any]) -> tuple[float, int]:
    """Cost and tokens of one run itself (its sub-agents have run records of their own)."""
    kinds = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    return stats["cost_usd"], sum(stats.get(k, 0) for k in kinds)


def measure(children: int, calls: int, limits: dict[str, Any]) -> dict[str, Any]:
    with AgentHarness(manifest(children, calls, limits)) as harness:
        result = harness.run("s1", "split the audit", timeout=300)
        record = harness.session("s1")
    assert record is not None
    totals = [own_totals(run.stats) for run in record.runs]  # the root's and its children's
    cost, tokens = sum(c for c, _ in totals), sum(t for _, t in totals)
    return {
        "limits": limits,
        "status": result["status"],
        "cost_usd": round(cost, 6),
        "tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=4)
    parser.add_argument("--calls", type=int, default=8)
    args = parser.parse_args()
    for limits in ({"maxCostUsd": 1.0}, {"maxTokens": 10_500}):
        print(json.dumps(measure(args.children, args.calls, limits)), flush=True)


if __name__ == "__main__":
    main()

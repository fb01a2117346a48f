"""The DurableAgent manifest the benches' workers serve: a scripted model and the given tools."""

from __future__ import annotations

from typing import Any


def scripted_agent(
    name: str, script: list[dict[str, Any]], tools: list[dict[str, Any]], max_turns: int
) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": name},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": script},
            "tools": tools,
            "limits": {"maxTurns": max_turns},
        },
    }

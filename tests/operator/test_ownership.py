"""Which deployments make an agent's Restate service names taken (`other_owner`), with stand-ins
for Restate's deployment list and the API server (the end-to-end case, one name in two
namespaces, is in test_failures.py)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from tether_operator.context import Operator
from tether_operator.kube import KubeError
from tether_operator.ownership import other_owner


class Stand:
    def __init__(
        self, deployments: list[dict[str, Any]], agents: set[str], forbidden: bool = False
    ):
        self._deployments = deployments
        self._agents = agents
        self._forbidden = forbidden
        self.restate = self
        self.kube = self

    async def deployments(self) -> list[dict[str, Any]]:
        return self._deployments

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        if self._forbidden:
            raise KubeError(403, "forbidden")
        return {"kind": kind} if f"{namespace}/{name}" in self._agents else None


def deployment(owner: str | None, *services: str) -> dict[str, Any]:
    metadata = {"tether.dev/agent": owner} if owner else {}
    return {"id": "dp_1", "uri": "http://w", "services": [{"name": s} for s in services],
            "metadata": metadata}  # fmt: skip


def owner(stand: Stand, namespace: str = "a", agent: str = "x") -> str | None:
    return asyncio.run(other_owner(cast(Operator, stand), namespace, agent))


@pytest.mark.parametrize(
    ("deployments", "agents", "taken"),
    [
        ([deployment("a/x", "x", "x-inbox")], {"a/x"}, None),  # its own
        ([deployment("b/x", "x", "x-inbox")], {"b/x"}, "DurableAgent b/x"),
        ([deployment("b/x", "x", "x-inbox")], set(), None),  # b/x is gone: stale
        (
            [deployment("b/x-inbox", "x-inbox", "x-inbox-inbox")],
            {"b/x-inbox"},
            "DurableAgent b/x-inbox",
        ),
        ([deployment(None, "x")], set(), "Restate deployment dp_1 at http://w"),
        ([deployment("b/y", "y", "y-inbox")], {"b/y"}, None),  # other names
    ],
    ids=["own", "other-namespace", "stale", "inbox-name", "not-tether", "unrelated"],
)
def test_other_owner(
    deployments: list[dict[str, Any]], agents: set[str], taken: str | None
) -> None:
    found = owner(Stand(deployments, agents))
    assert (found if found is None else found[: len(taken or "")]) == taken


def test_an_owner_it_may_not_read_counts_as_there() -> None:
    stand = Stand([deployment("b/x", "x", "x-inbox")], set(), forbidden=True)
    assert owner(stand) == "DurableAgent b/x"

"""Merging the children of one spawn call into the parent run and its session.

A child's stats join the parent run's `children` (so the parent's budgets count them), its run
record (`SessionRun` with `parent_run_id` / `parent_call_id`) and those of its descendants are
saved in the parent's session, and `on_child_merged` receives the subtree. The child's turns
travel in the `MergedChild` records; they are not appended to the parent's `session.turns`,
because every turn there is part of the parent's conversation with its model (a child's turns
between a tool call and its result would break the transcript).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator

from ..agent.agent import Agent
from ..agent.stats import AgentStats
from ..durable.ids import deterministic_uuid
from ..messages import JSON
from ..session.session import Session
from ..session.types import SessionRun
from ..tools.base import ToolContext
from .child_results import MERGED_CHILDREN_EXTRA, agent_stats, run_status
from .types import (
    ChildRunResult,
    MergedChild,
    RestateSpawnToolOptions,
)


class LabelCounters:
    """`child-1`, `child-2`, ... per session. A counter starts after the child runs the session
    already holds, and the session is loaded from the journal at the start of every attempt, so
    a replay hands out the same labels in the same order."""

    def __init__(self) -> None:
        self._by_session: weakref.WeakKeyDictionary[Session, Iterator[int]] = (
            weakref.WeakKeyDictionary()
        )
        self._without_session = itertools.count(1)

    def next(self, session: Session | None) -> str:
        if session is None:
            return f"child-{next(self._without_session)}"
        counter = self._by_session.get(session)
        if counter is None:
            used = session.child_runs
            counter = self._by_session[session] = itertools.count(used + 1)
        return f"child-{next(counter)}"


class Merge:
    """Merges the children of one spawn call into the parent run and session."""

    def __init__(
        self, options: RestateSpawnToolOptions, ctx: ToolContext, labels: LabelCounters
    ) -> None:
        self.options = options
        self.ctx = ctx
        self.labels = labels
        agent: Agent | None = ctx.agent
        self.session = agent.session if agent is not None else None

    def node(self, label: str, task: str, result: ChildRunResult) -> MergedChild:
        """A merged record of a direct child (relative depth 1) with its relabeled subtree."""
        node: MergedChild = {
            "label": label,
            "task": task,
            "depth": 1,
            "status": result["status"],
            "stats": result["stats"],
            "turns": result["turns"],
        }
        if "started_at" in result:
            node["started_at"] = result["started_at"]
        if "ended_at" in result:
            node["ended_at"] = result["ended_at"]
        below = [self.relabel(c, 2) for c in result.get("children") or []]
        if below:
            node["children"] = below
        return node

    def relabel(self, child: MergedChild, depth: int) -> MergedChild:
        """A descendant's record, labeled from this session's counter at this level's depth."""
        node: MergedChild = {
            **child,
            "label": self.labels.next(self.session),
            "depth": depth,
        }
        below = [self.relabel(c, depth + 1) for c in child.get("children") or []]
        if below:
            node["children"] = below
        else:
            node.pop("children", None)
        return node

    def run_id(self, node: MergedChild) -> str:
        """The child's own run id, else one derived from this call and the node's label."""
        given = node["stats"].get("run_id")
        if isinstance(given, str) and given:
            return given
        return deterministic_uuid(f"{self.ctx.run_id}:{self.ctx.call_id}:{node['label']}")

    def session_run(
        self, node: MergedChild, parent_run_id: str, parent_call_id: str | None
    ) -> SessionRun:
        """The run record of `node`. Times come from the child's clock (replay-stable: they
        arrived in the journaled call result), else its turns, else this run's start."""
        turns = node["turns"]
        run_stats: AgentStats | None = self.ctx.run_stats
        fallback = run_stats.started_at if run_stats else None
        started = node.get("started_at") or node["stats"].get("started_at")
        ended = node.get("ended_at") or node["stats"].get("ended_at")
        if started is None:
            started = turns[0]["created_at"] if turns else fallback or 0.0
        if ended is None and turns:
            ended = turns[-1]["created_at"]
        return SessionRun(
            id=self.run_id(node),
            status=run_status(node),
            started_at=float(started),
            ended_at=None if ended is None else float(ended),
            prompt=node["task"],
            stats=node["stats"],
            parent_run_id=parent_run_id,
            parent_call_id=parent_call_id,
        )

    async def persist(
        self, node: MergedChild, parent_run_id: str, parent_call_id: str | None
    ) -> None:
        """Save the run records of `node` and its descendants in the parent's session."""
        assert self.session is not None
        await self.session.save_run(self.session_run(node, parent_run_id, parent_call_id))
        for child in node.get("children") or []:
            await self.persist(child, self.run_id(node), None)

    async def merge(self, node: MergedChild) -> AgentStats:
        """Persist, count and hand up one direct child's subtree; returns its stats."""
        ctx = self.ctx
        if self.options.persist and self.session is not None:
            await self.persist(node, ctx.run_id, ctx.call_id)
        stats = agent_stats(node["stats"])
        run_stats: AgentStats | None = ctx.run_stats
        if run_stats is not None:
            run_stats.children.append(stats)
        collector = ctx.extras.get(MERGED_CHILDREN_EXTRA)
        if isinstance(collector, list):
            collector.append(node)
        if self.options.on_child_merged is not None:
            self.options.on_child_merged(node, ctx)
        return stats

    async def announce(self, children: list[AgentStats]) -> None:
        """`spawn:complete` per child, from one journaled step: it fires in the attempt that
        first gets past the children, and never again on a replay (a child's result is often
        first seen by a replay that resumed a suspended parent, so "the call ran live" cannot
        be told apart from the call's own journal entry). Besides `call_id` and the child's
        `stats`, the payload has the child's `index` in the call and the call's `fanout`."""
        agent: Agent | None = self.ctx.agent
        if agent is None:
            return
        hooks = agent.hooks

        async def fire() -> JSON:
            for index, stats in enumerate(children):
                payload = {
                    "call_id": self.ctx.call_id,
                    "stats": stats,
                    "index": index,
                    "fanout": len(children),
                }
                await hooks.call("spawn:complete", payload)
            return len(children)

        await self.ctx.durable.step("decision", "spawn:complete", fire)

"""How long a stopping worker pod lets its calls in flight finish (a rollout, a scale-down, a
node drain): the worker's graceful timeout and its pod's termination grace period.

A run leaves a stopping worker before its next model step, and the worker exits once nothing is
in flight. So the grace period is what the turn in flight may still take: the rest of its model
call and a tool call after it. A call still running when it is over is cut off: a model call is
paid again on another pod, an unsafe tool body is reported interrupted. A long grace period
costs nothing while nothing runs.

Imported by the operator: nothing here may import the runtime.
"""

from __future__ import annotations

import math

from . import DurableAgentSpec, ToolSpecEntry, parse_duration

GRACEFUL_TIMEOUT_ENV = "TETHER_WORKER_GRACEFUL_TIMEOUT"
"""The worker's graceful timeout in seconds (read by `tether worker` and its hypercorn config)."""
MCP_TIMEOUT = 60.0
"""Seconds for an MCP call (and for connecting and listing) when the entry sets no timeout."""
TOOL_SECONDS = 60.0
"""A tool call's bound when its entry sets none: the MCP default and the shell built-in's (the
http built-in's is 30 s, the file tools' instant). A Python tool without `timeout` has no bound
of its own; a call of it longer than this may be cut off by a stop."""
MODEL_TOKENS_PER_SECOND = 25.0
"""The slowest output a model call is waited for at: `maxTokens` of output at this rate (hosted
models stream several times faster)."""
SETTLE_SECONDS = 5.0
"""For the journal to acknowledge the last step and the process to exit."""
LONGEST_STEP_SECONDS = 30 * 60.0
"""Restate aborts an attempt whose step runs longer than this after it asked the worker to
suspend (the agent's `abort_timeout`): no use waiting longer for one by default."""
POD_MARGIN_SECONDS = 5
"""The pod's grace period past the worker's: `tether worker` kills what is left 2 s after its
graceful timeout (`deadline.HARD_EXIT_MARGIN`) and says so in its log, before the kubelet would."""


def tool_seconds(entry: ToolSpecEntry) -> float:
    """The longest a call of this tool runs: its entry's `timeout`, a built-in's
    `timeoutSeconds`, whichever is shorter, else `TOOL_SECONDS` (`MCP_TIMEOUT` for a server)."""
    bounds = [parse_duration(entry.timeout)] if entry.timeout else []
    configured = entry.config.get("timeoutSeconds")
    if entry.builtin and isinstance(configured, int | float) and configured > 0:
        bounds.append(float(configured))
    if bounds:
        return min(bounds)
    return MCP_TIMEOUT if entry.mcp else TOOL_SECONDS


def stop_grace_seconds(spec: DurableAgentSpec) -> float:
    """The worker's graceful timeout: `spec.worker.stopGracePeriod`, else a model call of
    `maxTokens` at `MODEL_TOKENS_PER_SECOND`, the longest tool call after it and
    `SETTLE_SECONDS`, at most `LONGEST_STEP_SECONDS`."""
    if spec.worker.stop_grace_period:
        return parse_duration(spec.worker.stop_grace_period)
    model = spec.model.max_tokens / MODEL_TOKENS_PER_SECOND
    tool = max((tool_seconds(entry) for entry in spec.tools), default=0.0)
    return min(model + tool + SETTLE_SECONDS, LONGEST_STEP_SECONDS)


def pod_grace_seconds(spec: DurableAgentSpec) -> int:
    """The worker pod's `terminationGracePeriodSeconds`."""
    return math.ceil(stop_grace_seconds(spec)) + POD_MARGIN_SECONDS

"""The trace context of agent runs, derived from their ids (no OpenTelemetry package needed).

A run's trace id is a hash of its run id, and the ids of its spans are hashes of the run id and
the step they stand for (`run`, `turn/<n>`, `tool/<call id>`, `park/<call id>`), so every
invocation that works on a run (a suspension, a retry, a new pod after a crash) puts its spans in
the same trace, under the same parents, with nothing stored anywhere. A sub-agent that runs in an
invocation of its own (on Restate) gets the W3C `traceparent` of the spawn call that started it
in its request (`child_traceparent`, under `TRACEPARENT_KEY`): its spans join the parent's trace,
its run's span under that call's.

`traces_wanted` says from the standard `OTEL_*` variables whether to trace at all: only with an
OTLP endpoint (or `OTEL_TRACES_EXPORTER=console`), so without one nothing is imported or done.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError

TRACEPARENT_KEY = "traceparent"
"""The key of a child run's request that carries its parent's trace context."""

EXPORTERS = ("otlp", "console")
"""The values of `OTEL_TRACES_EXPORTER` that Tether exports with (and `none`)."""
OTLP_PROTOCOL = "http/protobuf"

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


def _hash(kind: str, *parts: str, size: int) -> int:
    digest = hashlib.sha256("\x1f".join((kind, *parts)).encode()).digest()
    return int.from_bytes(digest[:size], "big") or 1  # zero is the invalid id


def trace_id_of(run_id: str) -> int:
    """The trace id (128 bits) of the run `run_id` when it is not a sub-agent's."""
    return _hash("tether-trace", run_id, size=16)


def span_id_of(run_id: str, *step: str) -> int:
    """The span id (64 bits) of one step of the run: `("run",)`, `("turn", "3")`..."""
    return _hash("tether-span", run_id, *step, size=8)


@dataclass(frozen=True)
class TraceParent:
    """A span that a run's spans hang under: its trace and its id."""

    trace_id: int
    span_id: int

    def header(self) -> str:
        """As a W3C `traceparent` (sampled)."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"

    @classmethod
    def parse(cls, value: object) -> TraceParent | None:
        """A `traceparent` header's context; None for anything else (a request without one)."""
        match = _TRACEPARENT.match(value.strip().lower()) if isinstance(value, str) else None
        if match is None:
            return None
        trace_id, span_id = int(match[1], 16), int(match[2], 16)
        return cls(trace_id, span_id) if trace_id and span_id else None


def run_trace_id(run_id: str, parent: TraceParent | None) -> int:
    """The trace of run `run_id`: its parent's, else its own."""
    return parent.trace_id if parent is not None else trace_id_of(run_id)


def child_traceparent(parent: TraceParent | None, run_id: str, call_id: str) -> str:
    """The `traceparent` of a sub-agent started by call `call_id` of run `run_id` (itself under
    `parent`, or a run of its own): the span of that spawn call, in the run's trace."""
    return TraceParent(run_trace_id(run_id, parent), span_id_of(run_id, "tool", call_id)).header()


def _variable(env: Mapping[str, str], name: str, default: str = "") -> str:
    return (env.get(name) or default).strip()


def traces_endpoint(env: Mapping[str, str]) -> str | None:
    """Where OTLP/HTTP traces go: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else
    `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`; None without either."""
    if endpoint := _variable(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return endpoint
    if base := _variable(env, "OTEL_EXPORTER_OTLP_ENDPOINT"):
        return f"{base.removesuffix('/')}/v1/traces"
    return None


def trace_exporters(env: Mapping[str, str]) -> list[str]:
    """The exporters the environment asks for (`OTEL_TRACES_EXPORTER`, default `otlp`), none
    when tracing is off: `OTEL_SDK_DISABLED=true`, `none`, or `otlp` without an endpoint.
    A value Tether cannot export with is a `ConfigError`."""
    if _variable(env, "OTEL_SDK_DISABLED").lower() == "true":
        return []
    names = [n.strip().lower() for n in _variable(env, "OTEL_TRACES_EXPORTER", "otlp").split(",")]
    names = [n for n in names if n]
    if "none" in names:
        return []
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={','.join(names)}: Tether exports traces with "
            f"{' or '.join(EXPORTERS)} (or none); remove {', '.join(unknown)}"
        )
    if "otlp" in names:
        for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            protocol = _variable(env, variable)
            if protocol and protocol != OTLP_PROTOCOL:
                raise ConfigError(
                    f"{variable}={protocol}: Tether sends OTLP over HTTP ({OTLP_PROTOCOL}); "
                    "point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (4318)"
                )
            if protocol:
                break
        if traces_endpoint(env) is None:
            names.remove("otlp")  # no endpoint: no OTLP, at no cost
    return names


def traces_wanted(env: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces (see `trace_exporters`)."""
    return bool(trace_exporters(env))

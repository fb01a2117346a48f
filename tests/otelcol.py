"""A real trace backend for the trace tests: the OpenTelemetry Collector that
`scripts/build-otelcol.sh` builds (the OTLP receiver and contrib's file exporter, cached in
~/.cache/tether/otelcol), run as a process of its own on loopback, writing every span it receives
to a JSON-lines file that the tests read (`Collector.spans`).

`Collector(directory)` is a `with` block: a free port, a config, the process in a group of its
own (stopped, group and all, at the end), ready once it answers an empty OTLP export.
`collector.env()` is what points a process at it (the standard `OTEL_*` variables).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.programs.lifecycle import Lifecycle
from tether.programs.local_http import request
from tether.programs.process_group import GroupProcess
from tether.programs.restate_server import free_port
from tether.testing import wait_until

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "scripts" / "build-otelcol.sh"


def otelcol_binary() -> Path:
    """The collector binary: built by the script if missing (minutes, once), else at once."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed ({done.returncode}):\n{done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])


CONFIG = """\
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{port}
exporters:
  file:
    path: {path}
    flush_interval: 50ms
service:
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
"""


def _value(value: dict[str, Any]) -> Any:
    """An OTLP/JSON `AnyValue` as Python."""
    if "arrayValue" in value:
        return [_value(v) for v in value["arrayValue"].get("values", [])]
    if "intValue" in value:
        return int(value["intValue"])
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    return None


def _attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {item["key"]: _value(item.get("value", {})) for item in items or []}


@dataclass(frozen=True)
class ExportedSpan:
    """A span as the collector wrote it."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    """1 internal, 3 client (OTLP's `SpanKind`)."""
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: int
    """0 unset, 1 ok, 2 error."""
    status_message: str
    service: str

    @property
    def failed(self) -> bool:
        return self.status == 2


def read_spans(path: Path) -> list[ExportedSpan]:
    """Every span of the file exporter's JSON lines, in the order received."""
    if not path.exists():
        return []
    spans: list[ExportedSpan] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        for resource_spans in json.loads(line).get("resourceSpans", []):
            resource = _attributes(resource_spans.get("resource", {}).get("attributes"))
            for scope_spans in resource_spans.get("scopeSpans", []):
                for span in scope_spans.get("spans", []):
                    status = span.get("status", {})
                    spans.append(
                        ExportedSpan(
                            trace_id=span["traceId"],
                            span_id=span["spanId"],
                            parent_id=span.get("parentSpanId", ""),
                            name=span["name"],
                            kind=int(span.get("kind", 0)),
                            start_ns=int(span["startTimeUnixNano"]),
                            end_ns=int(span["endTimeUnixNano"]),
                            attributes=_attributes(span.get("attributes")),
                            status=int(status.get("code", 0)),
                            status_message=status.get("message", ""),
                            service=str(resource.get("service.name", "")),
                        )
                    )
    return spans


class Collector(Lifecycle):
    """The collector on a free loopback port, writing spans to `directory/traces.jsonl`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.path = directory / "traces.jsonl"
        self.process: GroupProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Collector:
        binary = otelcol_binary()
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "otelcol.yaml"
        config.write_text(CONFIG.format(port=self.port, path=self.path))
        self.process = GroupProcess(
            [str(binary), "--config", str(config)], log=self.directory / "otelcol.log"
        )

        def ready() -> bool:
            assert self.process is not None
            if not self.process.alive():
                raise RuntimeError(f"the collector exited:\n{self.process.log_tail()}")
            headers = {"content-type": "application/json"}
            answer = request("POST", f"{self.endpoint}/v1/traces", body=b"{}", headers=headers)
            return answer.status == 200

        wait_until(ready, timeout=30, what="the collector to take OTLP on its HTTP port")
        return self

    def close(self) -> None:
        if self.process is not None:
            self.process.stop(grace=5)  # SIGTERM: the file exporter flushes; then the group

    def env(self, *, schedule_delay_ms: int = 100) -> dict[str, str]:
        """The variables that point a process's traces at the collector (exported in batches
        every `schedule_delay_ms`)."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": str(schedule_delay_ms),
        }

    def spans(self) -> list[ExportedSpan]:
        return read_spans(self.path)

    def wait_for(
        self,
        predicate: Callable[[list[ExportedSpan]], bool],
        *,
        timeout: float = 30.0,
        what: str = "spans",
    ) -> list[ExportedSpan]:
        """The spans once `predicate` holds for them."""

        def check() -> list[ExportedSpan] | None:
            spans = self.spans()
            return spans if predicate(spans) else None

        return wait_until(check, timeout=timeout, what=what)

    def log_tail(self) -> str:
        return self.process.log_tail() if self.process is not None else ""

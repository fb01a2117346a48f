"""The chart's Grafana dashboard as PromQL: every panel's queries with the dashboard's variables
filled in, as the e2e sends them to its Prometheus (`steps.dashboard_has_data`).

Grafana fills in `$agent` (a query variable: all agents is its `allValue`, `.*`, under `=~`),
`$datasource` (only in the panels' datasource, never in a query) and its own `$__rate_interval`,
`$__interval` and `$__range`; here they get the values of `VARIABLES`. A query that still holds a
`$` after that names a variable nobody fills in, and is refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD = (
    Path(__file__).resolve().parents[1] / "helm" / "tether" / "files" / "tether-dashboard.json"
)

VARIABLES = {
    "agent": ".*",  # "All": the variable's allValue
    "__rate_interval": "5m",
    "__interval": "1m",
    "__range": "1h",
}
"""What Grafana would put in place of each variable; `$agent` is used with `=~`."""

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
_LABEL_VALUES = re.compile(r"^label_values\(\s*([a-zA-Z_:][\w:]*)\s*,\s*(\w+)\s*\)$")


@dataclass(frozen=True)
class Query:
    """One target of one panel, ready for Prometheus."""

    panel: str
    ref: str
    expr: str

    @property
    def name(self) -> str:
        return f"{self.panel!r} ({self.ref})"


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def substitute(expr: str, variables: dict[str, str] | None = None) -> str:
    """`expr` with every `$name`, `${name}`, `${name:format}` and `[[name]]` replaced; a
    variable without a value is a `KeyError` naming it."""
    values = VARIABLES if variables is None else variables

    def value(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        if name not in values:
            raise KeyError(f"no value for the dashboard variable ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(value, expr)


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's panels, those inside rows included, rows themselves left out."""
    found: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def queries(dashboard: dict[str, Any], variables: dict[str, str] | None = None) -> list[Query]:
    """Every target of every panel, substituted, in the dashboard's order."""
    return [
        Query(
            str(panel.get("title")), str(target.get("refId")), substitute(target["expr"], variables)
        )
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def variable_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """For each query variable (`label_values(metric, label)`), the PromQL that lists the values
    Grafana would offer: `count by (label) (metric)`."""
    found: dict[str, str] = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = str(query.get("query") if isinstance(query, dict) else query).strip()
        match = _LABEL_VALUES.match(text)
        if match is None:
            raise ValueError(f"variable {variable.get('name')}: not label_values(...): {text!r}")
        metric, label = match.groups()
        found[str(variable["name"])] = f"count by ({label}) ({metric})"
    return found

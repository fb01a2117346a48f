"""The chart's Grafana dashboard: the ConfigMap the real helm CLI renders for Grafana's
dashboard sidecar, the dashboard's panels and variables, and its queries as the e2e sends them
to Prometheus (`e2e.dashboard`, which `e2e/steps.py` evaluates against a real Prometheus)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from e2e import dashboard
from tests.helm.chart import (
    CHART,
    HISTOGRAM_SERIES,
    METRIC,
    by_kind,
    helm,
    one,
    operator_metrics,
    render,
    tether_metrics,
)

BOARD = dashboard.load()
PANELS = dashboard.panels(BOARD)
NO_AGENT_LABEL = {"tether_webhook_requests_total"}
"""Tether's metrics without an `agent` label: the sidecar counts its requests by outcome only."""


def test_the_dashboard_is_rendered_only_when_enabled(helm_bin: Path) -> None:
    assert by_kind(render(helm_bin), "ConfigMap") == []
    config_map = one(render(helm_bin, "monitoring.dashboard.enabled=true"), "ConfigMap")
    metadata = config_map["metadata"]
    assert (metadata["name"], metadata["namespace"]) == ("t-dashboard", "tether-system")
    assert metadata["labels"]["grafana_dashboard"] == "1"
    assert metadata["labels"]["app.kubernetes.io/instance"] == "t"
    assert "annotations" not in metadata
    assert list(config_map["data"]) == ["tether.json"]
    assert json.loads(config_map["data"]["tether.json"]) == BOARD


def test_the_dashboards_namespace_labels_and_annotations_are_values(helm_bin: Path) -> None:
    config_map = one(
        render(
            helm_bin,
            "monitoring.dashboard.enabled=true",
            "monitoring.dashboard.namespace=monitoring",
            "monitoring.dashboard.labels.grafana_dashboard=null",
            "monitoring.dashboard.labels.team-dashboards=tether",
            "monitoring.dashboard.annotations.grafana_folder=Agents",
        ),
        "ConfigMap",
    )
    metadata = config_map["metadata"]
    assert metadata["namespace"] == "monitoring"
    assert metadata["labels"]["team-dashboards"] == "tether"
    assert "grafana_dashboard" not in metadata["labels"]
    assert metadata["annotations"] == {"grafana_folder": "Agents"}
    assert json.loads(config_map["data"]["tether.json"]) == BOARD


def test_the_chart_with_the_dashboard_lints(helm_bin: Path) -> None:
    args = ["lint", "--strict", str(CHART), "--set", "monitoring.dashboard.enabled=true"]
    assert "0 chart(s) failed" in helm(helm_bin, *args).stdout


BAD_VALUES = {
    "switch": ("monitoring.dashboard.enabled=yes", "/monitoring/dashboard/enabled"),
    "namespace": ("monitoring.dashboard.namespace=Grafana_NS", "/monitoring/dashboard/namespace"),
    "label value": ("monitoring.dashboard.labels.grafana_dashboard=1", "grafana_dashboard"),
    "unknown value": ("monitoring.dashboard.folder=Tether", "folder"),
}


@pytest.mark.parametrize("case", list(BAD_VALUES), ids=list(BAD_VALUES))
def test_bad_dashboard_values_are_refused_naming_the_value(helm_bin: Path, case: str) -> None:
    value, named = BAD_VALUES[case]
    result = helm(helm_bin, "template", "t", str(CHART), "--set", value, check=False)
    assert result.returncode != 0
    assert named in result.stderr, result.stderr


# The dashboard itself -----------------------------------------------------------------------


def variable(name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [v for v in BOARD["templating"]["list"] if v["name"] == name]
    assert len(found) == 1, name
    return found[0]


def test_the_dashboard_picks_a_prometheus_and_agents() -> None:
    source = variable("datasource")
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    agent = variable("agent")
    assert agent["type"] == "query"
    assert (agent["includeAll"], agent["multi"], agent["allValue"]) == (True, True, ".*")
    assert agent["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    # Every agent pod's sidecar reports tether_parked_calls, zeros too: all agents are listed.
    assert dashboard.variable_queries(BOARD) == {"agent": "count by (agent) (tether_parked_calls)"}
    assert BOARD["uid"] == "tether" and BOARD.get("id") is None


def test_every_panel_has_a_query_on_the_chosen_prometheus() -> None:
    titles = [panel["title"] for panel in PANELS]
    assert len(titles) == len(set(titles)), "the e2e names panels by title"
    for panel in PANELS:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        targets = panel.get("targets") or []
        assert targets, f"panel {panel['title']!r} has no query"
        refs = [target["refId"] for target in targets]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in targets:
            assert target["expr"].strip(), f"panel {panel['title']!r} {target['refId']}: no expr"
            assert target["datasource"] == panel["datasource"]
            assert target.get("legendFormat"), f"panel {panel['title']!r} {target['refId']}"
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
            assert target["expr"].count("{") == target["expr"].count("}"), target["expr"]


def test_the_panels_on_call_people_look_at() -> None:
    def exprs(title: str) -> str:
        [panel] = [p for p in PANELS if p["title"] == title]
        return " ".join(target["expr"] for target in panel["targets"])

    assert "tether_runs_total" in exprs("Runs finished, by status")
    assert "max by (agent, kind) (tether_parked_calls" in exprs("Parked calls now")
    assert "tether_parked_oldest_seconds" in exprs("Oldest parked call")
    parked = exprs("Time parked until answered")
    assert parked.count("histogram_quantile(") == 3
    assert "tether_parked_duration_seconds_bucket" in parked
    assert "tether_replays_total" in exprs("Replays and replayed steps")
    assert "tether_child_fanout_bucket" in exprs("Sub-agent runs and fan-out")
    assert "by (agent, model, kind)" in exprs("Tokens by agent and model")
    assert "by (agent, model)" in exprs("Cost by agent and model")
    assert "tether_model_call_duration_seconds_bucket" in exprs("Model latency")
    assert "tether_tool_duration_seconds_bucket" in exprs("Tool latency")
    assert "tether_webhook_requests_total" in exprs("Webhook outcomes")
    assert "tether_mcp_calls_total" in exprs("MCP calls")
    assert 'outcome!="ok"' in exprs("MCP errors")
    assert "tether_mcp_call_duration_seconds_bucket" in exprs("MCP latency")
    versions = exprs("Runs and pods by version")
    assert "tether_version_parked_runs" in versions and "tether_version_replicas" in versions
    assert "tether_schedule_next_run_timestamp_seconds" in exprs("Schedules: next and last runs")
    assert "tether_spend_cap_used_ratio" in exprs("Spend caps used")


def test_the_dashboard_shows_every_tether_metric_and_no_other() -> None:
    """A metric added to Tether (its workers', sidecars' or operator's) goes on the dashboard
    (and so through the e2e's check against a real Prometheus); a name the dashboard queries is
    one Tether exports."""
    declared = {**tether_metrics(), **operator_metrics()}
    used: set[str] = set()
    for query in dashboard.queries(BOARD):
        for name in METRIC.findall(query.expr):
            base = HISTOGRAM_SERIES.sub("", name)
            if declared.get(base) == "histogram":
                name = base
            assert name in declared, f"{query.name} queries {name}, which Tether does not export"
            used.add(name)
    assert used == set(declared)


def test_the_agent_variable_filters_every_query_of_an_agent_metric() -> None:
    for panel in PANELS:
        for target in panel["targets"]:
            for name in set(METRIC.findall(target["expr"])) - NO_AGENT_LABEL:
                selectors = re.findall(rf"\b{name}\{{([^}}]*)\}}", target["expr"])
                assert selectors, f"{panel['title']!r}: {name} without a label selector"
                for selector in selectors:
                    assert 'agent=~"$agent"' in selector, f"{panel['title']!r}: {selector}"


# What the e2e sends to Prometheus -----------------------------------------------------------


def test_the_e2e_fills_in_every_variable_of_every_query() -> None:
    queries = dashboard.queries(BOARD)
    assert len(queries) == sum(len(panel["targets"]) for panel in PANELS)
    for query in queries:
        assert "$" not in query.expr and "[[" not in query.expr, query.name
    by_name = {query.name: query.expr for query in queries}
    assert by_name["'Oldest parked call' (A)"] == (
        'max by (agent) (tether_parked_oldest_seconds{agent=~".*"})'
    )
    assert by_name["'Runs finished, by status' (A)"] == (
        '60 * sum by (agent, status) (rate(tether_runs_total{agent=~".*"}[5m]))'
    )


SUBSTITUTIONS = {
    "plain": ('x{agent=~"$agent"}[$__rate_interval]', 'x{agent=~".*"}[5m]'),
    "braces": ('x{agent=~"${agent}"}[${__rate_interval}]', 'x{agent=~".*"}[5m]'),
    "format": ('x{agent=~"${agent:regex}"}', 'x{agent=~".*"}'),
    "old syntax": ('x{agent=~"[[agent]]"}', 'x{agent=~".*"}'),
    "range": ("increase(x[$__range]) / $__interval", "increase(x[1h]) / 1m"),
    "no variable": ("sum(x)", "sum(x)"),
}


@pytest.mark.parametrize("case", list(SUBSTITUTIONS), ids=list(SUBSTITUTIONS))
def test_substitution(case: str) -> None:
    expr, expected = SUBSTITUTIONS[case]
    assert dashboard.substitute(expr) == expected


def test_a_variable_without_a_value_is_named() -> None:
    with pytest.raises(KeyError, match=r"\$tenant"):
        dashboard.substitute('x{tenant="$tenant"}')
    assert dashboard.substitute('x{tenant="$tenant"}', {"tenant": "a"}) == 'x{tenant="a"}'


def test_queries_of_rows_are_found_and_panels_without_targets_are_kept() -> None:
    inner = {"title": "inner", "targets": [{"refId": "A", "expr": 'up{a="$agent"}'}]}
    outer = {
        "title": "outer",
        "targets": [{"refId": "B", "expr": "sum(rate(x[$__rate_interval]))"}],
    }
    row = {"type": "row", "title": "collapsed", "panels": [inner]}
    board = {"panels": [row, outer, {"title": "text", "type": "text"}]}
    assert [p["title"] for p in dashboard.panels(board)] == ["inner", "outer", "text"]
    assert dashboard.queries(board) == [
        dashboard.Query("inner", "A", 'up{a=".*"}'),
        dashboard.Query("outer", "B", "sum(rate(x[5m]))"),
    ]

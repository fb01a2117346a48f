"""The chart's alerting rules (helm/tether/files/tether-alerts.yaml): Prometheus's own promtool
checks them and runs their unit tests (tests/helm/alerts_test.yaml, series in, alerts out), the
real helm CLI renders them into a PrometheusRule (which the Prometheus Operator's CRD takes:
tests/helm/test_install.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

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

RULES_FILE = CHART / "files" / "tether-alerts.yaml"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yaml")
RULES: dict[str, Any] = yaml.safe_load(RULES_FILE.read_text())
ALERTS = [rule for group in RULES["groups"] for rule in group["rules"]]


def promtool(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)


def test_promtool_finds_the_rules_valid(promtool_bin: Path) -> None:
    checked = promtool(promtool_bin, "check", "rules", str(RULES_FILE))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout


def test_each_alert_fires_on_its_series_and_only_for_them(promtool_bin: Path) -> None:
    tested = promtool(promtool_bin, "test", "rules", str(UNIT_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    cases = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired = {
        check["alertname"]
        for case in cases
        for check in case["alert_rule_test"]
        if check.get("exp_alerts")
    }
    assert fired == {rule["alert"] for rule in ALERTS}  # a new alert gets a test


def test_the_unit_tests_catch_a_wrong_threshold(promtool_bin: Path, tmp_path: Path) -> None:
    """A rule that would stay quiet (its ratio's threshold raised past what the series give)
    fails its test: they check what fires, not only that the files load."""
    rules = RULES_FILE.read_text()
    assert rules.count("> 0.1\n") == 1
    mutated = tmp_path / "helm" / "tether" / "files"
    mutated.mkdir(parents=True)
    (mutated / RULES_FILE.name).write_text(rules.replace("> 0.1\n", "> 0.3\n"))
    tests = tmp_path / "tests" / "helm"
    tests.mkdir(parents=True)
    shutil.copy(UNIT_TESTS, tests / UNIT_TESTS.name)
    tested = promtool(promtool_bin, "test", "rules", str(tests / UNIT_TESTS.name))
    assert tested.returncode != 0
    assert "TetherRunsFailing" in tested.stdout + tested.stderr


def test_every_alert_says_how_bad_and_what_happened_on_tether_metrics_only() -> None:
    declared = {**tether_metrics(), **operator_metrics()}
    for rule in ALERTS:
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        for name in METRIC.findall(rule["expr"]):
            base = HISTOGRAM_SERIES.sub("", name)
            assert name in declared or declared.get(base) == "histogram", (rule["alert"], name)
        assert re.search(r"by \([^)]*namespace", rule["expr"]), rule["alert"]


def test_the_rules_are_rendered_only_when_enabled_with_their_labels(helm_bin: Path) -> None:
    assert by_kind(render(helm_bin), "PrometheusRule") == []
    rule = one(
        render(
            helm_bin,
            "monitoring.alerts.enabled=true",
            "monitoring.alerts.labels.release=kube-prometheus",
            "monitoring.alerts.ruleLabels.team=platform",
            "monitoring.alerts.ruleLabels.severity=page",
        ),
        "PrometheusRule",
    )
    assert rule["metadata"]["name"] == "t-alerts"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    rendered = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert [r["alert"] for r in rendered] == [r["alert"] for r in ALERTS]
    for mine, theirs in zip(rendered, ALERTS, strict=True):
        # every alert routed to the team; an alert's own severity wins
        assert mine["labels"] == {**theirs["labels"], "team": "platform"}
        assert {k: v for k, v in mine.items() if k != "labels"} == {
            k: v for k, v in theirs.items() if k != "labels"
        }


def test_bad_alert_values_are_refused_naming_the_value(helm_bin: Path) -> None:
    bad = helm(
        helm_bin, "template", "t", str(CHART), "--set", "monitoring.alerts.enable=true", check=False
    )
    assert bad.returncode != 0 and "enable" in bad.stderr

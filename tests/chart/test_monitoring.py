"""The chart's monitoring objects and the files behind them: the Grafana dashboard (ConfigMap for the
sidecar, and the plain JSON file), the alerts (PrometheusRule, and the plain rules file checked and
unit-tested with ``promtool``), the runbook every alert links to."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from .conftest import (
    CHART_DIR,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    REPO,
    Manifest,
    find,
    helm,
    one,
    to_json_schema,
)

DASHBOARD = CHART_DIR / "dashboards" / "multilane.json"
RULES = CHART_DIR / "alerts" / "multilane.rules.yaml"
RULES_TEST = Path(__file__).parent / "data" / "multilane.rules.test.yaml"
PROMETHEUSRULE_SCHEMA = Path(__file__).parent / "data" / "prometheusrule-v1.openapi.yaml"
RUNBOOK = REPO / "docs" / "runbook.md"
DEFAULT_RUNBOOK = "https://github.com/multilane/multilane/blob/main/docs/runbook.md"
ON = {"metrics": {"grafanaDashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}}

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [r for g in doc["groups"] for r in g["rules"]]


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def runbook_anchors() -> set[str]:
    """GitHub-style anchors of the runbook's headings."""
    out = set()
    for line in RUNBOOK.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return out


# --- the dashboard ---------------------------------------------------------------------------------


def test_dashboard_structure() -> None:
    dash = dashboard()
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(ids)}"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "consumer", "topic"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    # every panel and target uses the datasource variable: no hard-coded datasource uid anywhere
    text = DASHBOARD.read_text(encoding="utf-8")
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', text))
    assert uids <= {"${datasource}", "-- Grafana --", dash["uid"]}, uids
    for p in panels(dash):
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            assert t["expr"].strip()
        gp = p["gridPos"]
        assert gp["x"] >= 0 and gp["x"] + gp["w"] <= 24, p["title"]


def test_dashboard_has_the_issue_panels_and_decision_annotations() -> None:
    dash = dashboard()
    exprs = " ".join(t["expr"] for p in panels(dash) for t in p.get("targets", []))
    for metric in (
        "multilane_consumer_lag",
        "multilane_records_processed_total",
        "multilane_operator_replicas",
        "multilane_operator_factor",
        "multilane_lane_utilisation_ratio",
        "multilane_in_flight_records",
        "multilane_partition_paused",
        "multilane_records_retried_total",
        "multilane_records_dead_lettered_total",
        "multilane_stalled_records",
        "multilane_operator_moves_in_flight",
        "multilane_operator_handoff_pause_seconds_bucket",
        "multilane_restore_records_remaining",
        "multilane_commit_latency_seconds_bucket",
    ):
        assert metric in exprs, metric
    annotations = [a for a in dash["annotations"]["list"] if a.get("expr")]
    assert any("multilane_operator_scaling_decisions_total" in a["expr"] for a in annotations)


# --- the alerts --------------------------------------------------------------------------------------


def test_every_alert_has_summary_description_and_a_runbook_section() -> None:
    anchors = runbook_anchors()
    found = rules()
    assert len(found) >= 7
    for rule in found:
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        url = annotations["runbook_url"]
        assert url.startswith(DEFAULT_RUNBOOK + "#"), url
        assert url.split("#", 1)[1] == rule["alert"].lower() in anchors, (rule["alert"], sorted(anchors))
        assert rule["labels"]["severity"] in ("warning", "critical")


@needs_promtool
def test_promtool_check_rules() -> None:
    done = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


@needs_promtool
def test_promtool_rule_unit_tests() -> None:
    """Each alert fires on a synthetic broken consumer and stays silent on a healthy one."""
    tests = yaml.safe_load(RULES_TEST.read_text(encoding="utf-8"))
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == {r["alert"] for r in rules()}
    done = subprocess.run(
        ["promtool", "test", "rules", RULES_TEST.name],
        capture_output=True,
        text=True,
        cwd=RULES_TEST.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


# --- the chart ---------------------------------------------------------------------------------------


def test_monitoring_objects_are_off_by_default(render: Any) -> None:
    docs = render()
    assert find(docs, "PrometheusRule") == []
    labelled = [d for d in find(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"].get("labels", {})]
    assert labelled == []


def test_dashboard_configmap(render: Any) -> None:
    docs = render(ON)
    cm = one(docs, "ConfigMap", f"{RELEASE}-multilane-dashboard")
    kubernetes_validate.validate(cm, KUBE_VERSION, strict=True)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert json.loads(cm["data"]["multilane.json"]) == dashboard()
    moved = render(
        {"metrics": {"grafanaDashboard": {"enabled": True, "namespace": "monitoring",
                                          "annotations": {"grafana_folder": "multilane"}}}}
    )
    cm = one(moved, "ConfigMap", f"{RELEASE}-multilane-dashboard")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "multilane"}


def test_prometheusrule_matches_the_rules_file_and_its_crd_schema(render: Any) -> None:
    schema = to_json_schema(yaml.safe_load(PROMETHEUSRULE_SCHEMA.read_text(encoding="utf-8")))
    docs = render(ON)
    rule = one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    jsonschema.validate(rule, schema)
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    # the schema is not toothless: a rule without expr and an unknown field are refused
    broken = json.loads(json.dumps(rule))
    del broken["spec"]["groups"][0]["rules"][0]["expr"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)
    broken = json.loads(json.dumps(rule))
    broken["spec"]["groups"][0]["rules"][0]["severity"] = "warning"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_prometheusrule_options(render: Any) -> None:
    values: Manifest = {
        "metrics": {
            "prometheusRule": {
                "enabled": True,
                "namespace": "monitoring",
                "labels": {"release": "prom"},
                "ruleLabels": {"team": "platform"},
                "runbookBaseUrl": "https://wiki.example.com/multilane/runbook",
            }
        }
    }
    rule = one(render(values), "PrometheusRule")
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "prom"
    for r in rule["spec"]["groups"][0]["rules"]:
        assert r["labels"]["team"] == "platform" and r["labels"]["severity"]
        assert r["annotations"]["runbook_url"] == (
            f"https://wiki.example.com/multilane/runbook#{r['alert'].lower()}"
        )


def test_operator_servicemonitor_keeps_consumer_labels(render: Any) -> None:
    docs = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    endpoint = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["honorLabels"] is True


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"metrics": {"prometheusRule": {"enabled": True, "runbookUrl": "x"}}}, "runbookUrl"),
        ({"metrics": {"prometheusRule": {"runbookBaseUrl": "wiki/runbook.md"}}}, "runbookBaseUrl"),
        ({"metrics": {"grafanaDashboard": {"namespace": "Monitoring"}}}, "namespace"),
    ],
)
def test_values_schema_rejects_bad_monitoring_values(chart: Any, values: Manifest, fragment: str) -> None:
    with pytest.raises(helm.HelmValuesError) as excinfo:
        chart.validate_schema(values)
    assert fragment in str(excinfo.value)


def test_notes_name_the_monitoring_objects(render_notes: Any) -> None:
    assert "Monitoring:" not in render_notes()
    notes = render_notes(ON)
    assert f"ConfigMap {RELEASE}-multilane-dashboard" in notes
    assert f"PrometheusRule {RELEASE}-multilane" in notes
    assert "enable\n   metrics.serviceMonitor and metrics.workerPodMonitor" in notes

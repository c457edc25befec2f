"""The PrometheusRule passes `promtool check rules`, each alert fires in `promtool test rules`,
and every metric the alerts and the dashboard use is one the controller exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import CHART, NAMESPACE, Rendered, dump_yaml

REPO = Path(__file__).resolve().parents[2]
PROMTOOL = shutil.which("promtool") or "promtool not installed: apt-get install prometheus"
# promtool is a test dependency (.ci/run installs it): a missing one fails, never skips.
SEL = {"job": "ebb-ebbtide", "namespace": NAMESPACE}


def _series(metric: str, values: str, **labels: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in {**SEL, **labels}.items())
    return {"series": f"{metric}{{{body}}}", "values": values}


def _expect(rule: dict[str, Any], labels: dict[str, str], value: str = "") -> dict[str, Any]:
    """An expected alert: the rule's labels plus ``labels``, annotations as Prometheus expands
    them (only ``$labels.x`` and ``$value`` are used in the chart)."""
    annotations = {}
    for key, text in rule["annotations"].items():
        for name, v in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", v)
        annotations[key] = text.replace("{{ $value }}", value)
    return {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations}


def _case(
    rules: dict[str, dict[str, Any]],
    alert: str,
    series: list[dict[str, str]],
    *,
    quiet_at: str,
    firing_at: str,
    labels: dict[str, str],
    value: str = "",
) -> dict[str, Any]:
    """A promtool test: nothing at ``quiet_at``, exactly one ``alert`` at ``firing_at``."""
    return {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [
            {"eval_time": quiet_at, "alertname": alert, "exp_alerts": []},
            {
                "eval_time": firing_at,
                "alertname": alert,
                "exp_alerts": [_expect(rules[alert], labels, value)],
            },
        ],
    }


@pytest.fixture(scope="module")
def rule_groups(rendered: dict[str, Rendered]) -> list[dict[str, Any]]:
    """The rendered PrometheusRule's groups (monitoring values set)."""
    groups: list[dict[str, Any]] = rendered["monitoring"].one("PrometheusRule")["spec"]["groups"]
    return groups


@pytest.fixture
def rules_file(rule_groups: list[dict[str, Any]], tmp_path: Path) -> Path:
    path = tmp_path / "ebbtide.rules.yaml"
    path.write_text(dump_yaml({"groups": rule_groups}))
    return path


def test_promtool_check_rules(rules_file: Path) -> None:
    """`promtool check rules` accepts the rendered groups."""
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 rules found" in done.stdout


def test_promtool_every_alert_fires(
    rule_groups: list[dict[str, Any]], rules_file: Path, tmp_path: Path
) -> None:
    """Each alert stays quiet before its condition has lasted `for`, then fires with the
    expected labels and annotations; healthy inputs (one leader, flat lag) fire nothing."""
    assert PROMTOOL is not None
    rules = {r["alert"]: r for g in rule_groups for r in g["rules"]}
    ns = {"namespace": NAMESPACE}
    tests = [
        _case(rules, "EbbtideControllerDown",
              [_series("ebbtide_leader", "1 1 1 stale", pod="ebb-a")],
              quiet_at="6m", firing_at="9m", labels=SEL),
        _case(rules, "EbbtideNoLeader",
              [_series("ebbtide_leader", "1 1 0x20", pod="ebb-a"),
               _series("ebbtide_leader", "0x22", pod="ebb-b")],
              quiet_at="3m", firing_at="6m", labels={}),
        _case(rules, "EbbtideConsumerLagGrowing",
              [_series("ebbtide_consumer_lag", "0+200x30", pod="ebb-a",
                       topic="ebbtide.gpu.utilization", partition="0")],
              quiet_at="14m", firing_at="20m", value="4000",
              labels={**ns, "pod": "ebb-a", "topic": "ebbtide.gpu.utilization"}),
        _case(rules, "EbbtideSloBreaching",
              [_series("ebbtide_slo_state", "1x20", pod="ebb-a", service="serving/chat",
                       state="breaching"),
               _series("ebbtide_slo_state", "1x20", pod="ebb-b", service="serving/chat",
                       state="breaching")],
              quiet_at="14m", firing_at="16m", labels={**ns, "service": "serving/chat"}),
        _case(rules, "EbbtideActuationFailures",
              [_series("ebbtide_actions_total", "0 0 1 1 2x10", pod="ebb-a", action="evict",
                       outcome="failed"),
               _series("ebbtide_actions_total", "0+5x14", pod="ebb-a", action="evict",
                       outcome="applied")],
              quiet_at="5m", firing_at="8m", labels={**ns, "action": "evict"}),
        _case(rules, "EbbtideMigConversionFailed",
              [_series("ebbtide_mig_conversion_failures_total", "0 0 0 1x10", pod="ebb-a")],
              quiet_at="2m", firing_at="5m", labels=ns),
        # Healthy: one leader, a large but shrinking lag, no failures: no alert at all.
        {
            "interval": "1m",
            "input_series": [
                _series("ebbtide_leader", "1x30", pod="ebb-a"),
                _series("ebbtide_leader", "0x30", pod="ebb-b"),
                _series("ebbtide_consumer_lag", "9000-100x30", pod="ebb-a", topic="t",
                        partition="0"),
                _series("ebbtide_slo_state", "0x30", pod="ebb-a", service="s", state="breaching"),
                _series("ebbtide_mig_conversion_failures_total", "0x30", pod="ebb-a"),
            ],
            "alert_rule_test": [
                {"eval_time": "30m", "alertname": name, "exp_alerts": []} for name in rules
            ],
        },
    ]  # fmt: skip
    fired = {t["alert_rule_test"][1]["alertname"] for t in tests[:-1]}
    assert fired == set(rules), "every alert needs a firing test"
    # Not matched by any rule_files glob: promtool would load it as rules otherwise.
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(
        dump_yaml({"rule_files": [rules_file.name], "evaluation_interval": "1m", "tests": tests})
    )
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _exported_metrics() -> set[str]:
    """Series names the controller exports, read from controller/process/metrics.py's
    constructors."""
    source = (REPO / "controller" / "process" / "metrics.py").read_text()
    suffixes = {
        "Counter": ("_total",),
        "CounterMetricFamily": ("_total",),
        "Histogram": ("_bucket", "_sum", "_count"),
        "Gauge": ("",),
        "GaugeMetricFamily": ("",),
    }
    names: set[str] = set()
    for kind, name in re.findall(r"\b(\w+)\(\s*\"(ebbtide_\w+)\"", source):
        names.update(name + suffix for suffix in suffixes[kind])
    return names


def test_alerts_and_dashboard_use_exported_metrics(rule_groups: list[dict[str, Any]]) -> None:
    """Every ebbtide_* series named in the alerts or the dashboard exists in metrics.py."""
    exported = _exported_metrics()
    assert {"ebbtide_leader", "ebbtide_actions_total", "ebbtide_slo_state"} <= exported
    exprs = [r["expr"] for g in rule_groups for r in g["rules"]]
    dashboard = json.loads((CHART / "dashboards" / "ebbtide.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\bebbtide_\w+", e)}
    assert used - exported == set()
    assert len(used) >= 15


def test_dashboard_is_grafana_json_with_a_datasource_variable() -> None:
    """The dashboard parses, has unique panel ids, and queries through ${datasource}."""
    dashboard = json.loads((CHART / "dashboards" / "ebbtide.json").read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["templating"]["list"][0]["type"] == "datasource"
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])

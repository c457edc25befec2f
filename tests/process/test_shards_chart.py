"""The chart's sharded-ingest switch, rendered by the real Helm engine: off renders today's one
Deployment unchanged; on adds the aggregators and makes the controller replicas deciders."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from controller.process.settings import load_settings
from helm.conftest import CHART, Rendered, parse, render


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    loaded = helm.Chart.load(CHART)
    yield loaded
    loaded.close()


def env_of(deploy: dict[str, Any]) -> dict[str, str]:
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_sharding_is_off_by_default(chart: Any) -> None:
    """Default values: one Deployment, whose replicas read every event (no role flag)."""
    r = parse("default", {}, render(chart, {}))
    (deploy,) = r.of_kind("Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert not [a for a in container["args"] if a.startswith("--role")]
    assert "EBBTIDE_SHARDS__GROUP_ID" not in env_of(deploy)


def test_sharding_on_renders_aggregators_in_one_group_and_deciders(chart: Any) -> None:
    """shards.enabled: N aggregator pods (role aggregate, no API token) and the controller
    replicas as deciders, all naming the same group and aggregates topic."""
    values = {"shards": {"enabled": True, "aggregators": {"replicas": 3}, "groupId": "g1"}}
    r: Rendered = parse("shards", values, render(chart, values))
    decider = r.one("Deployment", "ebb-ebbtide")
    aggregator = r.one("Deployment", "-aggregator")
    assert aggregator["spec"]["replicas"] == 3
    pod = aggregator["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert "--role=aggregate" in container["args"]
    (dc,) = decider["spec"]["template"]["spec"]["containers"]
    assert "--role=decide" in dc["args"]
    for deploy in (decider, aggregator):
        env = env_of(deploy)
        assert env["EBBTIDE_SHARDS__GROUP_ID"] == "g1"
        assert env["EBBTIDE_SHARDS__AGGREGATES_TOPIC"] == "ebbtide.aggregates"
    assert env_of(aggregator)["EBBTIDE_KAFKA__GPU_TOPIC"] == "ebbtide.gpu.utilization"


def test_a_bad_shards_value_is_refused_by_the_schema(chart: Any) -> None:
    """An unknown key under shards fails the render with the schema's message."""
    with pytest.raises(Exception, match=r"(?i)shards"):
        render(chart, {"shards": {"enabled": True, "replica": 2}})


def test_both_roles_env_loads_into_settings(chart: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every EBBTIDE_* name the aggregator and the decider containers get is a setting, and
    their --role flags name the roles."""
    values = {"shards": {"enabled": True, "flushEverySeconds": 0.5}}
    r = parse("shards", values, render(chart, values))
    for suffix, role in (("-aggregator", "aggregate"), ("ebb-ebbtide", "decide")):
        (container,) = r.one("Deployment", suffix)["spec"]["template"]["spec"]["containers"]
        for name in [n for n in os.environ if n.startswith("EBBTIDE_")]:
            monkeypatch.delenv(name)
        for item in container["env"]:
            if "value" in item:
                monkeypatch.setenv(item["name"], item["value"])
        (flag,) = [a for a in container["args"] if a.startswith("--role=")]
        settings = load_settings(
            None, policies=[Path("p.yaml")], shards={"role": flag.removeprefix("--role=")}
        )
        assert settings.shards.role == role
        assert settings.shards.flush_every_s == 0.5
        assert settings.kafka.gpu_topic == "ebbtide.gpu.utilization"

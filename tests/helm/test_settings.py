"""The controller container's rendered env and args load into
``controller.process.settings.Settings``:
every EBBTIDE_* name the chart writes is one the controller reads."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from controller.process.settings import Settings, load_settings

from .conftest import NAMESPACE, VALUE_SETS, Rendered, load_yaml, render

POD = "ebb-ebbtide-7d9f-abcde"


def _env(container: dict[str, Any]) -> dict[str, str]:
    """The container's literal env with $(VAR) references expanded as the kubelet does."""
    resolved: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            resolved[item["name"]] = {"metadata.name": POD, "metadata.namespace": NAMESPACE}[field]
        else:
            value = item["value"]
            resolved[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: resolved[m[1]], value)
    return resolved


def _load(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings as ``ebbtide run`` builds them from the container's args and env."""
    for name in [n for n in os.environ if n.startswith("EBBTIDE_")]:
        monkeypatch.delenv(name)
    for name, value in _env(container).items():
        monkeypatch.setenv(name, value)
    args = container["args"]
    assert args[0] == "run"
    flags = dict(a.removeprefix("--").partition("=")[::2] for a in args[1:] if "=" in a)
    policies = [Path(a.removeprefix("--policy=")) for a in args if a.startswith("--policy=")]
    return load_settings(
        None,
        policies=policies,
        cluster=flags["cluster"],
        dry_run="--dry-run" in args,
        http={"address": flags["metrics-address"]},
    )


@pytest.mark.parametrize("name", VALUE_SETS)
def test_controller_env_loads_into_settings(
    rendered: dict[str, Rendered], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No unknown group field, no wrong type; identity, Lease, rewind and topics as rendered."""
    container = rendered[name].one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    settings = _load(container, monkeypatch)
    assert settings.kube.identity == POD
    assert settings.kube.lease_namespace == NAMESPACE
    assert settings.kube.lease_name == "ebb-ebbtide"
    assert settings.kafka.rewind_margin_s == 30
    assert settings.kafka.partitions_refresh_s == 30
    assert settings.kafka.gpu_topic == "ebbtide.gpu.utilization"
    assert settings.http.address == "0.0.0.0:9108"
    assert settings.dry_run is (name != "live")
    assert settings.policies == [Path("/etc/ebbtide/policies.d/balanced.yaml")]


def test_sasl_tls_settings_point_at_the_mounted_files(
    rendered: dict[str, Rendered], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SASL and TLS on, the settings name the Secret files, never a password."""
    container = rendered["sasl-tls"].one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    kafka = _load(container, monkeypatch).kafka
    assert kafka.security_protocol == "SASL_SSL"
    assert kafka.sasl_mechanism == "SCRAM-SHA-512"
    assert kafka.sasl_password is None
    assert kafka.sasl_password_file == Path("/etc/ebbtide/kafka-sasl/password")
    assert kafka.ssl_cafile == Path("/etc/ebbtide/kafka-tls/ca.crt")
    assert kafka.ssl_certfile == Path("/etc/ebbtide/kafka-tls/tls.crt")
    assert kafka.ssl_keyfile == Path("/etc/ebbtide/kafka-tls/tls.key")
    assert kafka.replication_factor == 3
    assert (
        _load(
            rendered["default"].one("Deployment")["spec"]["template"]["spec"]["containers"][0],
            monkeypatch,
        ).kafka.replication_factor
        is None
    )
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    for path in (kafka.sasl_password_file, kafka.ssl_cafile, kafka.ssl_keyfile):
        assert str(path.parent) in mounts


def test_mig_timeouts_reach_the_settings(chart: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """controller.migTimeoutsSeconds becomes kube.mig_*_timeout_s; keys left out keep the
    chart's defaults."""
    out = render(chart, {"controller": {"migTimeoutsSeconds": {"drain": 120, "reboot": 3600}}})
    deployment = load_yaml(out["ebbtide/templates/deployment.yaml"])
    kube = _load(deployment["spec"]["template"]["spec"]["containers"][0], monkeypatch).kube
    timeouts = (
        kube.mig_drain_timeout_s,
        kube.mig_reconfigure_timeout_s,
        kube.mig_reboot_timeout_s,
        kube.mig_advertise_timeout_s,
    )
    assert timeouts == (120, 900, 3600, 300)

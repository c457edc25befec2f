"""The rendered chart: valid Kubernetes objects, hardened pods, HA, Kafka secrets, the agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from ruamel.yaml import YAML

from .conftest import CHART, NAMESPACE, VALUE_SETS, Rendered, helm, values_for

KUBE_VERSION = "1.30.0"
#: Kinds without a schema in kubernetes-validate: checked for shape only.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_is_clean(name: str) -> None:
    """`helm lint --strict` reports no error or warning for each values set."""
    assert helm is not None
    report = helm.lint(
        CHART, values_for(name), strict=True, namespace=NAMESPACE, kube_version="v1.30.0"
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == []
    assert problems == []


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_manifest_validates_strictly(rendered: dict[str, Rendered], name: str) -> None:
    """Each object validates against the Kubernetes 1.30 schemas with --strict (custom kinds
    only need apiVersion, kind, metadata and spec)."""
    failures = []
    for path, manifest in rendered[name].manifests:
        if manifest["kind"] in CUSTOM_KINDS:
            assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
            assert manifest["metadata"]["name"]
            assert isinstance(manifest["spec"], dict)
            continue
        try:
            kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{path} {manifest['kind']}: {exc.message} at {list(exc.path)}")
    assert failures == []


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_container_is_hardened(rendered: dict[str, Rendered], name: str) -> None:
    """Every container: no privilege escalation, read-only root, ALL capabilities dropped,
    RuntimeDefault seccomp, requests and limits, /tmp on an emptyDir; non-root except the agent
    with pod attribution, which is uid 0 with no capabilities."""
    pods = rendered[name].pod_specs()
    assert pods
    for workload, spec in pods:
        root = "--pod-attribution" in spec["containers"][0]["args"]
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["securityContext"]["runAsNonRoot"] is not root, workload
        tmp_volumes = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        for c in _containers(spec):
            sc = c["securityContext"]
            where = f"{workload}/{c['name']}"
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert sc.get("privileged", False) is False, where
            if root:
                assert (sc["runAsNonRoot"], sc["runAsUser"]) == (False, 0), where
            else:
                assert sc["runAsNonRoot"] is True, where
                assert sc.get("runAsUser") != 0, where
            for kind in ("requests", "limits"):
                assert set(c["resources"][kind]) == {"cpu", "memory"}, where
            assert any(
                m["mountPath"] == "/tmp" and m["name"] in tmp_volumes for m in c["volumeMounts"]
            ), where
        assert not {"hostPID", "hostNetwork", "hostIPC"} & set(spec), workload


def test_agent_without_attribution_is_non_root(rendered: dict[str, Rendered]) -> None:
    """Agent on, attribution off (the default): non-root, no hostPath, --no-pod-attribution."""
    spec = rendered["networkpolicy"].one("DaemonSet")["spec"]["template"]["spec"]
    assert "--no-pod-attribution" in spec["containers"][0]["args"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert not any("hostPath" in v for v in spec["volumes"])


def test_agent_runs_only_on_gpu_nodes_with_nvml(rendered: dict[str, Rendered]) -> None:
    """The DaemonSet targets GPU nodes, tolerates the GPU taint, gets NVML from the NVIDIA
    runtime without requesting a GPU, and mounts the pod-resources socket read-only; it watches
    its Node to release NVML during MIG reconfigurations, with a token allowed to read nodes
    only."""
    ds = rendered["agent"].one("DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["automountServiceAccountToken"] is True
    role = rendered["agent"].one("ClusterRole", "-agent")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    (c,) = spec["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert c["args"][:5] == [
        "agent",
        "--bootstrap=kafka.kafka.svc:9092",
        "--interval=10s",
        "--max-rate=12.5",
        "--mig-util=memory",
    ]
    assert "--release-during-mig" in c["args"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "pod-resources")
    assert mount == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }


def test_controller_is_highly_available_by_default(rendered: dict[str, Rendered]) -> None:
    """Two replicas, anti-affinity across nodes, a PDB allowing one disruption, a grace period
    above the shutdown timeout, and a Lease identity from the pod name."""
    r = rendered["default"]
    deploy = r.one("Deployment")
    spec = deploy["spec"]["template"]["spec"]
    assert deploy["spec"]["replicas"] == 2
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    selector = deploy["spec"]["selector"]["matchLabels"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    pdb = r.one("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deploy["spec"]["selector"]
    (c,) = spec["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert spec["terminationGracePeriodSeconds"] > int(env["EBBTIDE_SHUTDOWN_TIMEOUT_S"]["value"])
    assert env["EBBTIDE_KUBE__IDENTITY"]["value"] == "$(POD_NAME)"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["EBBTIDE_KUBE__LEASE_NAMESPACE"]["value"] == NAMESPACE
    assert "EBBTIDE_KAFKA__GROUP_ID" not in env  # no consumer group: nothing left behind
    assert env["EBBTIDE_KAFKA__REWIND_MARGIN_S"]["value"] == "30"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_ha_off_has_one_replica_and_no_pdb(rendered: dict[str, Rendered]) -> None:
    """replicas: 1 renders no PodDisruptionBudget (it could only block node drains)."""
    r = rendered["ha-off"]
    assert r.one("Deployment")["spec"]["replicas"] == 1
    assert r.of_kind("PodDisruptionBudget") == []


@pytest.mark.parametrize(("name", "flag"), [("default", "--dry-run"), ("live", "--no-dry-run")])
def test_dry_run_is_a_flag(rendered: dict[str, Rendered], name: str, flag: str) -> None:
    """dryRun: true (the default) passes --dry-run; false passes --no-dry-run; NOTES say which."""
    args = rendered[name].one("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert flag in args
    assert ("DRY RUN" in rendered[name].notes) is (flag == "--dry-run")


def test_policies_are_mounted_and_passed(rendered: dict[str, Rendered]) -> None:
    """Each policy file in the ConfigMap is a --policy flag on a read-only, whole-directory
    mount (so ConfigMap edits reach the controller's hot reload)."""
    r = rendered["default"]
    cm = r.one("ConfigMap", "-policies")
    spec = r.one("Deployment")["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    flags = [a.removeprefix("--policy=") for a in c["args"] if a.startswith("--policy=")]
    assert flags == [f"/etc/ebbtide/policies.d/{f}" for f in sorted(cm["data"])]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "policies")
    assert mount["readOnly"] is True
    assert "subPath" not in mount
    volume = next(v for v in spec["volumes"] if v["name"] == "policies")
    assert volume["configMap"]["name"] == cm["metadata"]["name"]


def test_sasl_and_tls_come_from_mounted_secrets(rendered: dict[str, Rendered]) -> None:
    """SASL password and TLS files are Secret volumes named by path in EBBTIDE_KAFKA__*_FILE
    variables, on the controller and the agent alike; no secret value is in an env var."""
    r = rendered["sasl-tls"]
    for workload, spec in r.pod_specs():
        (c,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["EBBTIDE_KAFKA__SECURITY_PROTOCOL"] == "SASL_SSL", workload
        assert env["EBBTIDE_KAFKA__SASL_MECHANISM"] == "SCRAM-SHA-512"
        assert env["EBBTIDE_KAFKA__SASL_PASSWORD_FILE"] == "/etc/ebbtide/kafka-sasl/password"
        assert env["EBBTIDE_KAFKA__SSL_CAFILE"] == "/etc/ebbtide/kafka-tls/ca.crt"
        assert env["EBBTIDE_KAFKA__SSL_CERTFILE"] == "/etc/ebbtide/kafka-tls/tls.crt"
        assert env["EBBTIDE_KAFKA__SSL_KEYFILE"] == "/etc/ebbtide/kafka-tls/tls.key"
        assert not any("secretKeyRef" in e.get("valueFrom", {}) for e in c["env"])
        volumes = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
        assert volumes["kafka-sasl"]["secretName"] == "ebbtide-kafka-user"
        assert volumes["kafka-sasl"]["items"] == [{"key": "password", "path": "password"}]
        assert volumes["kafka-tls"]["items"] == [
            {"key": "ca.crt", "path": "ca.crt"},
            {"key": "user.crt", "path": "tls.crt"},
            {"key": "user.key", "path": "tls.key"},
        ]
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["kafka-sasl"]["readOnly"] is True
        assert mounts["kafka-tls"]["readOnly"] is True


def test_network_policy_limits_ingress_and_egress(rendered: dict[str, Rendered]) -> None:
    """Controller: ingress only to the metrics port; egress only to DNS, Kafka and the API
    server. Agent: no ingress; egress to DNS and Kafka."""
    r = rendered["networkpolicy"]
    ctl = r.one("NetworkPolicy", "ebbtide")["spec"]
    assert ctl["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = ctl["ingress"]
    assert ingress["ports"] == [{"port": 9108, "protocol": "TCP"}]
    ports = [sorted(p["port"] for p in rule["ports"]) for rule in ctl["egress"]]
    assert ports == [[53, 53], [9093], [6443]]
    cidrs = [b["ipBlock"]["cidr"] for b in ctl["egress"][2]["to"]]
    assert cidrs == ["10.0.0.1/32", "172.18.0.2/32"]
    agent = r.one("NetworkPolicy", "-agent")["spec"]
    assert agent["ingress"] == []
    assert [sorted(p["port"] for p in rule["ports"]) for rule in agent["egress"]] == [
        [53, 53],
        [9093],
        [6443],  # its own Node's MIG state (agent.releaseDuringMig)
    ]


def test_optional_objects_are_off_by_default(rendered: dict[str, Rendered]) -> None:
    """The defaults render no agent, ServiceMonitor, PrometheusRule, dashboard or NetworkPolicy."""
    kinds = {m["kind"] for _, m in rendered["default"].manifests}
    assert kinds == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
    }


def test_monitoring_objects(rendered: dict[str, Rendered]) -> None:
    """ServiceMonitor scrapes the metrics port of this release's Service; the dashboard
    ConfigMap carries the Grafana sidecar label in the configured namespace."""
    r = rendered["monitoring"]
    sm = r.one("ServiceMonitor")
    svc = r.one("Service")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] == "metrics"
    dash = r.one("ConfigMap", "-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["metadata"]["namespace"] == "monitoring"


def test_chart_readme_lists_every_top_level_value() -> None:
    """The chart README's values table names every top-level key of values.yaml."""
    values = YAML(typ="safe").load((Path(CHART) / "values.yaml").read_text())
    readme = (Path(CHART) / "README.md").read_text()
    table = [line for line in readme.splitlines() if line.startswith("| `")]
    missing = [key for key in values if not any(f"`{key}" in row for row in table)]
    assert missing == []

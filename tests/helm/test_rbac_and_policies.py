"""The chart's RBAC equals controller/rbac.py, and its policies pass `ebbtide policy validate`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.kube.state import workload_kinds
from controller.rbac import CLUSTER_RULES, LEASE_RULES, Rule, cluster_rules
from controller.settings import Settings

from .conftest import NAMESPACE, VALUE_SETS, Rendered, load_yaml, load_yaml_all, render

REPO = Path(__file__).resolve().parents[2]


def _as_rules(manifest: dict[str, Any]) -> list[Rule]:
    return [
        Rule(g, tuple(r["resources"]), tuple(r["verbs"]))
        for r in manifest["rules"]
        for g in r["apiGroups"]
    ]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_no_rbac_wildcards(rendered: dict[str, Rendered], name: str) -> None:
    """No '*' in any apiGroups, resources or verbs; no resourceNames tricks, no nonResourceURLs."""
    for kind in ("ClusterRole", "Role"):
        for role in rendered[name].of_kind(kind):
            for rule in role["rules"]:
                assert "nonResourceURLs" not in rule
                for key in ("apiGroups", "resources", "verbs"):
                    assert not any("*" in item for item in rule[key]), (kind, rule)


def test_cluster_role_is_exactly_the_code_list(rendered: dict[str, Rendered]) -> None:
    """The ClusterRole's rules equal controller.rbac.CLUSTER_RULES, in order."""
    assert _as_rules(rendered["default"].one("ClusterRole")) == list(CLUSTER_RULES)


def test_lease_role_is_exactly_the_code_list(rendered: dict[str, Rendered]) -> None:
    """The Role (release namespace only) equals controller.rbac.LEASE_RULES."""
    role = rendered["default"].one("Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _as_rules(role) == list(LEASE_RULES)


def test_bindings_name_the_controller_account(rendered: dict[str, Rendered]) -> None:
    """Both bindings grant their role to the controller's ServiceAccount, and no other."""
    r = rendered["default"]
    deploy_sa = r.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    for kind, role in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = r.one(kind)
        assert binding["roleRef"]["kind"] == role
        assert binding["roleRef"]["name"] == r.one(role)["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": deploy_sa, "namespace": NAMESPACE}
        ]


@pytest.mark.parametrize(
    "kinds",
    [["Deployment"], ["StatefulSet", "PyTorchJob"], []],
    ids=["deployments-only", "no-deployments", "none"],
)
def test_cluster_role_follows_the_workload_kinds_setting(
    chart: Any, kinds: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """controller.workloadKinds reaches the controller as its kube.workload_kinds setting, and
    the ClusterRole is exactly controller.rbac.cluster_rules for those kinds."""
    out = render(chart, {"controller": {"workloadKinds": kinds}})
    docs = load_yaml_all(out["ebbtide/templates/rbac.yaml"])
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    container = load_yaml(out["ebbtide/templates/deployment.yaml"])["spec"]["template"]["spec"][
        "containers"
    ][0]
    (env,) = [e["value"] for e in container["env"] if e["name"] == "EBBTIDE_KUBE__WORKLOAD_KINDS"]
    monkeypatch.setenv("EBBTIDE_KUBE__WORKLOAD_KINDS", env)
    setting = Settings(policies=[Path("p.yaml")]).kube.workload_kinds
    assert list(setting) == kinds
    assert _as_rules(role) == list(cluster_rules(workload_kinds(setting)))


def test_default_policy_is_the_library_balanced_policy(rendered: dict[str, Rendered]) -> None:
    """values.yaml's default policy is policies/library/balanced.yaml, data for data."""
    library = load_yaml((REPO / "policies/library/balanced.yaml").read_text())
    cm = rendered["default"].one("ConfigMap", "-policies")
    assert load_yaml(cm["data"]["balanced.yaml"]) == library


@pytest.mark.parametrize("name", VALUE_SETS)
def test_configmap_policies_pass_policy_validate(
    rendered: dict[str, Rendered], name: str, tmp_path: Path
) -> None:
    """The rendered ConfigMap's files, written out as the pod sees them, pass
    `ebbtide policy validate`."""
    cm = rendered[name].one("ConfigMap", "-policies")
    files = []
    for file, text in cm["data"].items():
        (tmp_path / file).write_text(text)
        files.append(str(tmp_path / file))
    result = CliRunner().invoke(cli, ["policy", "validate", *files])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ok: policy 'balanced'")


def test_several_policy_files_merge_and_validate(chart: Any, tmp_path: Path) -> None:
    """Two documents in `policies` become two --policy flags that merge into one valid policy."""
    out = render(
        chart,
        {
            "policies": {
                "extra.yaml": {
                    "apiVersion": "ebbtide.io/v1alpha1",
                    "kind": "Policy",
                    "metadata": {"name": "extra"},
                    "spec": {"pools": {"spare": {"nodeSelector": {"ebbtide.io/pool": "spare"}}}},
                }
            }
        },
    )
    cm = load_yaml(out["ebbtide/templates/configmap-policies.yaml"])
    assert sorted(cm["data"]) == ["balanced.yaml", "extra.yaml"]
    paths = []
    for file, text in sorted(cm["data"].items()):
        (tmp_path / file).write_text(text)
        paths.append(str(tmp_path / file))
    result = CliRunner().invoke(cli, ["policy", "validate", *paths])
    assert result.exit_code == 0, result.output

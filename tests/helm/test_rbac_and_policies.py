"""The chart's RBAC equals controller/process/rbac.py, and its policies pass `ebbtide policy
validate`."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.kube.state import workload_kinds
from controller.process.rbac import CLUSTER_RULES, LEASE_RULES, Rule, cluster_rules
from controller.process.settings import Settings

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
    """The ClusterRole's rules equal controller.process.rbac.CLUSTER_RULES, in order."""
    assert _as_rules(rendered["default"].one("ClusterRole")) == list(CLUSTER_RULES)


def test_lease_role_is_exactly_the_code_list(rendered: dict[str, Rendered]) -> None:
    """The Role (release namespace only) equals controller.process.rbac.LEASE_RULES."""
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
    ("kinds", "kueue"),
    [
        (["Deployment"], False),
        (["StatefulSet", "PyTorchJob"], False),
        ([], False),
        (["JobSet", "RayCluster", "Job"], False),
        (["JobSet", "RayCluster", "Job"], True),
        (["JobSet", "RayCluster"], True),
        (["PyTorchJob"], True),
        (["Deployment", "StatefulSet"], True),
    ],
    ids=[
        "deployments-only",
        "no-deployments",
        "none",
        "jobset-ray-job",
        "jobset-ray-job-kueue",
        "jobset-ray-kueue",
        "pytorchjob-kueue",
        "apps-kueue",
    ],
)
def test_cluster_role_follows_the_workload_kinds_setting(
    chart: Any, kinds: list[str], kueue: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """controller.workloadKinds reaches the controller as its kube.workload_kinds setting, and
    the ClusterRole is exactly controller.process.rbac.cluster_rules for those kinds and
    controller.kueue."""
    out = render(chart, {"controller": {"workloadKinds": kinds, "kueue": kueue}})
    container = load_yaml(out["ebbtide/templates/deployment.yaml"])["spec"]["template"]["spec"][
        "containers"
    ][0]
    (env,) = [e["value"] for e in container["env"] if e["name"] == "EBBTIDE_KUBE__WORKLOAD_KINDS"]
    monkeypatch.setenv("EBBTIDE_KUBE__WORKLOAD_KINDS", env)
    setting = Settings(policies=[Path("p.yaml")]).kube.workload_kinds
    assert list(setting) == kinds
    assert cluster_role(out) == list(cluster_rules(workload_kinds(setting), kueue_support=kueue))


def cluster_role(out: dict[str, str]) -> list[Rule]:
    """The controller's ClusterRole in a render, as rules."""
    docs = load_yaml_all(out["ebbtide/templates/rbac.yaml"])
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    return _as_rules(role)


def test_every_setting_renders_exactly_the_code_list(chart: Any) -> None:
    """For every subset of the workload kinds, with and without controller.kueue, the chart's
    ClusterRole is controller.process.rbac.cluster_rules for the same values (what the test API
    server
    authorizes with is what the controller declares)."""
    kinds = ["Deployment", "StatefulSet", "PyTorchJob", "JobSet", "RayCluster", "Job"]
    for subset in itertools.chain.from_iterable(
        itertools.combinations(kinds, n) for n in range(len(kinds) + 1)
    ):
        for kueue in (False, True):
            out = render(chart, {"controller": {"workloadKinds": list(subset), "kueue": kueue}})
            want = cluster_rules(workload_kinds(subset), kueue_support=kueue)
            assert cluster_role(out) == list(want), (subset, kueue)


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


SLO = {"percentile": 99, "objectiveMs": 300}
EXTRA_POOL = {
    "apiVersion": "ebbtide.io/v1alpha1",
    "kind": "Policy",
    "metadata": {"name": "extra"},
    "spec": {"pools": {"spare": {"nodeSelector": {"ebbtide.io/pool": "spare"}}}},
}


def validate_files(data: dict[str, str], tmp_path: Path) -> Any:
    """`ebbtide policy validate` on the ConfigMap's files, written out as the pod sees them."""
    paths = []
    for file, text in sorted(data.items()):
        (tmp_path / file).write_text(text)
        paths.append(str(tmp_path / file))
    return CliRunner().invoke(cli, ["policy", "validate", *paths])


def policy_files(out: dict[str, str]) -> tuple[list[str], list[str]]:
    """The ConfigMap's file names and the Deployment's --policy flags."""
    cm = load_yaml(out["ebbtide/templates/configmap-policies.yaml"])
    deploy = load_yaml(out["ebbtide/templates/deployment.yaml"])
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = [a.removeprefix("--policy=/etc/ebbtide/policies.d/") for a in args if "--policy=" in a]
    return sorted(cm["data"]), flags


def test_your_policy_replaces_the_default(chart: Any, tmp_path: Path) -> None:
    """A policy of your own is the only one the controller reads: the default's chat service
    and MIG rules do not slip in beside it."""
    library = load_yaml((REPO / "policies/library/latency-first.yaml").read_text())
    out = render(chart, {"policies": {"mine.yaml": library}})
    assert policy_files(out) == (["mine.yaml"], ["mine.yaml"])
    cm = load_yaml(out["ebbtide/templates/configmap-policies.yaml"])
    result = validate_files(cm["data"], tmp_path)
    assert result.exit_code == 0, result.output


def test_merging_with_the_default_when_asked(chart: Any, tmp_path: Path) -> None:
    """With mergeDefaultPolicies, two documents become two --policy flags that merge into one
    valid policy."""
    out = render(chart, {"policies": {"extra.yaml": EXTRA_POOL}, "mergeDefaultPolicies": True})
    assert policy_files(out) == (["balanced.yaml", "extra.yaml"], ["balanced.yaml", "extra.yaml"])
    cm = load_yaml(out["ebbtide/templates/configmap-policies.yaml"])
    result = validate_files(cm["data"], tmp_path)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        pytest.param({"training": {"selector": {"a": "b"}}}, "spec.training", id="training-twice"),
        pytest.param(
            {"services": {"chat": {"namespace": "x", "pool": "whole", "slo": SLO}}},
            "spec.services.chat",
            id="same-service",
        ),
        pytest.param(
            {"pools": {"whole": {"nodeSelector": {"a": "b"}}}}, "spec.pools.whole", id="same-pool"
        ),
    ],
)
def test_a_merge_the_controller_would_refuse_fails_the_install(
    chart: Any, spec: dict[str, Any], path: str, tmp_path: Path
) -> None:
    """Merged on purpose with a conflicting document: `helm install` fails at template time
    with the key and both file names, which is what the controller would refuse at start."""
    doc = {**EXTRA_POOL, "spec": {**EXTRA_POOL["spec"], **spec}}
    with pytest.raises(Exception, match=rf"{path} is defined in both balanced.yaml and mine.yaml"):
        render(chart, {"policies": {"mine.yaml": doc}, "mergeDefaultPolicies": True})
    data = {
        "balanced.yaml": (REPO / "policies/library/balanced.yaml").read_text(),
        "mine.yaml": json.dumps(doc),
    }
    refused = validate_files(data, tmp_path)
    assert refused.exit_code != 0
    assert "defined twice" in refused.output

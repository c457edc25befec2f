"""The chart's ServiceObjectives setting (real Helm engine): RBAC for the resource and its status
subresource only where ``serviceObjectives.namespaces`` allows (a Role per namespace, a
ClusterRole for ``*``, nothing when empty), exactly controller/process/rbac.py's
OBJECTIVE_RULES; the setting reaches the controller; NOTES shows ``kubectl get``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from controller.process.rbac import OBJECTIVE_RULES, Rule
from controller.process.settings import Settings
from support.kubeapi_rbac import RbacSettings, chart_authorizer

from .conftest import NAMESPACE, Rendered, parse, render


def _rendered(chart: Any, namespaces: list[str]) -> Rendered:
    values = {"serviceObjectives": {"namespaces": namespaces}}
    return parse("objectives", values, render(chart, values))


def _objective_roles(r: Rendered) -> list[dict[str, Any]]:
    return [
        m
        for _, m in r.manifests
        if m["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
        and m["metadata"]["name"].endswith("-objectives")
    ]


def _rules(role: dict[str, Any]) -> list[Rule]:
    return [
        Rule(g, tuple(r["resources"]), tuple(r["verbs"]))
        for r in role["rules"]
        for g in r["apiGroups"]
    ]


def _env(r: Rendered) -> dict[str, str]:
    (container,) = r.one("Deployment")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_a_role_in_each_namespace_listed(chart: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """[team-a, team-b]: a Role and a RoleBinding in each, the Role exactly OBJECTIVE_RULES,
    bound to the controller's ServiceAccount; the controller gets the same namespaces."""
    r = _rendered(chart, ["team-a", "team-b"])
    found = _objective_roles(r)
    assert sorted((m["kind"], m["metadata"]["namespace"]) for m in found) == [
        ("Role", "team-a"), ("Role", "team-b"),
        ("RoleBinding", "team-a"), ("RoleBinding", "team-b"),
    ]  # fmt: skip
    sa = r.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    for m in found:
        if m["kind"] == "Role":
            assert _rules(m) == list(OBJECTIVE_RULES)
        else:
            assert m["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                    "name": m["metadata"]["name"]}  # fmt: skip
            assert m["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    for name, value in _env(r).items():
        if name.startswith("EBBTIDE_KUBE__OBJECTIVE"):
            monkeypatch.setenv(name, value)
    kube = Settings(policies=[Path("p.yaml")]).kube
    assert kube.objective_namespaces == ("team-a", "team-b")
    assert kube.objective_status_every_s == 15


def test_everywhere_is_one_cluster_role(chart: Any) -> None:
    """["*"]: one ClusterRole (OBJECTIVE_RULES) and its ClusterRoleBinding, no Role."""
    r = _rendered(chart, ["*"])
    found = _objective_roles(r)
    assert sorted(m["kind"] for m in found) == ["ClusterRole", "ClusterRoleBinding"]
    (role,) = [m for m in found if m["kind"] == "ClusterRole"]
    assert _rules(role) == list(OBJECTIVE_RULES)
    assert _env(r)["EBBTIDE_KUBE__OBJECTIVE_NAMESPACES"] == '["*"]'


def test_off_by_default(rendered: dict[str, Rendered]) -> None:
    """[] (the default): no RBAC for ServiceObjectives, no setting, and the notes say it is off."""
    r = rendered["default"]
    assert _objective_roles(r) == []
    assert not any(name.startswith("EBBTIDE_KUBE__OBJECTIVE") for name in _env(r))
    assert "ServiceObjectives are off (serviceObjectives.namespaces: [])" in r.notes
    assert "kubectl get serviceobjectives" not in r.notes


def test_notes_show_kubectl_get(rendered: dict[str, Rendered]) -> None:
    notes = rendered["objectives"].notes
    assert "kubectl get serviceobjectives -A" in notes
    assert "in team-a, team-b" in notes


@pytest.mark.parametrize(
    ("namespaces", "says"),
    [(["*", "team-a"], "maxItems"), (["Team_A"], "does not match pattern")],
    ids=["star-with-others", "bad-name"],
)
def test_the_schema_refuses_bad_namespaces(chart: Any, namespaces: list[str], says: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(chart, {"serviceObjectives": {"namespaces": namespaces}})
    assert "/serviceObjectives/namespaces" in str(caught.value)
    assert says in str(caught.value), str(caught.value)


def test_the_authorizer_grants_status_only_where_allowed() -> None:
    """What the test API server decides from these roles: list/watch and /status patches in
    team-a; nothing in team-b; never a write of the object itself (a team's spec)."""
    authorizer = chart_authorizer(RbacSettings(objectives=("team-a",)))
    base = "/apis/ebbtide.io/v1alpha1/namespaces/{}/serviceobjectives"
    assert authorizer.refusal("GET", base.format("team-a"), {"watch": "true"}) is None
    assert authorizer.refusal("PATCH", base.format("team-a") + "/search/status", {}) is None
    assert authorizer.refusal("PATCH", base.format("team-a") + "/search", {}) is not None
    assert authorizer.refusal("GET", base.format("team-b"), {}) is not None
    assert authorizer.refusal("GET", "/apis/ebbtide.io/v1alpha1/serviceobjectives", {}) is not None


def test_not_with_sharded_ingest(chart: Any) -> None:
    """shards.enabled with ServiceObjectives fails the render with the reason."""
    values = {"serviceObjectives": {"namespaces": ["team-a"]}, "shards": {"enabled": True}}
    with pytest.raises(
        Exception, match=r"serviceObjectives\.namespaces needs shards\.enabled: false"
    ):
        render(chart, values)

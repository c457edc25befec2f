"""The RBAC list and the test API server's authorizer: what the chart's roles allow and refuse,
and the refusal the apiserver answers."""

from __future__ import annotations

import pytest

from controller.kube.state import workload_kinds
from controller.process.rbac import CLUSTER_RULES, allowed, cluster_rules
from controller.process.settings import DEFAULT_WORKLOAD_KINDS
from support.kubeapi_rbac import RbacSettings, chart_authorizer

EBBTIDE = "ebbtide-system"


@pytest.mark.parametrize(
    ("method", "path", "query"),
    [
        ("GET", "/api/v1/nodes", {"watch": "true"}),
        ("PATCH", "/api/v1/nodes/gpu-0", {}),
        ("POST", "/api/v1/namespaces/ml/pods/p-0/eviction", {}),
        ("GET", "/apis/apps/v1/namespaces/ml/deployments/train/scale", {}),
        ("PATCH", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/j/scale", {}),
        ("PUT", f"/apis/coordination.k8s.io/v1/namespaces/{EBBTIDE}/leases/ebbtide", {}),
        ("POST", "/api/v1/namespaces/default/events", {}),
        ("GET", "/apis/apps/v1", {}),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_what_the_controller_does_is_allowed(method: str, path: str, query: dict[str, str]) -> None:
    """Each kind of request the controller makes is granted by the chart's default roles
    (discovery is allowed to anyone, as system:discovery is)."""
    assert chart_authorizer().refusal(method, path, query) is None


@pytest.mark.parametrize(
    ("method", "path", "why"),
    [
        ("DELETE", "/api/v1/namespaces/ml/pods/p-0", 'cannot delete resource "pods"'),
        ("DELETE", "/api/v1/namespaces/ml/pods", 'cannot deletecollection resource "pods"'),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/ml/deployments/train",
            'cannot patch resource "deployments" in API group "apps" in the namespace "ml"',
        ),
        ("GET", "/api/v1/secrets", 'cannot list resource "secrets" in API group "" at the cluster'),
        ("POST", "/api/v1/nodes", 'cannot create resource "nodes"'),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/ml/leases/ebbtide",
            'cannot update resource "leases"',
        ),
    ],
    ids=lambda x: "" if x.startswith("cannot") else x,
)
def test_anything_else_is_forbidden_as_the_apiserver_says(method: str, path: str, why: str) -> None:
    """Deleting pods behind a PDB's back, patching workloads, reading secrets, a Lease outside
    the release namespace: 403 Forbidden naming the ServiceAccount, verb, resource and scope."""
    refusal = chart_authorizer().refusal(method, path, {})
    assert refusal is not None
    assert (refusal.code, refusal.reason) == (403, "Forbidden")
    assert (
        'is forbidden: User "system:serviceaccount:ebbtide-system:ebb-ebbtide"' in refusal.message
    )
    assert why in refusal.message


def test_the_authorizer_follows_the_settings_under_test() -> None:
    """The chart rendered with workloadKinds [JobSet] grants no write of JobSets; with
    kueue: true it grants the patch of the object (the mark) and Kueue's Workloads."""
    path = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/pytorch"
    workload = "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads/w"
    plain = chart_authorizer(RbacSettings(kinds=("JobSet",)))
    assert plain.refusal("GET", path, {}) is None
    assert plain.refusal("PATCH", path, {}) is not None
    kueue = chart_authorizer(RbacSettings(kinds=("JobSet",), kueue=True))
    assert kueue.refusal("PATCH", path, {}) is None
    assert kueue.refusal("PATCH", workload, {}) is None


def test_rules_follow_the_tracked_workload_kinds() -> None:
    """Each tracked kind gets read and /scale rules; an untracked kind (PyTorchJob) gets none,
    and the default setting's rules are CLUSTER_RULES."""
    rules = cluster_rules(workload_kinds(["Deployment"]))
    assert allowed(rules, "apps", "deployments/scale", "patch")
    assert not allowed(rules, "apps", "statefulsets", "list")
    assert not any(r.group == "kubeflow.org" for r in rules)
    assert cluster_rules(workload_kinds(DEFAULT_WORKLOAD_KINDS)) == CLUSTER_RULES


def test_kinds_without_scale_patch_the_object_and_jobs_reach_kueue() -> None:
    """RayCluster has no /scale: it gets patch on the object and no /scale rule; a JobSet is
    never resized, so it gets no write; Job adds list/patch on Kueue workloads, and with it
    every kind's object may be patched (the mark of a preemption through Kueue); none of it is
    granted unless the kind is tracked."""
    assert not allowed(
        cluster_rules(workload_kinds(["JobSet", "RayCluster"])),
        "jobset.x-k8s.io",
        "jobsets",
        "patch",
    )
    rules = cluster_rules(workload_kinds(["JobSet", "RayCluster", "Job"]))
    assert allowed(rules, "jobset.x-k8s.io", "jobsets", "patch")
    assert allowed(rules, "ray.io", "rayclusters", "patch")
    assert not allowed(rules, "ray.io", "rayclusters/scale", "patch")
    assert allowed(rules, "kueue.x-k8s.io", "workloads", "patch")
    assert allowed(rules, "autoscaling", "horizontalpodautoscalers", "watch")
    assert not any(r.group in ("kueue.x-k8s.io", "ray.io") for r in CLUSTER_RULES)


def test_kueue_support_reaches_workloads_for_any_kind_once() -> None:
    """With Kueue support, JobSet and RayCluster alone get get/list/patch on Kueue Workloads
    (found by owner reference, read back after a restart); with Job too, the rule is there once;
    the /scale kinds' objects get patch too, their /scale rule unchanged."""
    kinds = workload_kinds(["JobSet", "RayCluster"])
    assert not allowed(cluster_rules(kinds), "kueue.x-k8s.io", "workloads", "patch")
    rules = cluster_rules(kinds, kueue_support=True)
    assert all(allowed(rules, "kueue.x-k8s.io", "workloads", v) for v in ("get", "list", "patch"))
    with_job = cluster_rules(workload_kinds(["Job", "JobSet"]), kueue_support=True)
    assert sum(r.group == "kueue.x-k8s.io" for r in with_job) == 1
    scaled = cluster_rules(workload_kinds(["PyTorchJob", "Deployment"]), kueue_support=True)
    assert allowed(scaled, "kubeflow.org", "pytorchjobs", "patch")
    assert allowed(scaled, "apps", "deployments", "patch")
    assert allowed(scaled, "apps", "deployments/scale", "patch")
    assert not allowed(CLUSTER_RULES, "apps", "deployments", "patch")

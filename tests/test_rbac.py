"""The RBAC list: what the request check allows and refuses."""

from __future__ import annotations

import pytest

from controller.kube.state import workload_kinds
from controller.rbac import CLUSTER_RULES, allowed, cluster_rules
from controller.settings import DEFAULT_WORKLOAD_KINDS
from support.kubeapi import LoggedRequest
from support.rbac_check import rbac_violations


def req(method: str, path: str, **query: str) -> LoggedRequest:
    return LoggedRequest(method, path, dict(query), None, "application/json")


@pytest.mark.parametrize(
    "request_",
    [
        req("GET", "/api/v1/nodes", watch="true"),
        req("PATCH", "/api/v1/nodes/gpu-0"),
        req("POST", "/api/v1/namespaces/ml/pods/p-0/eviction"),
        req("GET", "/apis/apps/v1/namespaces/ml/deployments/train/scale"),
        req("PATCH", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/j/scale"),
        req("PUT", "/apis/coordination.k8s.io/v1/namespaces/ebbtide/leases/ebbtide"),
        req("POST", "/api/v1/namespaces/default/events"),
    ],
    ids=lambda r: f"{r.method} {r.path}",
)
def test_what_the_controller_does_is_allowed(request_: LoggedRequest) -> None:
    """Each kind of request the controller makes is covered by the declared rules."""
    assert rbac_violations([request_]) == []


@pytest.mark.parametrize(
    ("request_", "why"),
    [
        (req("DELETE", "/api/v1/namespaces/ml/pods/p-0"), "core pods delete"),
        (req("PATCH", "/apis/apps/v1/namespaces/ml/deployments/train"), "apps deployments patch"),
        (req("GET", "/api/v1/secrets"), "core secrets list"),
        (req("POST", "/api/v1/nodes"), "core nodes create"),
    ],
    ids=lambda x: x if isinstance(x, str) else f"{x.method} {x.path}",
)
def test_anything_else_is_a_violation(request_: LoggedRequest, why: str) -> None:
    """Deleting pods behind a PDB's back, patching workloads, reading secrets: refused."""
    (violation,) = rbac_violations([request_])
    assert why in violation


def test_rules_follow_the_tracked_workload_kinds() -> None:
    """Each tracked kind gets read and /scale rules; an untracked kind (PyTorchJob) gets none,
    and the default setting's rules are CLUSTER_RULES."""
    rules = cluster_rules(workload_kinds(["Deployment"]))
    assert allowed(rules, "apps", "deployments/scale", "patch")
    assert not allowed(rules, "apps", "statefulsets", "list")
    assert not any(r.group == "kubeflow.org" for r in rules)
    assert cluster_rules(workload_kinds(DEFAULT_WORKLOAD_KINDS)) == CLUSTER_RULES


def test_kinds_without_scale_patch_the_object_and_jobs_reach_kueue() -> None:
    """JobSet and RayCluster have no /scale: they get patch on the object and no /scale rule;
    Job adds list/patch on Kueue workloads; none of it is granted unless the kind is tracked."""
    rules = cluster_rules(workload_kinds(["JobSet", "RayCluster", "Job"]))
    assert allowed(rules, "jobset.x-k8s.io", "jobsets", "patch")
    assert allowed(rules, "ray.io", "rayclusters", "patch")
    assert not allowed(rules, "ray.io", "rayclusters/scale", "patch")
    assert allowed(rules, "kueue.x-k8s.io", "workloads", "patch")
    assert allowed(rules, "autoscaling", "horizontalpodautoscalers", "watch")
    assert not any(r.group in ("kueue.x-k8s.io", "ray.io") for r in CLUSTER_RULES)


def test_kueue_support_reaches_workloads_for_any_kind_once() -> None:
    """With Kueue support, JobSet and RayCluster alone get get/list/patch on Kueue Workloads
    (found by owner reference, read back after a restart); with Job too, the rule is there once."""
    kinds = workload_kinds(["JobSet", "RayCluster"])
    assert not allowed(cluster_rules(kinds), "kueue.x-k8s.io", "workloads", "patch")
    rules = cluster_rules(kinds, kueue_support=True)
    assert all(allowed(rules, "kueue.x-k8s.io", "workloads", v) for v in ("get", "list", "patch"))
    with_job = cluster_rules(workload_kinds(["Job", "JobSet"]), kueue_support=True)
    assert sum(r.group == "kueue.x-k8s.io" for r in with_job) == 1

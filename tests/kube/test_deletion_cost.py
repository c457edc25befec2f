"""A Deployment's scale-down removes the replicas the engine named: over HTTP against the test
API server, the chosen pods get the lowest ``pod-deletion-cost`` before the ``/scale`` write,
no other pod is touched, and dry-run writes nothing."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient

from controller.kube.actuator import KubeActuator
from controller.kube.client import ApiLimits
from controller.kube.workloads.apps import DELETION_COST
from controller.loop.gate import SafetyGate
from controller.loop.port import Outcome
from policies.decisions import Explanation, Scale
from policies.model import Policy
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod

Obj = dict[str, Any]
APP = {"app": "chat"}
WHY = Explanation.of("slo-scale-down", "chat well within its objective")
FAST = ApiLimits(timeout_s=0.3, attempts=4, deadline_s=5.0)


def policy() -> Policy:
    slo = {"percentile": 99, "objectiveMs": 100, "window": "30s"}
    chat = {
        "namespace": "serving",
        "pool": "whole",
        "replicas": {"min": 1, "max": 4},
        "slo": slo,
        "scale": {},
    }
    spec = {
        "pools": {"whole": {"nodeSelector": {"ebbtide.io/pool": "whole"}}},
        "services": {"chat": chat},
    }
    meta = {"name": "test"}
    return Policy.model_validate(
        {"apiVersion": "ebbtide.io/v1alpha1", "kind": "Policy", "metadata": meta, "spec": spec}
    )


def workload(kind: str) -> Obj:
    obj: Obj = {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": "chat", "namespace": "serving", "labels": dict(APP)},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": dict(APP)},
            "template": {"metadata": {"labels": dict(APP)}, "spec": {"containers": []}},
        },
    }
    if kind == "StatefulSet":
        obj["spec"]["serviceName"] = "chat"
    return obj


async def setup(kubeapi: KubeAPIServer, kind: str = "Deployment") -> None:
    await kubeapi.create(workload(kind))
    for i, node in enumerate(("w0", "w1", "w0", "w1")):
        pod = make_pod(f"chat-{i}", namespace="serving", labels=APP, node=node, gpus=1)
        await kubeapi.create(pod)


def shrink(
    kind: str = "Deployment",
    *,
    dry_run: bool = False,
    remove: tuple[str, ...] = ("serving/chat-0", "serving/chat-2"),
) -> Scale:
    return Scale(1.0, "serving/chat", kind, 4, 2, "inference", WHY, dry_run=dry_run, remove=remove)


def costs(kubeapi: KubeAPIServer) -> dict[str, str | None]:
    return {
        p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(DELETION_COST)
        for p in kubeapi.objects("pods", "serving")
    }


async def test_named_pods_get_the_lowest_deletion_cost_before_the_scale_write(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    await setup(kubeapi)
    gate = SafetyGate(policy(), is_leader=lambda: True)
    act = KubeActuator(kube_client, gate, nodes=list, limits=FAST)
    # chat-9 is already gone: nothing to mark, and no reason to hold the scale-down back
    [result] = await act.apply(
        [shrink(remove=("serving/chat-0", "serving/chat-9", "serving/chat-2"))]
    )
    assert result.outcome == Outcome.APPLIED
    low = str(-(2**31))
    assert costs(kubeapi) == {"chat-0": low, "chat-1": None, "chat-2": low, "chat-3": None}
    writes = [r.path for r in kubeapi.requests if r.method == "PATCH"]
    assert writes == [
        "/api/v1/namespaces/serving/pods/chat-0",
        "/api/v1/namespaces/serving/pods/chat-9",
        "/api/v1/namespaces/serving/pods/chat-2",
        "/apis/apps/v1/namespaces/serving/deployments/chat/scale",
    ]


async def test_dry_run_and_statefulsets_mark_no_pod(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Dry-run writes nothing; a StatefulSet cannot be told which pods go, so none is marked."""
    await setup(kubeapi)
    await kubeapi.create(workload("StatefulSet"))
    gate = SafetyGate(policy(), is_leader=lambda: True)
    act = KubeActuator(kube_client, gate, nodes=list, limits=FAST)
    [dry] = await act.apply([shrink(dry_run=True)])
    assert dry.outcome == Outcome.DRY_RUN
    assert not [r for r in kubeapi.requests if r.method == "PATCH"]
    [sts] = await act.apply([shrink("StatefulSet")])
    assert sts.outcome == Outcome.APPLIED
    assert set(costs(kubeapi).values()) == {None}
    [write] = [r.path for r in kubeapi.requests if r.method == "PATCH"]
    assert write.endswith("/statefulsets/chat/scale")

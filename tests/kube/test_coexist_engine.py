"""The engine knows which workloads another autoscaler sizes: an HPA-scaled elastic training
Deployment with free GPUs next to it is never planned to grow, so the actuator is never asked
and refuses nothing — tick after tick — unless the policy gives it to Ebbtide. Against the test
API server: the cluster state, the engine and the actuator as the controller wires them."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from controller.loop.port import Outcome
from policies.decisions import Scale
from policies.engine import Engine
from support.e2e import eventually
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_node, make_pod
from support.workload_kinds import (
    TRAINING,
    events,
    kind_actuator,
    manifest,
    synced_state,
    training_policy,
)

Obj = dict[str, Any]


def elastic_deployment() -> Obj:
    """``ml/train``: 2 replicas of 1 GPU, elastic up to 6 by Ebbtide's annotations."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "labels": dict(TRAINING),
            "annotations": {"ebbtide.io/min-replicas": "1", "ebbtide.io/max-replicas": "6"},
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "train"}},
            "template": {
                "metadata": {"labels": {"app": "train", **TRAINING}},
                "spec": {
                    "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
                },
            },
        },
    }


@pytest.mark.parametrize(("owner", "grows"), [("others", False), ("ebbtide", True)])
async def test_an_hpa_scaled_workload_is_never_planned_to_resize(
    kubeapi: KubeAPIServer, kube_client: ApiClient, owner: str, grows: bool
) -> None:
    """Six free GPUs stay free for 20 minutes of ticks: with the HPA owning ml/train the engine
    decides no Scale and no EbbtideRefused Event is raised; with training.owner: ebbtide it
    grows ml/train (the same setup can grow). Once the HPA is gone, the workload is Ebbtide's."""
    await kubeapi.create(make_node("gpu-0", labels={"ebbtide.io/pool": "whole"}, gpus=8))
    await kubeapi.create(elastic_deployment())
    for i in range(2):
        pod = make_pod(f"train-5d8f-{i}", namespace="ml", labels=TRAINING, node="gpu-0", gpus=1)
        pod["metadata"]["labels"]["pod-template-hash"] = "5d8f"
        pod["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-5d8f", "uid": "rs"}
        ]
        await kubeapi.create(pod)
    await kubeapi.create(manifest("autoscalers.yaml", "HorizontalPodAutoscaler"))
    policy = training_policy(owner=owner, elastic={"growAfter": "1m"})
    engine = Engine(policy)
    now = 1_000_000.0
    async with synced_state(kube_client) as state:
        await kubeapi.until(lambda: bool(state.owners()))
        snapshot = state.snapshot()
        (train,) = snapshot.workloads
        assert train.scaled_by == "HorizontalPodAutoscaler ml/train"
        act = kind_actuator(kube_client, ("Deployment",), policy=policy, owners=state.owners,
                            clock=lambda: now)  # fmt: skip
        scales: list[Scale] = []
        for tick in range(40):
            now = 1_000_000.0 + 30.0 * tick
            decisions = engine.evaluate(now, state.snapshot())
            scales += [d for d in decisions if isinstance(d, Scale)]
            results = await act.apply(decisions)
            assert all(r.outcome is not Outcome.REFUSED for r in results), results
        await kubeapi.delete("horizontalpodautoscalers", "ml", "train")
        await eventually(lambda: not state.owners(), 5)  # the watch delivers the deletion
        assert state.snapshot().workloads[0].scaled_by is None  # re-translated
    assert bool(scales) is grows, scales
    assert all(d.workload == "ml/train" for d in scales)
    assert [e for e in events(kubeapi) if e[0] == "EbbtideRefused"] == []

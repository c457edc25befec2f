"""Coexistence with other controllers: a workload an HPA or a KEDA ScaledObject scales is not
resized (refusal + Event) unless the policy gives it to Ebbtide; a cluster without KEDA still
syncs; Karpenter's and the cluster autoscaler's "leave this pod alone" annotations hold."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from controller.loop.port import Outcome
from policies.drain import protection
from policies.snapshot import Pod, frozen_map
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod
from support.workload_kinds import (
    SCALED_OBJECT,
    TRAINING,
    events,
    evict,
    kind_actuator,
    manifest,
    scale,
    synced_state,
    training_policy,
    writes,
)

Obj = dict[str, Any]


def deployment(name: str) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml", "labels": dict(TRAINING)},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}},
        },
    }


async def test_a_workload_another_autoscaler_scales_is_refused(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """The HPA's Deployment and the ScaledObject's (kind defaulting to Deployment) are refused
    with a reason naming the autoscaler and an EbbtideRefused Event; nothing is written."""
    kubeapi.add_resource(SCALED_OBJECT)
    for name in ("train", "queue-worker"):
        await kubeapi.create(deployment(name))
    await kubeapi.create(manifest("autoscalers.yaml", "HorizontalPodAutoscaler"))
    await kubeapi.create(manifest("autoscalers.yaml", "ScaledObject"))
    async with synced_state(kube_client) as state:
        await kubeapi.until(lambda: len(state.owners()) == 2)
        act = kind_actuator(kube_client, ("Deployment",), owners=state.owners)
        results = await act.apply(
            [scale("ml/train", "Deployment", 4, 2), scale("ml/queue-worker", "Deployment", 4, 2)]
        )
    assert [r.outcome for r in results] == [Outcome.REFUSED, Outcome.REFUSED]
    assert "HorizontalPodAutoscaler ml/train scales Deployment ml/train" in results[0].detail
    assert "KEDA ScaledObject ml/queue-worker" in results[1].detail
    assert writes(kubeapi) == []
    refused = {obj for reason, obj, _ in events(kubeapi) if reason == "EbbtideRefused"}
    assert refused == {"Deployment/train", "Deployment/queue-worker"}


async def test_the_policy_can_give_ebbtide_the_workload(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """With training.owner: ebbtide the HPA's Deployment is scaled through /scale."""
    await kubeapi.create(deployment("train"))
    await kubeapi.create(manifest("autoscalers.yaml", "HorizontalPodAutoscaler"))
    async with synced_state(kube_client) as state:
        await kubeapi.until(lambda: bool(state.owners()))
        act = kind_actuator(
            kube_client, ("Deployment",), policy=training_policy(owner="ebbtide"),
            owners=state.owners,
        )  # fmt: skip
        (result,) = await act.apply([scale("ml/train", "Deployment", 4, 2)])
    assert result.outcome is Outcome.APPLIED, result.detail
    assert writes(kubeapi) == [("PATCH", "/apis/apps/v1/namespaces/ml/deployments/train/scale")]


async def test_a_cluster_without_keda_syncs(kubeapi: KubeAPIServer, kube_client: ApiClient) -> None:
    """No KEDA CRD (its LIST answers 404): the state syncs and still indexes HPAs."""
    await kubeapi.create(manifest("autoscalers.yaml", "HorizontalPodAutoscaler"))
    async with synced_state(kube_client) as state:
        assert not state.informers["scaledobjects.keda.sh"].installed
        assert state.owners() == {("Deployment", "ml", "train"): "HorizontalPodAutoscaler ml/train"}


@pytest.mark.parametrize(
    ("annotation", "value", "outcome"),
    [
        ("karpenter.sh/do-not-disrupt", "true", Outcome.REFUSED),
        ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false", Outcome.REFUSED),
        ("cluster-autoscaler.kubernetes.io/safe-to-evict", "true", Outcome.APPLIED),
    ],
    ids=["karpenter", "ca-safe-to-evict-false", "ca-safe-to-evict-true"],
)
async def test_node_autoscaler_protections_hold(
    kubeapi: KubeAPIServer, kube_client: ApiClient, annotation: str, value: str, outcome: Outcome
) -> None:
    """A pod Karpenter or the cluster autoscaler must leave alone is not evicted, and the
    engine's victim selection sees the same protection."""
    pod = make_pod("train-0", namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["annotations"] = {annotation: value}
    await kubeapi.create(pod)
    (result,) = await kind_actuator(kube_client, ("Deployment",)).apply([evict("ml/train-0")])
    assert result.outcome is outcome, result.detail
    snapshot_pod = Pod("ml", "train-0", annotations=frozen_map({annotation: value}))
    assert (protection(snapshot_pod, ()) is None) is (outcome is Outcome.APPLIED)
    if outcome is Outcome.REFUSED:
        assert annotation in result.detail

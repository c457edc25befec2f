"""PyTorchJob: bounds from ``elasticPolicy``, never resized without it or when the training
operator's own HPA (``elasticPolicy.metrics``) owns it, never the Master or worker-0 evicted —
over HTTP against the test API server with Kubeflow's own example manifests."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from controller.kube.translate import Priorities
from controller.kube.workloads.pytorchjob import PYTORCHJOBS
from controller.loop.port import Outcome
from policies.inventory import Inventory
from policies.snapshot import Snapshot
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod
from support.workload_kinds import (
    TRAINING,
    evict,
    kind_actuator,
    manifest,
    scale,
    training_policy,
    writes,
)

Obj = dict[str, Any]


def elastic(**policy: Any) -> Obj:
    job = manifest("pytorchjob-elastic.yaml")
    job["spec"]["elasticPolicy"].update(policy)
    return job


def job_pod(job: str, role: str, index: int) -> Obj:
    pod = make_pod(f"{job}-{role}-{index}", namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["labels"].update(
        {
            "training.kubeflow.org/job-name": job,
            "training.kubeflow.org/replica-type": role,
            "training.kubeflow.org/replica-index": str(index),
        }
    )
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job, "uid": "u",
         "controller": True}
    ]  # fmt: skip
    return pod


@pytest.mark.parametrize(
    ("job", "bounds", "refusal"),
    [
        (elastic(), (1, 3), None),
        (elastic(minReplicas=0), (1, 3), None),
        (manifest("pytorchjob-fixed.yaml"), (1, 1), "has no elasticPolicy"),
        (elastic(metrics=[{"type": "Resource"}]), (2, 2), "HorizontalPodAutoscaler owns"),
    ],
    ids=["elastic", "worker-0-stays", "no-elastic-policy", "operator-hpa"],
)
def test_bounds_and_refusals_come_from_the_elastic_policy(
    job: Obj, bounds: tuple[int, int], refusal: str | None
) -> None:
    """elasticPolicy gives the bounds (never below 1 worker); without it, or with metrics, the
    job's size is fixed and a resize is refused with the reason."""
    w = PYTORCHJOBS.workload(job, Priorities())
    assert (w.min_replicas, w.max_replicas) == bounds
    why = PYTORCHJOBS.refusal(job, 1)
    assert (why is None) if refusal is None else (why is not None and refusal in why)


def test_the_engine_sees_the_owner_bounds_not_its_annotations() -> None:
    """An elastic job's annotations say 0..9, its elasticPolicy 1..3: the engine shrinks and
    grows within 1..3."""
    job = elastic()
    job["metadata"]["annotations"] = {
        "ebbtide.io/min-replicas": "0",
        "ebbtide.io/max-replicas": "9",
    }
    w = PYTORCHJOBS.workload(job, Priorities())
    view = Inventory(Snapshot(workloads=(w,)), training_policy()).training["ml/elastic-imagenet"]
    assert (view.min_replicas, view.max_replicas) == (1, 3)


async def test_an_elastic_job_shrinks_through_scale(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """2→1 writes Worker.replicas through /scale; 1→0 is outside the elasticPolicy and refused
    without a write."""
    await kubeapi.create(elastic())
    act = kind_actuator(kube_client, ("PyTorchJob",))
    (done,) = await act.apply([scale("ml/elastic-imagenet", "PyTorchJob", 2, 1)])
    assert done.outcome is Outcome.APPLIED, done.detail
    stored = kubeapi.get("PyTorchJob", "ml", "elastic-imagenet")
    assert stored is not None
    assert stored["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert writes(kubeapi) == [
        ("PATCH", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/elastic-imagenet/scale")
    ]
    (below,) = await act.apply([scale("ml/elastic-imagenet", "PyTorchJob", 1, 0)])
    assert below.outcome is Outcome.REFUSED
    assert "outside the PyTorchJob's bounds 1..3" in below.detail
    assert len(writes(kubeapi)) == 1


async def test_a_job_without_elastic_policy_is_never_resized(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A fixed-size job's shrink is refused with the reason and an Event; nothing is written."""
    await kubeapi.create(manifest("pytorchjob-fixed.yaml"))
    act = kind_actuator(kube_client, ("PyTorchJob",))
    (result,) = await act.apply([scale("ml/pytorch-simple", "PyTorchJob", 1, 0)])
    assert result.outcome is Outcome.REFUSED
    assert "no elasticPolicy" in result.detail
    assert writes(kubeapi) == []
    (event,) = kubeapi.objects("events", "ml")
    assert event["reason"] == "EbbtideRefused"
    assert "no elasticPolicy" in event["message"]


@pytest.mark.parametrize(
    ("role", "index", "outcome"),
    [
        ("master", 0, Outcome.REFUSED),
        ("worker", 0, Outcome.REFUSED),
        ("worker", 1, Outcome.APPLIED),
    ],
    ids=["master", "worker-0", "worker-1"],
)
async def test_the_master_and_worker_0_are_never_evicted(
    kubeapi: KubeAPIServer, kube_client: ApiClient, role: str, index: int, outcome: Outcome
) -> None:
    """Evicting the Master or worker-0 of an elastic job is refused (it shrinks instead); any
    other worker is evicted through the Eviction API."""
    await kubeapi.create(elastic())
    pod = await kubeapi.create(job_pod("elastic-imagenet", role, index))
    act = kind_actuator(kube_client, ("PyTorchJob",))
    (result,) = await act.apply([evict(f"ml/{pod['metadata']['name']}", "ml/elastic-imagenet")])
    assert result.outcome is outcome, result.detail
    posted = [p for _, p in writes(kubeapi) if p.endswith("/eviction")]
    assert len(posted) == (outcome is Outcome.APPLIED)

"""The checkpoint handshake before an eviction: notice on the pod, wait for the ack or the
deadline, then evict — once, across a controller restart — and the GPU-hours it wasted."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import ApiClient

from controller.loop.port import Outcome
from policies.checkpoint import (
    ACK,
    DEADLINE,
    HANDSHAKE,
    NOTICE,
    next_step,
    stamp,
    wasted_gpu_hours,
)
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod
from support.workload_kinds import TRAINING, evict, kind_actuator, training_policy, writes

T0 = 1_900_000_000.0


@pytest.mark.parametrize(
    ("annotations", "now", "action"),
    [
        ({}, T0, "evict"),
        ({HANDSHAKE: "true"}, T0, "notify"),
        ({HANDSHAKE: "true", NOTICE: stamp(T0)}, T0 + 299, "wait"),
        ({HANDSHAKE: "true", NOTICE: stamp(T0)}, T0 + 300, "evict"),
        ({HANDSHAKE: "true", NOTICE: stamp(T0), DEADLINE: "60"}, T0 + 61, "evict"),
        ({HANDSHAKE: "true", NOTICE: stamp(T0), ACK: stamp(T0 + 5)}, T0 + 6, "evict"),
        ({HANDSHAKE: "true", NOTICE: stamp(T0), ACK: stamp(T0 - 500)}, T0 + 6, "wait"),
    ],
    ids=[
        "not-opted-in",
        "notify",
        "wait",
        "default-deadline",
        "own-deadline",
        "acked",
        "stale-ack",
    ],
)
def test_the_next_step(annotations: dict[str, str], now: float, action: str) -> None:
    """Only opted-in pods are asked; an ack older than the notice does not count."""
    assert next_step(annotations, now=now).action == action


def test_wasted_gpu_hours_count_from_the_last_checkpoint() -> None:
    """4 GPUs, acked 30 min ago → 2 GPU-hours; no checkpoint known → since the pod started."""
    assert wasted_gpu_hours({ACK: stamp(T0)}, 4, started=None, now=T0 + 1800) == 2.0
    assert wasted_gpu_hours({}, 2, started=stamp(T0), now=T0 + 3600) == 2.0
    assert wasted_gpu_hours({}, 2, started=None, now=T0) == 0.0


async def test_notice_then_ack_then_one_eviction_across_a_restart(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """The first try writes the notice (IN_PROGRESS: under way); a restarted controller finds
    it and waits without writing (BLOCKED); after the ack the pod is evicted once, reporting
    1 GPU x 10 s."""
    now = [T0]
    pod = make_pod("train-0", namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["annotations"] = {HANDSHAKE: "true"}
    await kubeapi.create(pod)
    (noticed,) = await kind_actuator(kube_client, ("Deployment",), clock=lambda: now[0]).apply(
        [evict("ml/train-0")]
    )
    assert noticed.outcome is Outcome.IN_PROGRESS, noticed.detail
    stored = kubeapi.get("Pod", "ml", "train-0")
    assert stored is not None
    assert stored["metadata"]["annotations"][NOTICE] == stamp(T0)
    now[0] = T0 + 10
    restarted = kind_actuator(kube_client, ("Deployment",), clock=lambda: now[0])
    (waiting,) = await restarted.apply([evict("ml/train-0")])
    assert waiting.outcome is Outcome.BLOCKED
    assert "waiting for a checkpoint acknowledgement" in waiting.detail
    assert len(writes(kubeapi)) == 1  # the notice only
    await kubeapi.patch(
        "Pod", "ml", "train-0", {"metadata": {"annotations": {ACK: stamp(T0 + 20)}}}
    )
    now[0] = T0 + 30
    (evicted,) = await restarted.apply([evict("ml/train-0")])
    assert evicted.outcome is Outcome.APPLIED, evicted.detail
    assert "checkpoint acknowledged" in evicted.detail
    assert evicted.wasted_gpu_hours == pytest.approx(10 / 3600)
    assert [p for _, p in writes(kubeapi) if p.endswith("/eviction")] == [
        "/api/v1/namespaces/ml/pods/train-0/eviction"
    ]


async def test_dry_run_gives_no_notice(kubeapi: KubeAPIServer, kube_client: ApiClient) -> None:
    """In dry-run the notice is reported, not written."""
    pod = make_pod("train-0", namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["annotations"] = {HANDSHAKE: "true"}
    await kubeapi.create(pod)
    act = kind_actuator(kube_client, ("Deployment",), dry_run=True)
    (result,) = await act.apply([evict("ml/train-0")])
    assert result.outcome is Outcome.DRY_RUN
    assert "preemption notice" in result.detail
    assert writes(kubeapi) == []


@pytest.mark.parametrize(
    ("annotations", "evicted"),
    [({}, True), ({DEADLINE: "600"}, False)],
    ids=["policy-deadline", "pod-annotation-wins"],
)
async def test_the_policy_sets_the_deadline_of_training_pods(
    kubeapi: KubeAPIServer, kube_client: ApiClient, annotations: dict[str, str], evicted: bool
) -> None:
    """training.checkpoint.deadline: 1m: a training pod noticed 61 s ago without an ack is
    evicted (not at the default 300 s); a pod's own deadline annotation wins."""
    now = [T0]
    pod = make_pod("train-0", namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["annotations"] = {HANDSHAKE: "true", NOTICE: stamp(T0 - 61), **annotations}
    await kubeapi.create(pod)
    act = kind_actuator(
        kube_client,
        ("Deployment",),
        policy=training_policy(checkpoint={"deadline": "1m"}),
        clock=lambda: now[0],
    )
    (result,) = await act.apply([evict("ml/train-0")])
    assert (result.outcome is Outcome.APPLIED) is evicted, result.detail
    if not evicted:
        assert result.outcome is Outcome.BLOCKED


@pytest.mark.parametrize(
    "kinds",
    [
        pytest.param(("PyTorchJob",), marks=pytest.mark.kube_rbac(kinds=["PyTorchJob"])),
        pytest.param(("RayCluster",), marks=pytest.mark.kube_rbac(kinds=["RayCluster"])),
    ],
    ids=["PyTorchJob", "RayCluster"],
)
async def test_the_notice_is_allowed_whatever_kinds_are_tracked(
    kubeapi: KubeAPIServer, kube_client: ApiClient, kinds: tuple[str, ...]
) -> None:
    """With the chart's RBAC for workloadKinds without Deployment, the notice (a patch of the
    pod) is still granted: the pod is noticed and the eviction under way, not failed with 403."""
    pod = make_pod("train-0", namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["annotations"] = {HANDSHAKE: "true"}
    await kubeapi.create(pod)
    (noticed,) = await kind_actuator(kube_client, kinds, clock=lambda: T0).apply(
        [evict("ml/train-0")]
    )
    assert noticed.outcome is Outcome.IN_PROGRESS, noticed.detail
    stored = kubeapi.get("Pod", "ml", "train-0")
    assert stored is not None
    assert stored["metadata"]["annotations"][NOTICE] == stamp(T0)

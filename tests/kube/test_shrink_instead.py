"""A pinned training Deployment is shrunk through ``/scale`` instead of having pods evicted.

Over the Kubernetes adapter (real engine, watch cache, safety gate and actuator against the
HTTP test server, no Kafka): the pods the engine would have evicted are named, get the lowest
``controller.kubernetes.io/pod-deletion-cost`` (the ReplicaSet removes them first), and no
Eviction is posted, so no replacement is created to race chat's new replicas for the GPUs.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from controller.kube.workloads.apps import DELETION_COST
from controller.loop.port import ActionResult, Outcome
from policies.decisions import Scale
from streams.events import InferenceLatency
from support.e2e import build_cluster, in_process_controller
from support.kubeapi import KubeAPIServer

pytestmark = pytest.mark.slow


async def test_a_pinned_deployment_is_shrunk_naming_its_pods_and_nothing_is_evicted(
    kubeapi: KubeAPIServer, tmp_path: Path
) -> None:
    """Training pinned at its 10 replicas (min = max = 10, no GPU free): a breach shrinks it
    below its floor through /scale, the named pods carry the lowest deletion cost, no Eviction
    is posted, and chat scales by as many replicas as the shrink frees."""
    await build_cluster(kubeapi, full=True)
    pinned = {"ebbtide.io/min-replicas": "10", "ebbtide.io/max-replicas": "10"}
    await kubeapi.patch("Deployment", "ml", "train", {"metadata": {"annotations": pinned}})
    results: list[ActionResult] = []
    async with in_process_controller(kubeapi, tmp_path) as controller:
        deadline = time.monotonic() + 20
        while not any(r.decision.target == "serving/chat" for r in results):
            assert time.monotonic() < deadline, [r.detail for r in results]
            for _ in range(40):
                controller.engine.observe(
                    InferenceLatency(ts=time.time(), service="chat", namespace="serving",
                                     samples_ms=[900.0] * 20)
                )  # fmt: skip
            results.extend(await controller.evaluate_once())
            await asyncio.sleep(0.2)
    [shrink] = [r for r in results if r.decision.target == "ml/train"]
    [up] = [r for r in results if r.decision.target == "serving/chat"]
    assert isinstance(shrink.decision, Scale)
    assert isinstance(up.decision, Scale)
    assert shrink.outcome is Outcome.APPLIED, shrink.detail
    assert up.outcome is Outcome.APPLIED, up.detail
    named = [key.split("/")[1] for key in shrink.decision.remove]
    freed = shrink.decision.from_replicas - shrink.decision.to_replicas
    assert (shrink.decision.from_replicas, len(named)) == (10, freed)
    assert up.decision.to_replicas - up.decision.from_replicas == freed
    assert "instead of evicting" in shrink.decision.explanation.reason
    assert kubeapi.get("Deployment", "ml", "train")["spec"]["replicas"] == 10 - freed  # type: ignore[index]
    for name in named:
        pod = kubeapi.get("Pod", "ml", name)
        assert pod is not None
        assert pod["metadata"]["annotations"][DELETION_COST] == str(-(2**31))
    assert not [r for r in kubeapi.requests if r.path.endswith("/eviction")]
    assert kubeapi.forbidden == [], "the chart's RBAC forbids requests the controller made"

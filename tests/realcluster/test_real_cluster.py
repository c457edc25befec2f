"""The Kubernetes adapter against a real API server (see conftest: opt-in)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kubernetes_asyncio import client

from controller.kube.actuator import KubeActuator
from controller.kube.informer import Informer, Resource
from controller.kube.leader import LeaderElector, LeaseSettings
from controller.loop.gate import SafetyGate
from controller.loop.port import Outcome
from policies.decisions import Evict, Explanation, Scale
from policies.loader import load_policy_text

POLICY = """
apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata: {name: real}
spec:
  pools: {all: {nodeSelector: {}, kind: whole}}
  training: {selector: {ebbtide.io/class: training}}
  budgets:
    evictions: {max: 5, per: 1m}
    scaleSteps: {max: 5, per: 1m}
    migConversions: {max: 1, per: 1h}
"""


def deployment(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name, "ebbtide.io/class": "training"}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.9"}]},
            },
        },
    }


async def test_scale_and_pdb_guarded_eviction(real_api: client.ApiClient, scratch: str) -> None:
    """/scale shrinks a Deployment; an eviction a PDB forbids is BLOCKED and the pod stays."""
    apps, core, policy_api = (
        client.AppsV1Api(real_api), client.CoreV1Api(real_api), client.PolicyV1Api(real_api)
    )  # fmt: skip
    await apps.create_namespaced_deployment(scratch, deployment("train", 2))
    actuator = KubeActuator(real_api, SafetyGate(load_policy_text(POLICY)), nodes=list)
    why = Explanation.of("test", "real-cluster test")
    shrink = Scale(time.time(), f"{scratch}/train", "Deployment", 2, 1, "training", why)
    (result,) = await actuator.apply([shrink])
    assert result.outcome is Outcome.APPLIED, result.detail
    scale = await apps.read_namespaced_deployment_scale("train", scratch)
    assert scale.spec.replicas == 1

    await policy_api.create_namespaced_pod_disruption_budget(
        scratch,
        {"metadata": {"name": "keep"},
         "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "train"}}}},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        pods = (await core.list_namespaced_pod(scratch, label_selector="app=train")).items
        if pods and pods[0].status.phase == "Running":
            break
        assert time.monotonic() < deadline, "the pod did not start"
        await asyncio.sleep(1)
    pod = pods[0].metadata.name
    evict = Evict(time.time(), f"{scratch}/{pod}", None, f"{scratch}/train", 1.0, why)
    (result,) = await actuator.apply([evict])
    assert result.outcome is Outcome.BLOCKED, result.detail
    assert (await core.read_namespaced_pod(pod, scratch)).metadata.deletion_timestamp is None


async def test_informer_lists_and_watches(real_api: client.ApiClient, scratch: str) -> None:
    """A list+watch of the scratch namespace's ConfigMaps sees a create and a delete."""
    informer = Informer(real_api, Resource(plural="configmaps"), namespaces=(scratch,))
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.wait_synced(), 30)
        core = client.CoreV1Api(real_api)
        await core.create_namespaced_config_map(scratch, {"metadata": {"name": "x"}})
        deadline = time.monotonic() + 30
        while informer.get(f"{scratch}/x") is None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    finally:
        informer.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_lease_election(real_api: client.ApiClient, scratch: str) -> None:
    """A replica acquires the Lease in the scratch namespace and is leader."""
    settings = LeaseSettings(name="ebbtide", namespace=scratch, lease_duration_s=4,
                             renew_deadline_s=3, retry_period_s=1)  # fmt: skip
    elector = LeaderElector(real_api, identity="real-test", settings=settings)
    task = asyncio.create_task(elector.run())
    try:
        deadline = time.monotonic() + 30
        while not elector.is_leader:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

"""RayCluster (KubeRay, no ``/scale``): a shrink sets the group's ``replicas`` together with
``scaleStrategy.workersToDelete`` naming the newest workers; the group's own min/max bound it;
a cluster with the Ray autoscaler is left to it — against the test API server with KubeRay's
GPU sample."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from controller.loop.port import Outcome
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod
from support.kubeapi_rbac import Authorizer
from support.kubeapi_store import Store
from support.workload_kinds import RAYCLUSTER, TRAINING, kind_actuator, manifest, scale, writes

pytestmark = pytest.mark.kube_rbac(kinds=["RayCluster"])


def worker(name: str, group: str = "gpu-group") -> dict[str, Any]:
    pod = make_pod(name, namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["labels"].update(
        {"ray.io/cluster": "raycluster-gpu", "ray.io/group": group, "ray.io/node-type": "worker"}
    )
    return pod


@pytest.fixture
async def hourly(kube_authorizer: Authorizer | None) -> AsyncIterator[KubeAPIServer]:
    """A test API server whose clock moves an hour per object created (distinct ages),
    authorizing as ``kubeapi`` does."""
    ticks = itertools.count()
    store = Store(clock=lambda: 1.8e9 + 3600 * next(ticks))
    async with KubeAPIServer(store=store, authorizer=kube_authorizer) as server:
        server.add_resource(RAYCLUSTER)
        yield server
    assert server.forbidden == []


async def test_a_shrink_names_the_newest_workers_to_delete(hourly: KubeAPIServer) -> None:
    """3→1 writes replicas 1 and workersToDelete = the two newest workers of the group (a pod
    of another group is never named); 1→2 then only raises replicas."""
    kubeapi = hourly
    await kubeapi.create(manifest("raycluster.yaml"))
    for name in ("w-b", "w-c", "w-a"):
        await kubeapi.create(worker(name))
    await kubeapi.create(worker("cpu-newest", group="cpu-group"))
    async with ApiClient(Configuration(host=kubeapi.url)) as kube_client:
        await _shrink_then_grow(kubeapi, kube_client)


async def _shrink_then_grow(kubeapi: KubeAPIServer, kube_client: ApiClient) -> None:
    act = kind_actuator(kube_client, ("RayCluster",))
    (shrunk,) = await act.apply([scale("ml/raycluster-gpu", "RayCluster", 3, 1)])
    assert shrunk.outcome is Outcome.APPLIED, shrunk.detail
    assert "removing w-a, w-c" in shrunk.detail
    stored = kubeapi.get("RayCluster", "ml", "raycluster-gpu")
    assert stored is not None
    (group,) = stored["spec"]["workerGroupSpecs"]
    assert group["replicas"] == 1
    assert group["scaleStrategy"]["workersToDelete"] == ["w-a", "w-c"]
    (grown,) = await act.apply([scale("ml/raycluster-gpu", "RayCluster", 1, 2)])
    assert grown.outcome is Outcome.APPLIED, grown.detail
    stored = kubeapi.get("RayCluster", "ml", "raycluster-gpu")
    assert stored is not None
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    assert stored["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"] == []


async def test_the_group_bounds_and_the_ray_autoscaler_are_respected(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Growing past the group's maxReplicas (4) is refused; with enableInTreeAutoscaling any
    resize is refused, naming the Ray autoscaler; nothing is written."""
    kubeapi.add_resource(RAYCLUSTER)
    await kubeapi.create(manifest("raycluster.yaml"))
    act = kind_actuator(kube_client, ("RayCluster",))
    (over,) = await act.apply([scale("ml/raycluster-gpu", "RayCluster", 3, 5)])
    assert over.outcome is Outcome.REFUSED
    assert "bounds 1..4" in over.detail
    await kubeapi.patch("RayCluster", "ml", "raycluster-gpu",
                        {"spec": {"enableInTreeAutoscaling": True}})  # fmt: skip
    (owned,) = await act.apply([scale("ml/raycluster-gpu", "RayCluster", 3, 2)])
    assert owned.outcome is Outcome.REFUSED
    assert "Ray autoscaler" in owned.detail
    assert writes(kubeapi) == []


async def test_a_raycluster_kueue_admitted_is_not_resized(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A RayCluster with Kueue's queue label is Kueue's: a resize is refused, nothing written."""
    kubeapi.add_resource(RAYCLUSTER)
    cluster = manifest("raycluster.yaml")
    cluster["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "user-queue"
    await kubeapi.create(cluster)
    act = kind_actuator(kube_client, ("RayCluster",))
    (result,) = await act.apply([scale("ml/raycluster-gpu", "RayCluster", 3, 2)])
    assert result.outcome is Outcome.REFUSED
    assert "Kueue manages the RayCluster" in result.detail
    assert writes(kubeapi) == []

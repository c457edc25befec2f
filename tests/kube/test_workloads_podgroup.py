"""Gang minimums from the gang scheduler's PodGroups (Volcano, scheduler-plugins), not only
from Ebbtide's annotation: by ownerReference or by name, picked up when a PodGroup appears —
over HTTP against the test API server."""

from __future__ import annotations

from kubernetes_asyncio.client import ApiClient

from policies.inventory import Inventory
from support.e2e import eventually
from support.kubeapi import KubeAPIServer
from support.workload_kinds import (
    COSCHEDULING_PODGROUP,
    TRAINING,
    VOLCANO_PODGROUP,
    manifest,
    manifests,
    synced_state,
    training_policy,
)


async def test_podgroup_min_member_is_the_gang_minimum(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A Volcano PodGroup owned by the PyTorchJob gives it gang minimum 2 over its annotation's
    5; a coscheduling PodGroup named like a Deployment, created later, gives that one 3."""
    kubeapi.add_resource(VOLCANO_PODGROUP)
    kubeapi.add_resource(COSCHEDULING_PODGROUP)
    job = manifest("pytorchjob-elastic.yaml")
    job["metadata"]["annotations"] = {"ebbtide.io/gang-minimum": "5"}
    job = await kubeapi.create(job)
    volcano = manifest("podgroups.yaml", "PodGroup")
    volcano["metadata"]["ownerReferences"][0]["uid"] = job["metadata"]["uid"]
    await kubeapi.create(volcano)
    await kubeapi.create(
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "train", "namespace": "ml", "labels": dict(TRAINING)},
         "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "t"}},
                  "template": {"metadata": {"labels": {"app": "t"}}, "spec": {"containers": []}}}}
    )  # fmt: skip
    async with synced_state(kube_client) as state:

        def minimums() -> dict[str, int | None]:
            return {w.key: w.gang_min for w in state.snapshot().workloads}

        assert minimums() == {"ml/elastic-imagenet": 2, "ml/train": None}
        (coscheduling,) = [
            d
            for d in manifests("podgroups.yaml")
            if d["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
        ]
        await kubeapi.create(coscheduling)
        await eventually(lambda: minimums()["ml/train"] == 3, 5)
        views = Inventory(state.snapshot(), training_policy()).training
        assert (views["ml/elastic-imagenet"].gang_min, views["ml/train"].gang_min) == (2, 3)

"""Kueue preemption of the kinds Ebbtide resizes through ``/scale`` (PyTorchJob, Deployment,
StatefulSet), under the RBAC the chart renders with ``controller.kueue: true``: the job is marked
(a patch of the object itself, not of ``/scale``), then its Kueue Workload is deactivated; a grow
reactivates it and clears the mark. The test API server authorizes every request as the chart's
ClusterRole does, so a verb the chart lacks fails here, as a 403 would in a cluster."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from controller.loop.port import Outcome
from support.e2e import deployment, workload_pod
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod
from support.workload_kinds import (
    KUEUE_WORKLOAD,
    TRAINING,
    evict,
    kind_actuator,
    kueue_state,
    manifest,
    scale,
    writes,
)

Obj = dict[str, Any]
QUEUE = {"kueue.x-k8s.io/queue-name": "user-queue"}
APP = {"app": "train", **TRAINING}
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads"


def pytorchjob() -> tuple[Obj, Obj, str]:
    """The elastic PyTorchJob example in Kueue's queue, a worker pod of it, its URL path."""
    job = manifest("pytorchjob-elastic.yaml")
    job["metadata"]["labels"].update(QUEUE)
    pod = make_pod("elastic-imagenet-worker-1", namespace="ml", labels=dict(TRAINING), gpus=1)
    pod["metadata"]["labels"]["training.kubeflow.org/job-name"] = "elastic-imagenet"
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "elastic-imagenet",
         "uid": "u", "controller": True}
    ]  # fmt: skip
    return job, pod, "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/elastic-imagenet"


def deployment_job() -> tuple[Obj, Obj, str]:
    """A training Deployment in Kueue's queue, a pod of its ReplicaSet, its URL path."""
    job = deployment("ml", "train", 2, labels={**APP, **QUEUE})
    pod = workload_pod("ml", "train", 0, "gpu-0", APP)
    return job, pod, "/apis/apps/v1/namespaces/ml/deployments/train"


def statefulset_job() -> tuple[Obj, Obj, str]:
    """The same as a StatefulSet, its pod owned by it directly."""
    job = deployment("ml", "train", 2, labels={**APP, **QUEUE})
    job["kind"] = "StatefulSet"
    pod = make_pod("train-0", namespace="ml", labels=dict(APP), gpus=1)
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "train", "uid": "u",
         "controller": True}
    ]  # fmt: skip
    return job, pod, "/apis/apps/v1/namespaces/ml/statefulsets/train"


async def admitted(kubeapi: KubeAPIServer, job: Obj, pod: Obj) -> str:
    """Store the job, the Kueue Workload it owns and its pod; returns the Workload's name."""
    kubeapi.add_resource(KUEUE_WORKLOAD)
    created = await kubeapi.create(job)
    workload = manifest("kueue-job.yaml", "Workload")
    name = f"{job['kind'].lower()}-{job['metadata']['name']}-1a2b3"
    workload["metadata"]["name"] = name
    workload["metadata"]["ownerReferences"] = [
        {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": job["metadata"]["name"],
         "uid": created["metadata"]["uid"], "controller": True}
    ]  # fmt: skip
    await kubeapi.create(workload)
    await kubeapi.create(pod)
    return name


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(pytorchjob, marks=pytest.mark.kube_rbac(kinds=["PyTorchJob"], kueue=True)),
        pytest.param(deployment_job, marks=pytest.mark.kube_rbac(kinds=["Deployment"], kueue=True)),
        pytest.param(
            statefulset_job, marks=pytest.mark.kube_rbac(kinds=["StatefulSet"], kueue=True)
        ),
    ],
    ids=["PyTorchJob", "Deployment", "StatefulSet"],
)
async def test_kueue_preemption_of_a_scale_kind_is_allowed_by_the_chart(
    kubeapi: KubeAPIServer, kube_client: ApiClient, build: Any
) -> None:
    """With the chart's RBAC for workloadKinds [kind] and kueue: true, evicting a pod of a
    Kueue-admitted job marks the job and deactivates its Workload (no Eviction, no 403)."""
    job, pod, path = build()
    name = await admitted(kubeapi, job, pod)
    pod_key = f"ml/{pod['metadata']['name']}"
    act = kind_actuator(kube_client, (job["kind"],))
    (result,) = await act.apply([evict(pod_key, f"ml/{job['metadata']['name']}")])
    assert result.outcome is Outcome.APPLIED, result.detail
    assert writes(kubeapi) == [("PATCH", path), ("PATCH", f"{WORKLOADS}/{name}")]
    assert kueue_state(kubeapi, name, job["kind"], job["metadata"]["name"]) == (False, name)


@pytest.mark.kube_rbac(kinds=["PyTorchJob"], kueue=True)
async def test_a_pytorchjob_kueue_stopped_resumes_when_grown(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Once Kueue suspends the preempted PyTorchJob (runPolicy.suspend), a grow reactivates its
    Workload and clears the mark on the object, all within the chart's RBAC."""
    job, pod, path = pytorchjob()
    name = await admitted(kubeapi, job, pod)
    act = kind_actuator(kube_client, ("PyTorchJob",))
    await act.apply([evict("ml/elastic-imagenet-worker-1", "ml/elastic-imagenet")])
    suspend = {"spec": {"runPolicy": {"suspend": True}}}  # Kueue's part
    await kubeapi.patch("PyTorchJob", "ml", "elastic-imagenet", suspend)
    (grow,) = await act.apply([scale("ml/elastic-imagenet", "PyTorchJob", 0, 2)])
    assert grow.outcome is Outcome.APPLIED, grow.detail
    assert kueue_state(kubeapi, name, "PyTorchJob", "elastic-imagenet") == (True, None)
    assert writes(kubeapi)[2:] == [("PATCH", f"{WORKLOADS}/{name}"), ("PATCH", path)]

"""Kueue for every kind: a Kueue-admitted JobSet's pods are never evicted behind Kueue's back (its
Workload, found by its owner reference, is deactivated instead, then reactivated on a grow), and
the two writes of a preemption are ordered so that a crash between them leaves a job Ebbtide
knows is its own — against the test API server."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient

from controller.cluster import Outcome
from controller.kube.translate import Priorities
from controller.kube.workloads import ADAPTERS
from controller.kube.workloads.kueue import PREEMPTED
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod
from support.workload_kinds import (
    JOB,
    JOBSET,
    KUEUE_WORKLOAD,
    TRAINING,
    evict,
    kind_actuator,
    manifest,
    scale,
    writes,
)

Obj = dict[str, Any]
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads"
JOBSET_PATH = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/pytorch"
JOB_PATH = "/apis/batch/v1/namespaces/ml/jobs/sample-job"
JOBSET_WORKLOAD = "jobset-pytorch-9d2e1"
JOB_WORKLOAD = "job-sample-job-3f1c7"


async def admitted_jobset(kubeapi: KubeAPIServer) -> Obj:
    """The JobSet example with Kueue's queue label, the Workload Kueue made for it (owned by
    it), an unrelated Workload, and one running worker pod (owned by a child Job)."""
    kubeapi.add_resource(JOBSET)
    kubeapi.add_resource(JOB)
    kubeapi.add_resource(KUEUE_WORKLOAD)
    jobset = manifest("jobset.yaml")
    jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "user-queue"
    jobset["metadata"]["annotations"] = {"ebbtide.io/scale-group": "workers"}
    created = await kubeapi.create(jobset)
    uid = created["metadata"]["uid"]
    for name, owner, owner_uid in (
        ("job-sample-job-0a0a0", "Job", "other"),
        (JOBSET_WORKLOAD, "JobSet", uid),
    ):
        workload = manifest("kueue-job.yaml", "Workload")
        workload["metadata"]["name"] = name
        workload["metadata"]["ownerReferences"] = [
            {"apiVersion": "jobset.x-k8s.io/v1alpha2" if owner == "JobSet" else "batch/v1",
             "kind": owner, "name": "pytorch" if owner == "JobSet" else "sample-job",
             "uid": owner_uid, "controller": True}
        ]  # fmt: skip
        await kubeapi.create(workload)
    pod = make_pod("pytorch-workers-0-0-abcde", namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = "pytorch"
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "pytorch-workers-0", "uid": "j",
         "controller": True}
    ]  # fmt: skip
    await kubeapi.create(pod)
    return created


def active(kubeapi: KubeAPIServer, name: str) -> bool:
    stored = kubeapi.get("Workload", "ml", name)
    assert stored is not None
    return bool(stored["spec"]["active"])


def mark(kubeapi: KubeAPIServer, kind: str, name: str) -> str | None:
    stored = kubeapi.get(kind, "ml", name)
    assert stored is not None
    return (stored["metadata"].get("annotations") or {}).get(PREEMPTED)


async def test_a_kueue_jobset_pod_is_not_evicted_its_workload_is_deactivated(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Evicting a worker of a Kueue-labelled JobSet (with Job tracked too, listed first) posts no
    Eviction: the JobSet is marked, then the Workload it owns is deactivated, not the other."""
    await admitted_jobset(kubeapi)
    act = kind_actuator(kube_client, ("Job", "JobSet"))
    (result,) = await act.apply([evict("ml/pytorch-workers-0-0-abcde", "ml/pytorch")])
    assert result.outcome is Outcome.APPLIED, result.detail
    assert f"deactivated Kueue Workload {JOBSET_WORKLOAD}" in result.detail
    assert writes(kubeapi) == [("PATCH", JOBSET_PATH), ("PATCH", f"{WORKLOADS}/{JOBSET_WORKLOAD}")]
    assert not active(kubeapi, JOBSET_WORKLOAD)
    assert active(kubeapi, "job-sample-job-0a0a0")
    assert mark(kubeapi, "JobSet", "pytorch") == JOBSET_WORKLOAD


async def test_a_preempted_jobset_resumes_when_grown(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Once Kueue suspends the preempted JobSet it shows 0 replicas, growable to its workers;
    the grow reactivates the Workload and clears the mark, and does not touch replicas."""
    await admitted_jobset(kubeapi)
    act = kind_actuator(kube_client, ("JobSet",))
    await act.apply([evict("ml/pytorch-workers-0-0-abcde", "ml/pytorch")])
    await kubeapi.patch("JobSet", "ml", "pytorch", {"spec": {"suspend": True}})  # Kueue's part
    stored = kubeapi.get("JobSet", "ml", "pytorch")
    assert stored is not None
    w = ADAPTERS["JobSet"].workload(stored, Priorities())
    assert (w.replicas, w.min_replicas, w.max_replicas) == (0, 0, 4)
    (grow,) = await act.apply([scale("ml/pytorch", "JobSet", 0, 4)])
    assert grow.outcome is Outcome.APPLIED, grow.detail
    assert (active(kubeapi, JOBSET_WORKLOAD), mark(kubeapi, "JobSet", "pytorch")) == (True, None)
    stored = kubeapi.get("JobSet", "ml", "pytorch")
    assert stored is not None
    assert stored["spec"]["replicatedJobs"][1]["replicas"] == 4


async def admitted_job(kubeapi: KubeAPIServer) -> None:
    kubeapi.add_resource(JOB)
    kubeapi.add_resource(KUEUE_WORKLOAD)
    job = await kubeapi.create(manifest("kueue-job.yaml", "Job"))
    uid = job["metadata"]["uid"]
    workload = manifest("kueue-job.yaml", "Workload")
    workload["metadata"]["ownerReferences"][0]["uid"] = uid
    await kubeapi.create(workload)
    pod = make_pod("sample-job-x7k2p", namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "sample-job", "uid": uid}
    ]
    await kubeapi.create(pod)


async def test_a_crash_between_the_two_writes_leaves_the_job_ebbtides(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """The mark is written first: when the Workload's write fails (the controller died before
    it), the Workload is still active, and a restarted controller finishes the preemption
    (one more write) instead of calling it done; once Kueue suspends the Job, a grow resumes
    it. Were the Workload written first, a crash would leave an unmarked suspended Job that
    nothing resumes."""
    await admitted_job(kubeapi)
    kubeapi.faults.add(method="PATCH", path_regex="/workloads/", status=500, times=None)
    (first,) = await kind_actuator(kube_client, ("Job",)).apply(
        [evict("ml/sample-job-x7k2p", "ml/sample-job")]
    )
    assert first.outcome is Outcome.FAILED, first.detail
    assert (active(kubeapi, JOB_WORKLOAD), mark(kubeapi, "Job", "sample-job")) == (
        True,
        JOB_WORKLOAD,
    )
    kubeapi.faults.clear()
    restarted = kind_actuator(kube_client, ("Job",))
    (again,) = await restarted.apply([evict("ml/sample-job-x7k2p", "ml/sample-job")])
    assert again.outcome is Outcome.APPLIED, again.detail
    assert not active(kubeapi, JOB_WORKLOAD)
    (third,) = await restarted.apply([evict("ml/sample-job-x7k2p", "ml/sample-job")])
    assert third.outcome is Outcome.ALREADY_DONE, third.detail
    await kubeapi.patch("Job", "ml", "sample-job", {"spec": {"suspend": True}})  # Kueue's part
    (grow,) = await kind_actuator(kube_client, ("Job",)).apply(
        [scale("ml/sample-job", "Job", 0, 3)]
    )
    assert grow.outcome is Outcome.APPLIED, grow.detail
    assert (active(kubeapi, JOB_WORKLOAD), mark(kubeapi, "Job", "sample-job")) == (True, None)


async def test_when_the_mark_cannot_be_written_nothing_is_deactivated(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A failed mark fails the preemption before the Workload is touched."""
    await admitted_job(kubeapi)
    kubeapi.faults.add(method="PATCH", path_regex="/jobs/sample-job", status=500, times=None)
    (result,) = await kind_actuator(kube_client, ("Job",)).apply(
        [evict("ml/sample-job-x7k2p", "ml/sample-job")]
    )
    assert result.outcome is Outcome.FAILED, result.detail
    assert active(kubeapi, JOB_WORKLOAD)
    assert not any(path.startswith(WORKLOADS) for _, path in writes(kubeapi))

"""JobSet (no ``/scale``): resized through its replicated job's ``replicas`` with a conditional
merge patch, the other replicated jobs left as they are; a Kueue-admitted JobSet's pods are never
evicted behind Kueue's back (its Workload, found by its owner reference, is deactivated instead,
then reactivated on a grow) — against the test API server with the JobSet example manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from controller.cluster import Outcome
from controller.kube.state import workload_kinds
from controller.kube.translate import Priorities
from controller.kube.workloads import ADAPTERS
from controller.kube.workloads.jobset import JOBSETS
from controller.settings import Settings
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod
from support.workload_kinds import (
    JOB,
    JOBSET,
    KUEUE_WORKLOAD,
    TRAINING,
    evict,
    kind_actuator,
    kueue_state,
    manifest,
    scale,
    synced_state,
    writes,
)

Obj = dict[str, Any]


def worker_pod() -> Obj:
    """A running worker of the JobSet ``ml/pytorch``: owned by a child Job, labelled with the
    JobSet's name."""
    pod = make_pod("pytorch-workers-0-0-abcde", namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = "pytorch"
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "pytorch-workers-0", "uid": "j",
         "controller": True}
    ]  # fmt: skip
    return pod


def test_a_replica_is_a_whole_job_of_pods() -> None:
    """The first replicated job (the driver) is sized unless ebbtide.io/scale-group names
    another; a workers replica takes parallelism (2) times 1 GPU."""
    job = manifest("jobset.yaml")
    assert (JOBSETS.replicas(job), JOBSETS.workload(job, Priorities()).gpus_per_replica) == (1, 0)
    job["metadata"]["annotations"] = {"ebbtide.io/scale-group": "workers"}
    w = JOBSETS.workload(job, Priorities())
    assert (w.replicas, w.gpus_per_replica, w.min_replicas) == (4, 2, None)


async def test_a_jobset_shrinks_and_grows_through_its_replicated_job(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """4→2 then 2→3 write replicatedJobs[workers].replicas on the JobSet itself; the driver's
    replicated job is untouched."""
    kubeapi.add_resource(JOBSET)
    job = manifest("jobset.yaml")
    job["metadata"]["annotations"] = {"ebbtide.io/scale-group": "workers"}
    await kubeapi.create(job)
    act = kind_actuator(kube_client, ("JobSet",))
    results = await act.apply(
        [scale("ml/pytorch", "JobSet", 4, 2), scale("ml/pytorch", "JobSet", 2, 3)]
    )
    assert [r.outcome for r in results] == [Outcome.APPLIED, Outcome.APPLIED], results
    stored = kubeapi.get("JobSet", "ml", "pytorch")
    assert stored is not None
    driver, workers = stored["spec"]["replicatedJobs"]
    assert (driver["name"], driver["replicas"], workers["replicas"]) == ("driver", 1, 3)
    assert workers["template"] == job["spec"]["replicatedJobs"][1]["template"]
    path = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/pytorch"
    assert writes(kubeapi) == [("PATCH", path), ("PATCH", path)]


async def test_a_jobset_changed_since_the_decision_is_refused(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Decided on 3→2 but the JobSet has 4 workers: refused as changed under us, no write."""
    kubeapi.add_resource(JOBSET)
    job = manifest("jobset.yaml")
    job["metadata"]["annotations"] = {"ebbtide.io/scale-group": "workers"}
    await kubeapi.create(job)
    (result,) = await kind_actuator(kube_client, ("JobSet",)).apply(
        [scale("ml/pytorch", "JobSet", 3, 2)]
    )
    assert result.outcome is Outcome.REFUSED
    assert "changed under us" in result.detail
    assert writes(kubeapi) == []


async def test_the_setting_tracks_jobsets_and_their_pods(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """With kube.workload_kinds naming JobSet and Job, a JobSet pod (owned by a child Job,
    labelled with the JobSet's name) belongs to the JobSet, not to the Job."""
    kubeapi.add_resource(JOBSET)
    kubeapi.add_resource(JOB)
    await kubeapi.create(manifest("jobset.yaml"))
    await kubeapi.create(worker_pod())
    settings = Settings(policies=[Path("p.yaml")], kube={"workload_kinds": ["JobSet", "Job"]})
    kinds = workload_kinds(settings.kube.workload_kinds)
    async with synced_state(kube_client, kinds=kinds) as state:
        snapshot = state.snapshot()
    assert [(w.key, w.kind) for w in snapshot.workloads] == [("ml/pytorch", "JobSet")]
    assert [p.workload for p in snapshot.pods] == ["ml/pytorch"]


WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads"
JOBSET_PATH = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/pytorch"
JOBSET_WORKLOAD = "jobset-pytorch-9d2e1"


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
    await kubeapi.create(worker_pod())
    return created


def active(kubeapi: KubeAPIServer, name: str) -> bool:
    return kueue_state(kubeapi, name, "JobSet", "pytorch")[0]


def mark(kubeapi: KubeAPIServer) -> str | None:
    return kueue_state(kubeapi, JOBSET_WORKLOAD, "JobSet", "pytorch")[1]


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
    assert mark(kubeapi) == JOBSET_WORKLOAD


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
    assert (active(kubeapi, JOBSET_WORKLOAD), mark(kubeapi)) == (True, None)
    stored = kubeapi.get("JobSet", "ml", "pytorch")
    assert stored is not None
    assert stored["spec"]["replicatedJobs"][1]["replicas"] == 4

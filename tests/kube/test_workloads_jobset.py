"""JobSet (no ``/scale``): never resized, since JobSet's webhook refuses any change of
``replicatedJobs`` (the test API server refuses as it does); a Kueue-admitted JobSet's pods are
never evicted behind Kueue's back (its Workload, found by its owner reference, is deactivated
instead, then reactivated on a grow) — against the test API server with the JobSet example
manifest."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from controller.kube.client import KubeError
from controller.kube.state import workload_kinds
from controller.kube.translate import Priorities
from controller.kube.workloads import ADAPTERS, Io
from controller.kube.workloads.jobset import JOBSETS
from controller.loop.port import Outcome
from controller.process.settings import Settings
from policies.inventory import Inventory
from policies.snapshot import Snapshot
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
    training_policy,
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


def test_a_replica_is_a_whole_job_of_pods_and_the_size_is_fixed() -> None:
    """The first replicated job (the driver) is counted unless ebbtide.io/scale-group names
    another; a workers replica takes parallelism (2) times 1 GPU; the bounds are the size
    itself, whatever Ebbtide's annotations say, and any resize is refused with the reason."""
    job = manifest("jobset.yaml")
    assert (JOBSETS.replicas(job), JOBSETS.workload(job, Priorities()).gpus_per_replica) == (1, 0)
    job["metadata"]["annotations"] = {
        "ebbtide.io/scale-group": "workers",
        "ebbtide.io/min-replicas": "1",
        "ebbtide.io/max-replicas": "8",
    }
    w = JOBSETS.workload(job, Priorities())
    assert (w.replicas, w.gpus_per_replica, w.min_replicas, w.max_replicas) == (4, 2, 4, 4)
    view = Inventory(Snapshot(workloads=(w,)), training_policy()).training["ml/pytorch"]
    assert (view.min_replicas, view.max_replicas) == (4, 4)
    assert "webhook refuses any change of spec.replicatedJobs" in (JOBSETS.refusal(job, 2) or "")


PATH = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/pytorch"


def fewer_jobs(workers: Obj) -> None:
    workers["replicas"] = 2


def fewer_pods(workers: Obj) -> None:
    workers["template"]["spec"].update(parallelism=1, completions=1)


def elsewhere(workers: Obj) -> None:
    pod = workers["template"]["spec"]["template"]["spec"]
    pod.update(nodeSelector={"pool": "b"}, tolerations=[{"key": "k", "operator": "Exists"}])


def nothing(workers: Obj) -> None:
    return None


@pytest.mark.kube_rbac(None)
@pytest.mark.parametrize(
    ("suspended", "change", "refused"),
    [
        (False, fewer_jobs, True),
        (False, fewer_pods, True),
        (True, fewer_jobs, True),
        (False, elsewhere, True),
        (True, elsewhere, False),
        (False, nothing, False),
    ],
    ids=[
        "replicas",
        "parallelism",
        "replicas-while-suspended",
        "placement-while-running",
        "placement-while-suspended",
        "metadata-only",
    ],
)
async def test_the_server_refuses_what_jobsets_webhook_refuses(
    kubeapi: KubeAPIServer, suspended: bool, change: Callable[[Obj], None], refused: bool
) -> None:
    """A merge patch of the JobSet's spec (with a mark in metadata, as Kueue's preemption
    writes) is refused by the webhook (403) exactly when it changes more than a suspended JobSet's
    pod placement; a refused one changes nothing."""
    kubeapi.add_resource(JOBSET)
    job = manifest("jobset.yaml")
    job["spec"]["suspend"] = suspended
    await kubeapi.create(job)
    change(job["spec"]["replicatedJobs"][1])
    body = {"metadata": {"annotations": {"ebbtide.io/preempted": "w"}}, "spec": job["spec"]}
    async with ApiClient(Configuration(host=kubeapi.url)) as api:
        io = Io(api, attempts=1)
        if not refused:
            await io.request("PATCH", PATH, body)
            return
        with pytest.raises(KubeError) as caught:
            await io.request("PATCH", PATH, body)
    assert caught.value.status == 403
    assert (
        'admission webhook "vjobset.kb.io" denied the request: spec.replicatedJobs: Invalid value'
        in str(caught.value)
    )
    assert "field is immutable" in str(caught.value)
    stored = kubeapi.get("JobSet", "ml", "pytorch")
    assert stored is not None
    assert "annotations" not in stored["metadata"]


@pytest.mark.kube_rbac(kinds=["JobSet"])
async def test_a_jobset_is_never_resized(kubeapi: KubeAPIServer, kube_client: ApiClient) -> None:
    """4→2 and 4→6 of the workers are refused before any write, with the webhook's reason and
    an Event, under the chart's RBAC for JobSet (which grants no write)."""
    kubeapi.add_resource(JOBSET)
    job = manifest("jobset.yaml")
    job["metadata"]["annotations"] = {"ebbtide.io/scale-group": "workers"}
    await kubeapi.create(job)
    act = kind_actuator(kube_client, ("JobSet",))
    results = await act.apply(
        [scale("ml/pytorch", "JobSet", 4, 2), scale("ml/pytorch", "JobSet", 4, 6)]
    )
    assert [r.outcome for r in results] == [Outcome.REFUSED, Outcome.REFUSED], results
    assert all("webhook refuses any change" in r.detail for r in results)
    assert writes(kubeapi) == []
    assert {e["reason"] for e in kubeapi.objects("events", "ml")} == {"EbbtideRefused"}


@pytest.mark.kube_rbac(kinds=["JobSet", "Job"])
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


@pytest.mark.kube_rbac(kinds=["Job", "JobSet"])
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


@pytest.mark.kube_rbac(kinds=["JobSet"], kueue=True)
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

"""batch/v1 Jobs and Kueue: a plain Job is resized through ``parallelism``; a Job that Kueue
admitted is never resized nor has its pods evicted behind Kueue's back — it is preempted by
deactivating its Kueue Workload and resumed by activating it, once, across restarts — against
the test API server with Kueue's sample Job and the Workload Kueue makes for it."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from controller.kube.translate import Priorities
from controller.kube.workloads import kueue
from controller.kube.workloads.job import JOBS
from controller.kube.workloads.kueue import PREEMPTED
from controller.loop.port import Outcome
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod
from support.workload_kinds import (
    JOB,
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
pytestmark = pytest.mark.kube_rbac(kinds=["Job"])
WORKLOAD = "job-sample-job-3f1c7"
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads"
JOB_PATH = "/apis/batch/v1/namespaces/ml/jobs/sample-job"


async def admitted_job(kubeapi: KubeAPIServer) -> Obj:
    """Kueue's sample Job, admitted: the Job, its Workload (owned by it) and one running pod."""
    kubeapi.add_resource(JOB)
    kubeapi.add_resource(KUEUE_WORKLOAD)
    job = await kubeapi.create(manifest("kueue-job.yaml", "Job"))
    uid = job["metadata"]["uid"]
    workload = manifest("kueue-job.yaml", "Workload")
    workload["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] = uid
    workload["metadata"]["ownerReferences"][0]["uid"] = uid
    await kubeapi.create(workload)
    pod = make_pod("sample-job-x7k2p", namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "sample-job", "uid": uid,
         "controller": True}
    ]  # fmt: skip
    await kubeapi.create(pod)
    return job


def active(kubeapi: KubeAPIServer) -> bool:
    return kueue_state(kubeapi, WORKLOAD, "Job", "sample-job")[0]


def mark(kubeapi: KubeAPIServer) -> str | None:
    return kueue_state(kubeapi, WORKLOAD, "Job", "sample-job")[1]


async def test_a_kueue_job_is_preempted_through_its_workload_once(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Evicting a pod of an admitted Job marks the Job, then deactivates its Workload
    (spec.active=false); no Eviction is posted. A second eviction, by a restarted controller,
    finds the mark and the inactive Workload and writes nothing."""
    await admitted_job(kubeapi)
    (first,) = await kind_actuator(kube_client, ("Job",)).apply(
        [evict("ml/sample-job-x7k2p", "ml/sample-job")]
    )
    assert first.outcome is Outcome.APPLIED, first.detail
    assert f"deactivated Kueue Workload {WORKLOAD}" in first.detail
    assert (active(kubeapi), mark(kubeapi)) == (False, WORKLOAD)
    assert writes(kubeapi) == [("PATCH", JOB_PATH), ("PATCH", f"{WORKLOADS}/{WORKLOAD}")]
    (again,) = await kind_actuator(kube_client, ("Job",)).apply(
        [evict("ml/sample-job-x7k2p", "ml/sample-job")]
    )
    assert again.outcome is Outcome.ALREADY_DONE, again.detail
    assert len(writes(kubeapi)) == 2


async def test_dry_run_preemption_writes_nothing(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """In dry-run the Workload is found and named, and nothing is written."""
    await admitted_job(kubeapi)
    act = kind_actuator(kube_client, ("Job",), dry_run=True)
    (result,) = await act.apply([evict("ml/sample-job-x7k2p", "ml/sample-job")])
    assert result.outcome is Outcome.DRY_RUN
    assert f"would deactivate Kueue Workload {WORKLOAD}" in result.detail
    assert writes(kubeapi) == []
    assert active(kubeapi)


async def test_a_kueue_job_is_never_resized_and_resumes_when_grown(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A shrink of the admitted Job is refused (Kueue would requeue it). Once preempted and
    suspended by Kueue it shows 0 replicas, growable to its parallelism; the grow activates the
    Workload again and clears the mark."""
    await admitted_job(kubeapi)
    act = kind_actuator(kube_client, ("Job",))
    (shrink,) = await act.apply([scale("ml/sample-job", "Job", 3, 2)])
    assert shrink.outcome is Outcome.REFUSED
    assert "Kueue" in shrink.detail
    await act.apply([evict("ml/sample-job-x7k2p", "ml/sample-job")])
    await kubeapi.patch("Job", "ml", "sample-job", {"spec": {"suspend": True}})  # Kueue's part
    job = kubeapi.get("Job", "ml", "sample-job")
    assert job is not None
    w = JOBS.workload(job, Priorities())
    assert (w.replicas, w.min_replicas, w.max_replicas) == (0, 0, 3)
    (grow,) = await act.apply([scale("ml/sample-job", "Job", 0, 1)])
    assert grow.outcome is Outcome.APPLIED, grow.detail
    assert (active(kubeapi), mark(kubeapi)) == (True, None)


async def test_a_job_suspended_by_someone_else_is_not_resumed(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A suspended Job without Ebbtide's mark may not grow: refused, nothing written."""
    kubeapi.add_resource(JOB)
    job = manifest("kueue-job.yaml", "Job")
    job["spec"]["suspend"] = True
    await kubeapi.create(job)
    assert JOBS.workload(job, Priorities()).max_replicas == 0
    (result,) = await kind_actuator(kube_client, ("Job",)).apply(
        [scale("ml/sample-job", "Job", 0, 1)]
    )
    assert result.outcome is Outcome.REFUSED
    assert "someone else" in result.detail
    assert writes(kubeapi) == []


async def test_a_plain_job_is_resized_through_parallelism(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Without Kueue, 3→2 patches spec.parallelism on the Job, conditionally."""
    kubeapi.add_resource(JOB)
    job = manifest("kueue-job.yaml", "Job")
    del job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    await kubeapi.create(job)
    (result,) = await kind_actuator(kube_client, ("Job",)).apply(
        [scale("ml/sample-job", "Job", 3, 2)]
    )
    assert result.outcome is Outcome.APPLIED, result.detail
    stored = kubeapi.get("Job", "ml", "sample-job")
    assert stored is not None
    assert stored["spec"]["parallelism"] == 2
    assert writes(kubeapi) == [("PATCH", JOB_PATH)]


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
    assert (active(kubeapi), mark(kubeapi)) == (
        True,
        WORKLOAD,
    )
    kubeapi.faults.clear()
    restarted = kind_actuator(kube_client, ("Job",))
    (again,) = await restarted.apply([evict("ml/sample-job-x7k2p", "ml/sample-job")])
    assert again.outcome is Outcome.APPLIED, again.detail
    assert not active(kubeapi)
    (third,) = await restarted.apply([evict("ml/sample-job-x7k2p", "ml/sample-job")])
    assert third.outcome is Outcome.ALREADY_DONE, third.detail
    await kubeapi.patch("Job", "ml", "sample-job", {"spec": {"suspend": True}})  # Kueue's part
    (grow,) = await kind_actuator(kube_client, ("Job",)).apply(
        [scale("ml/sample-job", "Job", 0, 3)]
    )
    assert grow.outcome is Outcome.APPLIED, grow.detail
    assert (active(kubeapi), mark(kubeapi)) == (True, None)


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
    assert active(kubeapi)
    assert not any(path.startswith(WORKLOADS) for _, path in writes(kubeapi))


@pytest.mark.parametrize(
    ("labels", "annotations", "managed"),
    [
        ({"kueue.x-k8s.io/queue-name": "q"}, {}, True),
        ({}, {"kueue.x-k8s.io/queue-name": "q"}, True),
        ({"kueue.x-k8s.io/prebuilt-workload-name": "w"}, {}, True),
        ({}, {PREEMPTED: "w"}, True),
        ({"app": "x"}, {"example.com/kueue": "no"}, False),
    ],
    ids=["queue-label", "old-annotation", "prebuilt", "ebbtides-mark", "none"],
)
def test_kueues_own_labels_and_annotations_say_it_is_kueues(
    labels: dict[str, str], annotations: dict[str, str], managed: bool
) -> None:
    """Any kueue.x-k8s.io/ label or annotation (or Ebbtide's mark) makes a job Kueue's: fixed
    bounds and a Kueue refusal for a resize."""
    job = manifest("kueue-job.yaml", "Job")
    job["metadata"]["labels"] = labels
    job["metadata"]["annotations"] = annotations
    assert kueue.managed(job) is managed
    w = JOBS.workload(job, Priorities())
    assert ((w.min_replicas, w.max_replicas) == (3, 3)) is managed
    assert ("Kueue" in (JOBS.refusal(job, 2) or "")) is managed


async def test_a_prebuilt_workload_is_found_by_its_label(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A Job naming its prebuilt Workload (and no owner reference on it) is stopped through
    that Workload, read by name: no LIST of the namespace's Workloads."""
    await admitted_job(kubeapi)
    await kubeapi.patch(
        "Job", "ml", "sample-job",
        {"metadata": {"labels": {"kueue.x-k8s.io/prebuilt-workload-name": WORKLOAD}}},
    )  # fmt: skip
    await kubeapi.patch("Workload", "ml", WORKLOAD, {"metadata": {"ownerReferences": None}})
    (result,) = await kind_actuator(kube_client, ("Job",)).apply(
        [evict("ml/sample-job-x7k2p", "ml/sample-job")]
    )
    assert result.outcome is Outcome.APPLIED, result.detail
    assert (active(kubeapi), mark(kubeapi)) == (False, WORKLOAD)
    assert not any(r.method == "GET" and r.path == WORKLOADS for r in kubeapi.requests)

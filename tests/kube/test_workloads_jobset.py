"""JobSet (no ``/scale``): resized through its replicated job's ``replicas`` with a conditional
merge patch, the other replicated jobs left as they are — against the test API server with the
JobSet example manifest."""

from __future__ import annotations

from pathlib import Path

from kubernetes_asyncio.client import ApiClient

from controller.cluster import Outcome
from controller.kube.state import workload_kinds
from controller.kube.translate import Priorities
from controller.kube.workloads.jobset import JOBSETS
from controller.settings import Settings
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod
from support.workload_kinds import (
    JOB,
    JOBSET,
    TRAINING,
    kind_actuator,
    manifest,
    scale,
    synced_state,
    writes,
)


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
    pod = make_pod("pytorch-workers-0-0-abcde", namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = "pytorch"
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "pytorch-workers-0", "uid": "j",
         "controller": True}
    ]  # fmt: skip
    await kubeapi.create(pod)
    settings = Settings(policies=[Path("p.yaml")], kube={"workload_kinds": ["JobSet", "Job"]})
    kinds = workload_kinds(settings.kube.workload_kinds)
    async with synced_state(kube_client, kinds=kinds) as state:
        snapshot = state.snapshot()
    assert [(w.key, w.kind) for w in snapshot.workloads] == [("ml/pytorch", "JobSet")]
    assert [p.workload for p in snapshot.pods] == ["ml/pytorch"]

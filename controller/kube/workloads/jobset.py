"""JobSet (``jobset.x-k8s.io/v1alpha2``): never resized, only preempted.

A JobSet runs ``replicas`` Jobs per replicated job, each of ``parallelism`` pods; the replicas
Ebbtide counts are one replicated job's (the first, or the one
:data:`~controller.kube.workloads.base.SCALE_GROUP` names), and a replica is a whole Job, so it
takes ``parallelism`` times the pod's GPUs.

JobSet's validating webhook makes ``spec.replicatedJobs`` immutable (kubernetes-sigs/jobset
``pkg/webhooks/jobset_webhook.go`` ``ValidateUpdate``): only the pod template's metadata,
nodeSelector, tolerations and scheduling gates of a suspended JobSet may change, so any write of
``replicas`` is refused (403, "admission webhook … denied the request"). The alpha ``ElasticJobSet``
gate (off by default) lets ``parallelism`` and ``completions`` of Indexed jobs change, never
``replicas``; that would resize every Job of the replicated job at once, pods not replicas, and is
not used. So a JobSet's size is fixed (:attr:`~controller.kube.workloads.base.Adapter.fixed_size`):
the engine plans no shrink or grow of it, whatever its annotations say; it is preempted whole
through Kueue when Kueue admits it, else by evicting its pods (the whole gang when a PodGroup's
minMember says so), and its RBAC grants no write unless Kueue support is on (the preemption's mark).
"""

from __future__ import annotations

from typing import Final

from controller.kube.translate import Obj, WorkloadKind, get_path
from controller.kube.workloads.base import Adapter, in_group, int_or_none

__all__ = ["JOBSET", "JOBSETS", "JobSetAdapter"]

JOBSET: Final = WorkloadKind(
    kind="JobSet",
    group="jobset.x-k8s.io",
    version="v1alpha2",
    plural="jobsets",
    replicas_path="spec.replicatedJobs.0.replicas",
    template_path="spec.replicatedJobs.0.template.spec.template",
    pod_label="jobset.sigs.k8s.io/jobset-name",
)


class JobSetAdapter(Adapter):
    """See the module docstring."""

    fixed_size = (
        "JobSet's webhook refuses any change of spec.replicatedJobs (replicas included): a "
        "JobSet is never resized, only preempted"
    )

    def located(self, obj: Obj) -> WorkloadKind:
        return in_group(self.kind, obj, "spec.replicatedJobs", "name", "template.spec.template")

    def gpus_per_replica(self, obj: Obj, pod_gpus: int) -> int:
        job_spec = self.located(obj).template_path.removesuffix(".template")
        parallelism = int_or_none(get_path(obj, f"{job_spec}.parallelism"))
        return pod_gpus * (1 if parallelism is None else parallelism)


JOBSETS = JobSetAdapter(JOBSET)

"""JobSet (``jobset.x-k8s.io/v1alpha2``): no ``/scale`` subresource.

A JobSet runs ``replicas`` Jobs per replicated job, each of ``parallelism`` pods. Ebbtide resizes
one replicated job (the first, or the one :data:`~controller.kube.workloads.base.SCALE_GROUP`
names) by writing its ``replicas`` (elastic JobSets allow it; the JobSet controller removes the
highest job indexes first). A replica is a whole Job, so it takes ``parallelism`` times the pod's
GPUs. JobSet has no bounds of its own: they come from Ebbtide's annotations.
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

    def located(self, obj: Obj) -> WorkloadKind:
        return in_group(self.kind, obj, "spec.replicatedJobs", "name", "template.spec.template")

    def gpus_per_replica(self, obj: Obj, pod_gpus: int) -> int:
        job_spec = self.located(obj).template_path.removesuffix(".template")
        parallelism = int_or_none(get_path(obj, f"{job_spec}.parallelism"))
        return pod_gpus * (1 if parallelism is None else parallelism)


JOBSETS = JobSetAdapter(JOBSET)

"""``batch/v1`` Jobs: resized through ``spec.parallelism`` (bounds from Ebbtide's annotations).

A Job Kueue admits is stopped and resumed through its Kueue Workload like any other kind
(:mod:`~controller.kube.workloads.kueue`); while suspended it shows 0 replicas.
"""

from __future__ import annotations

from typing import Final

from controller.kube.translate import WorkloadKind
from controller.kube.workloads import kueue
from controller.kube.workloads.base import Adapter

__all__ = ["JOB", "JOBS", "JobAdapter"]

JOB: Final = WorkloadKind(
    kind="Job",
    group="batch",
    version="v1",
    plural="jobs",
    replicas_path="spec.parallelism",
    template_path="spec.template",
)


class JobAdapter(Adapter):
    """No owner rules of its own; Kueue's RBAC is always granted (Jobs are what Kueue admits
    most)."""

    extra_rules = (kueue.RULE,)


JOBS = JobAdapter(JOB)

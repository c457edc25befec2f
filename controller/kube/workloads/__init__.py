"""Workload adapters: how Ebbtide acts on each kind the way its owner expects.

One interface (:class:`~controller.kube.workloads.base.Adapter`), one file per kind, like KEDA's
scalers: ``apps`` (Deployment, StatefulSet through ``/scale``), ``pytorchjob`` (Kubeflow
``elasticPolicy``), ``jobset``, ``raycluster`` (KubeRay ``workersToDelete``) and ``job``
(``batch/v1``, Kueue's Workloads). :data:`ADAPTERS` registers them by kind name, the names the
``kube.workload_kinds`` setting uses; informers, the actuator and RBAC all follow that setting.
:mod:`~controller.kube.workloads.autoscalers` finds the HPAs and KEDA ScaledObjects Ebbtide
must not fight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from controller.kube.workloads import kueue
from controller.kube.workloads.apps import DEPLOYMENTS, STATEFULSETS
from controller.kube.workloads.base import Adapter, Io, Patch
from controller.kube.workloads.job import JOBS
from controller.kube.workloads.jobset import JOBSETS
from controller.kube.workloads.pytorchjob import PYTORCHJOBS
from controller.kube.workloads.raycluster import RAYCLUSTERS

__all__ = ["ADAPTERS", "Adapter", "Io", "Patch", "kueue"]

ADAPTERS: Final[Mapping[str, Adapter]] = {
    a.kind.kind: a for a in (DEPLOYMENTS, STATEFULSETS, PYTORCHJOBS, JOBSETS, RAYCLUSTERS, JOBS)
}
"""Every adapter by kind name (``Deployment``, ``PyTorchJob``, ``Job``…)."""

"""Settings of the Kubernetes adapter: the cluster, the Lease, the workload kinds, the MIG flow's
timeouts. A group of ``ebbtide run``'s settings (``kube:``, ``EBBTIDE_KUBE__*``), defined here so
the adapter does not depend on the process that runs it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DEFAULT_WORKLOAD_KINDS", "KubeSettings", "WorkloadKindName"]

WorkloadKindName = Literal["Deployment", "StatefulSet", "PyTorchJob", "JobSet", "RayCluster", "Job"]
"""The workload kinds the Kubernetes adapter knows (``controller.kube.state.WORKLOAD_KINDS``)."""
DEFAULT_WORKLOAD_KINDS: tuple[WorkloadKindName, ...] = ("Deployment", "StatefulSet", "PyTorchJob")


def _default_identity() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()


class KubeSettings(BaseModel):
    """The cluster, and the Lease replicas elect a leader with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: Path | None = None
    """Defaults to in-cluster configuration in a pod, else ``$KUBECONFIG`` or ~/.kube/config."""
    context: str | None = None
    lease_name: str = "ebbtide-controller"
    lease_namespace: str = "ebbtide-system"
    identity: str = Field(default_factory=_default_identity)
    """This replica's name in the Lease (the pod name in Kubernetes)."""
    lease_duration_s: int = Field(15, ge=2)
    renew_deadline_s: float = Field(10.0, gt=1)
    retry_period_s: float = Field(2.0, ge=1)
    node_selector: str = ""
    """Label selector of the nodes to watch (e.g. ``nvidia.com/gpu.present=true``)."""
    workload_kinds: tuple[WorkloadKindName, ...] = DEFAULT_WORKLOAD_KINDS
    """Workload kinds to watch and scale (JSON list in the environment). RBAC follows it: the
    chart renders its ClusterRole from the same value. A kind whose CRD is not installed is
    skipped, logged once, and picked up when it is."""
    mig_drain_timeout_s: float = Field(600.0, gt=0)
    """A MIG flow rolls back when the node's GPU pods are not gone this long after it started."""
    mig_reconfigure_timeout_s: float = Field(900.0, gt=0)
    """...when the MIG manager has not reported ``success`` this long after the label was set."""
    mig_reboot_timeout_s: float = Field(1800.0, gt=0)
    """A node the MIG manager reports ``rebooting`` gets at least this long before a rollback."""
    mig_advertise_timeout_s: float = Field(300.0, gt=0)
    """...and this long after ``success`` for the device plugin to advertise the layout."""
    objective_namespaces: tuple[str, ...] = ()
    """Namespaces whose ServiceObjectives join the policy (the chart's
    ``serviceObjectives.namespaces``; JSON list in the environment): empty, none is watched
    (the ConfigMap-only mode); ``["*"]``, every namespace. RBAC follows it: the chart grants
    the resource and its status only there."""
    objective_status_every_s: float = Field(15.0, gt=0)
    """A ServiceObjective's status is written at most once per this many seconds, and only when
    it changed (the HPA writes its status once per sync period, 15 s by default:
    kube-controller-manager's ``--horizontal-pod-autoscaler-sync-period``)."""

    @model_validator(mode="after")
    def _distinct_kinds(self) -> KubeSettings:
        if len(set(self.workload_kinds)) != len(self.workload_kinds):
            raise ValueError(f"workload_kinds lists a kind twice: {list(self.workload_kinds)}")
        if "*" in self.objective_namespaces and len(self.objective_namespaces) > 1:
            raise ValueError(
                "objective_namespaces: '*' (every namespace) stands alone; got "
                f"{list(self.objective_namespaces)}"
            )
        return self

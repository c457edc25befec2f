"""The Kubernetes cluster runtime: watches, actuator and leader election, assembled.

:class:`KubeRuntime` is what ``ebbtide run --cluster kube`` hands the controller: the cluster
port (a snapshot from :class:`~controller.kube.state.KubeClusterState`, decisions carried out by
:class:`~controller.kube.actuator.KubeActuator` behind a :class:`~controller.loop.gate.SafetyGate`),
leadership from a Lease (:class:`~controller.kube.leader.LeaderElector`), the per-tick
upkeep that moves MIG conversions along, and, where the ``kube.objective_namespaces`` setting
allows any, the ServiceObjectives (:class:`~controller.kube.objectives.ObjectiveSync`): the
cluster counts as synced only once they are listed too, so no decision is made without the
objectives and pauses teams set. Every replica watches; only the leader writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kubernetes_asyncio.client import ApiClient

from controller.kube.actuator import KubeActuator, MigFlowSettings
from controller.kube.client import connect
from controller.kube.kube_settings import KubeSettings
from controller.kube.leader import LeaderElector, LeaseSettings
from controller.kube.objectives import ObjectiveSync
from controller.kube.state import ClusterStateSettings, KubeClusterState, workload_kinds
from controller.loop.gate import SafetyGate
from controller.loop.port import ActionResult, Cluster, Notice
from policies.budgets import Ledger
from policies.decisions import Decision
from policies.model import Policy
from policies.snapshot import Snapshot

__all__ = ["KubeCluster", "KubeRuntime"]


class KubeCluster:
    """The cluster port over the watch cache and the actuator."""

    def __init__(
        self,
        state: KubeClusterState,
        actuator: KubeActuator,
        objectives: ObjectiveSync | None = None,
    ) -> None:
        self.state = state
        self.actuator = actuator
        self.objectives = objectives

    @property
    def synced(self) -> bool:
        return self.state.synced and (self.objectives is None or self.objectives.synced)

    def snapshot(self) -> Snapshot:
        return self.state.snapshot()

    async def apply(self, decisions: Sequence[Decision]) -> list[ActionResult]:
        return await self.actuator.apply(decisions)

    async def report(self, result: ActionResult) -> None:
        await self.actuator.report(result)

    async def notice(self, notice: Notice) -> None:
        await self.actuator.notice(notice)


class KubeRuntime:
    """A real cluster through its API. Build with :meth:`connect`."""

    def __init__(
        self, api: ApiClient, kube: KubeSettings, policy: Policy, *, dry_run: bool
    ) -> None:
        k = kube
        self._api = api
        self.elector = LeaderElector(
            api,
            identity=k.identity,
            settings=LeaseSettings(
                name=k.lease_name,
                namespace=k.lease_namespace,
                lease_duration_s=k.lease_duration_s,
                renew_deadline_s=k.renew_deadline_s,
                retry_period_s=k.retry_period_s,
            ),
        )
        self.gate = SafetyGate(policy, is_leader=self.is_leader, dry_run=dry_run)
        kinds = workload_kinds(k.workload_kinds)
        self.state = KubeClusterState(
            api, ClusterStateSettings(node_selector=k.node_selector or None, workload_kinds=kinds)
        )
        mig = MigFlowSettings(
            drain_timeout_s=k.mig_drain_timeout_s,
            reconfigure_timeout_s=k.mig_reconfigure_timeout_s,
            reboot_timeout_s=k.mig_reboot_timeout_s,
            advertise_timeout_s=k.mig_advertise_timeout_s,
        )
        actuator = KubeActuator(
            api,
            self.gate,
            nodes=self.state.nodes,
            workload_kinds=kinds,
            mig=mig,
            owners=self.state.owners,
        )
        self.objectives = (
            ObjectiveSync(api, k.objective_namespaces, every_s=k.objective_status_every_s)
            if k.objective_namespaces
            else None
        )
        """The ServiceObjectives (``None`` in the ConfigMap-only mode)."""
        self._cluster = KubeCluster(self.state, actuator, self.objectives)

    @classmethod
    async def connect(cls, kube: KubeSettings, policy: Policy, *, dry_run: bool) -> KubeRuntime:
        """Connect with in-cluster config or a kubeconfig (``KubeConfigError`` if neither)."""
        api = await connect(kube.kubeconfig, context=kube.context)
        return cls(api, kube, policy, dry_run=dry_run)

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    @property
    def ledger(self) -> Ledger:
        return self.gate.ledger

    def is_leader(self) -> bool:
        return self.elector.is_leader

    def reconfigure(self, policy: Policy) -> None:
        self.gate.reconfigure(policy)

    async def run(self) -> None:
        extra = [self.objectives.run()] if self.objectives is not None else []
        await asyncio.gather(self.state.run(), self.elector.run(), *extra)

    async def tick(self, now: float) -> list[ActionResult]:
        """Move MIG conversions along and clear expired checkpoint notices (the leader only:
        followers never write)."""
        if not self.is_leader() or not self.state.synced:
            return []
        actuator = self._cluster.actuator
        await actuator.expire_notices(self.state.snapshot().pods)
        return await actuator.resume_all()

    async def close(self) -> None:
        self.state.stop()
        if self.objectives is not None:
            self.objectives.stop()
        await self._api.close()

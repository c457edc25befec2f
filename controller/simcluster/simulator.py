"""A simulated GPU cluster behind the cluster port: time-driven effects, a simple scheduler.

Design:

* **Discrete events.** The cluster is a heap of timed effects (a pod's grace period ends, a pod
  finishes starting, a workload controller creates replacement pods, a node finishes draining or
  reconfiguring). :meth:`SimCluster.advance` runs every effect due up to ``now`` in time order
  (ties in the order they were scheduled) and, after each instant, lets the scheduler place
  pending pods. Nothing due means one heap peek: advancing an idle cluster costs nothing.
* **Deterministic.** No wall clock, no hash-ordered iteration; the only randomness (does a MIG
  reconfiguration fail?) comes from a ``random.Random(seed)``. The same seed, scenario and
  decisions give the same :attr:`SimCluster.effects`.
* **The port.** :meth:`snapshot` returns the same :class:`~policies.snapshot.Snapshot` object
  while nothing changed (the engine caches indexes on its identity); pod, node and workload
  tuples are rebuilt only for the part that changed. :meth:`apply` carries decisions out at the
  current simulated time (advancing first to a later ``decision.at``) and never raises for one
  decision. Outcomes follow the Kubernetes adapter (a gone or terminating pod, replicas or a
  MIG layout already at target: ``ALREADY_DONE``; a MIG flow started or under way:
  ``IN_PROGRESS``; dry-run: ``DRY_RUN``, nothing changes).
* **Effects** (delays from :class:`SimDelays`): *Evict* marks the pod terminating; it keeps its
  GPUs until the decision's ``grace_s`` ends. A pod owned by a workload is replaced at
  once (``replace_create_s``, 0 by default: a ReplicaSet does not count a terminating pod)
  because the workload still wants its replicas: evicting without shrinking only moves the pod,
  and the replacement waits in the scheduler's queue for the GPUs the evicted pod still holds.
  *Scale* sets replicas; missing pods appear after ``scale_up_create_s``,
  extra ones are removed at once with the default grace in the ReplicaSet's order: unscheduled
  first, then not running, then the decision's ``remove`` (the pods a real cluster's
  ``pod-deletion-cost`` marks), then newest. *MigConvert/MigRevert* (the node's ``mig_flow`` set
  while under way) drain by the one rule a real cluster follows (:mod:`policies.drain`,
  :attr:`SimCluster.drain`): when a GPU pod on the node may not be evicted (inference, protected
  namespace, ``do-not-disrupt``, not training) the flow fails before changing anything
  (``FAILED``, a ``mig_failed`` effect), as the Kubernetes flow rolls back before evicting
  anything; so does a layout the node's MIG strategy cannot serve (a node labelled
  ``nvidia.com/mig.strategy=single`` and a config of several profiles,
  :func:`policies.miglayout.unservable`), as the Kubernetes flow fails it at start. Otherwise
  they cordon the node (``mig.config.state: pending``), evict its GPU pods
  with the default grace (pods without GPUs stay), then set ``nvidia.com/mig.config`` and
  reconfigure for ``mig_reconfigure_s``; with probability ``mig_failure_probability`` that fails
  and the node rolls back to its previous layout (``state: failed``), else its GPUs become MIG
  slices (or whole cards) and it is relabelled into the target pool using the pool's
  ``nodeSelector``, and, under ``single``, as GPU feature discovery relabels it
  (``nvidia.com/gpu.product`` ``…-MIG-<profile>``, ``nvidia.com/gpu.count`` the instances:
  :func:`policies.miglayout.gfd_labels`) when it carries those labels. Either way it is
  uncordoned unless it was cordoned before.
* **Quota admission.** A namespace with a ``requests.nvidia.com/gpu`` quota in the starting
  snapshot gets no pod that would take its live pods' GPUs past ``hard``: a workload controller
  stays short of replicas (no effect is logged) and tries again when a pod of the namespace
  goes. The snapshot shows each quota with that use, as the quota controller reports it.
* **Scheduler** (:mod:`controller.simcluster.nodeindex`): pending pods, highest priority first, then
  oldest (kube-scheduler's queue order, ``PrioritySort.Less`` in kubernetes
  ``pkg/scheduler/framework/plugins/queuesort/priority_sort.go``; ties here go by creation,
  there by the time a pod was last queued), go to the fitting node with the fewest free GPUs:
  whole cards on non-MIG nodes, MIG requests on nodes with free instances of each profile,
  never on cordoned or reconfiguring nodes, only on nodes carrying the pod's selector (its
  workload's pool and template), meeting its required node affinity and whose taints it
  tolerates (:func:`policies.placement.admits`, as the engine plans). A bound pod is
  ``Pending`` until ``pod_startup_s`` (or its workload's own :attr:`PodTemplate.startup_s`)
  passes, then ``Running``.
* **Scheduler preemption** (off unless :attr:`SimCluster.preemption` is set; never while the
  starting cluster settles): kube-scheduler's DefaultPreemption with PriorityClasses. A pending
  pod that fits nowhere picks a node where evicting pods of *lower* priority makes it fit
  (:func:`~controller.simcluster.nodeindex.preemption_plan`: fewest and least important victims),
  evicts them with the pods' grace period (``eviction_grace_s``: they keep their GPUs until it
  ends), is nominated to that node and waits; while victims there are still terminating it
  preempts nothing more, and what it will take there is not free to pods of lower or equal
  priority. When they are gone the scheduler places it like any pod (on that node or wherever
  it now fits). A preempted workload pod is replaced, like an evicted one.
"""

from __future__ import annotations

import heapq
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from controller.loop.port import ActionResult, Notice, Outcome
from controller.simcluster.nodeindex import (
    Flight,
    NodeIndex,
    NodeRec,
    PodRec,
    gpu_use,
    mig_layout,
    preemption_plan,
)
from controller.simcluster.values import (
    DEFAULT_TRAINING_SELECTOR,
    EPOCH,
    UNPOOLED,
    Effect,
    EffectKind,
    GpuUse,
    PodTemplate,
    SimDelays,
)
from policies.decisions import Decision, Evict, MigConvert, MigRevert, Scale
from policies.drain import DrainRule, must_leave, plan_drain
from policies.inventory import matches
from policies.miglayout import gfd_labels, layout_of, strategy_of, unservable
from policies.model import PolicySpec, PoolSpec
from policies.snapshot import (
    MIG_DISABLED,
    FrozenMap,
    GpuQuota,
    Node,
    Pod,
    PodPhase,
    Snapshot,
    Workload,
)

if TYPE_CHECKING:
    from controller.simcluster.scenario import Scenario
    from policies.model import Policy

__all__ = ["SimCluster"]

_SUFFIX: Final = re.compile(r"-(\d+)$")


class SimCluster:
    """A deterministic simulated cluster implementing the :class:`~controller.loop.port.Cluster`
    port, plus :meth:`advance` and read-only views for reports."""

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        delays: SimDelays | None = None,
        seed: int = 0,
        start: float = EPOCH,
        pools: Mapping[str, PoolSpec] | None = None,
        training_selector: Mapping[str, str] = DEFAULT_TRAINING_SELECTOR,
        templates: Mapping[str, PodTemplate] | None = None,
        pod_selectors: Mapping[str, Mapping[str, str]] | None = None,
        convert_to: str | None = None,
        revert_to: str | None = None,
        drain: DrainRule | None = None,
        preemption: bool = False,
        mig_configs: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        """Start from ``snapshot`` at ``start``. Workloads missing pods get them at once and
        pending pods are placed at once, already Running: the snapshot is a settled cluster.
        ``templates`` (by workload key) and ``pod_selectors`` (by pod key) say where pods may run;
        converted nodes join ``convert_to`` (default: the first ``mig`` pool by name), reverted
        ones ``revert_to`` (default: the first ``whole`` pool). ``drain`` is the policy's drain
        rule (default: a policy's default protected namespaces and ``training_selector``);
        ``mig_configs`` the policy's named MIG configs (mixed layouts)."""
        self.delays = delays or SimDelays()
        self.seed = seed
        self.notices: list[Notice] = []
        """What :meth:`notice` was told, in order (no Events in a simulation)."""
        self._rng = random.Random(seed)
        self._now = start
        self._pools = dict(sorted((pools or {}).items()))
        kinds = [(n, p.kind) for n, p in self._pools.items()]
        self._convert_to = convert_to or next((n for n, k in kinds if k == "mig"), None)
        self._revert_to = revert_to or next((n for n, k in kinds if k == "whole"), None)
        self.training_selector: Mapping[str, str] = FrozenMap(training_selector)
        self.drain = drain or DrainRule(
            protected_namespaces=frozenset(PolicySpec.model_fields["protected_namespaces"].default),
            training_selector=self.training_selector,
            inference_workloads=frozenset(),
        )
        """Which pods a MIG drain may evict; the gated cluster keeps it the policy's."""
        self.preemption = preemption
        self._mig_configs = mig_configs
        """The scheduler preempts lower-priority pods (kube's DefaultPreemption); see above."""
        self.preemptions = 0
        """Pods the scheduler has preempted so far."""
        self._nominated: dict[str, None] = {}
        self._templates = dict(templates or {})
        self._queue: list[tuple[float, int, str, str]] = []
        self._seq = 0
        self._effects: list[Effect] = []
        self._nodes: dict[str, NodeRec] = {}
        self._index = NodeIndex()
        self._pods: dict[str, PodRec] = {}
        self._pending: dict[str, None] = {}
        self._workloads: dict[str, Workload] = {w.key: w for w in snapshot.workloads}
        self._wl_pods: dict[str, dict[str, None]] = {k: {} for k in self._workloads}
        self._next_index: dict[str, int] = {}
        self._classes = snapshot.priority_classes
        self._quota_hard = {q.namespace: q.hard for q in snapshot.quotas}
        self._ns_gpus: dict[str, int] = {}
        """GPUs requested by the live pods of each namespace with a quota (its quota's use)."""
        self._dirty = False
        self._instant = True
        self._snap: Snapshot | None = None
        self._node_tuple: tuple[Node, ...] | None = None
        self._pod_tuple: tuple[Pod, ...] | None = None
        self._wl_tuple: tuple[Workload, ...] | None = None
        self._usage: dict[str, GpuUse] | None = None
        for node in sorted(snapshot.nodes, key=lambda n: n.name):
            rec = self._nodes[node.name] = NodeRec.of(node)
            self._index.update(rec)
        selectors = pod_selectors or {}
        for pod in snapshot.pods:
            sel = selectors.get(pod.key)
            if sel is None and pod.workload is not None:
                sel = self._template(pod.workload).node_selector
            self._add_pod(pod, sel or {})
        for key in self._workloads:
            self._reconcile(key)
        self._schedule()
        self._instant = False

    @classmethod
    def from_scenario(
        cls, scenario: Scenario, *, start: float = EPOCH, policy: Policy | None = None
    ) -> SimCluster:
        """The cluster a :class:`~controller.simcluster.scenario.Scenario` describes; a
        :class:`~policies.model.Policy` supplies pools, training selector and MIG pools."""
        from controller.simcluster.scenario import build_cluster

        return build_cluster(scenario, start=start, policy=policy)

    @property
    def synced(self) -> bool:
        """Always true: the simulator knows its whole state."""
        return True

    @property
    def now(self) -> float:
        """The current simulated time."""
        return self._now

    def snapshot(self) -> Snapshot:
        """The current view; the same object until something changes."""
        if self._snap is None:
            if self._node_tuple is None:
                self._node_tuple = tuple(r.node for r in self._nodes.values())
            if self._pod_tuple is None:
                recs = sorted(self._pods.values(), key=lambda r: (r.pod.namespace, r.pod.name))
                self._pod_tuple = tuple(r.pod for r in recs)
            if self._wl_tuple is None:
                self._wl_tuple = tuple(self._workloads[k] for k in sorted(self._workloads))
            quotas = tuple(
                GpuQuota(ns, hard, self._ns_gpus.get(ns, 0))
                for ns, hard in sorted(self._quota_hard.items())
            )
            self._snap = Snapshot(
                self._node_tuple, self._pod_tuple, self._wl_tuple, self._classes, quotas
            )
        return self._snap

    def advance(self, now: float) -> None:
        """Run every effect due up to ``now``; the scheduler runs after each instant."""
        queue = self._queue
        while queue and queue[0][0] <= now:
            at, _, kind, key = heapq.heappop(queue)
            self._now = max(self._now, at)
            self._handle(kind, key)
            if not queue or queue[0][0] > at:
                self._schedule()
        self._now = max(self._now, now)

    def next_due(self) -> float:
        """When the next effect falls due (a grace period, a pod's start-up, a MIG
        reconfiguration); ``inf`` when none is queued. Until then :meth:`advance` changes
        nothing but the clock."""
        queue = self._queue
        return queue[0][0] if queue else math.inf

    async def report(self, result: ActionResult) -> None:
        """A simulated cluster has no Events: the caller's decisions log is the record."""

    async def notice(self, notice: Notice) -> None:
        """No Events here either: the process's log line is the record; kept for tests."""
        self.notices.append(notice)

    async def apply(self, decisions: Sequence[Decision]) -> list[ActionResult]:
        """Carry out ``decisions`` in order at the current time (or a later ``decision.at``)."""
        results: list[ActionResult] = []
        for decision in decisions:
            if decision.at > self._now:
                self.advance(decision.at)
            try:
                outcome, detail = self._apply_one(decision)
            except Exception as exc:  # a bug here must not stop the other decisions
                outcome, detail = Outcome.FAILED, f"simulator error: {exc!r}"
            results.append(ActionResult(decision, outcome, detail))
            self._schedule()
        return results

    @property
    def effects(self) -> Sequence[Effect]:
        """Everything the cluster did, in order (read-only view)."""
        return tuple(self._effects)

    def effects_since(self, index: int) -> Sequence[Effect]:
        """Effects from position ``index`` on (for incremental reports)."""
        return tuple(self._effects[index:])

    def pod(self, key: str) -> Pod | None:
        """The pod ``namespace/name`` as it is now, or ``None`` when it is gone."""
        rec = self._pods.get(key)
        return None if rec is None else rec.pod

    def pending_pods(self) -> tuple[Pod, ...]:
        """Pods waiting for a node, highest priority then oldest first."""
        recs = sorted((self._pods[k] for k in self._pending), key=lambda r: r.order)
        return tuple(r.pod for r in recs)

    def pool_of(self, node: Node) -> str | None:
        """The first pool (by name) whose node selector ``node`` carries."""
        for name, pool in self._pools.items():
            if matches(pool.node_selector, node.labels):
                return name
        return None

    def gpus_by_use(self) -> Mapping[str, GpuUse]:
        """Physical GPUs per pool (:data:`UNPOOLED` for nodes in none) by current use."""
        if self._usage is not None:
            return self._usage
        pools = {name: self.pool_of(rec.node) or UNPOOLED for name, rec in self._nodes.items()}
        self._usage = gpu_use(self._nodes.values(), self._pods, pools, self.training_selector)
        return self._usage

    def _apply_one(self, d: Decision) -> tuple[Outcome, str]:
        if isinstance(d, Scale):
            return self._apply_scale(d)
        if isinstance(d, Evict):
            return self._apply_evict(d)
        return self._apply_mig(d)

    def _apply_scale(self, d: Scale) -> tuple[Outcome, str]:
        wl = self._workloads.get(d.workload)
        if wl is None:
            return Outcome.FAILED, f"workload {d.workload} not found"
        if d.to_replicas < 0:
            return Outcome.FAILED, f"cannot scale to {d.to_replicas} replicas"
        if wl.replicas == d.to_replicas:
            return Outcome.ALREADY_DONE, f"already at {wl.replicas}"
        if d.dry_run:
            return Outcome.DRY_RUN, f"would scale {wl.replicas} -> {d.to_replicas}"
        self._workloads[d.workload] = replace(wl, replicas=d.to_replicas)
        self._wl_tuple = None
        self._touch()
        self._log("scaled", d.workload, f"{wl.replicas} -> {d.to_replicas}")
        if d.to_replicas > wl.replicas:
            self._at(self._now + self.delays.scale_up_create_s, "reconcile", d.workload)
        else:
            self._reconcile(d.workload, frozenset(d.remove))
        return Outcome.APPLIED, f"scaled {wl.replicas} -> {d.to_replicas}"

    def _apply_evict(self, d: Evict) -> tuple[Outcome, str]:
        rec = self._pods.get(d.pod)
        if rec is None or rec.pod.phase in ("Succeeded", "Failed"):
            return Outcome.ALREADY_DONE, "the pod is gone"
        if rec.terminating:
            return Outcome.ALREADY_DONE, "the pod is terminating"
        if d.dry_run:
            return Outcome.DRY_RUN, f"would evict with grace {d.grace_s:g}s"
        self._terminate(rec, d.grace_s, "evicted")
        return Outcome.APPLIED, f"evicted, grace {d.grace_s:g}s"

    def _apply_mig(self, d: MigConvert | MigRevert) -> tuple[Outcome, str]:
        rec = self._nodes.get(d.node)
        if rec is None:
            return Outcome.FAILED, f"node {d.node} not found"
        if isinstance(d, MigConvert):
            target = d.profile if d.profile.startswith("all-") else f"all-{d.profile}"
            to_pool = self._convert_to
        else:
            target, to_pool = MIG_DISABLED, self._revert_to
        node = rec.node
        if rec.flight is not None:
            return Outcome.IN_PROGRESS, f"{d.node} is {rec.flight.phase} to {rec.flight.target}"
        if (node.mig_config or MIG_DISABLED) == target:
            return Outcome.ALREADY_DONE, f"{d.node} is at {target}"
        if (
            why := unservable(layout_of(target, self._mig_configs), strategy_of(node.labels))
        ) is not None:
            self._log("mig_failed", d.node, why)
            return Outcome.FAILED, why
        drain = plan_drain(
            self.drain, [r.pod for k in rec.pods if not (r := self._pods[k]).terminating]
        )
        pods = [p.key for p in drain.evict]
        plan = f"cordon {d.node}, evict {len(pods)} pods, set {target}"
        if drain.refusal is not None:
            if d.dry_run:
                return Outcome.DRY_RUN, f"would fail: {drain.refusal}"
            self._log("mig_failed", d.node, f"drain refused: {drain.refusal}")
            return Outcome.FAILED, f"rolled back: {drain.refusal}"
        if d.dry_run:
            return Outcome.DRY_RUN, f"would {plan}"
        rec.flight = Flight(target, node.mig_config, node.cordoned, to_pool)
        self._set_node(rec, replace(node, cordoned=True, mig_state="pending", mig_flow=True))
        self._log("cordoned", d.node, f"{d.action} to {target}")
        for key in pods:
            self._terminate(self._pods[key], self.delays.eviction_grace_s, f"draining {d.node}")
        self._at(self._now, "drained", d.node)
        return Outcome.IN_PROGRESS, f"started: {plan}"

    def _handle(self, kind: str, key: str) -> None:
        if kind == "gone":
            rec = self._pods.get(key)
            if rec is not None and rec.terminating:
                self._delete(rec, "grace period over")
        elif kind == "running":
            rec = self._pods.get(key)
            if rec is not None and rec.pod.node is not None and rec.pod.phase == "Pending":
                self._update_pod(rec, replace(rec.pod, phase="Running"))
                self._log("running", key, rec.pod.node or "")
        elif kind == "reconcile":
            self._reconcile(key)
        elif kind == "drained":
            self._drained(self._nodes[key])
        elif kind == "reconfigured":
            self._reconfigured(self._nodes[key])

    def _drained(self, rec: NodeRec) -> None:
        flight = rec.flight
        if flight is None or flight.phase != "draining":
            return
        leaving = [self._pods[k] for k in rec.pods if must_leave(self._pods[k].pod)]
        if leaving:  # still terminating: look again when the last grace period ends
            last = max(r.gone_at for r in leaving)
            self._at(max(last, self._now), "drained", rec.node.name)
            return
        flight.phase = "reconfiguring"
        self._set_node(rec, replace(rec.node, mig_config=flight.target))
        self._log("mig_reconfiguring", rec.node.name, flight.target)
        self._at(self._now + self.delays.mig_reconfigure_s, "reconfigured", rec.node.name)

    def _reconfigured(self, rec: NodeRec) -> None:
        flight = rec.flight
        if flight is None:
            return
        rec.flight = None
        node = rec.node
        failed = self._rng.random() < self.delays.mig_failure_probability
        if failed:
            node = replace(node, mig_config=flight.previous, mig_state="failed")
            self._log("mig_failed", node.name, f"rolled back to {flight.previous or 'whole'}")
        else:
            gpus = mig_layout(node.gpus, flight.target, self._mig_configs)
            cards = len({g.index for g in node.gpus})
            layout = layout_of(flight.target, self._mig_configs)
            labels = gfd_labels(self._relabel(node, flight.to_pool), layout, cards)
            node = replace(node, gpus=gpus, labels=labels, mig_config=flight.target)
            node = replace(node, mig_state="success")
            self._log("mig_done", node.name, f"{flight.target} in pool {self.pool_of(node)}")
        self._set_node(rec, replace(node, cordoned=flight.was_cordoned, mig_flow=False))
        if not flight.was_cordoned:
            self._log("uncordoned", node.name)
        self._dirty = True

    def _relabel(self, node: Node, to_pool: str | None) -> Mapping[str, str]:
        if to_pool is None or to_pool not in self._pools:
            return node.labels
        target = self._pools[to_pool].node_selector
        labels = dict(node.labels)
        source = self.pool_of(node)
        if source is not None:
            for k in self._pools[source].node_selector:
                if k not in target:
                    labels.pop(k, None)
        labels.update(target)
        return FrozenMap(labels)

    def _reconcile(self, wkey: str, remove: frozenset[str] = frozenset()) -> None:
        wl = self._workloads.get(wkey)
        if wl is None:
            return
        owned = [self._pods[k] for k in self._wl_pods[wkey]]
        live = [r for r in owned if not r.terminating]
        for _ in range(wl.replicas - len(live)):
            self._create_pod(wl)
        if len(live) > wl.replicas:
            live.sort(
                key=lambda r: (
                    r.pod.node is not None,
                    r.pod.phase == "Running",
                    r.pod.key not in remove,
                    -r.order[1],
                    -r.order[2],
                )
            )
            for rec in live[: len(live) - wl.replicas]:
                self._terminate(rec, self.delays.eviction_grace_s, "scaled down")

    def _create_pod(self, wl: Workload) -> None:
        hard = self._quota_hard.get(wl.namespace)
        if hard is not None and self._ns_gpus.get(wl.namespace, 0) + wl.gpus_per_replica > hard:
            return  # quota admission refuses it; a pod leaving the namespace retries
        index = self._next_index.get(wl.key)
        if index is None:
            found = [_SUFFIX.search(k) for k in self._wl_pods[wl.key]]
            index = max((int(m.group(1)) + 1 for m in found if m), default=0)
        while f"{wl.key}-{index}" in self._pods:
            index += 1
        self._next_index[wl.key] = index + 1
        tpl = self._template(wl.key)
        where = wl.placement
        pod = Pod(
            wl.namespace,
            f"{wl.name}-{index}",
            None,
            "Pending",
            wl.gpus_per_replica if not tpl.mig else 0,
            tpl.mig,
            wl.priority,
            wl.priority_class,
            wl.key,
            wl.labels,
            tpl.annotations,
            self._now,
            placement=where,
        )
        self._add_pod(pod, tpl.node_selector)
        if not self._instant:
            self._log("created", pod.key, wl.key)

    def _terminate(self, rec: PodRec, grace: float, why: str) -> None:
        key = rec.pod.key
        if rec.pod.node is None or grace <= 0:
            self._delete(rec, why)
        else:
            rec.terminating = True
            rec.gone_at = self._now + grace
            self._log("terminating", key, f"{why}, grace {grace:g}s")
            self._at(rec.gone_at, "gone", key)
        if rec.pod.workload in self._workloads:
            self._at(self._now + self.delays.replace_create_s, "reconcile", rec.pod.workload or "")

    def _add_pod(self, pod: Pod, pool_selector: Mapping[str, str]) -> None:
        """Track ``pod``, which runs where its placement and ``pool_selector`` (its pool's or
        template's labels, which the engine does not see: a MIG move relabels nodes) allow."""
        self._seq += 1
        where = pod.placement
        if pool_selector:
            where = replace(
                where, node_selector=FrozenMap({**where.node_selector, **pool_selector})
            )
        rec = PodRec(pod, where, (-pod.priority, pod.created, self._seq))
        self._pods[pod.key] = rec
        if pod.namespace in self._quota_hard:
            self._ns_gpus[pod.namespace] = self._ns_gpus.get(pod.namespace, 0) + pod.gpus
        if pod.workload in self._wl_pods:
            self._wl_pods[pod.workload][pod.key] = None
        if pod.node is not None and pod.node in self._nodes and pod.holds_gpus:
            self._hold(rec, self._nodes[pod.node], +1)
        elif pod.node is None and pod.phase == "Pending":
            self._pending[pod.key] = None
            self._dirty = True
        self._pod_tuple = None
        self._touch()

    def _delete(self, rec: PodRec, why: str) -> None:
        key = rec.pod.key
        del self._pods[key]
        self._pending.pop(key, None)
        self._nominated.pop(key, None)
        ns = rec.pod.namespace
        if ns in self._quota_hard:
            self._ns_gpus[ns] -= rec.pod.gpus
            for wkey, wl in self._workloads.items():  # quota freed: controllers retry
                if wl.namespace == ns:
                    self._at(self._now + self.delays.scale_up_create_s, "reconcile", wkey)
        if rec.pod.workload in self._wl_pods:
            self._wl_pods[rec.pod.workload or ""].pop(key, None)
        node = self._nodes.get(rec.pod.node or "")
        if node is not None and key in node.pods:
            self._hold(rec, node, -1)
            self._dirty = True
        self._pod_tuple = None
        self._touch()
        self._log("deleted", key, why)

    def _hold(self, rec: PodRec, node: NodeRec, sign: int) -> None:
        node.hold(rec.pod, sign)
        self._index.update(node)

    def _schedule(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        failed: set[tuple[Any, ...]] = set()
        for rec in sorted((self._pods[k] for k in self._pending), key=lambda r: r.order):
            pod = rec.pod
            shape = (pod.gpus, tuple(sorted(pod.mig.items())), rec.where)
            if shape in failed:
                continue
            node = self._index.fit(pod, rec.where, self._reserved(rec))
            if node is None:
                if not (self.preemption and not self._instant and self._preempt(rec)):
                    failed.add(shape)
                continue
            rec.nominated = None
            self._nominated.pop(pod.key, None)
            del self._pending[pod.key]
            startup = self.startup_s(pod.workload)
            instant = self._instant or startup == 0
            phase: PodPhase = "Running" if instant else "Pending"
            self._update_pod(rec, replace(pod, node=node.node.name, phase=phase))
            self._hold(rec, node, +1)
            if not self._instant:
                self._log("scheduled", pod.key, node.node.name)
                if phase == "Pending":
                    self._at(self._now + startup, "running", pod.key)

    def _reserved(self, rec: PodRec) -> dict[str, dict[str, int]] | None:
        """Per node, what pending pods nominated there with priority at least ``rec``'s will
        take (kube-scheduler counts them as if running when it places a less important pod)."""
        if not self._nominated:
            return None
        reserved: dict[str, dict[str, int]] = {}
        for key in self._nominated:
            other = self._pods.get(key)
            if other is None or other is rec or other.nominated is None:
                continue
            if other.pod.priority < rec.pod.priority or key not in self._pending:
                continue
            need = dict(other.pod.mig) if other.pod.mig else {"": other.pod.gpus}
            into = reserved.setdefault(other.nominated, {})
            for k, n in need.items():
                into[k] = into.get(k, 0) + n
        return reserved

    def _preempt(self, rec: PodRec) -> bool:
        """Preempt for pending ``rec`` (module docstring); false when no node would do."""
        if rec.nominated is not None:
            node = self._nodes.get(rec.nominated)
            if node is not None and any(self._pods[k].terminating for k in node.pods):
                return True  # its victims are still leaving: wait for them
            rec.nominated = None
            self._nominated.pop(rec.pod.key, None)
        reserved = self._reserved(rec)
        nodes = self._nodes.values()
        plan = preemption_plan(rec.pod, rec.where, nodes, self._pods, reserved or {})
        if plan is None:
            return False
        node, victims = plan
        rec.nominated = node.node.name
        self._nominated[rec.pod.key] = None
        for victim in victims:
            self.preemptions += 1
            why = f"preempted by {rec.pod.key} (priority {rec.pod.priority})"
            self._terminate(victim, self.delays.eviction_grace_s, why)
        return True

    def startup_s(self, workload: str | None) -> float:
        """From binding to Running for pods of ``workload``: its template's, else
        :attr:`SimDelays.pod_startup_s`."""
        own = self._template(workload or "").startup_s
        return self.delays.pod_startup_s if own is None else own

    def _template(self, wkey: str) -> PodTemplate:
        return self._templates.get(wkey) or PodTemplate()

    def _set_node(self, rec: NodeRec, node: Node) -> None:
        rec.set_node(node)
        self._index.update(rec)
        self._node_tuple = None
        self._touch()

    def _update_pod(self, rec: PodRec, pod: Pod) -> None:
        rec.pod = pod
        self._pod_tuple = None
        self._touch()

    def _touch(self) -> None:
        self._snap = None
        self._usage = None

    def _at(self, at: float, kind: str, key: str) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, kind, key))

    def _log(self, kind: EffectKind, target: str, detail: str = "") -> None:
        self._effects.append(Effect(self._now, kind, target, detail))

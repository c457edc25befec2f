"""Indexes of one snapshot under one policy: pools, free GPUs, training, services, demand.

Design:

* Built once per (snapshot object, policy) pair and cached by the engine: a snapshot is
  immutable, so while the caller hands the engine the same object, no index is rebuilt; at
  10,000 GPUs a rebuild is a few milliseconds, an ``evaluate`` without one far less.
* Everything the rules need is precomputed here: each node's pool (the first pool, by name,
  whose selector it matches), whole GPUs allocatable/held/free per pool, pending whole-GPU
  demand, the training workloads with their elastic bounds, gang minimum, progress and whether
  they are protected, and each service's workload and pending GPUs.
* A training workload another autoscaler sizes (an HPA, a KEDA ScaledObject: ``scaled_by``) is
  fixed at its replicas unless the policy's ``training.owner`` is ``ebbtide``: no shrink or
  grow is planned that the actuator would refuse (and refuse again after every hold-off).
* Protection is decided here once: a training workload is protected when its namespace is
  protected or it carries ``ebbtide.io/do-not-disrupt``; inference pods (owned by a service's
  workload, or not selected as training) are never candidates at all. What a drain may evict
  is :attr:`Inventory.drain_rule` (:mod:`policies.drain`), the one rule every drain follows.
* Free whole GPUs are kept per node too (:attr:`Inventory.node_free`): a replica lands on one
  node, so the rules ask :mod:`policies.placement` where it fits rather than trusting a pool's
  total. Namespaces' GPU quotas are indexed for the same reason: a grow the quota refuses would
  leave pods pending, not training.
* **Pending demand** is what could be scheduled and is not Ebbtide's own doing. Gated pods
  are no demand; nor are pods no pool node could ever take (a model, a toleration or a size
  no node offers: :func:`policies.placement.could_land`, kept in :attr:`Inventory.unplaceable`);
  nor is a pod its workload created within :data:`RECREATE_WINDOW_S` after Ebbtide evicted
  from or shrank that workload (``disrupted``: workload → times). The replacement of a pod
  Ebbtide evicted waits for the GPUs Ebbtide took on purpose; counting it would revert a MIG
  node (or free GPUs) to undo the eviction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policies.drain import DrainRule, disrupt_forbidden
from policies.model import DO_NOT_DISRUPT, Policy, RestartsSpec
from policies.placement import could_land
from policies.snapshot import GpuQuota, Node, Placement, Pod, Snapshot, Taint, Workload

__all__ = [
    "MAX_DISRUPTIONS",
    "RECREATE_WINDOW_S",
    "Inventory",
    "TrainingView",
    "matches",
    "note_disrupted",
]

#: A pod a workload creates this long after Ebbtide evicted from or shrank it is a replacement.
RECREATE_WINDOW_S = 300.0
#: Times kept per disrupted workload (bounded memory).
MAX_DISRUPTIONS = 4


def note_disrupted(disrupted: dict[str, tuple[float, ...]], workload: str, at: float) -> None:
    """Ebbtide evicted from or shrank ``workload`` at ``at`` (decided now, or read back from the
    decisions log, in any order and maybe twice): keep its latest times."""
    times = disrupted.get(workload, ())
    if at not in times:
        disrupted[workload] = tuple(sorted((*times, at))[-MAX_DISRUPTIONS:])


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """All of ``selector``'s labels are on ``labels``."""
    return all(labels.get(k) == v for k, v in selector.items())


def _int_annotation(annotations: Mapping[str, str], key: str) -> int | None:
    raw = annotations.get(key)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class TrainingView:
    """A training workload as the preemption rules see it."""

    workload: Workload
    min_replicas: int
    """Fewest replicas it may shrink to (its current count when not elastic)."""
    max_replicas: int
    """Most replicas it may grow to (its current count when not elastic)."""
    gang_min: int
    """Fewest pods it can run with (0: no gang)."""
    progress: float
    protected: str | None
    """Why it must not be touched, or ``None``."""
    pods: tuple[Pod, ...]
    """Its pods holding GPUs, sorted by name."""
    pool_gpus: Mapping[str, int]
    """GPUs its pods hold, per pool."""
    scaled_by: str | None = None
    """Another autoscaler sizes it and the policy does not give it to Ebbtide
    (``training.owner``): never resized (its bounds are its replicas), still evictable — an
    HPA does not fight an eviction."""
    grows_back: bool = False
    """Its maximum is stated (``ebbtide.io/max-replicas``, or its owner's bounds) and Ebbtide
    sizes it: a shrink below its floor is grown back to that maximum once GPUs are idle, so
    it may stand in for evicting pods its owner would recreate (:mod:`policies.preemption`)."""
    restarts: RestartsSpec | None = None
    """How a membership change of it is priced (the policy's ``training.restarts``), carried
    here so victim selection, which sees no policy, can weigh a restart against tasks."""

    @property
    def key(self) -> str:
        return self.workload.key


class Inventory:
    """Indexes over one snapshot for one policy. Read-only after construction."""

    def __init__(
        self,
        snapshot: Snapshot,
        policy: Policy,
        *,
        disrupted: Mapping[str, tuple[float, ...]] | None = None,
    ) -> None:
        spec = policy.spec
        disrupted = disrupted or {}
        self.snapshot = snapshot
        self.drain_rule = DrainRule.of(policy)
        self.nodes: dict[str, Node] = {n.name: n for n in snapshot.nodes}
        pools = sorted(spec.pools.items())
        self.node_pool: dict[str, str | None] = {}
        self.pool_nodes: dict[str, list[Node]] = {name: [] for name, _ in pools}
        for node in snapshot.nodes:
            pool = next((name for name, p in pools if matches(p.node_selector, node.labels)), None)
            self.node_pool[node.name] = pool
            if pool is not None:
                self.pool_nodes[pool].append(node)

        self.workloads: dict[str, Workload] = {w.key: w for w in snapshot.workloads}
        self.pods_by_node: dict[str, list[Pod]] = {}
        self.pods_by_workload: dict[str, list[Pod]] = {}
        held: dict[str, int] = {}
        self.pending_whole: list[Pod] = []
        self.pending_mig: dict[str, int] = {}
        """MIG instances pending pods wait for, by profile: what a conversion's layout serves."""
        self.replacements: list[Pod] = []
        """Pending pods that replace ones Ebbtide took (no demand; see the module docstring)."""
        self.unplaceable: list[Pod] = []
        """Pending pods no pool node could take (no demand; see the module docstring)."""
        pool_nodes = [n for n in snapshot.nodes if self.node_pool[n.name] is not None]
        pool_shapes = [
            (p.node_selector, [Taint(t.key, t.value, t.effect) for t in p.taints]) for _, p in pools
        ]
        landing: dict[tuple[Placement, int], bool] = {}
        for pod in snapshot.pods:
            if pod.workload is not None:
                self.pods_by_workload.setdefault(pod.workload, []).append(pod)
            if pod.holds_gpus and pod.node is not None:
                self.pods_by_node.setdefault(pod.node, []).append(pod)
                held[pod.node] = held.get(pod.node, 0) + pod.gpus
            elif pod.waiting and pod.gpus > 0:
                shape = (pod.placement, pod.gpus)
                if shape not in landing:
                    landing[shape] = could_land(pool_nodes, pool_shapes, pod.placement, pod.gpus)
                if _replacement(pod, disrupted):
                    self.replacements.append(pod)
                elif not landing[shape]:
                    self.unplaceable.append(pod)
                else:
                    self.pending_whole.append(pod)
            elif pod.waiting and not _replacement(pod, disrupted):
                for profile, n in pod.mig.items():
                    self.pending_mig[profile] = self.pending_mig.get(profile, 0) + n

        self.capacity: dict[str, int] = {}
        self.free: dict[str, int] = {}
        self.node_free: dict[str, int] = {
            n.name: max(0, n.whole_gpus - held.get(n.name, 0)) for n in snapshot.nodes
        }
        for pool, nodes in self.pool_nodes.items():
            self.capacity[pool] = sum(n.whole_gpus for n in nodes)
            self.free[pool] = sum(self.node_free[n.name] for n in nodes if not n.cordoned)
        self.quotas: dict[str, GpuQuota] = {q.namespace: q for q in snapshot.quotas}
        self.pending_whole_gpus = sum(p.gpus for p in self.pending_whole)

        # services: their workload, and GPUs their pending pods wait for
        self.service_workload: dict[str, Workload | None] = {}
        self.service_pending_gpus: dict[str, int] = {}
        inference_workloads: set[str] = set()
        for name, svc in sorted(spec.services.items()):
            key = f"{svc.namespace}/{name}"
            wkey = f"{svc.namespace}/{svc.workload or name}"
            inference_workloads.add(wkey)
            self.service_workload[key] = self.workloads.get(wkey)
            self.service_pending_gpus[key] = sum(
                p.gpus
                for p in self.pods_by_workload.get(wkey, ())
                if p.waiting and not _replacement(p, disrupted)
            )

        # training
        protected_ns = set(spec.protected_namespaces)
        self.training: dict[str, TrainingView] = {}
        self.loose_training_pods: list[Pod] = []
        training = spec.training
        if training is None:
            return
        allowed_pools = set(training.pools) or set(spec.pools)
        elastic = training.elastic
        for key in sorted(self.workloads):
            w = self.workloads[key]
            if key in inference_workloads or not matches(training.selector, w.labels):
                continue
            pods = tuple(
                p for p in self.pods_by_workload.get(key, ()) if p.holds_gpus and p.gpus > 0
            )
            pool_gpus: dict[str, int] = {}
            for p in pods:
                pool = self.node_pool.get(p.node or "")
                if pool is not None and pool in allowed_pools:
                    pool_gpus[pool] = pool_gpus.get(pool, 0) + p.gpus
            lo, hi = w.min_replicas, w.max_replicas  # the owner's bounds win over annotations
            if lo is None:
                lo = _int_annotation(w.annotations, elastic.min_replicas_annotation)
            if hi is None:
                hi = _int_annotation(w.annotations, elastic.max_replicas_annotation)
            scaled_by = w.scaled_by if training.owner != "ebbtide" else None
            if scaled_by is not None:  # another autoscaler's size: no resize is planned
                lo = hi = w.replicas
            gang = w.gang_min
            if gang is None:
                gang = _int_annotation(w.annotations, training.gang_minimum_annotation)
            reason: str | None = None
            if w.namespace in protected_ns:
                reason = f"namespace {w.namespace} is protected"
            elif disrupt_forbidden(w.annotations):
                reason = f"workload is annotated {DO_NOT_DISRUPT}"
            progress_raw = w.annotations.get(training.progress_annotation, "0")
            try:
                progress = float(progress_raw)
            except ValueError:
                progress = 0.0
            self.training[key] = TrainingView(
                workload=w,
                min_replicas=min(w.replicas, lo) if lo is not None else w.replicas,
                max_replicas=max(w.replicas, hi) if hi is not None else w.replicas,
                gang_min=gang or 0,
                progress=progress,
                protected=reason,
                pods=tuple(sorted(pods, key=lambda p: p.name)),
                pool_gpus=pool_gpus,
                scaled_by=scaled_by,
                grows_back=hi is not None and scaled_by is None,
                restarts=training.restarts,
            )
        # training pods without a known workload (bare pods, jobs not listed as workloads)
        for pod in snapshot.pods:
            if (
                pod.holds_gpus
                and pod.gpus > 0
                and (pod.workload is None or pod.workload not in self.workloads)
                and matches(training.selector, pod.labels)
                and self.node_pool.get(pod.node or "") in allowed_pools
            ):
                self.loose_training_pods.append(pod)

    def quota_left(self, namespace: str) -> int | None:
        """GPUs ``namespace``'s quota still allows, ``None`` without a quota."""
        quota = self.quotas.get(namespace)
        return None if quota is None else quota.left


def _replacement(pod: Pod, disrupted: Mapping[str, tuple[float, ...]]) -> bool:
    """``pod`` was created by its workload shortly after Ebbtide evicted from or shrank it."""
    times = disrupted.get(pod.workload or "", ())
    return any(at <= pod.created <= at + RECREATE_WINDOW_S for at in times)

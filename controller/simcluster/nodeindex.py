"""The scheduler's side of the simulated cluster: node and pod records, and a node index.

Design:

* :class:`NodeRec` keeps a node's whole-GPU and MIG capacity next to what its pods hold, updated
  incrementally as pods bind and leave, so no placement recounts a node.
* :class:`NodeIndex` buckets schedulable whole-card nodes by free GPUs (insertion-ordered dicts,
  so iteration is deterministic) and lists schedulable MIG nodes. Cordoned and reconfiguring
  nodes are in neither. :meth:`NodeIndex.fit` is best fit: the fitting node with the fewest free
  GPUs, which packs pods and keeps whole nodes free, in a walk over a few buckets. Whether a
  node may take a pod at all (its selector's labels, required node affinity, tolerations for
  the node's taints) is :func:`policies.placement.admits`, the rule the engine plans with, so
  both runtimes agree.
* :func:`preemption_plan` is kube-scheduler's DefaultPreemption, decided on the records without
  changing them (the cluster then evicts): for a pending pod that fits nowhere, every schedulable
  node it admits is a candidate when removing all its non-terminating pods of
  *lower* priority makes the pod fit (terminating pods still hold their GPUs; GPUs promised to
  pods already nominated to the node are not free). Victims are then reprieved, highest
  priority first (then oldest), while the pod still fits, so the fewest and least important are
  evicted. Among candidates the node is picked as ``pickOneNodeForPreemption`` does (no PDBs
  here): the lowest highest-victim priority, then the lowest sum of victim priorities, then the
  fewest victims, then the node name. As in kube-scheduler, what a pod nominated to a node will
  take is not free there for pods of lower or equal priority (``reserved``), neither to
  :meth:`NodeIndex.fit` nor to another preemption.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from controller.simcluster.values import GpuUse
from policies.inventory import matches
from policies.miglayout import layout_of
from policies.placement import admits
from policies.snapshot import Gpu, Node, Placement, Pod

__all__ = [
    "Flight",
    "NodeIndex",
    "NodeRec",
    "PodRec",
    "gpu_use",
    "mig_layout",
    "preemption_plan",
]


@dataclass(slots=True)
class PodRec:
    """A pod, where it may run, its scheduling order and whether it is terminating."""

    pod: Pod
    where: Placement
    """The pod's placement with its workload's pool (template) selector added."""
    order: tuple[int, float, int]
    terminating: bool = False
    gone_at: float = math.inf
    nominated: str | None = None
    """The node this pod preempted victims on and waits for (kube's ``nominatedNodeName``)."""


@dataclass(slots=True)
class Flight:
    """A MIG conversion or revert under way on a node."""

    target: str
    previous: str | None
    was_cordoned: bool
    to_pool: str | None
    phase: Literal["draining", "reconfiguring"] = "draining"


@dataclass(slots=True)
class NodeRec:
    """A node, its capacity and what its pods hold."""

    node: Node
    cap: int = 0
    mig_cap: dict[str, int] = field(default_factory=dict)
    used: int = 0
    used_mig: dict[str, int] = field(default_factory=dict)
    pods: dict[str, None] = field(default_factory=dict)
    flight: Flight | None = None
    bucket: int | None = None

    def set_node(self, node: Node) -> None:
        """Take ``node`` as the current value; recount capacity when its GPUs changed."""
        if node.gpus is not self.node.gpus or node.mig_config != self.node.mig_config:
            self.cap = node.whole_gpus
            self.mig_cap = node.mig_capacity() if node.is_mig else {}
        self.node = node

    def hold(self, pod: Pod, sign: int) -> None:
        """Count ``pod``'s GPUs as held here (``sign`` +1) or released (-1)."""
        if sign > 0:
            self.pods[pod.key] = None
        else:
            self.pods.pop(pod.key, None)
        self.used += sign * pod.gpus
        for profile, n in pod.mig.items():
            self.used_mig[profile] = self.used_mig.get(profile, 0) + sign * n

    @classmethod
    def of(cls, node: Node) -> NodeRec:
        mig = node.mig_capacity() if node.is_mig else {}
        return cls(node, cap=node.whole_gpus, mig_cap=mig)


class NodeIndex:
    """Schedulable nodes: whole-card ones bucketed by free GPUs, MIG ones in a list."""

    __slots__ = ("_free", "_mig")

    def __init__(self) -> None:
        self._free: dict[int, dict[str, NodeRec]] = {}
        self._mig: dict[str, NodeRec] = {}

    def update(self, rec: NodeRec) -> None:
        """Re-file ``rec`` after its capacity, use, cordon or flight changed."""
        name = rec.node.name
        if rec.bucket is not None:
            bucket = self._free[rec.bucket]
            bucket.pop(name, None)
            if not bucket:
                del self._free[rec.bucket]
            rec.bucket = None
        self._mig.pop(name, None)
        if rec.node.cordoned or rec.flight is not None:
            return
        if rec.mig_cap:
            self._mig[name] = rec
        elif rec.cap > 0 or not rec.node.gpus:
            rec.bucket = rec.cap - rec.used
            self._free.setdefault(rec.bucket, {})[name] = rec

    def fit(
        self,
        pod: Pod,
        where: Placement,
        reserved: Mapping[str, Mapping[str, int]] | None = None,
    ) -> NodeRec | None:
        """The node ``pod`` goes to, or ``None`` when none fits; ``reserved`` (per node, by
        ``""`` for whole GPUs or MIG profile) is held for pods nominated there."""
        held = reserved or {}
        if pod.mig:
            for rec in self._mig.values():
                free = rec.mig_cap
                used = rec.used_mig
                r = held.get(rec.node.name, {})
                if all(
                    free.get(p, 0) - used.get(p, 0) - r.get(p, 0) >= n for p, n in pod.mig.items()
                ) and admits(rec.node, where):
                    return rec
            return None
        for free_gpus in sorted(f for f in self._free if f >= pod.gpus):
            for rec in self._free[free_gpus].values():
                taken = held.get(rec.node.name, {}).get("", 0)
                if free_gpus - taken >= pod.gpus and admits(rec.node, where):
                    return rec
        return None


def _need(pod: Pod) -> dict[str, int]:
    """What ``pod`` asks of a node: whole GPUs under ``""``, else MIG instances by profile."""
    return dict(pod.mig) if pod.mig else {"": pod.gpus}


def _free(rec: NodeRec) -> dict[str, int]:
    if rec.mig_cap:
        return {p: n - rec.used_mig.get(p, 0) for p, n in rec.mig_cap.items()}
    return {"": rec.cap - rec.used}


def preemption_plan(
    pod: Pod,
    where: Placement,
    nodes: Iterable[NodeRec],
    pods: Mapping[str, PodRec],
    reserved: Mapping[str, Mapping[str, int]],
) -> tuple[NodeRec, list[PodRec]] | None:
    """The node ``pod`` should preempt on and its victims, or ``None`` (module docstring).
    ``reserved``: per node, what pods already nominated there will take."""
    need = _need(pod)
    if not any(need.values()):
        return None
    best: tuple[tuple[int, int, int, str], NodeRec, list[PodRec]] | None = None
    for rec in nodes:
        node = rec.node
        if node.cordoned or rec.flight is not None or bool(rec.mig_cap) != bool(pod.mig):
            continue
        if not admits(node, where):
            continue
        free = _free(rec)
        for k, n in reserved.get(node.name, {}).items():
            free[k] = free.get(k, 0) - n
        lower = [
            r
            for key in rec.pods
            if not (r := pods[key]).terminating and r.pod.priority < pod.priority
        ]
        for r in lower:
            for k, n in _need(r.pod).items():
                free[k] = free.get(k, 0) + n
        if any(free.get(k, 0) < n for k, n in need.items()):
            continue
        victims: list[PodRec] = []
        # reprieve the most important first: highest priority, then the oldest
        for r in sorted(lower, key=lambda r: (-r.pod.priority, r.pod.created, r.pod.key)):
            back = _need(r.pod)
            if all(free.get(k, 0) - back.get(k, 0) >= n for k, n in need.items()):
                for k, n in back.items():
                    free[k] = free.get(k, 0) - n
            else:
                victims.append(r)
        if not victims:
            continue  # it fits without preemption: the scheduler places it, not this
        prios = [v.pod.priority for v in victims]
        rank = (max(prios), sum(prios), len(victims), node.name)
        if best is None or rank < best[0]:
            best = (rank, rec, victims)
    return None if best is None else (best[1], best[2])


def gpu_use(
    nodes: Iterable[NodeRec],
    pods: Mapping[str, PodRec],
    pools: Mapping[str, str],
    training: Mapping[str, str],
) -> dict[str, GpuUse]:
    """Physical GPUs per pool (``pools``: node name → pool) by use; a whole card held by a pod
    whose labels match ``training`` is training, by any other pod inference."""
    acc: dict[str, list[int]] = {}
    for rec in nodes:
        row = acc.setdefault(pools[rec.node.name], [0] * 8)
        gpus = len(rec.node.gpus)
        row[0] += gpus
        if rec.flight is not None:
            row[5] += gpus
        elif rec.mig_cap:
            row[4] += gpus
            row[6] += sum(rec.used_mig.values())
            row[7] += sum(rec.mig_cap.values())
        else:
            held = [pods[k].pod for k in rec.pods]
            train = sum(p.gpus for p in held if matches(training, p.labels))
            row[2] += train
            row[1] += rec.used - train
            row[3] += gpus - rec.used
    return {k: GpuUse(*acc[k]) for k in sorted(acc)}


def mig_layout(
    gpus: tuple[Gpu, ...], config: str, configs: Mapping[str, Mapping[str, int]] | None = None
) -> tuple[Gpu, ...]:
    """The node's GPUs under MIG ``config`` (:func:`policies.miglayout.layout_of`; ``configs``:
    the policy's named ones). A snapshot :class:`Gpu` holds one profile, so a mixed layout gives
    each physical GPU one entry per profile, all with its index: capacity by profile is exact,
    and ``all-disabled`` turns each index back into one whole card."""
    layout = layout_of(config, configs)
    cards = {g.index: g for g in gpus}.values()
    if layout.disabled:
        return tuple(Gpu(g.index, g.model) for g in cards)
    per_gpu = sorted(layout.per_gpu.items())
    return tuple(Gpu(g.index, g.model, p, n) for g in cards for p, n in per_gpu)

"""Infer the starting cluster from a recording and a policy, when no scenario is given.

A recording says which GPUs exist (every ``gpu.utilization`` event names a node and a GPU), how
busy each was, and sometimes which pod ran on it (``pod``); latency events may name serving pods.
The policy says which pools, services and training exist. One streaming pass over the recording
(memory bounded by the cluster's size, never by the recording's length) collects per node its
GPUs, MIG instances, utilization and pods, and :func:`infer_snapshot` builds a
:class:`~policies.snapshot.Snapshot` by these rules, in this order:

1. **Nodes.** Every node named by a utilization event. Its GPUs: the whole-card GPU ids seen
   (integers count up to the largest plus one; named GPUs count once each), MIG instances
   counting toward their parent GPU. Model ``H100-80GB`` when the node's name contains ``h100``,
   else ``A100-80GB``.
2. **Pools.** A node joins the pool whose name is one of the ``-``/``_``/``.``-separated words of
   its name (``gpu-mig-3`` → ``mig``); else, when it reported MIG instances, ``mig.toPool`` (or
   the first ``mig`` pool by name); else ``mig.fromPool``, the first service's pool, or the first
   pool by name. It is given that pool's ``nodeSelector`` as labels. A node in a ``mig`` pool is
   partitioned with the profile it reported, else the policy's profile for its model.
3. **Pods seen.** A ``pod`` on utilization events becomes a running pod holding the GPUs (or
   MIG instances) that reported it, on the node where it held the most.
4. **Services.** Each policy service's workload (``namespace/workload``) owns the pods seen in
   its namespace named ``<workload>-…``. Without any, its replicas are the distinct ``pod`` values
   of its latency events, else ``replicas.min``, else 1; always within ``replicas``. Replicas not
   seen are placed on free whole GPUs of the service's pool, busiest nodes first; pending when
   none fit.
5. **Training** (only when the policy has ``training``). Other pods seen are training, grouped
   into workloads by name without the last ``-suffix``. Every whole GPU left free whose mean
   utilization over the recording is above the idle threshold (``mig.nodeIdleBelow``, else 5%)
   is held by one replica of an elastic workload ``training/inferred-<pool>`` (1 GPU per replica,
   shrinkable to 0, growable back to its size). Idle GPUs stay free.

What was inferred is returned as human-readable ``notes`` for the summary, with the event time
the recording spans (its first event's, in file order, and its latest), so a replay of it knows
its length before it starts (the width of its report's buckets:
:class:`~controller.offline.accounting.timeline.Timeline`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from controller.simcluster import DEFAULT_TRAINING_SELECTOR, PodTemplate, SimCluster
from policies.model import Policy
from policies.snapshot import Snapshot, SnapshotBuilder
from streams.events import (
    Event,
    EventDecoder,
    GpuUtilization,
    InferenceLatency,
    InferenceLoad,
    Rejection,
)

from .source import read_event_batches

__all__ = [
    "InferredCluster",
    "RecordingScan",
    "infer_cluster",
    "infer_snapshot",
    "scan_recording",
]

#: Most distinct pods remembered per service or node (bounds memory on pod churn).
MAX_PODS = 10_000
TRAINING_NAMESPACE = "training"
_WORDS = re.compile(r"[-_.]")


@dataclass(slots=True)
class _NodeScan:
    gpus: set[int | str] = field(default_factory=set)
    mig_profiles: Counter[str] = field(default_factory=Counter)
    util_sum: float = 0.0
    util_n: int = 0
    pods: dict[str, set[str]] = field(default_factory=dict)
    """pod → the devices (``gpu`` or ``gpu/instance``) that reported it."""
    mig_pods: dict[str, str] = field(default_factory=dict)
    """pod → the MIG profile it ran on, for pods seen on MIG instances."""


@dataclass(slots=True)
class RecordingScan:
    """What one pass over a recording tells about the cluster."""

    nodes: dict[str, _NodeScan] = field(default_factory=dict)
    service_pods: dict[str, set[str]] = field(default_factory=dict)
    services: set[str] = field(default_factory=set)
    """``namespace/service`` of every latency event (at most :data:`MAX_PODS`)."""
    first: float | None = None
    """The first event's time, in file order (where a replay starts)."""
    last: float = -math.inf
    """The latest event time."""

    def add(self, event: Event | InferenceLoad) -> None:
        t = event.time
        if self.first is None:
            self.first = t
        if t > self.last:
            self.last = t
        if type(event) is GpuUtilization:
            node = self.nodes.get(event.node)
            if node is None:
                node = self.nodes[event.node] = _NodeScan()
            node.gpus.add(event.gpu)
            node.util_sum += event.util_pct
            node.util_n += 1
            if event.mig_profile is not None:
                node.mig_profiles[event.mig_profile] += 1
            if event.pod is not None and len(node.pods) < MAX_PODS:
                device = f"{event.gpu}/{event.mig_instance}" if event.mig_profile else event.gpu
                node.pods.setdefault(event.pod, set()).add(str(device))
                if event.mig_profile is not None:
                    node.mig_pods[event.pod] = event.mig_profile
        elif type(event) is InferenceLatency:
            key = f"{event.namespace}/{event.service}"
            if len(self.services) < MAX_PODS:
                self.services.add(key)
            if event.pod is not None:
                pods = self.service_pods.setdefault(key, set())
                if len(pods) < MAX_PODS:
                    pods.add(event.pod)


def scan_recording(path: Path, decoder: EventDecoder | None = None) -> RecordingScan:
    """One streaming pass over ``path``."""
    scan = RecordingScan()
    for batch in read_event_batches(path, decoder):
        for item in batch:
            if type(item) is not Rejection:
                scan.add(item)  # type: ignore[arg-type]
    return scan


@dataclass(frozen=True, slots=True)
class InferredCluster:
    """The inferred starting cluster and how to simulate it."""

    snapshot: Snapshot
    notes: tuple[str, ...]
    policy: Policy
    templates: Mapping[str, PodTemplate]
    """Where each workload's new pods may run (its pool's node selector)."""
    span: tuple[float, float] | None = None
    """The recording's first event time (in file order) and its latest; ``None`` when it has
    no event."""

    def simulate(self, start: float) -> SimCluster:
        """A simulated cluster starting from this snapshot at ``start``."""
        spec = self.policy.spec
        selector = spec.training.selector if spec.training is not None else None
        return SimCluster(
            self.snapshot,
            start=start,
            pools=spec.pools,
            training_selector=selector or DEFAULT_TRAINING_SELECTOR,
            templates=self.templates,
            convert_to=spec.mig.to_pool if spec.mig is not None else None,
            revert_to=spec.mig.from_pool if spec.mig is not None else None,
        )


def _gpu_count(ids: Iterable[int | str]) -> int:
    ints = [i for i in ids if isinstance(i, int)]
    named = sum(1 for i in ids if not isinstance(i, int))
    return max((max(ints) + 1) if ints else 0, len(ints) + named if named else 0)


def _pool_for(name: str, scan: _NodeScan, policy: Policy) -> str:
    spec = policy.spec
    words = set(_WORDS.split(name.lower()))
    for pool in sorted(spec.pools):
        if pool in words:
            return pool
    mig_pools = sorted(p for p, s in spec.pools.items() if s.kind == "mig")
    if scan.mig_profiles and (spec.mig is not None or mig_pools):
        return spec.mig.to_pool if spec.mig is not None else mig_pools[0]
    if spec.mig is not None:
        return spec.mig.from_pool
    if spec.services:
        return spec.services[sorted(spec.services)[0]].pool
    return sorted(spec.pools)[0]


def infer_snapshot(scan: RecordingScan, policy: Policy) -> InferredCluster:
    """The starting cluster by the rules in the module docstring."""
    spec = policy.spec
    b = SnapshotBuilder()
    notes: list[str] = []
    free: dict[str, int] = {}
    busy: dict[str, float] = {}
    pool_of: dict[str, str] = {}
    mig_nodes: set[str] = set()
    templates: dict[str, PodTemplate] = {}
    for name in sorted(scan.nodes):
        ns = scan.nodes[name]
        pool = _pool_for(name, ns, policy)
        model = "H100-80GB" if "h100" in name.lower() else "A100-80GB"
        gpus = _gpu_count(ns.gpus)
        mig_config = None
        if spec.pools[pool].kind == "mig":
            profile = ns.mig_profiles.most_common(1)[0][0] if ns.mig_profiles else None
            fallback = next(iter(spec.mig.layouts_for(model)), None) if spec.mig else None
            mig_config = f"all-{profile}" if profile else (fallback or "all-1g.10gb")
            mig_nodes.add(name)
        b.node(name, gpus=gpus, model=model, labels=spec.pools[pool].node_selector,
               mig_config=mig_config)  # fmt: skip
        pool_of[name] = pool
        free[name] = 0 if mig_config else gpus
        busy[name] = ns.util_sum / ns.util_n if ns.util_n else 0.0
    pools = Counter(pool_of.values())
    notes.append(
        f"{len(scan.nodes)} nodes from utilization events: "
        + (", ".join(f"{n} in {p}" for p, n in sorted(pools.items())) or "none")
    )

    # pods seen on GPUs: each on the node where it held the most devices
    seen: dict[str, tuple[str, int, Counter[str]]] = {}
    for name in sorted(scan.nodes):
        ns = scan.nodes[name]
        for pod, devices in ns.pods.items():
            profile = ns.mig_pods.get(pod)
            mig = Counter({profile: len(devices)} if profile else {})
            if pod not in seen or len(devices) > seen[pod][1]:
                seen[pod] = (name, 0 if mig else len(devices), mig)
    for at, gpus, _ in seen.values():
        free[at] = max(0, free[at] - gpus)

    service_workloads: dict[str, str] = {}
    for svc_name in sorted(spec.services):
        svc = spec.services[svc_name]
        wname = svc.workload or svc_name
        wkey = f"{svc.namespace}/{wname}"
        service_workloads[wkey] = svc_name
        own = sorted(p for p in seen if p.startswith(f"{svc.namespace}/{wname}-"))
        from_latency = len(scan.service_pods.get(f"{svc.namespace}/{svc_name}", ()))
        bounds = svc.replicas
        if own:
            replicas, why = len(own), "pods seen on GPUs"
        elif from_latency:
            replicas, why = from_latency, "pods named by latency events"
        elif bounds is not None:
            replicas, why = bounds.min, "replicas.min"
        else:
            replicas, why = 1, "default"
        if bounds is not None:
            replicas = min(max(replicas, bounds.min), bounds.max)
        per = svc.gpus_per_replica
        placed: list[str | None] = []
        candidates = sorted(
            (n for n, p in pool_of.items() if p == svc.pool and n not in mig_nodes),
            key=lambda n: (-busy[n], n),
        )
        for _ in range(replicas - len(own)):
            node = next((n for n in candidates if free[n] >= per), None)
            if node is not None:
                free[node] -= per
            placed.append(node)
        b.workload(svc.namespace, wname, replicas=replicas, gpus_per_replica=per)
        templates[wkey] = PodTemplate(node_selector=spec.pools[svc.pool].node_selector)
        for pod in own:
            at, gpus, mig = seen.pop(pod)
            b.pod(svc.namespace, pod.split("/", 1)[1], node=at, gpus=gpus, mig=mig, workload=wkey)
        for i, node in enumerate(placed):
            b.pod(svc.namespace, f"{wname}-inferred-{i}", node=node, gpus=per, workload=wkey)
        pending = sum(1 for n in placed if n is None)
        notes.append(
            f"service {svc.namespace}/{svc_name}: {replicas} replicas ({why})"
            + (f", {pending} pending" if pending else "")
        )

    training = spec.training
    if training is not None:
        groups: dict[str, list[str]] = {}
        for pod in sorted(seen):
            groups.setdefault(pod.rsplit("-", 1)[0], []).append(pod)
        for wkey, pods in sorted(groups.items()):
            ns_, wname = wkey.split("/", 1)
            per = max(1, max(seen[p][1] for p in pods))
            b.workload(ns_, wname, kind="PyTorchJob", replicas=len(pods), gpus_per_replica=per,
                       labels=training.selector,
                       annotations=_elastic(policy, 0, len(pods)))  # fmt: skip
            for pod in pods:
                at, gpus, mig = seen[pod]
                b.pod(ns_, pod.split("/", 1)[1], node=at, gpus=gpus, mig=mig,
                      workload=wkey, labels=training.selector)  # fmt: skip
        idle_pct = spec.mig.node_idle_below * 100 if spec.mig is not None else 5.0
        allowed = set(training.pools) or set(spec.pools)
        for pool in sorted(allowed):
            nodes: list[str | None] = []
            for n in sorted(pool_of):
                if pool_of[n] == pool and n not in mig_nodes and busy[n] > idle_pct:
                    nodes += [n] * free[n]
                    free[n] = 0
            if nodes:
                templates[f"{TRAINING_NAMESPACE}/inferred-{pool}"] = PodTemplate(
                    node_selector=spec.pools[pool].node_selector
                )
                b.workload(TRAINING_NAMESPACE, f"inferred-{pool}", kind="PyTorchJob",
                           replicas=len(nodes), labels=training.selector,
                           annotations=_elastic(policy, 0, len(nodes)), nodes=nodes)  # fmt: skip
                notes.append(f"training/inferred-{pool}: {len(nodes)} busy GPUs not seen serving")
        if groups:
            notes.append(f"{len(groups)} training workloads from pods seen on GPUs")
    named = {f"{s.namespace}/{n}" for n, s in spec.services.items()}
    unknown = sorted(scan.services - named)
    if unknown:
        shown = ", ".join(unknown[:5]) + (
            f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        )
        notes.append(f"latency events for services the policy does not name (ignored): {shown}")
    idle = sum(free.values())
    notes.append(f"{idle} whole GPUs left free")
    span = None if scan.first is None else (scan.first, scan.last)
    return InferredCluster(b.build(), tuple(notes), policy, templates, span)


def _elastic(policy: Policy, lo: int, hi: int) -> dict[str, str]:
    training = policy.spec.training
    assert training is not None
    return {
        training.elastic.min_replicas_annotation: str(lo),
        training.elastic.max_replicas_annotation: str(hi),
    }


def infer_cluster(
    path: Path, policy: Policy, decoder: EventDecoder | None = None
) -> InferredCluster:
    """Scan ``path`` and infer its cluster under ``policy``."""
    return infer_snapshot(scan_recording(path, decoder), policy)

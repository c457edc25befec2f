"""Pure victim selection: which training to shrink, then which pods to evict, to free GPUs.

Design (Kueue's ``GetTargets`` in spirit: decide on an in-memory view, actuate elsewhere):

1. **Shrink first.** Elastic training workloads with pods in the pool are taken in victim order
   and scaled down, each to no less than ``max(minReplicas, gang minimum)``, until enough GPUs
   are freed. One scale step per workload.
2. **Evict only when shrinking is not enough.** Training pods in the pool are taken in victim
   order (lowest priority first, then newest / oldest / least progress, as the policy says;
   ties by name). A pod of a gang whose eviction would leave the gang below its minimum takes
   the whole gang with it, or is skipped when the eviction budget cannot pay for all of it.
   Workloads being shrunk in the same plan are not evicted from: which pods their controller
   removes is not known yet, so counting them twice could free fewer GPUs than planned.
3. **Never**: inference pods (not in the training view at all), protected namespaces,
   ``ebbtide.io/do-not-disrupt``. Each skipped candidate is reported as an
   :class:`~policies.decisions.Alternative` with the reason.

The function takes budgets as plain numbers and returns a :class:`Plan`; it does not mutate its
inputs and reads no clock, so the engine, ``policy test`` and a what-if tool share it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from policies.decisions import Alternative
from policies.drain import protection
from policies.inventory import TrainingView
from policies.model import VictimKey
from policies.snapshot import Pod

__all__ = ["Plan", "ShrinkStep", "Victim", "plan_capacity", "victim_sort_key"]

#: At most this many rejected alternatives are kept in a plan (explanations stay short).
MAX_ALTERNATIVES = 8


@dataclass(frozen=True, slots=True)
class ShrinkStep:
    workload: str
    kind: str
    from_replicas: int
    to_replicas: int
    gpus_freed: int


@dataclass(frozen=True, slots=True)
class Victim:
    pod: Pod
    workload: str | None
    gpus_freed: int
    whole_gang: bool
    """Evicted because its gang would drop below its minimum otherwise."""


@dataclass(frozen=True, slots=True)
class Plan:
    shrinks: tuple[ShrinkStep, ...]
    evictions: tuple[Victim, ...]
    freed: int
    rejected: tuple[Alternative, ...]


def victim_sort_key(
    order: Sequence[VictimKey], *, priority: int, created: float, progress: float, name: str
) -> tuple[float | str, ...]:
    """Sort key putting the first victim first."""
    parts: list[float | str] = []
    for key in order:
        if key == "priority":
            parts.append(priority)
        elif key == "newest":
            parts.append(-created)
        elif key == "oldest":
            parts.append(created)
        else:
            parts.append(progress)
    parts.append(name)
    return tuple(parts)


def _view_key(view: TrainingView, order: Sequence[VictimKey]) -> tuple[float | str, ...]:
    w = view.workload
    return victim_sort_key(
        order, priority=w.priority, created=w.created, progress=view.progress, name=view.key
    )


def plan_capacity(
    *,
    needed: int,
    pool: str,
    training: Iterable[TrainingView],
    loose_pods: Iterable[Pod] = (),
    pod_pool: dict[str, str | None],
    victim_order: Sequence[VictimKey],
    protected_namespaces: frozenset[str],
    scale_budget: int,
    eviction_budget: int,
    taken: frozenset[str] = frozenset(),
    held: Mapping[str, str] | None = None,
) -> Plan:
    """Free at least ``needed`` whole GPUs in ``pool`` (as many as possible when it cannot).

    ``pod_pool`` maps node names to pools; ``taken`` holds workload and pod keys already claimed
    by an earlier plan in the same evaluation; ``held`` maps pods the cluster recently refused to
    evict (a PodDisruptionBudget) to the reason, so the next victim in order is taken instead.
    """
    held = held or {}
    rejected: list[Alternative] = []

    def refusal(pod: Pod, view: TrainingView | None) -> str | None:
        """Why ``pod`` may not be evicted: held after a refusal, or protected. Asked of every
        pod an eviction takes, a gang's other members included."""
        return held.get(pod.key) or _protection(pod, view, protected_namespaces)

    def reject(option: str, why: str) -> None:
        if len(rejected) < MAX_ALTERNATIVES:
            rejected.append(Alternative(option, why))

    views = sorted(
        (v for v in training if v.pool_gpus.get(pool, 0) > 0 and v.key not in taken),
        key=lambda v: _view_key(v, victim_order),
    )
    freed = 0
    shrinks: list[ShrinkStep] = []
    shrunk: set[str] = set()
    for view in views:
        if freed >= needed:
            break
        w = view.workload
        floor = max(view.min_replicas, view.gang_min)
        if view.protected is not None:
            reject(f"shrink {view.key}", view.protected)
            continue
        if w.replicas <= floor or w.gpus_per_replica <= 0:
            continue
        if scale_budget <= 0:
            reject(f"shrink {view.key}", "scale-step budget is spent")
            continue
        per = w.gpus_per_replica
        k = min(w.replicas - floor, math.ceil((needed - freed) / per))
        gain = min(k * per, view.pool_gpus.get(pool, 0))
        shrinks.append(ShrinkStep(view.key, w.kind, w.replicas, w.replicas - k, gain))
        shrunk.add(view.key)
        scale_budget -= 1
        freed += gain

    evictions: list[Victim] = []
    if freed < needed:
        candidates: list[tuple[tuple[float | str, ...], Pod, TrainingView | None]] = []
        for view in views:
            if view.key in shrunk:
                reject(f"evict pods of {view.key}", "it is being shrunk in this plan")
                continue
            for pod in view.pods:
                key = victim_sort_key(
                    victim_order,
                    priority=pod.priority,
                    created=pod.created,
                    progress=view.progress,
                    name=pod.key,
                )
                candidates.append((key, pod, view))
        for pod in loose_pods:
            if pod.key in taken:
                continue
            key = victim_sort_key(
                victim_order, priority=pod.priority, created=pod.created, progress=0.0, name=pod.key
            )
            candidates.append((key, pod, None))
        candidates.sort(key=lambda c: c[0])
        gone: set[str] = set()
        for _, pod, cview in candidates:
            if freed >= needed:
                break
            if pod.key in gone or pod.node is None or pod_pool.get(pod.node) != pool:
                continue
            why = refusal(pod, cview)
            if why is not None:
                reject(f"evict {pod.key}", why)
                continue
            group = [pod]
            whole = False
            if cview is not None and cview.gang_min > 0:
                left = [p for p in cview.pods if p.key not in gone]
                if len(left) - 1 < cview.gang_min:
                    group = left
                    whole = True
                    others = [p for p in group if p.key != pod.key]
                    blocked = next((r for p in others if (r := refusal(p, cview))), None)
                    if blocked is not None:
                        reject(f"evict gang {cview.key}", blocked)
                        continue
            if len(group) > eviction_budget:
                what = f"gang {cview.key}" if whole and cview else pod.key
                reject(
                    f"evict {what}",
                    f"needs {len(group)} evictions; the eviction budget has {eviction_budget} left",
                )
                continue
            for victim in group:
                gone.add(victim.key)
                gain = victim.gpus if pod_pool.get(victim.node or "") == pool else 0
                evictions.append(
                    Victim(victim, cview.key if cview else victim.workload, gain, whole)
                )
                freed += gain
                eviction_budget -= 1
    return Plan(tuple(shrinks), tuple(evictions), freed, tuple(rejected))


def _protection(
    pod: Pod, view: TrainingView | None, protected_namespaces: frozenset[str]
) -> str | None:
    if view is not None and view.protected is not None:
        return view.protected
    return protection(pod, protected_namespaces)

"""Baselines Ebbtide is compared against, on the same cluster and the same load (with the
peers of :mod:`controller.offline.experiment.peers`), and the backfill every fair peer gets.

* **Static partitioning** (:func:`static_partition`): what a cluster without an autoscaler does.
  Before the run starts, every policy service with a scale target is sized for a load factor at
  ``rho = utilization`` (0.5, the capacity every peer is given), within the policy's replica
  bounds; the rest of each pool goes to elastic training, every job first at its minimum, then
  grown to its maximum in priority order (highest first) while whole GPUs remain. The plan is
  applied and the cluster settles before the measured run begins; during the run nothing
  changes but the backfill. Two sizings (:class:`StaticSettings`):

  - ``static-p95``: the P95 of the load of the *previous* window (the run's length, ending at
    its start: yesterday's day, the last hour of a trace) plus ``headroom`` (20 %), what an SRE
    sizes from past load;
  - ``static-peak``: the peak of the run's *own* load, bursts included: an oracle no SRE has,
    labelled as such.
* **Backfill** (:class:`Backfill`): idle GPUs are lent to preemptible training, as Kueue admits
  queued workloads into free quota: every ``period_s`` (15 s), while no pod waits for a GPU,
  each elastic training job (highest priority first) grows by whole replicas into its pool's
  free GPUs up to its maximum, and a job with a gang minimum only if the grown job reaches it
  (gang admission, all or nothing). Training runs below inference's PriorityClass, so the
  scheduler preempts what inference needs back. Every fair peer gets it; Ebbtide grows
  training by its own rules.
* **Polling autoscaler** (:class:`PollingAutoscaler`): a strawman, kept for continuity with the
  earlier benchmarks and left out of the fair peers. Every ``period_s`` (30 s) it reads each
  service's P99 over a one-minute window *ending* ``lag_s`` (30 s) ago and applies the HPA
  formula ``desired = ceil(replicas * p99 / objective)``, nothing while the ratio is within the
  policy's tolerance, bounded by the policy's replica bounds and the HPA's default behaviour
  (up: at most double or +4 pods per step; down: the highest recommendation of the last five
  minutes). Its run is the only one with the scheduler's preemption **off** and no backfill:
  scaled-up pods that find no free GPU stay Pending.

All produce :class:`~policies.decisions.Scale` decisions with an explanation, so their
``decisions.jsonl`` reads like Ebbtide's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.offline.experiment.load import LoadShape
from controller.offline.experiment.peers.promquery import PrometheusQuantile
from controller.offline.models.queueing import ServiceModel
from policies.decisions import Decision, Explanation, Scale
from policies.inventory import Inventory, TrainingView
from policies.model import Policy, ServiceSpec
from policies.snapshot import Snapshot
from streams.events import Event, InferenceLatency

__all__ = [
    "Backfill",
    "PollingAutoscaler",
    "StaticPlan",
    "StaticSettings",
    "load_quantile",
    "static_partition",
]


@dataclass(frozen=True, slots=True)
class StaticSettings:
    """How static partitioning sizes inference (module docstring)."""

    headroom: float = 0.2
    """Added on top of the sized load (``static-p95``; ``static-peak`` adds none)."""
    utilization: float = 0.5
    """Each replica planned at this fraction of what it serves."""
    quantile: float = 0.95
    """Of the previous window's load (``static-p95``)."""


def load_quantile(
    shape: LoadShape, start: float, duration: float, q: float, step: float = 60.0
) -> float:
    """The ``q`` quantile of the load factor over ``[start, start + duration)``, sampled every
    ``step`` seconds."""
    steps = max(1, math.ceil(duration / step))
    values = sorted(shape.factor(start + i * step) for i in range(steps))
    return values[min(len(values) - 1, math.floor(q * len(values)))]


@dataclass(frozen=True, slots=True)
class StaticPlan:
    """Replica counts static partitioning sets, and the decisions that set them."""

    replicas: Mapping[str, int]
    decisions: tuple[Scale, ...]


def _scale(
    at: float, key: str, kind: str, frm: int, to: int, role: str, rule: str, reason: str
) -> Scale:
    return Scale(at, key, kind, frm, to, role, Explanation.of(rule, reason))  # type: ignore[arg-type]


def static_partition(
    snapshot: Snapshot,
    policy: Policy,
    models: Mapping[str, ServiceModel],
    *,
    load_factor: float,
    at: float,
    target_rho: float = 0.5,
    sized_for: str = "the run's peak",
) -> StaticPlan:
    """Inference sized for ``load_factor`` of each service's peak rate (``sized_for`` says
    what that is), training on the rest (see the module docstring)."""
    inv = Inventory(snapshot, policy)
    spec = policy.spec
    replicas: dict[str, int] = {}
    decisions: list[Scale] = []
    used: dict[str, int] = {}
    for name, svc in sorted(spec.services.items()):
        key = f"{svc.namespace}/{name}"
        wl = inv.service_workload.get(key)
        model = models.get(key)
        if wl is None:
            continue
        want = wl.replicas
        if model is not None and svc.scale is not None and svc.replicas is not None:
            need = load_factor * model.peak_rps / (model.per_replica_rps * target_rho)
            want = min(svc.replicas.max, max(svc.replicas.min, math.ceil(round(need, 6))))
        replicas[wl.key] = want
        used[svc.pool] = used.get(svc.pool, 0) + want * svc.gpus_per_replica
        if want != wl.replicas:
            load = load_factor * (model.peak_rps if model else 0.0)
            decisions.append(
                _scale(
                    at,
                    wl.key,
                    wl.kind,
                    wl.replicas,
                    want,
                    "inference",
                    "static-peak",
                    f"{key} sized for {sized_for}, {load:.1f} "
                    f"req/s, at {target_rho:.0%} utilization",
                )
            )
    # whole GPUs held by pods that are neither services nor training stay where they are
    services = set(replicas)
    training = inv.training
    for pod in snapshot.pods:
        placed = pod.workload in services or pod.workload in training
        if pod.holds_gpus and pod.gpus > 0 and not placed:
            pool = inv.node_pool.get(pod.node or "")
            if pool is not None:
                used[pool] = used.get(pool, 0) + pod.gpus
    views = sorted(training.values(), key=lambda v: (-v.workload.priority, v.key))
    for pool in sorted(inv.capacity):
        mine = [v for v in views if v.pool_gpus.get(pool, 0) > 0 and v.protected is None]
        left = inv.capacity[pool] - used.get(pool, 0)
        target = {v.key: v.min_replicas for v in mine}
        left -= sum(v.min_replicas * v.workload.gpus_per_replica for v in mine)
        grow(mine, left, target)
        for v in mine:
            w = v.workload
            replicas[w.key] = target[v.key]
            if target[v.key] != w.replicas:
                decisions.append(
                    _scale(
                        at,
                        w.key,
                        w.kind,
                        w.replicas,
                        target[v.key],
                        "training",
                        "static-rest",
                        f"training gets the rest of {pool}",
                    )
                )
    return StaticPlan(replicas, tuple(decisions))


def grow(views: Iterable[TrainingView], free: int, target: dict[str, int]) -> int:
    """Grow each job of ``views`` in order from ``target`` (changed in place) by whole replicas
    into ``free`` GPUs, up to its maximum; a job with a gang minimum only if the grown job
    reaches it. Returns the GPUs left."""
    for v in views:
        gpr = max(1, v.workload.gpus_per_replica)
        extra = max(0, min(v.max_replicas - target[v.key], free // gpr))
        if extra and target[v.key] + extra < v.gang_min:
            continue
        target[v.key] += extra
        free -= extra * gpr
    return free


class Backfill:
    """Idle GPUs lent to preemptible training, gang-aware (module docstring)."""

    def __init__(self, policy: Policy, *, start: float, period_s: float = 15.0) -> None:
        self.policy = policy
        self.period_s = period_s
        self._next = start

    def evaluate(self, now: float, snapshot: Snapshot) -> list[Decision]:
        """Every ``period_s``, while no GPU pod waits: grow training into free GPUs."""
        if now < self._next:
            return []
        self._next = now + self.period_s
        inv = Inventory(snapshot, self.policy)
        if any(p.waiting and p.gpus > 0 for p in snapshot.pods):
            return []
        views = sorted(inv.training.values(), key=lambda v: (-v.workload.priority, v.key))
        out: list[Decision] = []
        for pool in sorted(inv.free):
            mine = [
                v
                for v in views
                if v.pool_gpus.get(pool, 0) > 0 and v.protected is None and v.scaled_by is None
            ]
            target = {v.key: v.workload.replicas for v in mine}
            if grow(mine, inv.free[pool], target) == inv.free[pool]:
                continue
            for v in mine:
                w = v.workload
                if target[v.key] != w.replicas:
                    out.append(
                        _scale(
                            now,
                            w.key,
                            w.kind,
                            w.replicas,
                            target[v.key],
                            "training",
                            "backfill",
                            f"{inv.free[pool]} idle GPUs in {pool} lent to training "
                            f"(priority order, whole gangs)",
                        )
                    )
        return out


class PollingAutoscaler:
    """HPA/KEDA-style polling on a delayed P99 (see the module docstring)."""

    name: str = "polling"
    label: str = "strawman: polling HPA (30s/30s-old P99), no preemption, no backfill"
    preemption: bool = False

    def __init__(
        self,
        policy: Policy,
        *,
        start: float,
        period_s: float = 30.0,
        lag_s: float = 30.0,
        window_s: float = 60.0,
        stabilization_s: float = 300.0,
    ) -> None:
        self.policy = policy
        self.start = start
        self.period_s = period_s
        self.lag_s = lag_s
        self.window_s = window_s
        self.stabilization_s = stabilization_s
        self._services: dict[str, tuple[str, ServiceSpec]] = {
            f"{s.namespace}/{name}": (name, s)
            for name, s in sorted(policy.spec.services.items())
            if s.scale is not None and s.replicas is not None
        }
        self._samples: dict[str, PrometheusQuantile] = {
            k: PrometheusQuantile(
                start=start, quantile=spec.slo.percentile / 100.0, window_s=window_s
            )
            for k, (_, spec) in self._services.items()
        }
        self._recommendations: dict[str, deque[tuple[float, int]]] = {
            k: deque() for k in self._services
        }
        self._next = start

    def observe(self, event: Event) -> None:
        """Keep the latency samples the delayed metric will be computed from."""
        if type(event) is not InferenceLatency or event.samples_ms is None:
            return
        samples = self._samples.get(event.key)
        if samples is not None:
            samples.observe(event.time, event.samples_ms)

    def metric(self, key: str, now: float) -> float | None:
        """P99 (the service's percentile) over ``(now - lag - window, now - lag]``."""
        return self._samples[key].until(now - self.lag_s)

    def evaluate(self, now: float, snapshot: Snapshot) -> list[Decision]:
        """Every ``period_s``: one HPA step per service."""
        if now < self._next:
            return []
        self._next = now + self.period_s
        inv = Inventory(snapshot, self.policy)
        out: list[Decision] = []
        for key, (name, spec) in self._services.items():
            wl = inv.service_workload.get(key)
            p = self.metric(key, now)
            if wl is None or p is None or spec.scale is None or spec.replicas is None:
                continue
            ratio = p / spec.slo.objective_ms
            current = wl.replicas
            if abs(ratio - 1.0) <= spec.scale.tolerance:
                desired = current
            else:
                desired = math.ceil(max(current, 1) * ratio)
            desired = min(spec.replicas.max, max(spec.replicas.min, desired))
            recs = self._recommendations[key]
            recs.append((now, desired))
            while recs and recs[0][0] < now - self.stabilization_s:
                recs.popleft()
            if desired > current:
                target = min(desired, max(2 * current, current + 4))
            else:
                target = max(r for _, r in recs)  # scale down only to the window's highest
                target = min(target, current)
            if target == current:
                continue
            out.append(
                _scale(
                    now,
                    wl.key,
                    wl.kind,
                    current,
                    target,
                    "inference",
                    "polling-hpa",
                    f"{name}: P{spec.slo.percentile:g} {p:.0f}ms as of {self.lag_s:g}s ago vs "
                    f"objective {spec.slo.objective_ms:g}ms: desired ceil({current} * "
                    f"{ratio:.2f}) = {desired}; scale {current}→{target}",
                )
            )
        return out

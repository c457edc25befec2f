"""Baselines Ebbtide is compared against, on the same cluster and the same load (with the
peers of :mod:`controller.offline.experiment.peers`).

* **Static partitioning** (:func:`static_partition`): what a cluster without an autoscaler does.
  Before the run starts, every policy service with a scale target is sized for the *peak* load
  of the run (bursts included: the load generator is known in advance, so this is the best a
  static plan can do) at ``rho = target_rho`` (0.5), within the policy's replica bounds; the
  rest of each pool goes to elastic training, every job first at its minimum, then grown to its
  maximum in priority order (highest first) while whole GPUs remain. The plan is applied and the
  cluster settles before the measured run begins; during the run nothing changes. Good SLO,
  inference GPUs idle most of the day.
* **Polling autoscaler** (:class:`PollingAutoscaler`): the Kubernetes HPA as KEDA or the HPA
  drive it by default. Every ``period_s`` (30 s) it reads each service's P99 over a one-minute
  window *ending* ``lag_s`` (30 s) ago (the metrics pipeline's delay: scrape, export, query) and
  applies the HPA formula ``desired = ceil(replicas * p99 / objective)``, nothing while the ratio
  is within the policy's tolerance, bounded by the policy's replica bounds and the HPA's default
  behaviour (up: at most double or +4 pods per step; down: the highest recommendation of the last
  five minutes, the stabilization window). It knows nothing about training: scaled-up pods that
  find no free GPU stay Pending, as with the default scheduler when training holds the GPUs and
  nothing preempts it: its run is the only one with the scheduler's preemption **off** (labelled
  "no preemption"; the earlier benchmarks' peer, kept for continuity). It never evicts, shrinks
  training or touches MIG. The fair HPA peers are in :mod:`controller.offline.experiment.peers`.

Both produce :class:`~policies.decisions.Scale` decisions with an explanation, so their
``decisions.jsonl`` reads like Ebbtide's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from controller.offline.experiment.peers.promquery import PrometheusQuantile
from controller.offline.models.queueing import ServiceModel
from policies.decisions import Decision, Explanation, Scale
from policies.inventory import Inventory
from policies.model import Policy, ServiceSpec
from policies.snapshot import Snapshot
from streams.events import Event, InferenceLatency

__all__ = ["PollingAutoscaler", "StaticPlan", "static_partition"]


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
    peak_factor: float,
    at: float,
    target_rho: float = 0.5,
) -> StaticPlan:
    """Inference sized for the run's peak, training on the rest (see the module docstring)."""
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
            need = peak_factor * model.peak_rps / (model.per_replica_rps * target_rho)
            want = min(svc.replicas.max, max(svc.replicas.min, math.ceil(round(need, 6))))
        replicas[wl.key] = want
        used[svc.pool] = used.get(svc.pool, 0) + want * svc.gpus_per_replica
        if want != wl.replicas:
            peak = peak_factor * (model.peak_rps if model else 0.0)
            decisions.append(
                _scale(
                    at,
                    wl.key,
                    wl.kind,
                    wl.replicas,
                    want,
                    "inference",
                    "static-peak",
                    f"{key} sized for the run's peak {peak:.1f} "
                    f"req/s at {target_rho:.0%} utilization",
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
        for v in mine:
            gpr = max(1, v.workload.gpus_per_replica)
            extra = max(0, min(v.max_replicas - target[v.key], left // gpr))
            target[v.key] += extra
            left -= extra * gpr
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


class PollingAutoscaler:
    """HPA/KEDA-style polling on a delayed P99 (see the module docstring)."""

    name: str = "polling"
    label: str = "polling autoscaler (HPA, 30s/30s-old P99), no preemption"
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

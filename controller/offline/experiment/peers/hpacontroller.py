"""The HPA controller the HPA-based peers share: one HPA object per policy service, reconciled
every sync period from the metrics of its peer.

Each policy service with a scale target gets one HPA (``minReplicas``/``maxReplicas`` the
policy's replica bounds); every ``sync_period_s`` the peer's :meth:`HpaPeer.proposals` give one
replica proposal per metric, the largest wins, and :meth:`~.hpa.HpaState.step` applies the
behaviour (stabilization, rate limits). The metrics come through Prometheus
(:class:`~.promquery.PrometheusQuantile`, a :class:`~.promquery.Pipeline`). Scaled-up pods that
find no free GPU are placed by the scheduler's PriorityClass preemption in the simulated
cluster; the HPA itself never shrinks training, converts MIG or evicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from controller.offline.experiment.peers.hpa import HpaBehavior, HpaState
from controller.offline.experiment.peers.promquery import Pipeline, PrometheusQuantile
from controller.offline.models.queueing import ServiceModel
from controller.offline.models.telemetry import running_replicas
from policies.decisions import Decision, Explanation, Scale
from policies.inventory import Inventory
from policies.model import Policy
from policies.snapshot import Snapshot
from streams.events import Event, InferenceLatency

__all__ = ["HpaPeer", "HpaService", "HpaSettings", "latency_proposal"]


@dataclass(frozen=True, slots=True)
class HpaSettings:
    """What every HPA-based peer lets an SRE set (the metric pipeline and the behaviour)."""

    scrape_s: float = 15.0
    window_s: float = 60.0
    adapter_s: float = 0.0
    down_window_s: float = 300.0
    """``behavior.scaleDown.stabilizationWindowSeconds``."""

    @property
    def pipeline(self) -> Pipeline:
        return Pipeline(self.scrape_s, self.window_s, self.adapter_s)


@dataclass(slots=True)
class HpaService:
    """One HPA object and what its metrics need to know about the service."""

    name: str
    objective_ms: float
    per_replica_rps: float
    """Requests/s one replica serves at full utilization (the same capacity Ebbtide is given)."""
    state: HpaState
    series: PrometheusQuantile


def latency_proposal(
    hpa: HpaService, now: float, *, current: int, ready: int, ratio: float, what: str
) -> list[tuple[int, str]]:
    """The P99 metric's proposal, ``target.type: Value`` at ``ratio`` x the objective."""
    p = hpa.series.read(now)
    if p is None:
        return []
    target = ratio * hpa.objective_ms
    want = hpa.state.raw(current=current, ready=ready, metric=p, target=target)
    quantile = f"P{hpa.series.quantile * 100:g}"
    return [(want, f"{quantile} {p:.0f}ms vs {what} {target:.0f}ms → {want}")]


class HpaPeer:
    """An HPA per service on the peer's metrics (module docstring)."""

    name: ClassVar[str]
    label: ClassVar[str]
    preemption: ClassVar[bool] = True
    settings: HpaSettings

    def __init__(
        self,
        policy: Policy,
        models: Mapping[str, ServiceModel],
        *,
        start: float,
        settings: HpaSettings,
    ) -> None:
        self.policy = policy
        self.settings = settings
        behavior = HpaBehavior(down_window_s=settings.down_window_s)
        self.sync_s = behavior.sync_period_s
        self._next = start
        self.hpas: dict[str, HpaService] = {}
        for name, s in sorted(policy.spec.services.items()):
            key = f"{s.namespace}/{name}"
            model = models.get(key)
            if s.scale is None or s.replicas is None or model is None:
                continue
            series = PrometheusQuantile.of(
                settings.pipeline, start=start, quantile=s.slo.percentile / 100.0
            )
            state = HpaState(s.replicas.min, s.replicas.max, behavior)
            self.hpas[key] = HpaService(
                name, s.slo.objective_ms, model.per_replica_rps, state, series
            )

    def observe(self, event: Event) -> None:
        """Requests go to the service's series."""
        if type(event) is not InferenceLatency or event.samples_ms is None:
            return
        hpa = self.hpas.get(event.key)
        if hpa is not None:
            hpa.series.observe(event.time, event.samples_ms)

    def proposals(
        self, hpa: HpaService, now: float, *, current: int, ready: int
    ) -> list[tuple[int, str]]:
        """One (replicas, why) per metric that has a value at ``now``."""
        raise NotImplementedError

    def evaluate(self, now: float, snapshot: Snapshot) -> list[Decision]:
        """Every sync period: one reconcile per HPA."""
        if now < self._next:
            return []
        self._next = now + self.sync_s
        inv = Inventory(snapshot, self.policy)
        out: list[Decision] = []
        for key, hpa in self.hpas.items():
            wl = inv.service_workload.get(key)
            if wl is None:
                continue
            ready = running_replicas(snapshot, {wl.key: key})[key]
            current = wl.replicas
            proposed = self.proposals(hpa, now, current=current, ready=ready)
            if not proposed:
                continue
            desired, _ = max(proposed, key=lambda p: p[0])
            to = hpa.state.step(now, current=current, desired=desired)
            if to == current:
                continue
            reasons = "; ".join(why for _, why in proposed)
            why = Explanation.of(
                self.name, f"{hpa.name}: {reasons}; {ready} ready: {self.name} {current}→{to}"
            )
            out.append(Scale(now, wl.key, wl.kind, current, to, "inference", why))
        return out

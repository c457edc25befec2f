"""Peer ``hpa-priority``: the HPA (default behaviour) on a Prometheus P99, with the default
scheduler preempting training for inference through PriorityClasses.

What a platform team gets without Ebbtide when inference runs at a higher PriorityClass than
training: one HPA per policy service with a scale target (``minReplicas``/``maxReplicas`` the
policy's replica bounds), its metric the service's latency percentile (the policy's SLO
percentile, an Object/External metric, ``target.type: Value``, ``value`` the objective) served by
prometheus-adapter (:class:`~.prometheus.PrometheusQuantile`: 15 s scrape, ``rate[1m]``), the
replica calculation of :class:`~.hpa.HpaState` every 15 s. Scaled-up pods that find no free GPU
are placed by the scheduler's preemption (the run turns :attr:`SimCluster.preemption
<controller.simcluster.SimCluster.preemption>` on): lower-priority training pods are evicted with
their
grace period. It never shrinks training, converts MIG or evicts by itself.
"""

from __future__ import annotations

from typing import ClassVar

from controller.offline.experiment.peers.hpa import HpaBehavior, HpaState
from controller.offline.experiment.peers.promquery import PrometheusQuantile
from controller.offline.models.telemetry import running_replicas
from policies.decisions import Decision, Explanation, Scale
from policies.inventory import Inventory
from policies.model import Policy
from policies.snapshot import Snapshot
from streams.events import Event, InferenceLatency

__all__ = ["HpaPriority"]


class HpaPriority:
    """The ``hpa-priority`` peer (module docstring)."""

    name: str = "hpa-priority"
    label: str = "HPA (15s sync, Prometheus P99 15s scrape + rate[1m]) + priority preemption"
    preemption: bool = True
    RULE: ClassVar[str] = "hpa"

    def __init__(
        self,
        policy: Policy,
        *,
        start: float,
        behavior: HpaBehavior | None = None,
        scrape_s: float = 15.0,
        window_s: float = 60.0,
    ) -> None:
        self.policy = policy
        self.behavior = behavior or HpaBehavior()
        self._next = start
        self._hpas: dict[str, tuple[str, float, HpaState, PrometheusQuantile]] = {}
        for name, s in sorted(policy.spec.services.items()):
            if s.scale is None or s.replicas is None:
                continue
            metric = PrometheusQuantile(
                start=start, quantile=s.slo.percentile / 100.0, scrape_s=scrape_s,
                window_s=window_s,
            )  # fmt: skip
            state = HpaState(s.replicas.min, s.replicas.max, self.behavior)
            self._hpas[f"{s.namespace}/{name}"] = (name, s.slo.objective_ms, state, metric)

    def observe(self, event: Event) -> None:
        """Requests go to the service's histogram."""
        if type(event) is not InferenceLatency or event.samples_ms is None:
            return
        hpa = self._hpas.get(event.key)
        if hpa is not None:
            hpa[3].observe(event.time, event.samples_ms)

    def metric(self, key: str, now: float) -> float | None:
        """The value the HPA reads for ``key`` at ``now``."""
        return self._hpas[key][3].read(now)

    def source(self) -> str:
        """How the metric reached the HPA, for the decision's reason."""
        return "via Prometheus"

    def evaluate(self, now: float, snapshot: Snapshot) -> list[Decision]:
        """Every sync period: one HPA reconcile per service."""
        if now < self._next:
            return []
        self._next = now + self.behavior.sync_period_s
        inv = Inventory(snapshot, self.policy)
        out: list[Decision] = []
        for key, (name, objective, state, metric) in self._hpas.items():
            wl = inv.service_workload.get(key)
            value = self.metric(key, now)
            if wl is None or value is None:
                continue
            ready = running_replicas(snapshot, {wl.key: key})[key]
            current = wl.replicas
            to = state.step(now, current=current, ready=ready, metric=value, target=objective)
            if to == current:
                continue
            why = Explanation.of(
                self.RULE,
                f"{name}: P{metric.quantile * 100:g} {value:.0f}ms {self.source()} vs target "
                f"{objective:g}ms, "
                f"{ready} ready: HPA {current}→{to}",
            )
            out.append(Scale(now, wl.key, wl.kind, current, to, "inference", why))
        return out

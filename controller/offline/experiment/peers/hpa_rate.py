"""Peer ``hpa-rate``: the HPA on request rate per replica with a latency guard, as LLM serving
is scaled (on demand signals, latency as a guard).

Two External metrics through prometheus-adapter; the larger proposal wins
(``computeReplicasForMetrics``):

* ``sum(rate(requests_total[1m]))``, ``target.type: AverageValue`` at ``utilization`` x
  the requests/s one replica serves (default 0.5: the same capacity Ebbtide's proactive example
  is given, ``leading.ratePerReplica`` 2.5 of 5);
* the P99, ``target.type: Value`` at ``guard`` x the objective (default 0.8).

Scale-down stabilization 10 minutes by default (a setting): the rate follows a quiet spell
down faster than the load comes back.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.offline.experiment.peers.hpacontroller import (
    HpaPeer,
    HpaService,
    HpaSettings,
    latency_proposal,
)

__all__ = ["HpaRate", "HpaRateSettings", "rate_proposal"]


@dataclass(frozen=True, slots=True)
class HpaRateSettings(HpaSettings):
    down_window_s: float = 600.0
    utilization: float = 0.5
    """Target request rate per replica as a fraction of what one replica serves."""
    guard: float = 0.8
    """The P99 guard's target as a fraction of the objective."""


def rate_proposal(
    hpa: HpaService, now: float, *, current: int, rate: float | None, utilization: float
) -> list[tuple[int, str]]:
    """The ``AverageValue`` request-rate proposal (shared with KEDA's rate query)."""
    if rate is None:
        return []
    target = utilization * hpa.per_replica_rps
    want = hpa.state.per_pod(current=current, total=rate, target=target)
    return [(want, f"rate {rate:.2f} req/s vs {target:.2f} per replica → {want}")]


class HpaRate(HpaPeer):
    """The ``hpa-rate`` peer (module docstring)."""

    name = "hpa-rate"
    label = "HPA on request rate/replica + P99 guard + priority preemption"
    settings: HpaRateSettings

    def proposals(
        self, hpa: HpaService, now: float, *, current: int, ready: int
    ) -> list[tuple[int, str]]:
        s = self.settings
        out = rate_proposal(
            hpa, now, current=current, rate=hpa.series.read_rate(now), utilization=s.utilization
        )
        guard = latency_proposal(
            hpa, now, current=current, ready=ready, ratio=s.guard, what="guard"
        )
        return out + guard

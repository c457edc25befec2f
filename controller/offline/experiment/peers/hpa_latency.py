"""Peer ``hpa-latency``: the HPA on the service's latency percentile, its target below the
objective.

One External metric, ``histogram_quantile(0.99, rate(..._bucket[1m]))`` through
prometheus-adapter, ``target.type: Value`` at ``target`` x the objective (default 0.7: an SRE
does not put the target *on* the SLO line, where the HPA's tolerance lets it hover just above
it). Behaviour: the HPA's defaults (:mod:`.hpa`), scale-down window a setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.offline.experiment.peers.hpacontroller import (
    HpaPeer,
    HpaService,
    HpaSettings,
    latency_proposal,
)

__all__ = ["HpaLatency", "HpaLatencySettings"]


@dataclass(frozen=True, slots=True)
class HpaLatencySettings(HpaSettings):
    target: float = 0.7
    """The P99 target as a fraction of the objective."""


class HpaLatency(HpaPeer):
    """The ``hpa-latency`` peer (module docstring)."""

    name = "hpa-latency"
    label = "HPA on P99 (target 0.7x objective) + priority preemption"
    settings: HpaLatencySettings

    def proposals(
        self, hpa: HpaService, now: float, *, current: int, ready: int
    ) -> list[tuple[int, str]]:
        return latency_proposal(
            hpa, now, current=current, ready=ready, ratio=self.settings.target, what="target"
        )

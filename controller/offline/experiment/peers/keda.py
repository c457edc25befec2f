"""Peer ``keda``: KEDA at its defaults, a ScaledObject with the Prometheus scaler.

KEDA creates the HPA (default behaviour, :mod:`.hpa`) and serves its External metric from the
scaler. Defaults (keda.sh "Scaling Deployments" and the Prometheus scaler): the query
``sum(rate(requests_total[1m]))`` with ``threshold`` the per-replica target, ``metricType:
AverageValue`` (KEDA's default), ``pollingInterval`` 30 s (which only drives activation from
zero) and ``useCachedMetrics: false``: at each 15 s HPA sync the metrics server asks the scaler,
which queries Prometheus then (``pkg/scaling/scale_handler.go`` ``GetScaledObjectMetrics``).
With ``cached`` on, the HPA reads the value of the last poll instead, up to 30 s older.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from controller.offline.experiment.peers.hpa_rate import rate_proposal
from controller.offline.experiment.peers.hpacontroller import HpaPeer, HpaService, HpaSettings
from controller.offline.models.queueing import ServiceModel
from policies.model import Policy

__all__ = ["Keda", "KedaSettings"]


@dataclass(frozen=True, slots=True)
class KedaSettings(HpaSettings):
    utilization: float = 0.5
    """``threshold`` as a fraction of the requests/s one replica serves."""
    cached: bool = False
    """``useCachedMetrics``."""
    polling_s: float = 30.0
    """``pollingInterval``."""


class Keda(HpaPeer):
    """The ``keda`` peer (module docstring)."""

    name = "keda"
    label = "KEDA (Prometheus rate, defaults) + HPA + priority preemption"
    settings: KedaSettings

    def __init__(
        self,
        policy: Policy,
        models: Mapping[str, ServiceModel],
        *,
        start: float,
        settings: KedaSettings,
    ) -> None:
        super().__init__(policy, models, start=start, settings=settings)
        self.start = start
        self._cache: dict[str, tuple[float, float | None]] = {}

    def rate(self, hpa: HpaService, now: float) -> float | None:
        """What the metrics server answers the HPA at ``now``: the query now, or with
        ``cached`` the value of the last poll at or before ``now``."""
        s = self.settings
        if not s.cached:
            return hpa.series.read_rate(now)
        k = math.floor(round((now - self.start) / s.polling_s, 9))
        poll = self.start + k * s.polling_s
        hit = self._cache.get(hpa.name)
        if hit is None or hit[0] != poll:
            hit = self._cache[hpa.name] = (poll, hpa.series.read_rate(poll))
        return hit[1]

    def proposals(
        self, hpa: HpaService, now: float, *, current: int, ready: int
    ) -> list[tuple[int, str]]:
        return rate_proposal(
            hpa, now, current=current, rate=self.rate(hpa, now),
            utilization=self.settings.utilization,
        )  # fmt: skip

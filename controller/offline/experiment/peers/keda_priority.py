"""Peer ``keda-priority``: KEDA's Prometheus scaler polled every 30 s in front of the HPA, with
the default scheduler's PriorityClass preemption.

KEDA creates the HPA (the same default behaviour, :mod:`.hpa_priority`) and serves its External
metric from the Prometheus scaler. With ``pollingInterval`` 30 s and the scaler's value cached
between polls (``useCachedMetrics``), the HPA reads, at each 15 s sync, the value of the query
KEDA ran at its last poll: up to 30 s older than the HPA's own Prometheus read, on top of the
scrape and ``rate[1m]`` delay. ``metricType: Value`` (a latency is not a per-pod average).
"""

from __future__ import annotations

import math

from controller.offline.experiment.peers.hpa_priority import HpaPriority
from policies.model import Policy

__all__ = ["KedaPriority"]


class KedaPriority(HpaPriority):
    """The ``keda-priority`` peer (module docstring)."""

    name = "keda-priority"
    label = "KEDA (30s poll) + HPA + priority preemption"
    RULE = "keda-hpa"

    def __init__(self, policy: Policy, *, start: float, polling_s: float = 30.0) -> None:
        super().__init__(policy, start=start)
        self.start = start
        self.polling_s = polling_s
        self._cache: dict[str, tuple[float, float | None]] = {}

    def metric(self, key: str, now: float) -> float | None:
        """The value KEDA's last poll (at or before ``now``) got from Prometheus."""
        poll = (
            self.start + math.floor(round((now - self.start) / self.polling_s, 9)) * self.polling_s
        )
        cached = self._cache.get(key)
        if cached is None or cached[0] != poll:
            cached = self._cache[key] = (poll, super().metric(key, poll))
        return cached[1]

    def source(self) -> str:
        return f"via KEDA (polled every {self.polling_s:g}s) and Prometheus"

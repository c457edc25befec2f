"""A service's request metrics as an autoscaler reads them through Prometheus.

Model: the service exports a request counter and a latency histogram; Prometheus scrapes them
every ``scrape_s`` (15 s) on a fixed grid from the run's start; the adapter (prometheus-adapter,
or KEDA's Prometheus scaler) evaluates its query (``histogram_quantile(0.99,
rate(..._bucket[window]))`` or ``sum(rate(..._count[window]))``, ``window`` 1 m) ``adapter_s``
after it is asked, seeing only what the last scrape at or before ``now - adapter_s`` collected.
So the value read at ``now`` covers the requests in ``(s - window, s]`` with ``s`` that scrape:
between ``adapter_s`` and ``adapter_s + scrape_s`` old, averaged over the window. The quantile is
exact over the requests (no bucket interpolation, which would only add error); the rate is the
count over the window (``rate()``'s extrapolation to the window's edges, on a grid-aligned
window, is the same).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Pipeline", "PrometheusQuantile"]


@dataclass(frozen=True, slots=True)
class Pipeline:
    """How a peer's metric reaches it (every field a setting of ``--compare``)."""

    scrape_s: float = 15.0
    """Prometheus' ``scrape_interval`` (its default is 1 m; 15 s is what most charts set)."""
    window_s: float = 60.0
    """The query's range, ``rate(...[window])``."""
    adapter_s: float = 0.0
    """Delay between the autoscaler's request and the data the adapter's query sees."""


class PrometheusQuantile:
    """Requests of one service and the delayed percentile and rate an adapter returns
    (module docstring)."""

    def __init__(
        self,
        *,
        start: float,
        quantile: float,
        scrape_s: float = 15.0,
        window_s: float = 60.0,
        query_s: float = 0.0,
    ) -> None:
        self.start = start
        self.quantile = quantile
        self.scrape_s = scrape_s
        self.window_s = window_s
        self.query_s = query_s
        self._ring: deque[tuple[float, Sequence[float]]] = deque()

    @classmethod
    def of(cls, pipeline: Pipeline, *, start: float, quantile: float) -> PrometheusQuantile:
        """The series as ``pipeline`` delivers it."""
        return cls(
            start=start,
            quantile=quantile,
            scrape_s=pipeline.scrape_s,
            window_s=pipeline.window_s,
            query_s=pipeline.adapter_s,
        )

    def observe(self, at: float, samples: Sequence[float]) -> None:
        """Requests completed at ``at``."""
        self._ring.append((at, samples))

    def last_scrape(self, now: float) -> float:
        """The newest scrape the query at ``now`` can see."""
        k = math.floor(round((now - self.query_s - self.start) / self.scrape_s, 9))
        return self.start + k * self.scrape_s

    def read(self, now: float) -> float | None:
        """The percentile over ``(s - window, s]`` for the last visible scrape ``s``."""
        return self.until(self.last_scrape(now))

    def read_rate(self, now: float) -> float | None:
        """Requests per second over ``(s - window, s]`` for the last visible scrape ``s``;
        ``None`` before the first scrape (no series yet)."""
        end = self.last_scrape(now)
        if end < self.start:
            return None
        self._trim(end)
        return sum(len(b) for ts, b in self._ring if ts <= end) / self.window_s

    def until(self, end: float) -> float | None:
        """The percentile of the requests in ``(end - window, end]``; older ones are dropped,
        so ``end`` must not go back in time."""
        self._trim(end)
        values = sorted(v for ts, batch in self._ring if ts <= end for v in batch)
        if not values:
            return None
        return values[math.floor(self.quantile * (len(values) - 1))]

    def _trim(self, end: float) -> None:
        ring = self._ring
        while ring and ring[0][0] <= end - self.window_s:
            ring.popleft()

"""A service's latency percentile as an HPA reads it through Prometheus.

Model: the service exports a latency histogram; Prometheus scrapes it every ``scrape_s`` (15 s)
on a fixed grid from the run's start; the adapter (prometheus-adapter, or KEDA's Prometheus
scaler) evaluates ``histogram_quantile(0.99, rate(..[window]))`` with ``window`` 1 m at the moment
it is asked, which sees only what the last scrape at or before ``now - query_s`` collected. So
the value read at ``now`` is the percentile of the requests in ``(s - window, s]`` with ``s`` that
scrape: between ``query_s`` and ``query_s + scrape_s`` old, averaged over a minute. The quantile
is exact over the requests (no bucket interpolation, which would only add error).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

__all__ = ["PrometheusQuantile"]


class PrometheusQuantile:
    """Requests of one service and the delayed percentile an adapter returns (module doc)."""

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

    def until(self, end: float) -> float | None:
        """The percentile of the requests in ``(end - window, end]``; older ones are dropped,
        so ``end`` must not go back in time."""
        ring = self._ring
        while ring and ring[0][0] <= end - self.window_s:
            ring.popleft()
        values = sorted(v for ts, batch in ring if ts <= end for v in batch)
        if not values:
            return None
        return values[math.floor(self.quantile * (len(values) - 1))]

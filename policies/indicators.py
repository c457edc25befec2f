"""Leading indicators: what a service's request stream says about the replicas it needs.

Design:

* The percentile is a lagging signal: it turns only once the queue has built, and a breach is
  declared ``breachAfter`` later still. The request rate moves with the load itself, so a
  service with ``scale.leading`` also asks for ``ceil(rate / ratePerReplica)`` replicas,
  breaching or not (:func:`~policies.rules.respond_to_breach` scales up to it, bounded like any
  scale-up; :func:`~policies.scaledown.scale_down` never recommends fewer).
* The rate is the request count of the SLO window (the exceedance counters the engine keeps
  anyway) over the part of the window that holds data: no second window, no extra work per
  event, and a window still filling after a start or a silence is not read as a quiet one
  (which would scale up a little, then wait out a cooldown). Fewer requests than
  ``minSamples`` give no rate, as they give no percentile. Over a full window the rate is a
  window's average, so on a step it lags by up to half a window: the percentile still answers
  a flash crowd; the rate meets a ramp early and keeps scale-down off what the load needs.
"""

from __future__ import annotations

import math

from policies.model import ServiceSpec
from policies.windows import LatencyWindow

__all__ = ["leading_replicas", "request_rate"]


def request_rate(spec: ServiceSpec, requests: int, window: LatencyWindow, now: float) -> float:
    """Requests/s at ``now``: ``requests`` counted over the SLO ``window`` divided by the span
    of it that holds data."""
    oldest = window.oldest(now)
    slo = spec.slo
    span = slo.window if oldest is None else min(slo.window, max(1.0, now - oldest))
    return requests / span


def leading_replicas(
    spec: ServiceSpec, requests: int, window: LatencyWindow, now: float, *, margin: float = 0.0
) -> int | None:
    """Replicas the request rate, raised by ``margin``, asks for (``None`` without a leading
    indicator, or with fewer requests than ``slo.minSamples``: too few to judge a rate by
    either). Scale-down asks with ``scale.tolerance`` as the margin, so a rate hovering at a
    replica boundary does not take a replica away that the next tick adds back."""
    lead = spec.scale.leading if spec.scale is not None else None
    if lead is None or requests < spec.slo.min_samples:
        return None
    rate = request_rate(spec, requests, window, now) * (1.0 + margin)
    return math.ceil(rate / lead.rate_per_replica - 1e-9)

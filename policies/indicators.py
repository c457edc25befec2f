"""Leading indicators: what a service's request stream says about the replicas it needs.

Design:

* The percentile is a lagging signal: it turns only once the queue has built, and a breach is
  declared ``breachAfter`` later still. The request rate moves with the load itself, so a
  service with ``scale.leading`` also asks for ``ceil(rate / ratePerReplica)`` replicas,
  breaching or not (:func:`~policies.rules.respond_to_breach` scales up to it, bounded like any
  scale-up; :func:`~policies.scaledown.scale_down` never recommends fewer).
* The rate is the request count of the SLO window (the exceedance counters the engine keeps
  anyway) over the window's length: no second window, no extra work per event. While the window
  fills after a start the rate is underestimated, which can only delay a scale-up, never cause
  one.
"""

from __future__ import annotations

import math

from policies.model import ServiceSpec

__all__ = ["leading_replicas", "request_rate"]


def request_rate(spec: ServiceSpec, requests: int) -> float:
    """Requests/s over the SLO window that counted ``requests``."""
    return requests / spec.slo.window


def leading_replicas(spec: ServiceSpec, requests: int) -> int | None:
    """Replicas the request rate asks for (``None`` without a leading indicator)."""
    lead = spec.scale.leading if spec.scale is not None else None
    if lead is None:
        return None
    return math.ceil(request_rate(spec, requests) / lead.rate_per_replica - 1e-9)

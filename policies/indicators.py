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
* ``learn: true`` takes the rate per replica from the service's own latency curve
  (:mod:`policies.capacity`), and asks nothing until that fit is confident; ``headroom`` plans
  for the rate one start-up ahead (:mod:`policies.headroom`); ``forecast`` for the higher rate
  the load's daily shape predicts then, while its error allows (:mod:`policies.forecast`).
  ``tolerance`` holds a scale-up ask at the current replicas while the planned rate is within
  it above what they serve (the HPA's per-direction tolerance): the rate of a level load
  wanders a few percent from window to window, and each crossing of a replica boundary would
  shrink training for a replica the next window no longer asks for.
  :func:`leading_ask` says what it used, for the explanation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.headroom import ServiceLoad
from policies.model import ServiceSpec
from policies.windows import LatencyWindow

__all__ = ["LeadingAsk", "leading_ask", "request_rate"]


@dataclass(frozen=True, slots=True)
class LeadingAsk:
    """What the leading indicator asks for, and from what."""

    replicas: int
    rate: float
    """Requests/s over the SLO window."""
    planned: float
    """Requests/s planned for: ``rate`` plus ``growth`` over ``lookahead_s`` (headroom)."""
    per_replica: float
    learned: bool
    """Whether ``per_replica`` was learned (:mod:`policies.capacity`) rather than set."""
    growth: float = 0.0
    lookahead_s: float = 0.0
    forecast: float | None = None
    """The trusted forecast's rate one lookahead ahead (:mod:`policies.forecast`), if any."""
    margin: float = 0.0
    """The fraction ``planned`` was raised by before dividing by ``per_replica``."""
    tolerance: float = 0.0
    """``leading.tolerance`` where it was weighed (a scale-up ask above the current replicas,
    held at them within it), else 0."""


def request_rate(spec: ServiceSpec, requests: int, window: LatencyWindow, now: float) -> float:
    """Requests/s at ``now``: ``requests`` counted over the SLO ``window`` divided by the span
    of it that holds data."""
    oldest = window.oldest(now)
    slo = spec.slo
    span = slo.window if oldest is None else min(slo.window, max(1.0, now - oldest))
    return requests / span


def leading_ask(
    spec: ServiceSpec,
    requests: int,
    window: LatencyWindow,
    now: float,
    *,
    margin: float = 0.0,
    load: ServiceLoad | None = None,
    down: bool = False,
    current: int | None = None,
) -> LeadingAsk | None:
    """Replicas the request rate, planned ahead (``headroom``, from ``load``) and raised by
    ``margin``, asks for; ``None`` without a leading indicator, with fewer requests than
    ``slo.minSamples`` (too few to judge a rate by either), or with ``learn: true``, no
    confident fit yet and no ``ratePerReplica`` to start from. Scale-down asks with ``down``
    (room for the steepest recent rise) and ``scale.tolerance`` as the margin, so a rate
    hovering at a replica boundary does not take a replica away that the next tick adds back.
    A learned rate takes no margin: it is the rate at ``leading.learnAt`` of the objective
    (unset: the objective over ``1 + tolerance``), the fit's confidence is in it
    (:mod:`policies.capacity`), and a second tolerance would keep a replica more than scale-up
    asks for; at ``learnAt: 100%`` the scale-down's margin is ``recoverBelow`` and the
    stabilization. Scaling up (``current``, the replicas now), the ask stays at ``current``
    while the planned rate is within ``leading.tolerance`` above what they serve."""
    lead = spec.scale.leading if spec.scale is not None else None
    if lead is None or requests < spec.slo.min_samples:
        return None
    fit = load.capacity(spec) if lead.learn and load is not None else None
    if fit is not None:
        per = fit.rate_per_replica
    elif lead.rate_per_replica is not None:
        per = lead.rate_per_replica
    else:
        return None
    rate = request_rate(spec, requests, window, now)
    planned, growth, ahead = rate, 0.0, 0.0
    if lead.headroom and load is not None:
        growth, ahead = load.growth(now, down=down), load.lookahead_s(spec)
        planned = rate + growth * ahead
    forecast = load.forecast if load is not None else None
    if load is not None and forecast is not None and forecast > planned:
        planned, ahead = forecast, load.lookahead_s(spec)
    if fit is not None:
        margin = 0.0
    replicas = math.ceil(planned * (1.0 + margin) / per - 1e-9)
    tolerance = 0.0
    if not down and current is not None and replicas > current:
        tolerance = lead.tolerance
        if planned <= current * per * (1.0 + tolerance):
            replicas = current
    return LeadingAsk(
        replicas, rate, planned, per, fit is not None, growth, ahead, forecast, margin, tolerance
    )

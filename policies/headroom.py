"""One service's load as the leading indicator plans with it: learned capacity and headroom.

Why: a replica asked for now serves only once its pod has started (minutes for an LLM server),
so the replicas a service needs are those of the load one start-up ahead, at the capacity it
actually has. :class:`ServiceLoad` is what the engine keeps per service with ``scale.leading``
(on :class:`~policies.servicetrack.ServiceTrack`): it takes one observation per evaluation
(:meth:`ServiceLoad.observe`) and answers what rate per replica and what planned rate the
leading indicator uses (:func:`policies.indicators.leading_ask`).

Design:

* Observations are taken once per SLO window (the first evaluation at or after the previous
  one's time plus a window), so an engine that evaluates at any cadence learns the same thing;
  the snapshot's pods are read only when a new snapshot came (start-up times).
* A capacity point (:class:`~policies.capacity.CapacityFit`) needs the window's percentile at
  or below the objective, a rate, and the same Running replicas for the whole window.
* With ``leading.forecast`` each observation also records the rate in the load's shape and
  forecasts one lookahead ahead (:mod:`policies.forecast`); the forecast is kept for the
  indicator only while its measured error allows.
* The lookahead is the start-up time (``leading.startup``, else observed, else none yet) plus
  half a window (the rate is a window's average). See :mod:`policies.capacity` for the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from policies.capacity import Capacity, CapacityFit, RateTrend, StartupClock
from policies.forecast import DailyShape
from policies.model import ServiceSpec
from policies.snapshot import Pod

__all__ = ["ServiceLoad"]


class ServiceLoad:
    """A service's learned capacity, start-up time and load growth (module docstring)."""

    __slots__ = (
        "_due",
        "_pods",
        "_running",
        "_running_since",
        "fit",
        "forecast",
        "shape",
        "startup",
        "trend",
    )

    def __init__(self) -> None:
        self.fit = CapacityFit()
        self.startup = StartupClock()
        self.trend = RateTrend()
        #: When the next window's observation is due.
        self._due = -math.inf
        #: The pods last read (a new snapshot's pods are a new tuple or list).
        self._pods: object = None
        self._running = -1
        self._running_since = -math.inf
        #: The load's shape, with ``leading.forecast``, and the rate it forecast at the last
        #: observation for one lookahead later (``None``: none, or not trusted).
        self.shape: DailyShape | None = None
        self.forecast: float | None = None

    def observe(
        self,
        now: float,
        spec: ServiceSpec,
        *,
        rate: float | None,
        p_ms: float | None,
        pods: Sequence[Pod],
    ) -> None:
        """What the evaluation at ``now`` sees: the request rate over the SLO window (``None``
        with too few requests), its percentile, and the service workload's pods."""
        if pods is not self._pods:
            self._pods = pods
            self.startup.observe(now, pods)
            running = sum(1 for p in pods if p.phase == "Running" and p.node is not None)
            if running != self._running:
                self._running, self._running_since = running, now
        window = spec.slo.window
        if now < self._due:
            return
        self._due = now + window
        if rate is None:
            return
        self.trend.add(now, rate)
        self._forecast(now, spec, rate)
        if (
            p_ms is not None
            and p_ms <= spec.slo.objective_ms
            and self._running > 0
            and now - self._running_since >= window
        ):
            # the window's requests weight its point (policies.capacity)
            self.fit.add(now, rate / self._running, p_ms, rate * window)

    def _forecast(self, now: float, spec: ServiceSpec, rate: float) -> None:
        """Record ``rate`` in the load's shape and forecast one lookahead ahead (made and
        scored every window, used only while trusted)."""
        lead = spec.scale.leading if spec.scale is not None else None
        want = lead.forecast if lead is not None else None
        if want is None:
            self.shape = self.forecast = None
            return
        shape = self.shape
        if shape is None or (shape.period_s, shape.slot_s) != (want.period, spec.slo.window):
            shape = self.shape = DailyShape(period_s=want.period, slot_s=spec.slo.window)
        shape.add(now, rate)
        predicted = shape.forecast(now, rate, self.lookahead_s(spec))
        self.forecast = predicted if shape.trusted(want.max_error) else None

    def capacity(self, spec: ServiceSpec) -> Capacity | None:
        """The confident learned capacity at ``leading.learnAt`` of the objective (unset: one
        tolerance below it), else ``None``."""
        scale = spec.scale
        lead = scale.leading if scale is not None else None
        if lead is not None and lead.learn_at is not None:
            return self.fit.capacity(spec.slo.objective_ms * lead.learn_at)
        tolerance = scale.tolerance if scale is not None else 0.0
        return self.fit.capacity(spec.slo.objective_ms / (1.0 + tolerance))

    def startup_s(self, spec: ServiceSpec) -> float:
        """A replica's start-up: ``leading.startup``, else the observed one, else none yet."""
        lead = spec.scale.leading if spec.scale is not None else None
        if lead is not None and lead.startup is not None:
            return lead.startup
        return self.startup.seconds or 0.0

    def lookahead_s(self, spec: ServiceSpec) -> float:
        """Seconds from asking for a replica to its serving, as the rate sees it."""
        return self.startup_s(spec) + spec.slo.window / 2

    def growth(self, now: float, *, down: bool) -> float:
        """Requests/s per second to plan for: the current slope scaling up; scaling down, the
        steepest recent rise (or the current slope, if steeper)."""
        slope = self.trend.slope
        return max(slope, self.trend.surge(now)) if down else slope

"""A forecast of a service's load from the shape of its last days, and how far to trust it.

Why: a reactive controller meets a ramp only once the rate has risen, and a replica then takes a
start-up to serve. Serving load has a daily shape; the last days' rates at the same time of day
say a morning ramp is coming before it does, so the leading indicator can pre-scale for it
(:func:`policies.indicators.leading_ask`), and the forecast's own error says when not to.

Design (pure; the engine passes the time):

* **Profile.** The period (``leading.forecast.period``, a day by default) is cut into slots of
  one SLO window; each slot keeps the rate observed in it on each of the last
  :data:`PERIODS_KEPT` periods. The slot's expected rate is the *lowest* of them, and a slot
  seen on fewer than :data:`MIN_PERIODS` periods expects nothing: a ramp seen every day is
  planned for, a one-off burst (a launch, an incident) is not (with one day seen, the first
  version pre-scaled for the day before's burst: BENCHMARKS.md).
* **Level.** Days differ in level, not only in shape, so a forecast is the profile scaled by
  how today's rate compares with the profile now, that ratio held within ``[1/2, 2]``: a
  burst no forecast knows does not multiply every later forecast.
* **Ahead.** What the indicator plans for is the highest forecast over the next lookahead (the
  start-up time): a ramp predicted to start within it is pre-scaled for.
* **Error.** Every forecast made is scored against the rate when its time comes (``|forecast
  - rate| / max(forecast, rate)``; one that came due in a silence is dropped), as a moving
  average over about :data:`ERROR_SPAN` scores; a forecast is used only after
  :data:`MIN_SCORED` scores and while that error is at most ``leading.forecast.maxError``.
  Otherwise the service scales on what it observes (reacting), as without a forecast.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final

__all__ = ["ERROR_SPAN", "MIN_PERIODS", "MIN_SCORED", "PERIODS_KEPT", "DailyShape"]

#: Periods (days) of rates each slot keeps.
PERIODS_KEPT: Final = 3
#: Earlier periods a slot needs before it forecasts: with one, a one-off burst is a "ramp".
MIN_PERIODS: Final = 2
#: Scores the forecast error averages over (an exponential moving average's span).
ERROR_SPAN: Final = 30
#: Scores needed before the forecast is trusted.
MIN_SCORED: Final = 10
_LEVEL: Final = (0.5, 2.0)


class DailyShape:
    """One service's load profile over a period, its forecasts and their error (module
    docstring)."""

    __slots__ = ("_pending", "_slots", "error", "period_s", "scored", "slot_s")

    def __init__(self, *, period_s: float, slot_s: float) -> None:
        self.period_s = period_s
        self.slot_s = slot_s
        #: slot -> (period number, rate) of the last periods it was observed in
        self._slots: dict[int, deque[tuple[int, float]]] = {}
        #: forecasts made and not yet scored: (when, forecast rate)
        self._pending: deque[tuple[float, float]] = deque()
        self.error = 0.0
        self.scored = 0

    def _slot(self, t: float) -> tuple[int, int]:
        """(period number, slot within it) of time ``t``."""
        period = math.floor(t / self.period_s)
        return period, int((t - period * self.period_s) // self.slot_s)

    def expected(self, t: float) -> float | None:
        """The profile's rate at time ``t`` from earlier periods (``None`` if none holds it)."""
        period, slot = self._slot(t)
        past = [r for p, r in self._slots.get(slot, ()) if p < period]
        return min(past) if len(past) >= MIN_PERIODS else None

    def add(self, now: float, rate: float) -> None:
        """The request rate of the window ending at ``now``: scores the forecasts due by now
        and records the rate in its slot."""
        pending = self._pending
        while pending and pending[0][0] <= now:
            due, forecast = pending.popleft()
            if now - due > self.slot_s:
                continue  # no rate was seen when it came due (a silence): nothing to score
            err = abs(forecast - rate) / max(forecast, rate, 1e-9)
            alpha = 2.0 / (ERROR_SPAN + 1) if self.scored else 1.0
            self.error += alpha * (err - self.error)
            self.scored += 1
        period, slot = self._slot(now)
        kept = self._slots.setdefault(slot, deque(maxlen=PERIODS_KEPT))
        if kept and kept[-1][0] == period:
            kept[-1] = (period, rate)
        else:
            kept.append((period, rate))

    def forecast(self, now: float, rate: float, ahead_s: float) -> float | None:
        """The highest rate expected over ``(now, now + ahead_s]``, at today's level (``rate``
        against the profile now), and remembered to be scored; ``None`` without a profile for
        now and for the whole span."""
        here = self.expected(now)
        if here is None or here <= 0:
            return None
        level = min(max(rate / here, _LEVEL[0]), _LEVEL[1])
        best: float | None = None
        steps = max(1, math.ceil(ahead_s / self.slot_s))
        for k in range(1, steps + 1):
            t = now + min(ahead_s, k * self.slot_s)
            seen = self.expected(t)
            if seen is None:
                return None
            best = seen if best is None else max(best, seen)
        assert best is not None
        predicted = best * level
        at = now + ahead_s
        if not self._pending or self._pending[-1][0] < at:
            self._pending.append((at, predicted))
        return predicted

    def trusted(self, max_error: float) -> bool:
        """Whether the forecasts scored so far were close enough to use the next."""
        return self.scored >= MIN_SCORED and self.error <= max_error

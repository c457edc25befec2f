"""What a service can serve and how soon it can grow: learned capacity, start-up time and growth.

Why: a leading indicator (:mod:`policies.indicators`) needs the request rate one replica serves
within the objective. A constant is a property of one model on one card, tuned by hand; this
module learns it online from what the service itself shows, and learns what a new replica costs
in time, so the replicas kept are those the load will need once a new one could be serving.

Design (pure: the engine passes the time and what it observed; no I/O, no clock):

* **Capacity from the latency curve.** Below saturation both a queue and a continuous-batching
  LLM server slow down as ``p = p0 / (1 - x / c)`` in the load per replica ``x`` (the
  simulator's queueing model, ``controller/offline/models/queueing.py``, and the iteration time
  ``T = t0 / (1 - lam * a)`` of ``controller/offline/models/llmserving.py``; the fit ``replay
  --model fit`` does offline, ``controller/offline/models/fit.py``, assumes the same curve). So
  ``1 / p`` is a straight line in ``x``: :class:`CapacityFit` keeps exponentially forgotten
  least-squares sums of ``(x, 1 / p)`` and solves in closed form for the ``x`` at which the
  line reaches ``1 / target`` (``target``: the objective over ``1 + scale.tolerance``, the
  edge of the band in which the breach response holds, so the indicator and the percentile
  aim at the same load; in the arena it beat the ``recoverBelow`` level on goodput at equal
  attainment: BENCHMARKS.md). Points with the percentile above the
  objective are left out: a saturated server's percentile stops following the curve (the
  backlog shows in the time to first token, not in the time per token; a queue's timeout caps
  it), and such points would bend the line.
* **Points weighted by their requests.** A window's percentile is an order statistic of its
  requests: over a few dozen it reads low (the 99th of 30 is about their maximum) as well as
  noisy, and the night's windows at low load are exactly those, so equal weights tilt the line
  steeper and put the learned rate below the one the service shows by day (BENCHMARKS.md,
  "busy windows set the learned rate"). Weighting each point by its window's requests
  (inverse variance: a percentile's variance falls with the count) lets the busy windows set
  it. ``points`` is then Kish's effective number, ``(sum w)^2 / sum w^2``.
* **Confidence.** The estimate is used only when the line falls with load, enough windows
  (:data:`MIN_POINTS`, in effective weight) back it, and the standard error of the solved
  ``x`` (the delta method on the regression, which grows with extrapolation beyond the loads
  seen) is at most :data:`MAX_RELATIVE_ERROR` of it, and it lies within
  :data:`MAX_EXTRAPOLATION` times the loads seen. Otherwise there is no learned capacity and
  the latency rules alone decide, as without a leading indicator.
* **One point per SLO window**, taken only when the service's Running replicas have not
  changed for a whole window: the window's percentile and rate then describe one load per
  replica, and consecutive points do not share requests.
* **Start-up time** (:class:`StartupClock`): a replica's pod seen bound but not yet Running
  and later seen Running took ``now - created``; the slowest of the last few is the start-up
  (a setting overrides it). Scale-up cannot help before then.
* **Growth** (:class:`RateTrend`): the least-squares slope of the last few windows' request
  rates, less three standard errors of it: only the growth the fit is confident of, so the
  window-to-window noise of a level rate is not planned for as a rise (and, kept as the
  steepest rise, held through the scale-down stabilization). A scale-up asks for the load
  one start-up (plus half a window: the rate is a window's average) ahead at that slope; a
  scale-down keeps what the steepest recent rise (forgotten over :data:`SURGE_HALF_LIFE_S`)
  would need before a replica given back could be serving again.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from policies.snapshot import Pod

__all__ = [
    "FIT_HALF_LIFE_S",
    "MAX_EXTRAPOLATION",
    "MAX_RELATIVE_ERROR",
    "MIN_POINTS",
    "CapacityFit",
    "RateTrend",
    "StartupClock",
]

#: Half-life of a capacity point's weight: a new model version or card shows within hours.
FIT_HALF_LIFE_S: Final = 4 * 3600.0
#: Effective points (windows) a fit needs before it is used.
MIN_POINTS: Final = 10.0
#: Largest standard error of the learned capacity, as a fraction of it, that is still used.
MAX_RELATIVE_ERROR: Final = 0.15
#: How far beyond the loads seen (their mean plus two standard deviations) a capacity may lie.
MAX_EXTRAPOLATION: Final = 2.0
#: Windows of request rate the growth slope is fitted over.
TREND_WINDOWS: Final = 5
#: Standard errors of the fitted slope taken off it: only growth the fit is confident of. Five
#: windows leave the slope three degrees of freedom, where about 97.5 % one-sided confidence
#: takes 3.2 standard errors (Student's t), not the 2 of a large sample.
TREND_STDERRS: Final = 3.0
#: Half-life of the steepest rise that scale-down keeps room for: a rise is met again if it
#: comes back within minutes, but the replicas of a ramp long past are not held through the
#: trough after it (with an hour, the Azure trace's hourly peaks held the peak's replicas all
#: day: BENCHMARKS.md).
SURGE_HALF_LIFE_S: Final = 900.0
#: Start-up times kept (the slowest of them is the estimate).
STARTUPS_KEPT: Final = 5


@dataclass(frozen=True, slots=True)
class Capacity:
    """A confident fit: requests/s one replica serves at the target latency, its standard
    error, and the effective points behind it."""

    rate_per_replica: float
    stderr: float
    points: float


class CapacityFit:
    """Exponentially forgotten least squares of ``1 / p`` on the load per replica (module
    docstring). O(1) memory and time per point."""

    __slots__ = ("_at", "_w", "_w2", "_wx", "_wxx", "_wxy", "_wy", "_wyy", "half_life_s")

    def __init__(self, *, half_life_s: float = FIT_HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self._at: float | None = None
        self._w = self._w2 = self._wx = self._wy = self._wxx = self._wxy = self._wyy = 0.0

    def add(self, now: float, load_per_replica: float, p_ms: float, weight: float = 1.0) -> None:
        """One window's point: ``p_ms`` observed at ``load_per_replica`` requests/s, weighted
        by ``weight`` (the window's requests: module docstring)."""
        if load_per_replica <= 0 or p_ms <= 0 or weight <= 0:
            return
        if self._at is not None and now > self._at:
            d = 0.5 ** ((now - self._at) / self.half_life_s)
            self._w *= d
            self._w2 *= d * d
            self._wx *= d
            self._wy *= d
            self._wxx *= d
            self._wxy *= d
            self._wyy *= d
        self._at = now
        x, y, w = load_per_replica, 1.0 / p_ms, weight
        self._w += w
        self._w2 += w * w
        self._wx += w * x
        self._wy += w * y
        self._wxx += w * x * x
        self._wxy += w * x * y
        self._wyy += w * y * y

    @property
    def points(self) -> float:
        """Effective number of points, ``(sum w)^2 / sum w^2``."""
        return self._w * self._w / self._w2 if self._w2 > 0 else 0.0

    def capacity(self, target_ms: float) -> Capacity | None:
        """The load per replica at which the fitted percentile reaches ``target_ms``, when
        confident (module docstring), else ``None``."""
        n = self.points
        if n < MIN_POINTS or self._w <= 0:
            return None
        w = self._w
        mx, my = self._wx / w, self._wy / w
        sxx = self._wxx / w - mx * mx
        sxy = self._wxy / w - mx * my
        syy = self._wyy / w - my * my
        if sxx <= 0:
            return None
        b = sxy / sxx
        if b >= 0:
            return None  # latency does not rise with load here: nothing to solve
        a = my - b * mx
        x_star = (1.0 / target_ms - a) / b
        if x_star <= 0 or x_star > MAX_EXTRAPOLATION * (mx + 2.0 * math.sqrt(sxx)):
            return None  # far beyond the loads seen: the curve may not hold there
        resid = max(0.0, syy - b * sxy) * n / max(1.0, n - 2.0)  # residual variance
        var = resid / (b * b) * (1.0 / n + (x_star - mx) ** 2 / (sxx * n))
        se = math.sqrt(var)
        if se > MAX_RELATIVE_ERROR * x_star:
            return None
        return Capacity(x_star, se, n)


class StartupClock:
    """How long a replica's pod takes from creation to Running (module docstring)."""

    __slots__ = ("_starting", "samples")

    def __init__(self) -> None:
        #: pod key -> when it was created (or first seen starting, if its creation is unknown)
        self._starting: dict[str, float] = {}
        self.samples: deque[float] = deque(maxlen=STARTUPS_KEPT)

    def observe(self, now: float, pods: Iterable[Pod]) -> None:
        """The workload's pods as the snapshot at ``now`` shows them."""
        seen: dict[str, float] = {}
        for pod in pods:
            key = pod.key
            if pod.phase == "Pending":
                first = self._starting.get(key, now)
                seen[key] = pod.created if 0 < pod.created <= first else first
            elif pod.phase == "Running" and key in self._starting:
                self.samples.append(max(0.0, now - self._starting[key]))
        self._starting = seen

    @property
    def seconds(self) -> float | None:
        """The slowest recent start-up, ``None`` before any replica was seen starting."""
        return max(self.samples) if self.samples else None


class RateTrend:
    """The request rate's recent slope, and the steepest recent rise (module docstring)."""

    __slots__ = ("_rates", "_surge", "_surge_at")

    def __init__(self) -> None:
        self._rates: deque[tuple[float, float]] = deque(maxlen=TREND_WINDOWS)
        self._surge = 0.0
        self._surge_at = 0.0

    def add(self, now: float, rate: float) -> None:
        """The request rate of the window ending at ``now``."""
        self._rates.append((now, rate))
        slope = self.slope
        if slope > self.surge(now):
            self._surge, self._surge_at = slope, now

    @property
    def slope(self) -> float:
        """Requests/s per second the rate rose by over the kept windows, less
        :data:`TREND_STDERRS` standard errors of the fitted slope (0 when that is not above 0,
        or with fewer than three windows)."""
        pts = self._rates
        if len(pts) < 3:
            return 0.0
        n = len(pts)
        mt = sum(t for t, _ in pts) / n
        mr = sum(r for _, r in pts) / n
        stt = sum((t - mt) ** 2 for t, _ in pts)
        if stt <= 0:
            return 0.0
        fitted = sum((t - mt) * (r - mr) for t, r in pts) / stt
        residual = sum((r - mr - fitted * (t - mt)) ** 2 for t, r in pts)
        stderr = math.sqrt(residual / (n - 2) / stt)
        return max(0.0, fitted - TREND_STDERRS * stderr)

    def surge(self, now: float) -> float:
        """The steepest slope seen, halved every :data:`SURGE_HALF_LIFE_S` since."""
        return float(self._surge * 0.5 ** (max(0.0, now - self._surge_at) / SURGE_HALF_LIFE_S))

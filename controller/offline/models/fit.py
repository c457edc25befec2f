"""Fit a service's latency to its load per replica, from a recording, and validate the fit.

Counterfactual replay (``ebbtide replay --model fit``) needs to know what latency a service
would have had with other replicas. The recording only shows the latencies it had; this module
fits the simulator's queueing model (:mod:`controller.offline.models.queueing`) to them, so the same
model that closes ``simulate``'s loop closes replay's, with parameters taken from the data.

The model, per tick of ``dt`` seconds, for a service with SLO percentile ``q``:

* offered rate ``r`` = the mean recorded arrivals per second over the last :data:`SMOOTH_S`
  seconds (a smoothed rate: single ticks carry Poisson noise);
* capacity ``C = replicas_running * c`` (``c``: requests/s one replica serves at saturation);
* backlog ``B <- clamp(B + (r - C) dt, 0, C * timeout)`` (fluid overload, as the simulator);
* ``P_q = min(timeout, p0 / (1 - r/C) + 1000 B / C)``, the slowdown capped at the simulator's
  ``cap`` (50) at or past saturation. ``p0`` is the ``P_q`` at zero load.

So two parameters are fitted, ``p0`` and ``c``; ``timeout`` and ``cap`` are the simulator's.
Requests are drawn as the simulator draws them, ``base * S * (1 + jitter * E)`` with ``E``
exponential, ``base = p0 / (1 + jitter * ln(1/(1-q)))``; ``jitter`` comes from the spread of
the quietest minutes (their median ``P_q / P_50`` ratio), which the model solves in closed form.

Fitting: the recording is cut into :data:`BUCKET_S` buckets; each with at least
:data:`MIN_REQUESTS` requests gives one point, its observed ``P_q`` (the engine's rank rule)
against the model's (the highest per-tick ``P_q`` in the bucket: the top 1% of a minute's
requests come from its worst seconds). Error is measured in log space (latency spans orders
of magnitude; the log residual is the relative error). For a given ``c`` the best ``p0`` is the
geometric mean of ``observed / slowdown`` over the points with no backlog (closed form), so
only ``c`` is searched: a log-spaced grid, then golden-section refinement. Goodness of fit:
``r2`` (of ``log P_q``) and ``rmse_ms``.

Validation: the fit is repeated on the first ``1 - HOLD_OUT`` of the buckets, the model runs
over the whole recording with those parameters, and the held-back buckets are scored (mean
absolute percentage error and RMSE of ``P_q``). The counterfactual uses the fit on all points.
A service with fewer than :data:`MIN_POINTS` points or ``r2`` below :data:`MIN_R2` is not
modelled: its recorded latencies are kept, and the summary says so.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from controller.offline.models.queueing import ServiceModel, slowdown

__all__ = [
    "BUCKET_S",
    "HOLD_OUT",
    "MIN_POINTS",
    "MIN_R2",
    "MIN_REQUESTS",
    "SMOOTH_S",
    "Fit",
    "LatencyFit",
    "Observed",
    "fit_line",
    "fit_service",
    "predict",
    "quantile_at",
    "smoothed_rates",
]

#: Seconds per fitted point (the engine's usual SLO window: enough requests for a P99).
BUCKET_S: Final = 60.0
#: Seconds of arrivals averaged into the offered rate.
SMOOTH_S: Final = 15.0
#: Requests a bucket needs to be a point.
MIN_REQUESTS: Final = 50
#: Points a service needs to be modelled.
MIN_POINTS: Final = 20
#: Lowest ``r2`` (of log ``P_q``) for a service to be modelled.
MIN_R2: Final = 0.5
#: Fraction of the buckets, the last ones, held back for validation.
HOLD_OUT: Final = 0.3
_SIMULATOR: Final = ServiceModel(key="", peak_rps=0.0, per_replica_rps=1.0, base_ms=1.0)
_CAP: Final = _SIMULATOR.cap
_TIMEOUT_MS: Final = _SIMULATOR.timeout_ms
_GRID: Final = 40
_GOLDEN: Final = 20


def quantile_at(values: Sequence[tuple[float, int]], q: float) -> float:
    """The engine's percentile of ``(latency, requests)`` pairs: the request of rank
    ``floor(q (n - 1))`` in latency order, ``n`` the requests in all (histogram buckets count
    as their requests, without expanding them)."""
    ordered = sorted(values)
    rank = math.floor(q * (sum(n for _, n in ordered) - 1))
    seen = 0
    for value, n in ordered:
        seen += n
        if seen > rank:
            return value
    return ordered[-1][0]


def smoothed_rates(arrivals: Sequence[int], dt: float) -> list[float]:
    """Per tick, the mean arrivals per second over the last :data:`SMOOTH_S` seconds."""
    n = max(1, round(SMOOTH_S / dt))
    out: list[float] = []
    total = 0
    for i, a in enumerate(arrivals):
        total += a
        if i >= n:
            total -= arrivals[i - n]
        out.append(total / (min(i + 1, n) * dt))
    return out


@dataclass(frozen=True)
class Observed:
    """One service over the recording: per tick, arrivals and Running replicas; per bucket,
    the observed percentiles (``None`` where the bucket had under :data:`MIN_REQUESTS`)."""

    key: str
    q: float
    """The SLO percentile as a fraction (0.99)."""
    dt: float
    arrivals: Sequence[int]
    replicas: Sequence[int]
    pq_ms: Sequence[float | None]
    """Observed ``P_q`` per bucket; bucket ``b`` covers ticks ``[b * per, (b + 1) * per)``."""
    p50_ms: Sequence[float | None]

    @property
    def per_bucket(self) -> int:
        return max(1, round(BUCKET_S / self.dt))

    @functools.cached_property
    def rates(self) -> list[float]:
        """The offered rate per tick (:func:`smoothed_rates`)."""
        return smoothed_rates(self.arrivals, self.dt)


@dataclass(frozen=True, slots=True)
class LatencyFit:
    """Fitted parameters and how well they fit the points they came from."""

    p0_ms: float
    """``P_q`` at zero load."""
    capacity_rps: float
    """``c``: requests/s one replica serves at saturation."""
    jitter: float
    r2: float
    rmse_ms: float
    points: int
    load_range: tuple[float, float]
    """Lowest and highest mean load per replica (requests/s) of a point: beyond it the
    model's form extrapolates, the data does not."""


@dataclass(frozen=True, slots=True)
class Fit:
    """A service's fit, its validation on held-back buckets, and whether it is used."""

    key: str
    q: float
    fit: LatencyFit | None
    validation: dict[str, Any] | None
    modelled: bool
    reason: str

    def model(self) -> ServiceModel:
        """The simulator's model with the fitted parameters (only for a modelled service)."""
        assert self.fit is not None
        f = self.fit
        base = f.p0_ms / (1.0 + f.jitter * -math.log(1.0 - self.q))
        return ServiceModel(
            key=self.key, peak_rps=0.0, per_replica_rps=f.capacity_rps, base_ms=base,
            jitter=f.jitter,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        f = self.fit
        return {
            "modelled": self.modelled,
            "reason": self.reason,
            "model": "P = min(timeout, p0 / (1 - rate / (replicas * c)) + backlog wait)",
            "percentile": round(100 * self.q, 3),
            "p0_ms": None if f is None else round(f.p0_ms, 2),
            "capacity_rps_per_replica": None if f is None else round(f.capacity_rps, 3),
            "jitter": None if f is None else round(f.jitter, 3),
            "r2": None if f is None else round(f.r2, 4),
            "rmse_ms": None if f is None else round(f.rmse_ms, 1),
            "points": 0 if f is None else f.points,
            "load_range_rps_per_replica": None
            if f is None
            else [round(f.load_range[0], 3), round(f.load_range[1], 3)],
            "validation": self.validation,
        }


def _terms(obs: Observed, capacity_rps: float) -> tuple[list[float], list[float]]:
    """Per bucket, the slowdown at the bucket's mean utilization and the highest backlog
    wait (ms) in it (``inf`` slowdown where no replica ran). The fit's inner loop: it runs
    once per tick for every candidate capacity, so it is written for speed."""
    per, dt, limit = obs.per_bucket, obs.dt, _TIMEOUT_MS / 1000.0
    slow: list[float] = []
    wait: list[float] = []
    rates, replicas = obs.rates, obs.replicas
    backlog = 0.0
    for start in range(0, len(rates), per):
        total_rho = worst = 0.0
        dead = False
        end = min(start + per, len(rates))
        for i in range(start, end):
            cap = replicas[i] * capacity_rps
            if cap <= 0.0:
                backlog, dead = 0.0, True
                continue
            rate = rates[i]
            total_rho += rate / cap
            if backlog or rate > cap:
                backlog += (rate - cap) * dt
                if backlog <= 0.0:
                    backlog = 0.0
                elif backlog > cap * limit:
                    backlog = cap * limit
                if 1000.0 * backlog / cap > worst:
                    worst = 1000.0 * backlog / cap
        slow.append(math.inf if dead else slowdown(total_rho / (end - start), _CAP))
        wait.append(worst)
    return slow, wait


def predict(obs: Observed, *, p0_ms: float, capacity_rps: float) -> list[float]:
    """The model's ``P_q`` per bucket: ``p0`` times the slowdown at the bucket's mean
    utilization, plus the highest backlog wait in it (see the module docstring)."""
    slow, wait = _terms(obs, capacity_rps)
    return [min(_TIMEOUT_MS, p0_ms * s + w) for s, w in zip(slow, wait, strict=True)]


#: ``(bucket, observed P_q in ms)`` of the buckets fitted or scored, in time order.
Points = Sequence[tuple[int, float]]


def _score(obs: Observed, points: Points, capacity_rps: float) -> tuple[float, float]:
    """``(sum of squared log errors, best p0)`` over ``points``."""
    slow, wait = _terms(obs, capacity_rps)
    logs = [
        math.log(y) - math.log(slow[b])
        for b, y in points
        if wait[b] == 0.0 and math.isfinite(slow[b])
    ]
    if not logs:
        return math.inf, 0.0
    p0 = math.exp(sum(logs) / len(logs))
    sse = sum(
        (math.log(min(_TIMEOUT_MS, p0 * slow[b] + wait[b])) - math.log(y)) ** 2 for b, y in points
    )
    return sse, p0


def _jitter(obs: Observed, points: Points, capacity_rps: float) -> float:
    """``jitter`` from the median ``P_q / P_50`` of the quietest quarter of the points:
    ``r = (1 + j L) / (1 + j ln 2)`` with ``L = ln(1/(1-q))``, solved for ``j``."""
    slow, _ = _terms(obs, capacity_rps)
    quiet = sorted(points, key=lambda p: slow[p[0]])[: max(1, len(points) // 4)]
    ratios = sorted(y / p50 for b, y in quiet if (p50 := obs.p50_ms[b]))
    if not ratios:
        return _SIMULATOR.jitter
    r = ratios[len(ratios) // 2]
    big = -math.log(1.0 - obs.q)
    denominator = big - r * math.log(2.0)
    if r <= 1.0:
        return 0.0
    return 10.0 if denominator <= 0 else min(10.0, (r - 1.0) / denominator)


def _fit(obs: Observed, points: Points) -> LatencyFit | None:
    """Least squares (log space) over ``points``; ``None`` without points."""
    if not points:
        return None
    loads = [a / (n * obs.dt) for a, n in zip(obs.arrivals, obs.replicas, strict=True) if n > 0]
    top = max(loads, default=1.0) or 1.0
    lo, hi = math.log(top / 4.0), math.log(top * 50.0)
    grid = [lo + (hi - lo) * i / (_GRID - 1) for i in range(_GRID)]
    scores = [_score(obs, points, math.exp(g))[0] for g in grid]
    best = min(range(_GRID), key=scores.__getitem__)
    a, b = grid[max(0, best - 1)], grid[min(_GRID - 1, best + 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    x1, x2 = b - ratio * (b - a), a + ratio * (b - a)
    f1, f2 = _score(obs, points, math.exp(x1))[0], _score(obs, points, math.exp(x2))[0]
    for _ in range(_GOLDEN):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - ratio * (b - a)
            f1 = _score(obs, points, math.exp(x1))[0]
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + ratio * (b - a)
            f2 = _score(obs, points, math.exp(x2))[0]
    capacity = math.exp((a + b) / 2.0)
    sse, p0 = _score(obs, points, capacity)
    if not math.isfinite(sse):
        return None
    observed = [math.log(y) for _, y in points]
    mean = sum(observed) / len(observed)
    total = sum((y - mean) ** 2 for y in observed)
    pred = predict(obs, p0_ms=p0, capacity_rps=capacity)
    rmse = math.sqrt(sum((pred[b] - y) ** 2 for b, y in points) / len(points))
    return LatencyFit(
        p0_ms=p0,
        capacity_rps=capacity,
        jitter=_jitter(obs, points, capacity),
        r2=1.0 - sse / total if total > 0 else 0.0,
        rmse_ms=rmse,
        points=len(points),
        load_range=(min(loads := _loads(obs, points)), max(loads)),
    )


def _loads(obs: Observed, points: Points) -> list[float]:
    """Mean requests/s per Running replica of each point's bucket (ticks without one skipped)."""
    per, out = obs.per_bucket, []
    for b, _ in points:
        ticks = range(b * per, min(len(obs.arrivals), (b + 1) * per))
        served = [obs.arrivals[t] / (obs.replicas[t] * obs.dt) for t in ticks if obs.replicas[t]]
        out.append(sum(served) / len(served) if served else 0.0)
    return out


def _validate(obs: Observed, points: Points) -> dict[str, Any] | None:
    """Fit the first ``1 - HOLD_OUT`` of the points, score the rest."""
    cut = math.ceil(len(points) * (1.0 - HOLD_OUT))
    train, held = points[:cut], points[cut:]
    fitted = _fit(obs, train)
    if fitted is None or not held:
        return None
    pred = predict(obs, p0_ms=fitted.p0_ms, capacity_rps=fitted.capacity_rps)
    errors = [(pred[b], y) for b, y in held]
    return {
        "fit_points": len(train),
        "held_points": len(held),
        "held_from_s": round(held[0][0] * BUCKET_S, 1),
        "mape_pct": round(100 * sum(abs(p - o) / o for p, o in errors) / len(errors), 2),
        "rmse_ms": round(math.sqrt(sum((p - o) ** 2 for p, o in errors) / len(errors)), 1),
    }


def fit_line(key: str, f: dict[str, Any]) -> str:
    """One service's fit (its ``summary.json`` entry), goodness and validation error, in a
    line: the CLI prints it and the report lists it."""
    if f["p0_ms"] is None:
        return f"fit {key}: {f['reason']}; recorded latencies kept"
    under = f"; replicas {f['replicas_from']}" if "replicas_from" in f else ""
    v = f["validation"]
    held = (
        "no held-back points"
        if v is None
        else f"held-back {v['held_points']} min: MAPE {v['mape_pct']:.1f}%, RMSE {v['rmse_ms']:g}ms"
    )
    used = "modelled" if f["modelled"] else f["reason"]
    lo, hi = f["load_range_rps_per_replica"]
    return (
        f"fit {key}: P{f['percentile']:g} = {f['p0_ms']:g}ms / (1 - load / "
        f"{f['capacity_rps_per_replica']:g} req/s per replica) + backlog; r2 {f['r2']:.2f}, "
        f"RMSE {f['rmse_ms']:g}ms over {f['points']} min at {lo:g}-{hi:g} req/s per replica; "
        f"{held}; {used}{under}"
    )


def fit_service(obs: Observed) -> Fit:
    """Fit, validate and judge one service (see the module docstring)."""
    points = [(b, y) for b, y in enumerate(obs.pq_ms) if y is not None and y > 0]
    if len(points) < MIN_POINTS:
        reason = f"too few points: {len(points)} minutes with >= {MIN_REQUESTS} requests, "
        return Fit(obs.key, obs.q, None, None, False, reason + f"need {MIN_POINTS}")
    fitted = _fit(obs, points)
    validation = _validate(obs, points)
    if fitted is None:
        return Fit(obs.key, obs.q, None, validation, False, "no point without a queue to fit")
    if fitted.r2 < MIN_R2:
        reason = f"poor fit: r2 {fitted.r2:.2f} < {MIN_R2}; recorded latencies kept"
        return Fit(obs.key, obs.q, fitted, validation, False, reason)
    return Fit(obs.key, obs.q, fitted, validation, True, "fitted")

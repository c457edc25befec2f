"""The latency fit of counterfactual replay: it recovers the model's parameters from data the
model generated, reports its validation error out of sample, and refuses to model what it
cannot fit."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from controller.offline.experiment.load import poisson
from controller.offline.models.fit import (
    BUCKET_S,
    HOLD_OUT,
    MIN_POINTS,
    Observed,
    fit_line,
    fit_service,
    quantile_at,
    smoothed_rates,
)
from controller.offline.models.queueing import ServiceModel, ServiceQueue

BASE_MS, JITTER, CAPACITY = 40.0, 0.15, 5.0
P0_MS = BASE_MS * (1 + JITTER * math.log(100))  # the P99 at zero load


def observed(
    minutes: int,
    *,
    rate: Callable[[int], float],
    replicas: Callable[[int], int],
    base_ms: Callable[[int], float] = lambda s: BASE_MS,
    seed: int = 3,
) -> Observed:
    """What the fit pass would collect from a service the simulator's queueing model served."""
    q_rng, a_rng = random.Random(seed), random.Random(seed + 1)
    queue = ServiceQueue(ServiceModel("serving/chat", 0.0, CAPACITY, BASE_MS), q_rng)
    arrivals: list[int] = []
    running: list[int] = []
    pq: list[float | None] = []
    p50: list[float | None] = []
    minute: list[float] = []
    for s in range(minutes * 60):
        queue.model = ServiceModel("serving/chat", 0.0, CAPACITY, base_ms(s))
        n = poisson(a_rng, rate(s))
        minute += queue.step(offered_rps=rate(s), replicas=replicas(s), arrivals=n, dt=1.0)
        arrivals.append(n)
        running.append(replicas(s))
        if s % 60 == 59:
            pairs = [(v, 1) for v in minute]
            pq.append(quantile_at(pairs, 0.99) if len(minute) >= 50 else None)
            p50.append(quantile_at(pairs, 0.5) if len(minute) >= 50 else None)
            minute = []
    return Observed("serving/chat", 0.99, 1.0, arrivals, running, pq, p50)


def wave(s: int) -> float:
    """2 to 9.5 requests/s and back, every 20 minutes."""
    return 2.0 + 7.5 * (0.5 - 0.5 * math.cos(2 * math.pi * s / 1200))


def steps(s: int) -> int:
    """Two replicas, three from minute 30."""
    return 2 if s < 1800 else 3


def test_fit_recovers_the_parameters_of_the_model_that_made_the_data() -> None:
    """On an hour the simulator's model served (load 0.2 to 0.95 of capacity, replicas 2 then
    3), the fit finds p0 and the per-replica capacity within 10%, the jitter within 0.05, and
    predicts the held-back 30% within 15%."""
    fit = fit_service(observed(60, rate=wave, replicas=steps))
    assert fit.modelled, fit.reason
    assert fit.fit is not None
    assert fit.fit.p0_ms == pytest.approx(P0_MS, rel=0.1)
    assert fit.fit.capacity_rps == pytest.approx(CAPACITY, rel=0.1)
    assert fit.fit.jitter == pytest.approx(JITTER, abs=0.05)
    assert fit.fit.r2 > 0.8
    assert fit.fit.points == 60
    lo, hi = fit.fit.load_range  # the wave: 2 to 9.5 req/s over 2 then 3 replicas
    assert 0.6 < lo < 1.2
    assert 4.3 < hi < 5.2
    v = fit.validation
    assert v is not None
    assert (v["fit_points"], v["held_points"]) == (42, 18)
    assert v["held_from_s"] == 42 * BUCKET_S
    assert v["mape_pct"] < 15.0
    model = fit.model()
    assert model.per_replica_rps == fit.fit.capacity_rps
    assert model.base_ms * (1 + model.jitter * math.log(100)) == pytest.approx(fit.fit.p0_ms)


def test_validation_is_out_of_sample() -> None:
    """When the service gets twice as slow in the held-back part, the validation error says
    so (the fit on the earlier part cannot know), while the same data without the change
    validates well."""
    change = math.ceil(60 * (1 - HOLD_OUT)) * 60
    same = fit_service(observed(60, rate=wave, replicas=steps))
    slower = fit_service(
        observed(
            60, rate=wave, replicas=steps, base_ms=lambda s: BASE_MS * (2 if s >= change else 1)
        )
    )
    assert same.validation is not None
    assert slower.validation is not None
    assert same.validation["mape_pct"] < 15.0
    assert slower.validation["mape_pct"] > 40.0


def test_too_few_points_keep_the_recorded_latencies() -> None:
    """Fewer than MIN_POINTS minutes with enough requests: not modelled, and the line says why."""
    fit = fit_service(observed(MIN_POINTS - 1, rate=wave, replicas=steps))
    assert not fit.modelled
    assert fit.fit is None
    assert fit.reason.startswith(f"too few points: {MIN_POINTS - 1} minutes")
    line = fit_line("serving/chat", fit.to_dict())
    assert line.endswith("recorded latencies kept")


def test_latency_unrelated_to_load_is_a_poor_fit() -> None:
    """Latencies that do not follow the load per replica (a random level each minute) give a
    low r2: the service is flagged and keeps its recorded latencies."""
    rng = random.Random(5)
    levels = [rng.uniform(50, 500) for _ in range(60)]
    base = observed(60, rate=wave, replicas=steps)
    noisy = Observed(
        base.key, base.q, base.dt, base.arrivals, base.replicas,
        [levels[b] for b in range(60)], [levels[b] / 2 for b in range(60)],
    )  # fmt: skip
    fit = fit_service(noisy)
    assert fit.fit is not None
    assert not fit.modelled
    assert fit.reason.startswith("poor fit: r2")
    assert fit.to_dict()["modelled"] is False
    assert fit_line("serving/chat", fit.to_dict()).endswith("recorded latencies kept")


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [
        pytest.param([(5.0, 1)], 0.99, 5.0, id="one"),
        pytest.param([(float(v), 1) for v in range(1, 101)], 0.99, 99.0, id="floor(q(n-1))"),
        pytest.param([(3.0, 1), (1.0, 1), (2.0, 1)], 0.5, 2.0, id="unsorted median"),
        pytest.param([(10.0, 98), (500.0, 2)], 0.99, 500.0, id="histogram: rank 98 of 100"),
        pytest.param([(10.0, 99), (500.0, 1)], 0.99, 10.0, id="histogram: rank 98 of 100 low"),
    ],
)
def test_quantile_uses_the_engines_rank_rule(
    values: list[tuple[float, int]], q: float, want: float
) -> None:
    """quantile_at picks the request of rank floor(q (n - 1)), as the engine's percentile,
    counting a histogram bucket as its requests."""
    before = list(values)
    assert quantile_at(values, q) == want
    assert values == before


def test_smoothed_rate_is_the_trailing_mean() -> None:
    """The offered rate is the mean arrivals per second over the last SMOOTH_S (15 s)."""
    rates = smoothed_rates([30] + [0] * 20, 1.0)
    assert rates[0] == 30.0
    assert rates[14] == 2.0
    assert rates[15] == 0.0

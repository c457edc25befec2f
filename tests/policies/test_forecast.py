"""The load's daily shape (policies/forecast.py): a ramp seen on the last days is forecast
before it comes, a one-off burst is not, and a forecast that errs is not trusted; and through
the engine, ``leading.forecast`` pre-scales before the ramp."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from policy_fixtures import T0, feed_latency, policy_dict, to_yaml

from policies.decisions import Scale
from policies.engine import Engine
from policies.forecast import MIN_SCORED, DailyShape
from policies.loader import load_policy_text
from policies.snapshot import SnapshotBuilder

DAY = 86400.0
SLOT = 60.0


def morning(t: float) -> float:
    """10 req/s at night, 40 from 08:00, with a 10-minute ramp between."""
    h = (t % DAY) / 3600.0
    return 10.0 + 30.0 * min(1.0, max(0.0, (h - 8.0) * 6.0))


def shaped(days: float, rate: Callable[[float], float], *, start: float = 0.0) -> DailyShape:
    shape = DailyShape(period_s=DAY, slot_s=SLOT)
    t = start
    while t < start + days * DAY:
        shape.add(t, rate(t))
        shape.forecast(t, rate(t), 300.0)
        t += SLOT
    return shape


def test_the_morning_ramp_is_forecast_before_it_comes() -> None:
    """After three days, at 07:58 (rate 10) a 10-minute lookahead already sees 08:08's 34;
    the third day's forecasts were right, so they are trusted."""
    shape = shaped(3, morning)
    now = 3 * DAY + 7 * 3600 + 58 * 60
    got = shape.forecast(now, morning(now), 600.0)
    assert morning(now) == 10.0
    assert got == pytest.approx(morning(now + 600.0))
    assert got == pytest.approx(34.0)
    assert shape.trusted(0.25)
    assert shape.error < 0.01


def test_before_two_whole_periods_there_is_no_forecast() -> None:
    shape = shaped(1.5, morning)
    now = 1.5 * DAY
    assert shape.forecast(now, morning(now), 300.0) is None
    assert not shape.trusted(0.25)
    assert shape.scored == 0


def test_a_one_off_burst_is_not_planned_for() -> None:
    """Day 1 had a burst at 03:00 that day 0 had not: day 2 expects the lower of the two, and
    on day 1 (one day seen) nothing is expected at all."""

    def burst(t: float) -> float:
        h = (t % DAY) / 3600.0
        return 10.0 * (6.0 if DAY <= t < 2 * DAY and 3.0 <= h < 3.25 else 1.0)

    shape = shaped(2, burst)
    now = 2 * DAY + 3 * 3600 - 120
    assert shape.forecast(now, 10.0, 300.0) == pytest.approx(10.0)
    assert shaped(1.5, burst).expected(1.5 * DAY) is None


def test_today_level_scales_the_shape_within_bounds() -> None:
    """Twice the last days' rate: twice the shape; ten times: held at twice."""
    shape = shaped(2, morning)
    now = 2 * DAY + 7 * 3600 + 56 * 60
    ahead = morning(now + 300.0)
    assert shape.forecast(now, 2 * morning(now), 300.0) == pytest.approx(2 * ahead)
    assert shape.forecast(now, 10 * morning(now), 300.0) == pytest.approx(2 * ahead)


def test_a_shape_that_does_not_repeat_is_not_trusted() -> None:
    """A load with no daily shape (random levels every half hour): its forecasts err, so they
    are not used; the service reacts."""
    rnd = random.Random(4)
    levels = [rnd.uniform(5.0, 50.0) for _ in range(200)]
    shape = shaped(3, lambda t: levels[int(t // 1800) % len(levels)])
    assert shape.scored >= MIN_SCORED
    assert shape.error > 0.25
    assert not shape.trusted(0.25)


def test_forecast_pre_scales_through_the_engine() -> None:
    """chat at 5 req/s a replica with a 2m start-up, on a load whose rate steps from 10 to 40
    req/s at minute 40 of every hour (``period: 1h``, to keep the test short): in the third
    hour the forecast scales it up before minute 40, the rate alone (no forecast) only after."""

    def first_up(forecast: bool) -> float:
        data = policy_dict()
        lead: dict[str, object] = {"ratePerReplica": 5, "headroom": True, "startup": "2m"}
        if forecast:
            lead["forecast"] = {"period": "1h", "maxError": "25%"}
        chat = data["spec"]["services"]["chat"]
        chat["scale"]["leading"] = lead
        chat["replicas"] = {"min": 2, "max": 10}
        engine = Engine(load_policy_text(to_yaml(data), "test.yaml"))
        b = SnapshotBuilder()
        b.node("w0", gpus=8, labels={"ebbtide.io/pool": "whole"})
        b.workload("serving", "chat", replicas=2, nodes=["w0"])
        snap = b.build()
        for s in range(3 * 3600):
            now = T0 + s
            minute = (s % 3600) / 60.0
            busy = 40.0 <= minute < 50.0
            feed_latency(engine, now, now + 1, 20.0, per_s=40 if busy else 10)
            ups = [
                d
                for d in engine.evaluate(now + 1, snap)
                if isinstance(d, Scale) and d.role == "inference" and d.to_replicas > 2
            ]
            if ups and s >= 2 * 3600:
                return (s + 1 - 2 * 3600) / 60.0
        return math.inf

    assert first_up(True) < 40.0 <= first_up(False)

"""Learned capacity, start-up time and load growth (policies/capacity.py, policies/headroom.py),
and ``leading: {learn: true, headroom: true}`` through the engine."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest
from policy_fixtures import T0, feed_latency, latency, policy_dict, to_yaml
from test_incremental import Lockstep

from policies.capacity import MIN_POINTS, CapacityFit, RateTrend, StartupClock
from policies.decisions import Decision, Scale
from policies.engine import Engine
from policies.headroom import ServiceLoad
from policies.loader import PolicyLoadError, load_policy_text
from policies.model import Policy
from policies.snapshot import Pod, Snapshot, SnapshotBuilder

WHOLE = {"ebbtide.io/pool": "whole"}


def curve(x: float, *, p0: float = 20.0, c: float = 10.0) -> float:
    """The latency law both serving models follow below saturation: ``p0 / (1 - x / c)``."""
    return p0 / (1.0 - x / c)


def fitted(points: list[tuple[float, float]], *, every: float = 60.0) -> CapacityFit:
    fit = CapacityFit()
    for i, (x, p) in enumerate(points):
        fit.add(T0 + i * every, x, p)
    return fit


LOADS = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0] * 2


@pytest.mark.parametrize(
    ("p0", "c", "target", "expected"),
    [
        (20.0, 10.0, 80.0, 7.5),  # c (1 - p0 / target)
        (20.0, 10.0, 40.0, 5.0),
        (50.0, 20.0, 240.0, 20.0 * (1 - 50.0 / 240.0)),
    ],
)
def test_capacity_is_where_the_latency_curve_meets_the_target(
    p0: float, c: float, target: float, expected: float
) -> None:
    """Points on ``p0 / (1 - x / c)`` give back the load per replica at ``target``."""
    loads = [c * f for f in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75)] * 2
    fit = fitted([(x, curve(x, p0=p0, c=c)) for x in loads])
    got = fit.capacity(target)
    assert got is not None
    assert got.rate_per_replica == pytest.approx(expected, rel=1e-6)
    assert got.points == pytest.approx(len(loads), rel=0.01)


@pytest.mark.parametrize(
    ("points", "why"),
    [
        ([(x, curve(x)) for x in LOADS[: int(MIN_POINTS) - 1]], "too few points"),
        ([(x, 30.0) for x in LOADS], "latency flat in load: no curve to solve"),
        ([(x, 30.0 - x) for x in LOADS], "latency falls with load"),
        (
            [(x, curve(x) * (3.0 if i % 2 else 0.4)) for i, x in enumerate(LOADS)],
            "noise swamps the curve: the solved load's error is too large",
        ),
        ([(x, curve(x)) for x in [1.0, 1.1, 1.2, 1.05] * 4], "only light loads: far extrapolation"),
    ],
)
def test_no_confident_fit_gives_no_capacity(points: list[tuple[float, float]], why: str) -> None:
    assert fitted(points).capacity(80.0) is None, why


def test_old_points_are_forgotten() -> None:
    """A service that got half as fast (a bigger model) is learned again within hours: the
    earlier points' weight halves every FIT_HALF_LIFE_S."""
    fit = fitted([(x, curve(x)) for x in LOADS * 3])
    before = fit.capacity(80.0)
    assert before is not None
    assert before.rate_per_replica == pytest.approx(7.5)
    start = T0 + 12 * 3600.0
    for i, x in enumerate(LOADS * 24):
        fit.add(start + i * 60.0, x / 2, curve(x / 2, c=5.0))
    after = fit.capacity(80.0)
    assert after is not None
    assert after.rate_per_replica == pytest.approx(3.75, rel=0.05)


def pod(name: str, phase: str, created: float) -> Pod:
    return Pod("serving", name, node="w0", phase=phase, gpus=1, created=created)  # type: ignore[arg-type]


def test_busy_windows_set_the_learned_rate() -> None:
    """A window's point weighs as many requests as it holds: the night's windows (12-30
    requests, whose percentile reads 15 % under the curve, as a 99th of a few dozen does) do
    not tilt the line the busy ones (180-420) draw. With equal weights the learned rate was
    7.23 req/s against the curve's 7.8 (7 % low); weighted it is within 5 % of it."""
    svc = chat_policy({"learn": True}).spec.services["chat"]
    pods = (pod("a", "Running", T0 - 600), pod("b", "Running", T0 - 600))
    load = ServiceLoad()
    loads = [0.2, 0.3, 0.4, 0.5] * 5 + [3.0, 4.0, 5.0, 6.0, 7.0] * 2
    for i, x in enumerate(loads):
        read = curve(x) * (0.85 if x < 1.0 else 1.0)
        load.observe(T0 + 30.0 * i, svc, rate=2 * x, p_ms=read, pods=pods)
    got = load.capacity(svc)
    assert got is not None
    truth = 10.0 * (1.0 - 20.0 / (100.0 / 1.1))  # the curve at the objective / (1 + tolerance)
    assert got.rate_per_replica == pytest.approx(truth, rel=0.05)


def test_startup_is_the_slowest_recent_creation_to_running() -> None:
    clock = StartupClock()
    assert clock.seconds is None
    clock.observe(T0, [pod("a", "Pending", T0 - 10), pod("b", "Running", T0 - 500)])
    clock.observe(T0 + 60, [pod("a", "Pending", T0 - 10), pod("b", "Running", T0 - 500)])
    assert clock.seconds is None  # b was never seen starting: no sample
    clock.observe(T0 + 170, [pod("a", "Running", T0 - 10)])
    assert clock.seconds == pytest.approx(180.0)
    # creation unknown (0): counted from when it was first seen starting
    clock.observe(T0 + 200, [pod("c", "Pending", 0.0)])
    clock.observe(T0 + 230, [pod("c", "Running", 0.0)])
    assert clock.seconds == pytest.approx(180.0)  # the slowest of the kept ones
    assert list(clock.samples) == pytest.approx([180.0, 30.0])


@pytest.mark.parametrize(
    ("rates", "slope"),
    [
        ([10.0, 16.0, 22.0, 28.0, 34.0], 0.1),  # +6 req/s a minute
        ([34.0, 28.0, 22.0, 16.0, 10.0], 0.0),  # falling: no growth
        ([10.0, 16.0], 0.0),  # too few windows
        # a noisy rise: 4.6 req/s a minute fitted, less three standard errors (sqrt(13.2 / 10))
        ([10.0, 20.0, 16.0, 26.0, 30.0], (4.6 - 3 * math.sqrt(1.32)) / 60),
        # a level rate's noise fits +0.4 req/s a minute, within its standard errors: no growth
        ([10.0, 18.0, 10.0, 18.0, 12.0], 0.0),
    ],
)
def test_growth_is_the_recent_rise_of_the_rate(rates: list[float], slope: float) -> None:
    """Only the rise the fit is confident of is planned for."""
    trend = RateTrend()
    for i, r in enumerate(rates):
        trend.add(T0 + 60.0 * i, r)
    assert trend.slope == pytest.approx(slope)


def test_the_steepest_rise_is_remembered_and_fades() -> None:
    trend = RateTrend()
    for i, r in enumerate([10.0, 16.0, 22.0, 22.0, 22.0, 22.0, 22.0, 22.0]):
        trend.add(T0 + 60.0 * i, r)
    assert trend.slope == 0.0
    peak = trend.surge(T0 + 120.0)
    assert peak == pytest.approx(0.1)
    assert trend.surge(T0 + 120.0 + 900.0) == pytest.approx(peak / 2)  # halved in 15 min
    assert trend.surge(T0 + 120.0 + 3600.0) == pytest.approx(peak / 16)


def chat_policy(leading: dict[str, object]) -> Policy:
    """The base test policy (objective 100ms, recoverBelow 80%, window 30s) with chat led by
    ``leading``."""
    data = policy_dict()
    data["spec"]["services"]["chat"]["scale"]["leading"] = leading
    return load_policy_text(to_yaml(data), "test.yaml")


def ups(decisions: list[Decision]) -> list[Scale]:
    return [d for d in decisions if isinstance(d, Scale) and d.role == "inference"]


def learning(engine: Engine, *, levels: int) -> tuple[Snapshot, float, list[Decision]]:
    """``levels`` loads of 60s each on chat's 2 running replicas, each at the latency the curve
    gives its load per replica (c = 10 req/s: 7.8 req/s at 100ms / 1.1, one tolerance below
    the objective): the snapshot, the time after them and the decisions."""
    b = SnapshotBuilder()
    b.node("w0", gpus=8, labels=WHOLE)
    b.workload("serving", "chat", replicas=2, nodes=["w0"])
    snap = b.build()
    out: list[Decision] = []
    t = T0
    for k in range(levels):
        per_s = 2 * (1 + k % 8)  # 1..8 req/s a replica
        for _ in range(60):
            feed_latency(engine, t, t + 1, curve(per_s / 2), per_s=per_s)
            t += 1
            out += engine.evaluate(t, snap)
    return snap, t, out


def learn(engine: Engine, *, levels: int) -> list[Decision]:
    """:func:`learning`, then 40 req/s at 30ms for 40s."""
    snap, t, out = learning(engine, levels=levels)
    for _ in range(40):  # then 40 req/s, still fast: only the rate says it is too much
        feed_latency(engine, t, t + 1, 30.0, per_s=40)
        t += 1
        out += engine.evaluate(t, snap)
    return out


def test_learned_capacity_leads_scale_up() -> None:
    """After 16 minutes of varied load, chat's capacity is learned (about 7.8 req/s a replica
    at 91ms) and 40 req/s scales it up on the rate alone, saying it learned the rate."""
    decisions = ups(learn(Engine(chat_policy({"learn": True})), levels=16))
    assert decisions, "no scale-up"
    first = decisions[0]
    assert first.explanation.rule == "leading-scale-up"
    per = first.explanation.inputs["learned_rate_per_replica"]
    assert isinstance(per, float)
    assert 6.0 <= per <= 8.0
    rate = first.explanation.inputs["request_rate"]
    assert isinstance(rate, float)
    assert first.to_replicas == math.ceil(rate / per) > 2
    assert "rate_per_replica" not in first.explanation.thresholds


@pytest.mark.parametrize(
    ("crowd", "learned", "sized"),
    [
        # the rate wants more than the 2 replicas: the rate at the learned capacity sizes it
        (36, True, lambda planned, per: max(math.ceil(planned / per), 3)),
        # the rate wants no more (the capacity learned is wrong): one replica more a step
        (12, True, lambda planned, per: 3),
        # nothing learned yet (two minutes): the percentile's ratio, 2 x 50, as far as the
        # node's 8 GPUs go
        (36, False, lambda planned, per: 8),
    ],
)
def test_a_breach_under_load_is_sized_by_the_learned_rate(
    crowd: int, learned: bool, sized: Callable[[float, float], int]
) -> None:
    """A crowd at 5s a request (50x the 100ms objective) on chat's 2 replicas: with a learned
    capacity the breach asks for what the rate needs there (at least one replica more), not
    for 2 x 50 (the percentile of an overloaded queue says how long it has been overloaded, not
    how many replicas it misses); without one, the percentile's ratio sizes it as before."""
    engine = Engine(chat_policy({"learn": True}))
    snap, t, _ = learning(engine, levels=16 if learned else 2)
    breach: list[Scale] = []
    while not breach:
        feed_latency(engine, t, t + 1, 5000.0, per_s=crowd)
        t += 1
        breach = ups(engine.evaluate(t, snap))
        assert t < T0 + 3600, "no breach response"
    first = breach[0]
    assert first.explanation.rule == "slo-breach-scale-up"
    inputs = first.explanation.inputs
    if not learned:
        assert "learned_rate_per_replica" not in inputs
        assert first.to_replicas == sized(0.0, 1.0)
        return
    per, rate = inputs["learned_rate_per_replica"], inputs["request_rate"]
    assert isinstance(per, float)
    assert isinstance(rate, float)
    assert first.to_replicas == sized(rate, per) < 8
    assert "learned" in first.explanation.reason
    assert any(a.option.endswith("= 100") for a in first.explanation.alternatives)


def test_one_more_replica_waits_for_a_window_the_last_step_could_show_in() -> None:
    """Breaching at a rate the learned capacity says 2 replicas serve: each step adds one, but
    only from a window that began after the last step (30s here, no start-up seen), although
    readyEndsCooldown would allow the next step 10s (breachAfter) after the last."""
    data = policy_dict()
    data["spec"]["services"]["chat"]["scale"].update(
        leading={"learn": True}, readyEndsCooldown=True
    )
    engine = Engine(load_policy_text(to_yaml(data), "test.yaml"))
    snap, t, _ = learning(engine, levels=16)
    steps: list[float] = []
    for _ in range(120):
        feed_latency(engine, t, t + 1, 5000.0, per_s=12)  # 6 a replica: under the learned 7.8
        t += 1
        steps += [t for d in ups(engine.evaluate(t, snap)) if d.to_replicas == 3]
    assert len(steps) >= 3, steps
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    assert min(gaps) >= 30.0, gaps


def test_a_learned_rate_scales_down_without_a_second_tolerance() -> None:
    """Once learned (about 7.8 req/s a replica, already the rate at the objective / 1.1),
    chat at 8 replicas and 36 req/s on its latency curve scales down to ceil(36 / learned),
    not raised by the tolerance again as a set rate is, and the reason prints the margin it
    used (x 1)."""
    data = policy_dict()
    data["spec"]["services"]["chat"]["scale"].update(
        leading={"learn": True},
        down={"stabilization": "20s", "below": "50%", "maxStep": 8, "cooldown": "1s"},
    )
    engine = Engine(load_policy_text(to_yaml(data), "test.yaml"))
    b = SnapshotBuilder()
    b.node("w0", gpus=8, labels=WHOLE)
    b.workload("serving", "chat", replicas=8, nodes=["w0"])
    snap = b.build()
    t = T0
    for k in range(16):  # 1..8 req/s a replica, a minute each, on the curve: learned
        for _ in range(60):
            feed_latency(engine, t, t + 1, curve(1 + k % 8), per_s=8 * (1 + k % 8))
            t += 1
            engine.evaluate(t, snap)
    downs: list[Scale] = []
    for _ in range(90):
        feed_latency(engine, t, t + 1, curve(36 / 8), per_s=36)
        t += 1
        downs += [d for d in ups(engine.evaluate(t, snap)) if d.to_replicas < 8]
    assert downs, "no scale-down"
    first = downs[0]
    per = first.explanation.inputs["learned_rate_per_replica"]
    planned = first.explanation.inputs["request_rate"]
    assert isinstance(per, float)
    assert isinstance(planned, float)
    with_tolerance = math.ceil(planned * 1.1 / per)
    assert first.to_replicas == math.ceil(planned / per) < with_tolerance
    assert f"* 1 / {per:.3g})" in first.explanation.reason


def test_without_a_confident_fit_the_latency_rules_alone_decide() -> None:
    """Two minutes of data learn nothing: 40 req/s at 30ms scales nothing, as without a
    leading indicator."""
    assert ups(learn(Engine(chat_policy({"learn": True})), levels=2)) == []


@pytest.mark.parametrize("leading", [{"ratePerReplica": "learn"}, {"learn": False}, {}])
def test_a_rate_per_replica_is_set_or_learned(leading: dict[str, object]) -> None:
    with pytest.raises(PolicyLoadError):
        chat_policy(leading)


def test_headroom_plans_one_startup_ahead() -> None:
    """With a 3m start-up and the rate rising 0.1 req/s each second, the ask is for the rate
    plus 0.1 x (180 + 15) s: a set start-up wins over the observed one."""
    spec = chat_policy({"ratePerReplica": 10, "headroom": True, "startup": "3m"})
    svc = spec.spec.services["chat"]
    load = ServiceLoad()
    for i, r in enumerate([10.0, 16.0, 22.0, 28.0, 34.0]):
        load.observe(T0 + 30.0 * i, svc, rate=r, p_ms=20.0, pods=())
    assert load.lookahead_s(svc) == pytest.approx(195.0)
    assert load.growth(T0 + 120.0, down=False) == pytest.approx(0.2)
    unset = chat_policy({"ratePerReplica": 10, "headroom": True}).spec.services["chat"]
    assert ServiceLoad().lookahead_s(unset) == pytest.approx(15.0)  # none observed yet


def test_learning_decides_as_ticking_everything() -> None:
    """The incremental engine learns what the full one learns and decides the same, tick by
    tick, with irregular tick gaps: chat on its latency curve at loads that change every
    minute (so the fit becomes confident), then a rush only the learned rate sees, with
    headroom and a forecast (period 1h) on."""
    rnd = random.Random(5)
    lead = {"learn": True, "headroom": True, "forecast": {"period": "1h"}}
    both = Lockstep(chat_policy(lead))
    b = SnapshotBuilder()
    b.node("w0", gpus=8, labels=WHOLE)
    b.workload("serving", "chat", replicas=2, nodes=["w0"])
    snap = b.build()
    now = T0
    end = T0 + 2 * 3600
    while now < end:
        step = rnd.choice([1.0] * 30 + [3.0, 7.0, 45.0])
        for t in [now + k for k in range(int(step))]:
            minute = int((t - T0) // 60)
            per_s = 40 if minute % 30 == 29 else 2 * (1 + minute % 8)
            ms = 30.0 if per_s == 40 else curve(per_s / 2) * rnd.uniform(0.95, 1.05)
            both.observe([latency(t + k / per_s, ms) for k in range(per_s)])
        now += step
        both.evaluate(now, snap)
    learned = [
        d for _, _, ds in both.decided for d in ds if "learned_rate_per_replica" in d["inputs"]
    ]
    assert learned, "the fit never became confident: the learned path was not compared"

"""The peers' algorithms: HPA v2 replica calculation and behaviour (Value and AverageValue
targets, several metrics), the Prometheus delay, KEDA with and without its cache, Knative's KPA
(stable and panic modes), the backfill, static-p95's sizing, the Pareto marks and Ebbtide's
event lag."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.offline.experiment.baselines import Backfill, load_quantile
from controller.offline.experiment.closedloop import EventLag, ebbtide_variant
from controller.offline.experiment.load import Diurnal
from controller.offline.experiment.pareto import mark
from controller.offline.experiment.peers import (
    HpaBehavior,
    HpaRate,
    HpaRateSettings,
    HpaState,
    Keda,
    KedaSettings,
    Kpa,
    KpaSettings,
    KpaState,
    PrometheusQuantile,
)
from controller.offline.models.queueing import default_model
from controller.simcluster import EPOCH, SimCluster, load_scenario
from policies.decisions import Explanation, Scale
from policies.loader import load_policy_text
from policies.model import Policy
from streams.events import InferenceLatency

ROOT = Path(__file__).resolve().parents[2]
BALANCED = ROOT / "policies" / "library" / "balanced.yaml"
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
MODELS = {"serving/chat": default_model("serving/chat", objective_ms=300, initial_replicas=4)}


def balanced() -> Policy:
    return load_policy_text(BALANCED.read_text())


def hpa(lo: int = 1, hi: int = 100) -> HpaState:
    return HpaState(lo, hi, HpaBehavior())


def step(h: HpaState, now: float, current: int, metric: float, target: float = 100) -> int:
    want = h.raw(current=current, ready=current, metric=metric, target=target)
    return h.step(now, current=current, desired=want)


@dataclass(frozen=True)
class Raw:
    current: int
    ready: int
    metric: float
    want: int


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Raw(10, 10, 109.0, 10), id="within-tolerance-above"),
        pytest.param(Raw(10, 10, 91.0, 10), id="within-tolerance-below"),
        pytest.param(Raw(10, 10, 111.0, 12), id="just-outside-tolerance-ceil"),
        pytest.param(Raw(10, 10, 200.0, 20), id="double"),
        pytest.param(Raw(10, 6, 200.0, 12), id="only-ready-pods-count"),
        pytest.param(Raw(10, 6, 105.0, 10), id="tolerance-keeps-spec-replicas-not-ready"),
        pytest.param(Raw(10, 10, 10.0, 2), id="clamped-to-min"),
        pytest.param(Raw(10, 0, 300.0, 2), id="none-ready-recommends-min"),
        pytest.param(Raw(0, 0, 300.0, 3), id="from-zero-ceil-ratio"),
        pytest.param(Raw(50, 50, 1000.0, 100), id="clamped-to-max"),
    ],
)
def test_hpa_raw_recommendation(case: Raw) -> None:
    """desired = ceil(ready * metric / target) outside the 10% tolerance, within [min, max]."""
    got = hpa(2, 100).raw(current=case.current, ready=case.ready, metric=case.metric, target=100)
    assert got == case.want


@pytest.mark.parametrize(
    ("current", "total", "want"),
    [
        pytest.param(10, 52.0, 10, id="within-tolerance-keeps-status-replicas"),
        pytest.param(10, 56.0, 12, id="outside-tolerance-ceil-total-over-target"),
        pytest.param(10, 20.0, 4, id="down-to-total-over-target"),
        pytest.param(0, 12.0, 3, id="from-zero"),
        pytest.param(4, 1.0, 2, id="clamped-to-min"),
    ],
)
def test_hpa_average_value_target(current: int, total: float, want: int) -> None:
    """AverageValue (GetExternalPerPodMetricReplicas): ratio total / (target * replicas); outside
    the tolerance ceil(total / target), whatever the ready count."""
    assert hpa(2, 100).per_pod(current=current, total=total, target=5.0) == want


@pytest.mark.parametrize(
    ("current", "metric", "want"),
    [
        pytest.param(2, 1000.0, 6, id="small-plus-4-pods-beats-100pct"),
        pytest.param(10, 1000.0, 20, id="large-100pct-beats-4-pods"),
        pytest.param(3, 150.0, 5, id="under-the-limit-as-desired"),
    ],
)
def test_hpa_scale_up_limit(current: int, metric: float, want: int) -> None:
    """Scale-up per 15 s period: at most max(2x, +4) of the period's starting count."""
    assert step(hpa(), 0.0, current, metric) == want


def test_hpa_scale_up_limit_counts_the_period_events() -> None:
    """A second sync in the same 15 s period can only add what is left of the period's limit;
    a sync a period later starts from the new count."""
    h = hpa()
    assert step(h, 0.0, 2, 1000) == 6
    assert step(h, 10.0, 6, 1000) == 6  # limit 6 reached
    assert step(h, 15.0, 6, 1000) == 12


def test_hpa_scale_down_waits_for_the_stabilization_window() -> None:
    """Scale-down takes the highest recommendation of the last 300 s: a low metric after a high
    one changes nothing until the high recommendation has left the window."""
    h = hpa()
    assert step(h, 0.0, 10, 100) == 10  # recommends 10
    for t in range(15, 300, 15):
        assert step(h, float(t), 10, 50) == 10, t
    assert step(h, 300.0, 10, 50) == 5


def test_hpa_scale_down_goes_to_the_window_maximum() -> None:
    """Recommendations 10, 8, 5 in the window: the count goes to 8 once 10 has left it."""
    h = hpa()
    step(h, 0.0, 10, 100)
    step(h, 100.0, 10, 80)
    for t in (150.0, 250.0):
        assert step(h, t, 10, 50) == 10
    assert step(h, 301.0, 10, 50) == 8


def test_prometheus_quantile_sees_only_the_last_scrape_and_its_window() -> None:
    """At now the value is the P99 of requests in (s - 60, s], s the last 15 s scrape."""
    m = PrometheusQuantile(start=0.0, quantile=0.99)
    for t in range(0, 200):
        m.observe(float(t), [float(t)])
    assert m.last_scrape(74.0) == 60.0
    assert m.read(74.0) == 59.0  # requests at 1..60: rank floor(0.99 * 59) = 58
    assert m.read(75.0) == 74.0  # scrape at 75: requests at 16..75


def test_prometheus_rate_is_the_last_scrapes_window_and_the_adapter_delays_it() -> None:
    """Two requests a second until 100 s, then ten: the rate over (s - 60, s] at the last scrape
    s; an adapter 20 s late sees the scrape before."""
    m = PrometheusQuantile(start=0.0, quantile=0.99)
    late = PrometheusQuantile(start=0.0, quantile=0.99, query_s=20.0)
    for t in range(1, 200):
        batch = [1.0] * (2 if t <= 100 else 10)
        m.observe(float(t), batch)
        late.observe(float(t), batch)
    assert m.read_rate(104.0) == pytest.approx(2.0)  # scrape at 90
    assert m.read_rate(165.0) == pytest.approx(10.0)  # scrape at 165: 106..165
    assert late.read_rate(120.0) == pytest.approx(2.0)  # sees the scrape at 90
    assert late.read_rate(-5.0) is None


def _chat(t: float, n: int, ms: float = 100.0) -> InferenceLatency:
    return InferenceLatency(ts=t, service="chat", namespace="serving", samples_ms=[ms] * n)


def test_keda_defaults_query_at_each_sync_and_the_cache_holds_the_last_poll() -> None:
    """useCachedMetrics false (the default): the HPA reads the query at its own sync; true: the
    value of the last 30 s poll."""
    live = Keda(balanced(), MODELS, start=0.0, settings=KedaSettings())
    cached = Keda(balanced(), MODELS, start=0.0, settings=KedaSettings(cached=True))
    for t in range(0, 200):
        for k in (live, cached):
            k.observe(_chat(float(t), 2 if t < 50 else 8))
    hpa_live, hpa_cached = live.hpas["serving/chat"], cached.hpas["serving/chat"]
    assert live.rate(hpa_live, 105.0) == pytest.approx(456 / 60)  # scrape at 105: 46..105
    assert cached.rate(hpa_cached, 90.0) == pytest.approx(366 / 60)  # poll at 90: 31..90
    assert cached.rate(hpa_cached, 105.0) == pytest.approx(366 / 60)  # still the poll at 90
    assert cached.rate(hpa_cached, 120.0) == pytest.approx(8.0)  # poll at 120: 61..120


def test_hpa_rate_takes_the_larger_of_rate_and_latency_guard() -> None:
    """Low rate but a P99 far above the guard: the guard's proposal wins; high rate with a fast
    P99: the rate's (ceil(rate / (0.5 * 5 req/s)))."""
    policy = balanced()
    peer = HpaRate(policy, MODELS, start=0.0, settings=HpaRateSettings())
    h = peer.hpas["serving/chat"]
    for t in range(0, 61):
        peer.observe(_chat(float(t), 5, ms=600.0))
    props = peer.proposals(h, 60.0, current=4, ready=4)
    assert max(props)[0] == 10  # guard 0.8 x 300 ms: ceil(4 * 600 / 240)
    fast = HpaRate(policy, MODELS, start=0.0, settings=HpaRateSettings())
    for t in range(0, 61):
        fast.observe(_chat(float(t), 20, ms=50.0))
    props = fast.proposals(fast.hpas["serving/chat"], 60.0, current=4, ready=4)
    assert max(props)[0] == 8  # 20 req/s / 2.5


def kpa(settings: KpaSettings | None = None, target: float = 10.0) -> KpaState:
    return KpaState(1, 100, target, settings or KpaSettings())


def feed(state: KpaState, start: int, end: int, concurrency: float) -> None:
    for t in range(start, end):
        state.observe(float(t), concurrency)


def test_kpa_stable_mode_targets_the_windows_mean_concurrency() -> None:
    """A steady 45 in flight, target 10 per replica: ceil(4.5) = 5, every tick, no flapping."""
    s = kpa(KpaSettings(scale_down_delay_s=0.0))
    feed(s, 0, 200, 45.0)
    assert [s.scale(float(t), ready=5) for t in range(60, 200, 2)] == [5] * 70
    assert s.panic_time is None


def test_kpa_panics_on_a_burst_and_never_scales_down_while_panicking() -> None:
    """The 6 s window at twice the ready pods' target starts panic: the panic count wins; once
    the burst ends the count holds until a stable window after the last over-threshold tick."""
    s = kpa(KpaSettings(scale_down_delay_s=0.0))
    feed(s, 0, 100, 40.0)
    assert s.scale(99.0, ready=4) == 4
    feed(s, 100, 110, 200.0)
    assert s.scale(109.0, ready=4) == 20  # panic: 6 s mean 200 / 10; 20 / 4 >= 200 %
    assert s.panic_time == 109.0
    feed(s, 110, 240, 40.0)
    held = [s.scale(float(t), ready=16) for t in range(111, 169, 2)]
    assert set(held) == {20}
    assert s.scale(171.0, ready=16) == 8  # un-panicked: stable 40/10 = 4, halved at most


def reversals(settings: KpaSettings) -> int:
    """Scale direction changes within 10 s over 20 minutes of a noisy load near 2 x target."""
    s = kpa(settings)
    rng = random.Random(7)
    ready, last, flips = 2, None, 0
    for t in range(0, 1200):
        s.observe(float(t), rng.gauss(20.0, 6.0))
        if t >= 60 and t % 2 == 0:
            want = s.scale(float(t), ready=ready)
            if want is not None and want != ready:
                up = want > ready
                if last is not None and last[0] != up and t - last[1] < 10:
                    flips += 1
                last, ready = (up, t), want
    return flips


def test_kpa_does_not_flap_at_the_arenas_defaults() -> None:
    """Regression: with Knative's scale-down-delay of 0 the count flips within seconds around
    the boundary; 60 s already makes no reversal within 10 s, and so does the arena's default
    (10 minutes)."""
    assert reversals(KpaSettings(scale_down_delay_s=60.0)) == 0
    assert reversals(KpaSettings(scale_down_delay_s=0.0)) > 0
    assert reversals(KpaSettings()) == 0


def test_kpa_starts_in_panic_with_more_than_one_ready_pod() -> None:
    """newAutoscaler: more than one ready pod starts in panic at that count (no early drop)."""
    s = kpa()
    s.start(0.0, 6)
    feed(s, 0, 30, 10.0)
    assert s.scale(29.0, ready=6) == 6
    one = kpa()
    one.start(0.0, 1)
    assert one.panic_time is None


def test_kpa_peer_scales_the_service_from_its_requests() -> None:
    """The peer turns requests into concurrency (sum of latencies over time) and scales the
    workload once it has data."""
    policy = balanced()
    snap = SimCluster.from_scenario(load_scenario(SCENARIO), policy=policy).snapshot()
    peer = Kpa(policy, MODELS, start=EPOCH, settings=KpaSettings())
    assert peer.evaluate(EPOCH, snap) == []  # no data yet
    for t in range(1, 120):
        peer.observe(_chat(EPOCH + t, 40, ms=300.0))  # 12 in flight
    (d,) = peer.evaluate(EPOCH + 120.0, snap)
    assert isinstance(d, Scale)
    assert d.workload == "serving/chat"
    assert d.to_replicas > 4


def test_kpa_rps_scales_on_the_request_rate_not_the_latency() -> None:
    """metric: rps: 20 req/s at any latency, target 0.5 x 5 req/s per replica: 8 replicas."""
    policy = balanced()
    snap = SimCluster.from_scenario(load_scenario(SCENARIO), policy=policy).snapshot()
    for ms in (50.0, 900.0):
        peer = Kpa(policy, MODELS, start=EPOCH, settings=KpaSettings(rps=True))
        for t in range(1, 120):
            peer.observe(_chat(EPOCH + t, 20, ms=ms))
        (d,) = peer.evaluate(EPOCH + 120.0, snap)
        assert isinstance(d, Scale)
        assert d.to_replicas == 8, ms


def test_backfill_grows_training_into_idle_gpus_by_priority_in_whole_gangs() -> None:
    """The small scenario's pretrain (2 GPUs a replica, 16 of max 24) and sweep: idle GPUs go
    to the higher-priority job first, whole replicas only; nothing while a GPU pod waits."""
    policy = balanced()
    sim = SimCluster.from_scenario(load_scenario(SCENARIO), policy=policy)
    snap = sim.snapshot()
    decisions = Backfill(policy, start=EPOCH).evaluate(EPOCH, snap)
    grown = {d.workload: d for d in decisions if isinstance(d, Scale)}
    assert grown, "the scenario has idle GPUs"
    assert all(d.role == "training" and d.to_replicas > d.from_replicas for d in grown.values())
    assert all(d.explanation.rule == "backfill" for d in grown.values())
    assert not any(p.waiting and p.gpus > 0 for p in snap.pods)


def test_backfill_waits_while_a_gpu_pod_is_pending() -> None:
    policy = balanced()
    sim = SimCluster.from_scenario(load_scenario(SCENARIO), policy=policy, start=EPOCH)
    why = Explanation.of("test", "more chat than fits")
    asyncio.run(sim.apply([Scale(EPOCH, "serving/chat", "Deployment", 4, 60, "inference", why)]))
    sim.advance(EPOCH + 5.0)
    snap = sim.snapshot()
    assert any(p.waiting and p.gpus > 0 for p in snap.pods)
    assert Backfill(policy, start=EPOCH).evaluate(EPOCH, snap) == []


def test_static_p95_is_sized_from_the_previous_window() -> None:
    """The diurnal day's previous hour before 02:00 is night: its P95 is far below the peak,
    and an hour before 16:00 it is near it."""
    day = Diurnal(start=EPOCH)
    night = load_quantile(day, EPOCH + 1 * 3600, 3600.0, 0.95)
    afternoon = load_quantile(day, EPOCH + 15 * 3600, 3600.0, 0.95)
    assert night < 0.3 < 0.95 < afternoon <= 1.0


def test_pareto_marks_dominated_runs_the_front_and_the_best_per_column() -> None:
    rows = [
        {"controller": "a", "slo_attainment": 0.99, "training_goodput_gpu_hours": 10.0},
        {"controller": "b", "slo_attainment": 0.95, "training_goodput_gpu_hours": 12.0},
        {"controller": "b", "slo_attainment": 0.94, "training_goodput_gpu_hours": 11.0},
        {"controller": "c", "slo_attainment": None, "training_goodput_gpu_hours": 20.0},
    ]
    for r in rows:
        r["fair"] = r["controller"] != "a"  # "a" an oracle
    out = mark(rows)
    assert [r["pareto"] for r in rows] == ["front", "front", "dominated", "none"]
    assert rows[2]["dominated_by"] == [1]
    assert rows[1]["dominates"] == [2]
    assert out["front"] == [0, 1]
    assert out["fair_front"] == [1]  # without the oracle, b's better run is alone on it
    assert out["best"]["slo_attainment"] == {"direction": "max", "value": 0.99, "runs": [0]}
    assert out["best"]["training_goodput_gpu_hours"]["runs"] == [3]
    assert [r["own_front"] for r in rows] == [True, True, False, False]


@pytest.mark.parametrize(
    ("lag", "ts", "seen"),
    [
        pytest.param(EventLag(5.0, 0.076), 101.0, 105.076, id="waits-for-the-flush"),
        pytest.param(EventLag(5.0, 0.076), 105.0, 105.076, id="on-the-flush"),
        pytest.param(EventLag(0.0, 0.0), 101.0, 101.0, id="on-time"),
    ],
)
def test_ebbtide_sees_events_after_the_flush_and_the_transport(
    lag: EventLag, ts: float, seen: float
) -> None:
    assert lag.visible_at(ts) == pytest.approx(seen)


def test_ebbtide_variant_sets_its_knobs_on_every_service_and_refuses_others() -> None:
    policy = balanced()
    v = ebbtide_variant(policy, {"breach_after_s": 15.0, "down_stabilization_s": 1200.0})
    chat = v.spec.services["chat"]
    assert chat.slo.breach_after == 15.0
    assert chat.scale is not None
    assert chat.scale.down is not None
    assert chat.scale.down.stabilization == 1200.0
    assert policy.spec.services["chat"].slo.breach_after == 30.0
    with pytest.raises(ValueError, match="no setting growAfter"):
        ebbtide_variant(policy, {"growAfter": 1.0})

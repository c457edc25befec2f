"""The peers' algorithms: HPA v2 replica calculation and behaviour, the Prometheus delay, KEDA's
polling cache."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.offline.experiment.peers import (
    HpaBehavior,
    HpaState,
    KedaPriority,
    PrometheusQuantile,
)
from policies.loader import load_policy_text
from streams.events import InferenceLatency

BALANCED = Path(__file__).resolve().parents[2] / "policies" / "library" / "balanced.yaml"


def hpa(lo: int = 1, hi: int = 100) -> HpaState:
    return HpaState(lo, hi, HpaBehavior())


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
    ("current", "metric", "want"),
    [
        pytest.param(2, 1000.0, 6, id="small-plus-4-pods-beats-100pct"),
        pytest.param(10, 1000.0, 20, id="large-100pct-beats-4-pods"),
        pytest.param(3, 150.0, 5, id="under-the-limit-as-desired"),
    ],
)
def test_hpa_scale_up_limit(current: int, metric: float, want: int) -> None:
    """Scale-up per 15 s period: at most max(2x, +4) of the period's starting count."""
    assert hpa().step(0.0, current=current, ready=current, metric=metric, target=100) == want


def test_hpa_scale_up_limit_counts_the_period_events() -> None:
    """A second sync in the same 15 s period can only add what is left of the period's limit;
    a sync a period later starts from the new count."""
    h = hpa()
    assert h.step(0.0, current=2, ready=2, metric=1000, target=100) == 6
    assert h.step(10.0, current=6, ready=6, metric=1000, target=100) == 6  # limit 6 reached
    assert h.step(15.0, current=6, ready=6, metric=1000, target=100) == 12


def test_hpa_scale_down_waits_for_the_stabilization_window() -> None:
    """Scale-down takes the highest recommendation of the last 300 s: a low metric after a high
    one changes nothing until the high recommendation has left the window."""
    h = hpa()
    assert h.step(0.0, current=10, ready=10, metric=100, target=100) == 10  # recommends 10
    for t in range(15, 300, 15):
        assert h.step(float(t), current=10, ready=10, metric=50, target=100) == 10, t
    assert h.step(300.0, current=10, ready=10, metric=50, target=100) == 5


def test_hpa_scale_down_goes_to_the_window_maximum() -> None:
    """Recommendations 10, 8, 5 in the window: the count goes to 8 once 10 has left it."""
    h = hpa()
    h.step(0.0, current=10, ready=10, metric=100, target=100)
    h.step(100.0, current=10, ready=10, metric=80, target=100)
    for t in (150.0, 250.0):
        assert h.step(t, current=10, ready=10, metric=50, target=100) == 10
    assert h.step(301.0, current=10, ready=10, metric=50, target=100) == 8


def test_prometheus_quantile_sees_only_the_last_scrape_and_its_window() -> None:
    """At now the value is the P99 of requests in (s - 60, s], s the last 15 s scrape."""
    m = PrometheusQuantile(start=0.0, quantile=0.99)
    for t in range(0, 200):
        m.observe(float(t), [float(t)])
    assert m.last_scrape(74.0) == 60.0
    assert m.read(74.0) == 59.0  # requests at 1..60: rank floor(0.99 * 59) = 58
    assert m.read(75.0) == 74.0  # scrape at 75: requests at 16..75


def test_keda_holds_the_value_of_its_last_poll() -> None:
    """The HPA reads, at 15 s syncs, what KEDA's last 30 s poll got from Prometheus."""
    policy = load_policy_text(BALANCED.read_text())
    k = KedaPriority(policy, start=0.0)
    for t in range(0, 200):
        k.observe(InferenceLatency(ts=float(t), service="chat", namespace="serving",
                                   samples_ms=[float(t)]))  # fmt: skip
    assert k.metric("serving/chat", 45.0) == k.metric("serving/chat", 30.0)
    assert k.metric("serving/chat", 60.0) == 59.0
    assert k.metric("serving/chat", 89.0) == 59.0

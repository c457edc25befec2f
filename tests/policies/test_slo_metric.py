"""An objective names its latency metric (e2e, ttft, tpot): a scraper publishes all three for
one service, and only the one its objective is on may move its window (the others used to be
mixed in: a 2 s TTFT histogram read as a 2 s request latency)."""

from __future__ import annotations

import copy

import pytest
from policy_fixtures import BASE, T0, cluster, make_policy, training

from policies.engine import Engine
from policies.partials import Fold, FoldSpec
from streams.events import InferenceLatency, LatencyHistogram

BOUNDS = [50.0, 100.0]
ALL_OVER = [0, 0, 20]
ALL_UNDER = [20, 0, 0]


def _feed(engine: Engine, start: int, end: int) -> None:
    for t in range(start, end):
        for objective, counts in (("ttft", ALL_OVER), ("e2e", ALL_UNDER)):
            hist = LatencyHistogram(bounds_ms=BOUNDS, counts=counts)
            engine.observe(InferenceLatency(ts=float(t), service="chat", namespace="serving",
                                            histogram=hist, objective=objective))  # fmt: skip


def _run(metric: str | None) -> Engine:
    services = copy.deepcopy(BASE["spec"]["services"])
    if metric is not None:
        services["chat"]["slo"]["metric"] = metric
    engine = Engine(make_policy(services=services))
    b = cluster(whole_nodes=2)
    training(b, "rigid", replicas=8, nodes=["w1"], priority=10)
    snap = b.build()
    for t in range(int(T0), int(T0) + 15):
        _feed(engine, t, t + 1)
        engine.evaluate(t + 1, snap)
    return engine


def test_an_e2e_objective_is_not_moved_by_ttft_events() -> None:
    engine = _run(None)  # the default: e2e
    assert engine.slo_state("serving/chat").state != "breaching"
    assert engine.other_metric == 15


def test_a_ttft_objective_reads_ttft_events_only() -> None:
    engine = _run("ttft")
    assert engine.slo_state("serving/chat").state == "breaching"
    assert engine.other_metric == 15


def test_sharded_folds_keep_the_objective_metric_only() -> None:
    services = copy.deepcopy(BASE["spec"]["services"])
    services["chat"]["slo"]["metric"] = "tpot"
    partials = Fold(FoldSpec.of(make_policy(services=services)), topic="t", partition=0, first=0)
    hist = LatencyHistogram(bounds_ms=BOUNDS, counts=ALL_OVER)
    events = [InferenceLatency(ts=T0, service="chat", namespace="serving", histogram=hist,
                               objective=o) for o in ("e2e", "ttft", "tpot")]  # fmt: skip
    partials.observe(events, T0)
    assert partials.other_metric == 2


@pytest.mark.parametrize("metric", ["p99", "TTFT"])
def test_an_unknown_metric_is_refused(metric: str) -> None:
    services = copy.deepcopy(BASE["spec"]["services"])
    services["chat"]["slo"]["metric"] = metric
    with pytest.raises(Exception, match="metric"):
        make_policy(services=services)


def test_the_shipped_llm_example_is_on_ttft() -> None:
    from pathlib import Path

    from policies.loader import load_policy_text

    path = Path(__file__).resolve().parents[2] / "examples" / "policy-llm.yaml"
    policy = load_policy_text(path.read_text(), str(path))
    assert policy.spec.services["chat"].slo.metric == "ttft"

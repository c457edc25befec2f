"""A histogram's overflow bucket holds requests *above* its last bound (docs/events.md, and
Prometheus' ``+Inf``): they count above every threshold and read as more than the last bound."""

from __future__ import annotations

from policy_fixtures import T0, cluster, make_policy, training

from policies.decisions import Scale
from policies.engine import Engine
from policies.model import SloSpec
from policies.slo import ExceedanceWindow
from policies.windows import LatencyWindow
from streams.events import InferenceLatency, LatencyHistogram
from streams.prometheus import PromQuery, Translation, to_events

SPEC = SloSpec.model_validate({"percentile": 99, "objectiveMs": 100, "recoverBelow": "80%"})
BOUNDS = [50.0, 100.0]
ALL_OVER = [0, 0, 20]  # every request took more than 100 ms


def test_the_overflow_counts_above_the_objective_at_the_last_bound() -> None:
    """Bounds [50, 100], objective 100: requests all over 100 ms put P99 above the objective
    (they used to count at 100, i.e. "between", and the service stayed ok)."""
    exceed = ExceedanceWindow(window_s=30, interval_s=1, high=100.0, low=80.0)
    exceed.add_histogram(T0, BOUNDS, ALL_OVER)
    assert exceed.counts(T0) == (20, 20, 20)
    assert exceed.level(T0, 0.99, 10) == ("above", 20)
    assert exceed.unresolved is None  # the last bound is the objective: exact


def test_the_overflow_counts_above_a_threshold_past_the_last_bound_and_says_so() -> None:
    """An objective past the last bound cannot be judged: the overflow errs high (above), and
    ``unresolved`` names the bound that falls short."""
    exceed = ExceedanceWindow(window_s=30, interval_s=1, high=200.0, low=160.0)
    exceed.add_histogram(T0, BOUNDS, [5, 5, 10])
    assert exceed.counts(T0) == (20, 10, 10)
    assert exceed.unresolved == 100.0


def test_a_quantile_in_the_overflow_reads_above_the_last_bound() -> None:
    """The sketch reads an overflow quantile as more than the last bound, and ``above_bound``
    names that bound; a quantile inside the buckets is a measurement (``None``)."""
    window = LatencyWindow(window_s=30, interval_s=1)
    window.add_histogram(T0, BOUNDS, ALL_OVER)
    p99 = window.quantile(T0, 0.99)
    assert p99 is not None
    assert p99 > 100.0
    assert window.above_bound(T0, 0.99) == 100.0
    window.add_histogram(T0, BOUNDS, [2000, 0, 0])
    assert window.above_bound(T0, 0.99) is None
    assert window.above_bound(T0 + 60, 0.99) is None  # empty


def _histograms(engine: Engine, start: float, end: float) -> None:
    t = start
    while t < end:
        hist = LatencyHistogram(bounds_ms=BOUNDS, counts=ALL_OVER)
        engine.observe(InferenceLatency(ts=t, service="chat", namespace="serving", histogram=hist))
        t += 1.0


def test_a_service_whose_every_request_overflows_breaches_and_scales_up() -> None:
    """End to end through the engine: bounds [50, 100], objective 100, every request over
    100 ms: the service breaches after breachAfter and is scaled up, the explanation saying
    the percentile is above the histogram's last bound."""
    engine = Engine(make_policy())
    b = cluster(whole_nodes=2)
    training(b, "rigid", replicas=8, nodes=["w1"], priority=10)
    snap = b.build()
    scales: list[tuple[float, Scale]] = []
    for t in range(int(T0), int(T0) + 15):
        _histograms(engine, t, t + 1)
        for d in engine.evaluate(t + 1, snap):
            if isinstance(d, Scale) and d.target == "serving/chat":
                scales.append((t + 1, d))
    assert engine.slo_state("serving/chat").state == "breaching"
    (at, scale), *_ = scales
    assert at == T0 + 11  # breachAfter 10 s
    assert (scale.from_replicas, scale.to_replicas) == (1, 2)
    assert scale.explanation.inputs["p99_above_last_bound_ms"] == 100.0
    assert "P99 > 100ms (above the histogram's last bound)" in scale.explanation.reason


def test_prometheus_inf_bucket_counts_above_the_objective() -> None:
    """``record --from-prometheus``: a ``+Inf`` bucket holding every request (none at or under
    0.1 s) becomes the overflow, which the counters put above a 100 ms objective."""
    series = [
        {"metric": {"service": "chat", "le": le}, "values": [[T0, v]]}
        for le, v in (("0.05", "0"), ("0.1", "0"), ("+Inf", "20"))
    ]
    out = Translation()
    to_events(PromQuery("latency", "x"), series, out)
    (event,) = out.events
    assert isinstance(event, InferenceLatency)
    assert event.histogram is not None
    exceed = ExceedanceWindow(window_s=30, interval_s=1, high=100.0, low=80.0)
    exceed.add_histogram(T0, event.histogram.bounds_ms, event.histogram.counts)
    assert exceed.level(T0, 0.99, 10) == ("above", 20)

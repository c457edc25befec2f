"""The pure parts of ``simulate``: the queueing model, the load generators, the baselines."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from controller.offline.experiment import (
    AzureTrace,
    Burst,
    Diurnal,
    PollingAutoscaler,
    ServiceModel,
    ServiceQueue,
    default_model,
    latency_samples,
    parse_burst,
    poisson,
    static_partition,
)
from controller.simcluster import EPOCH, SimCluster, load_scenario
from policies.loader import load_policy_text
from streams.events import InferenceLatency

ROOT = Path(__file__).resolve().parents[2]
AZURE = ROOT.parent / "shared" / "data" / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
BALANCED = ROOT / "policies" / "library" / "balanced.yaml"
MODEL = ServiceModel("serving/chat", peak_rps=25.0, per_replica_rps=5.0, base_ms=75.0)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.99 * (len(ordered) - 1))]


def test_latency_is_monotone_in_load_and_explodes_near_saturation() -> None:
    """With the same draws, every sample and the P99 rise with utilization; P99 at rho 0.98 is
    over 10x the unloaded P99, and at saturation it is the cap."""
    rhos = [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0, 1.5]
    runs = [latency_samples(MODEL, rho=r, wait_ms=0.0, n=2000, rng=random.Random(3)) for r in rhos]
    for lower, higher in itertools.pairwise(runs):
        assert all(a <= b for a, b in zip(lower, higher, strict=True))
    p99 = [_p99(r) for r in runs]
    print("P99 by rho:", dict(zip(rhos, p99, strict=True)))
    assert p99 == sorted(p99)
    assert p99[rhos.index(0.98)] > 10 * p99[0]
    assert p99[-1] == p99[-2]  # capped beyond saturation
    assert 1.5 * MODEL.base_ms < p99[0] < 2.0 * MODEL.base_ms  # base * (1 + 0.15 ln 100)


def test_overload_builds_a_backlog_that_more_replicas_drain() -> None:
    """Offered above capacity, the wait grows tick after tick; doubling the replicas drains it,
    and without any replica every request times out."""
    queue = ServiceQueue(MODEL, random.Random(1))
    medians = []
    for _ in range(30):
        samples = queue.step(offered_rps=25.0, replicas=4, arrivals=25, dt=1.0)
        medians.append(sorted(samples)[12])
    assert medians[-1] > medians[10] > medians[0]
    assert queue.backlog == pytest.approx(150.0)
    for _ in range(60):
        queue.step(offered_rps=25.0, replicas=8, arrivals=25, dt=1.0)
    assert queue.backlog == 0.0
    assert queue.rho == pytest.approx(25.0 / 40.0)
    assert queue.step(offered_rps=5.0, replicas=0, arrivals=3, dt=1.0) == [MODEL.timeout_ms] * 3


def test_default_model_breaches_above_rho_point_six() -> None:
    """The policy-derived model: P99 below the objective at rho 0.5, above it at rho 0.7."""
    model = default_model("serving/chat", objective_ms=300.0, initial_replicas=4)
    assert model.peak_rps == 25.0
    at = {
        r: _p99(latency_samples(model, rho=r, wait_ms=0.0, n=5000, rng=random.Random(0)))
        for r in (0.5, 0.7)
    }
    assert at[0.5] < 300.0 < at[0.7]


def test_diurnal_has_a_night_trough_a_day_peak_and_the_burst() -> None:
    """Trough 15% at 04:00, peak 100% at 16:00; the burst multiplies by its factor inside its
    window (ramps outside) and not before or after."""
    start = EPOCH + 2 * 3600
    shape = Diurnal(start=start, bursts=(Burst(1800.0, 900.0, 6.0),))
    assert shape.base(EPOCH + 4 * 3600) == pytest.approx(0.15)
    assert shape.base(EPOCH + 16 * 3600) == pytest.approx(1.0)
    assert shape.base(EPOCH + 4 * 3600) < shape.base(EPOCH + 2 * 3600) < 0.25
    t = start + 2000
    assert shape.factor(t) == pytest.approx(6.0 * shape.base(t))
    for outside in (start + 1000, start + 1800 + 900 + 60):
        assert shape.factor(outside) == pytest.approx(shape.base(outside))
    assert shape.base(start + 1790) < shape.factor(start + 1790) < 6 * shape.base(start + 1790)


def test_arrivals_are_deterministic_per_seed_with_the_right_mean() -> None:
    """The same seed gives the same counts, another seed others; the mean matches the rate
    for small (exact method) and large (normal) rates."""
    for mean in (3.0, 80.0):
        a = [poisson(random.Random(5), mean) for _ in range(1)]
        rng1, rng2, rng3 = random.Random(5), random.Random(5), random.Random(6)
        one = [poisson(rng1, mean) for _ in range(4000)]
        assert one == [poisson(rng2, mean) for _ in range(4000)]
        assert one != [poisson(rng3, mean) for _ in range(4000)]
        assert sum(one) / len(one) == pytest.approx(mean, rel=0.03)
        assert a[0] == one[0]


@pytest.mark.skipif(not AZURE.is_file(), reason="needs ../shared/data/azure-llm-2023")
def test_azure_trace_shapes_the_load_per_minute_and_repeats_hourly() -> None:
    """The trace's 8,819 arrivals become ~58 per-minute buckets scaled to a peak of 1, with real
    swings; the shape repeats every hour and reading twice gives the same shape."""
    shape = AzureTrace.from_csv(AZURE, start=EPOCH)
    assert 55 <= len(shape.buckets) <= 61  # 18:17 to 19:14
    assert max(shape.buckets) == 1.0
    assert min(shape.buckets) < 0.1  # near-silent minutes...
    assert sum(b > 0.5 for b in shape.buckets) > 15  # ...and busy ones
    assert shape.factor(EPOCH + 125.0) == shape.factor(EPOCH + 125.0 + 60 * len(shape.buckets))
    assert AzureTrace.from_csv(AZURE, start=EPOCH) == shape


def test_burst_syntax() -> None:
    """OFFSET:DURATION:FACTOR parses; anything else is a ValueError naming the input."""
    assert parse_burst("40m:15m:6") == Burst(2400.0, 900.0, 6.0)
    for bad in ("40m:15m", "x:15m:6", "40m:0s:6", "40m:15m:-1"):
        with pytest.raises(ValueError, match="burst"):
            parse_burst(bad)


def test_static_partition_sizes_inference_for_peak_and_gives_training_the_rest() -> None:
    """chat at the peak of 25 req/s x 1.1 at rho 0.5 gets 11 replicas; training fills the
    whole pool's 48 GPUs exactly, every job at least at its minimum."""
    policy = load_policy_text(BALANCED.read_text())
    snap = SimCluster.from_scenario(load_scenario(SCENARIO), policy=policy).snapshot()
    models = {"serving/chat": default_model("serving/chat", objective_ms=300, initial_replicas=4)}
    plan = static_partition(snap, policy, models, load_factor=1.1, at=EPOCH)
    assert plan.replicas["serving/chat"] == 11
    gpus = plan.replicas["serving/chat"] + 2 * plan.replicas["ml/pretrain"]
    gpus += plan.replicas["ml/sweep"]
    assert gpus == 48
    assert plan.replicas["ml/pretrain"] >= 8
    assert plan.replicas["ml/sweep"] >= 2
    assert {d.workload for d in plan.decisions} == {"serving/chat", "ml/pretrain", "ml/sweep"}


def test_polling_autoscaler_reads_a_30s_old_metric_every_30s() -> None:
    """A latency spike seen only in the last 30 s does not move the polling autoscaler; 30 s
    later it scales by the HPA formula, capped at double the replicas."""
    policy = load_policy_text(BALANCED.read_text())
    snap = SimCluster.from_scenario(load_scenario(SCENARIO), policy=policy).snapshot()
    auto = PollingAutoscaler(policy, start=EPOCH)
    for s in range(120):
        value = 900.0 if s >= 90 else 250.0
        auto.observe(
            InferenceLatency(ts=EPOCH + s, service="chat", namespace="serving", samples_ms=[value])
        )
    assert auto.evaluate(EPOCH + 119.0, snap) == []  # metric as of 89 s: 250 ms, within tolerance
    assert auto.evaluate(EPOCH + 130.0, snap) == []  # not a polling instant yet
    (decision,) = auto.evaluate(EPOCH + 149.0, snap)
    assert decision.workload == "serving/chat"
    assert (decision.from_replicas, decision.to_replicas) == (4, 8)

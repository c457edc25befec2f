"""What a running controller tells its operator about its ingest: histograms that cannot
resolve an objective (one log line per service) and partitions it does not read (``/readyz``)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from structlog.testing import capture_logs

from controller.process.app import Controller, load_policy_files
from controller.process.settings import load_settings
from controller.simcluster.sim_runtime import SimRuntime
from streams.consumer import Batch, ConsumerStats
from streams.events import InferenceLatency, LatencyHistogram

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
POLICY = ROOT / "policies" / "library" / "balanced.yaml"  # chat: objective 300 ms
NOW = 1_800_000_000.0


def _controller() -> Controller:
    settings = load_settings(policies=[POLICY], cluster=f"sim:{SCENARIO}")
    policy = load_policy_files(settings)
    runtime = SimRuntime.from_file(SCENARIO, policy, dry_run=settings.dry_run_for(policy))
    return Controller(settings, runtime, policy, clock=lambda: NOW)


def _histogram(bounds: list[float]) -> Batch:
    hist = LatencyHistogram(bounds_ms=bounds, counts=[1] * (len(bounds) + 1))
    event = InferenceLatency(ts=NOW, service="chat", namespace="serving", histogram=hist)
    return Batch(events=[event], positions={}, fetched_at=NOW)


async def test_histograms_ending_below_the_objective_are_warned_about_once() -> None:
    """Bounds ending at 250 ms under a 300 ms objective log one warning naming the service and
    the bound, however many such histograms arrive."""
    controller = _controller()
    with capture_logs() as logs:
        await controller.observe(_histogram([100.0, 300.0]))
        for _ in range(3):
            await controller.observe(_histogram([100.0, 250.0]))
    warnings = [e for e in logs if e["event"] == "slo.histogram_below_objective"]
    assert [(w["service"], w["last_bound_ms"]) for w in warnings] == [("serving/chat", 250.0)]


async def test_readiness_names_partitions_not_read() -> None:
    """A caught-up consumer with partitions listed but not read is not ready, and says which."""
    controller = _controller()
    stats = ConsumerStats(last_fetch_ok=time.monotonic(), caught_up=True)
    controller._consumer = SimpleNamespace(stats=stats)  # type: ignore[assignment]
    assert not any("partitions" in p for p in controller._not_ready())
    stats.unassigned = {("ebbtide.inference.latency", 6)}
    assert "partitions not read: ebbtide.inference.latency[6]" in controller._not_ready()

"""A live controller fed months-old events says so: a counter and one warning per burst."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from structlog.testing import capture_logs

from controller.process.app import Controller, load_policy_files
from controller.process.metrics import STALE_WARN_EVERY_S
from controller.process.settings import load_settings
from controller.simcluster.sim_runtime import SimRuntime
from streams.consumer import Batch
from streams.events import InferenceLatency

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
POLICY = ROOT / "policies" / "library" / "balanced.yaml"
NOW = 1_800_000_000.0
ELEVEN_MONTHS = 11 * 30 * 86_400.0


def _batch(*ages_s: float) -> Batch:
    events = [
        InferenceLatency(ts=NOW - age, service="chat", namespace="serving", latency_ms=50.0)
        for age in ages_s
    ]
    return Batch(events=events, positions={}, fetched_at=NOW)


def _stale_total(controller: Controller) -> float:
    text = generate_latest(controller.metrics.registry).decode()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ebbtide_events_stale_total ")]
    return float(line.split()[1])


async def test_old_events_are_counted_and_warned_about_once_per_burst() -> None:
    """Events 11 months old are counted as stale; a burst of them logs one warning; fresh
    events are not counted; a later burst warns again."""
    now = [NOW]
    settings = load_settings(policies=[POLICY], cluster=f"sim:{SCENARIO}")
    policy = load_policy_files(settings)
    runtime = SimRuntime.from_file(SCENARIO, policy, dry_run=settings.dry_run_for(policy))
    controller = Controller(settings, runtime, policy, clock=lambda: now[0])
    with capture_logs() as logs:
        await controller.observe(_batch(1.0, 2.0))
        await controller.observe(_batch(ELEVEN_MONTHS, ELEVEN_MONTHS + 5, 1.0))
        await controller.observe(_batch(ELEVEN_MONTHS))
        now[0] += STALE_WARN_EVERY_S
        await controller.observe(_batch(ELEVEN_MONTHS))
    assert _stale_total(controller) == 4
    warnings = [entry for entry in logs if entry["event"] == "events.stale"]
    assert [w["count"] for w in warnings] == [2, 1]
    assert warnings[0]["log_level"] == "warning"
    assert warnings[0]["oldest_age_s"] == ELEVEN_MONTHS + 5

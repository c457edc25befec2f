"""The skew counter: what the engine counted as skewed is scraped as a Prometheus counter."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest

from controller.process.metrics import Metrics, StateSources
from policies.engine import Engine
from policies.loader import load_policy_text
from streams.events import InferenceLatency

T0 = 1_767_225_600.0
LIBRARY = Path(__file__).parents[1] / "policies" / "library" / "balanced.yaml"


def test_skewed_events_are_scraped() -> None:
    """An event stamped 300 s ahead of the engine's clock shows in ebbtide_events_skewed_total."""
    engine = Engine(load_policy_text(LIBRARY.read_text(), str(LIBRARY)))
    engine.advance(T0)
    engine.observe(
        InferenceLatency(ts=T0 + 300.0, service="chat", namespace="serving", latency_ms=1.0)
    )
    sources = StateSources(
        engine=lambda: engine, consumer=lambda: None, is_leader=lambda: True, clock=lambda: T0
    )
    text = generate_latest(Metrics(sources).registry).decode()
    assert "ebbtide_events_skewed_total 1.0" in text

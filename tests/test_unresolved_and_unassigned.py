"""What an operator is told when a histogram cannot resolve an objective (``policy validate``,
the engine's count, the metric) and when event-topic partitions are not read (the metric)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from prometheus_client import generate_latest

from controller.cli.policy_commands import policy
from controller.process.metrics import Metrics, StateSources
from policies.engine import Engine
from policies.loader import load_policy_text
from streams.consumer import ConsumerStats
from streams.events import InferenceLatency, LatencyHistogram

T0 = 1_767_225_600.0
LIBRARY = Path(__file__).parents[1] / "policies" / "library" / "balanced.yaml"


def test_policy_validate_warns_when_the_histogram_ends_below_an_objective() -> None:
    """``--histogram-bounds`` ending at 250 ms warns for the 300 ms objective and still exits 0;
    bounds reaching past it warn of nothing."""
    result = CliRunner().invoke(
        policy, ["validate", str(LIBRARY), "--histogram-bounds", "50,100,250"]
    )
    assert result.exit_code == 0, result.output
    assert "warning: serving/chat: objective 300ms is above the histogram's last bound 250ms" in (
        result.stderr
    )
    result = CliRunner().invoke(policy, ["validate", str(LIBRARY), "--histogram-bounds", "100,300"])
    assert result.exit_code == 0
    assert "warning" not in result.stderr


def test_policy_validate_refuses_bounds_that_are_not_increasing() -> None:
    """Bounds out of order are a usage error (exit 2) naming the option."""
    result = CliRunner().invoke(policy, ["validate", str(LIBRARY), "--histogram-bounds", "100,50"])
    assert result.exit_code == 2
    assert "strictly increasing" in result.stderr


def _scrape(engine: Engine, stats: ConsumerStats | None = None) -> str:
    sources = StateSources(
        engine=lambda: engine, consumer=lambda: stats, is_leader=lambda: True, clock=lambda: T0
    )
    return generate_latest(Metrics(sources).registry).decode()


def test_histograms_ending_below_the_objective_are_counted_and_scraped() -> None:
    """The first histogram whose last bound (250) is below the objective (300) names the
    service in ``Engine.unresolved`` and in the metric; one reaching the objective does not."""
    engine = Engine(load_policy_text(LIBRARY.read_text(), str(LIBRARY)))
    engine.advance(T0)

    def send(bounds: list[float]) -> None:
        hist = LatencyHistogram(bounds_ms=bounds, counts=[1] * (len(bounds) + 1))
        engine.observe(InferenceLatency(ts=T0, service="chat", namespace="serving", histogram=hist))

    send([100.0, 300.0])
    assert engine.unresolved == {}
    send([100.0, 250.0])
    assert engine.unresolved == {"serving/chat": 250.0}
    text = _scrape(engine)
    assert 'ebbtide_histogram_last_bound_below_objective_ms{service="serving/chat"} 250.0' in text


def test_a_reload_forgets_what_it_said_of_the_old_objectives() -> None:
    """Regression: the services named as unresolved stayed named after a reload that removed
    them or moved their objective (the metric kept reporting them); the next histogram under
    the new policy says afresh."""
    text = LIBRARY.read_text()
    engine = Engine(load_policy_text(text, str(LIBRARY)))
    engine.advance(T0)
    hist = LatencyHistogram(bounds_ms=[100.0, 250.0], counts=[1, 1, 1])
    event = InferenceLatency(ts=T0, service="chat", namespace="serving", histogram=hist)
    engine.observe(event)
    assert engine.unresolved == {"serving/chat": 250.0}
    lower = text.replace("objectiveMs: 300", "objectiveMs: 250")
    assert lower != text
    engine.reload(load_policy_text(lower, str(LIBRARY)))
    assert engine.unresolved == {}
    engine.observe(event)
    assert engine.unresolved == {}


def test_unassigned_partitions_are_scraped_per_topic() -> None:
    """Partitions the consumer does not read show in ``ebbtide_partitions_unassigned``."""
    engine = Engine(load_policy_text(LIBRARY.read_text(), str(LIBRARY)))
    stats = ConsumerStats(unassigned={("lat", 3), ("lat", 4), ("gpu", 1)})
    text = _scrape(engine, stats)
    assert 'ebbtide_partitions_unassigned{topic="lat"} 2.0' in text
    assert 'ebbtide_partitions_unassigned{topic="gpu"} 1.0' in text

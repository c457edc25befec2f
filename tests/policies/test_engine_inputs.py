"""What the engine makes of awkward input: clocks running fast, policies losing pools."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from policy_fixtures import T0, cluster, latency, make_policy, policy_dict, util

from policies.engine import Engine
from policies.model import Policy
from streams.events import Event

# -- clock skew ----------------------------------------------------------------------------------

Make = Callable[[float], Event]
SLOW: Make = lambda t: latency(t, 500.0)  # noqa: E731
BUSY: Make = lambda t: util(t, "w0", 0, 90.0)  # noqa: E731


@pytest.mark.parametrize(
    ("make", "ahead", "skewed"),
    [
        pytest.param(SLOW, 300.0, 1, id="latency-300s-ahead-is-skewed"),
        pytest.param(BUSY, 300.0, 1, id="utilization-300s-ahead-is-skewed"),
        pytest.param(SLOW, 1.0, 0, id="latency-one-resolution-ahead-is-on-time"),
        pytest.param(BUSY, 20.0, 0, id="utilization-one-resolution-ahead-is-on-time"),
    ],
)
def test_a_fast_clock_cannot_blind_a_window(make: Make, ahead: float, skewed: int) -> None:
    """An event from the future is counted as skewed and taken at ``now``: every on-time event
    after it is still taken, none is dropped as late."""
    engine = Engine(make_policy())
    engine.evaluate(T0, cluster().build())
    assert engine.observe(make(T0 + ahead))
    assert engine.observe_many(make(T0 - 5.0 + k / 10) for k in range(50)) == 50
    assert (engine.skewed, engine.late) == (skewed, 0)


def test_skewed_latency_counts_at_now() -> None:
    """A skewed request is not lost: the window holds it at the engine's clock, so a read at
    ``now`` counts it with the on-time ones."""
    engine = Engine(make_policy())
    engine.advance(T0)
    engine.observe(latency(T0 + 300.0, 500.0))
    engine.observe_many(latency(T0 - 0.5, 1.0) for _ in range(9))
    (status,) = engine.service_status(T0)
    assert (status.samples, engine.skewed) == (10, 1)


def test_the_clock_never_goes_back() -> None:
    """An older ``now`` (a late tick, a second caller) does not tighten the bound."""
    engine = Engine(make_policy())
    engine.advance(T0 + 60.0)
    engine.advance(T0)
    assert engine.observe(latency(T0 + 60.5, 1.0))
    assert engine.skewed == 0


def test_no_bound_before_the_first_clock_reading() -> None:
    """Before ``advance`` or ``evaluate`` the engine knows no time: nothing counts as skewed."""
    engine = Engine(make_policy())
    assert engine.observe(latency(T0 + 300.0, 1.0))
    assert engine.skewed == 0


# -- reload ----------------------------------------------------------------------------------------


def whole_pool_only() -> Policy:
    """The test policy without its MIG pool (nor the MIG section that names it)."""
    return make_policy(mig=None, pools={"whole": policy_dict()["spec"]["pools"]["whole"]})


def test_a_reload_removing_a_pool_keeps_observing() -> None:
    """Readings of a node whose pool a reload removed are taken (no KeyError, so the consumer
    does not retry the batch and count its first events twice) and count toward no pool."""
    engine = Engine(make_policy())
    engine.evaluate(T0, cluster(mig_nodes=1).build())
    assert engine.observe(util(T0, "m0", 0, 50.0))
    assert engine.reload(whole_pool_only()).accepted
    batch = [latency(T0 + 0.5, 10.0), util(T0 + 0.5, "m0", 0, 70.0), util(T0 + 0.5, "w0", 0, 30.0)]
    assert engine.observe_many(batch) == 3
    assert engine.observed == 4
    assert [p.name for p in engine.pool_status(T0 + 1)] == ["whole"]
    assert engine.pool_status(T0 + 1)[0].util_pct == 30.0


def test_a_reload_adding_a_pool_places_its_nodes_at_once() -> None:
    """A reload adding a pool counts readings of its nodes toward it before the next tick."""
    engine = Engine(whole_pool_only())
    engine.evaluate(T0, cluster(mig_nodes=1).build())
    assert engine.reload(make_policy()).accepted
    engine.observe(util(T0 + 0.5, "m0", 0, 70.0))
    by_name = {p.name: p for p in engine.pool_status(T0 + 1)}
    assert by_name["mig"].util_pct == 70.0

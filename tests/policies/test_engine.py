"""The engine end to end: breach response, growth, reload, kill switch, dry run, determinism."""

from __future__ import annotations

import copy
import itertools

import pytest
from policy_fixtures import (
    T0,
    cluster,
    feed_latency,
    latency,
    make_policy,
    policy_dict,
    run,
    to_yaml,
    training,
)

from policies.decisions import Evict, Scale, decision_to_dict
from policies.engine import Engine
from policies.loader import Source
from streams.events import InferenceLatency, LatencyHistogram
from support.engine_probes import gpu_utilization, reload_sources


def breach_cluster() -> object:
    """Two whole nodes full: chat (1), elastic training (7, min 3), rigid low training (8)."""
    b = cluster(whole_nodes=2)
    training(b, "elastic", replicas=7, nodes=["w0"], min_replicas=3, max_replicas=7, priority=50)
    training(b, "rigid", replicas=8, nodes=["w1"], priority=10)
    return b.build()


def test_no_decision_before_breach_after() -> None:
    """A latency spike shorter than breachAfter leads to no decision."""
    engine = Engine(make_policy())
    snap = breach_cluster()
    out = [d for _, ds in run(engine, snap, T0, T0 + 9, 500.0) for d in ds]
    assert out == []
    assert engine.slo_state("serving/chat").state == "ok"


def test_breach_shrinks_then_scales_inference() -> None:
    """On breach: shrink elastic training first, evict only if needed, then scale inference up."""
    engine = Engine(make_policy())
    snap = breach_cluster()
    before = copy.deepcopy(snap)
    rounds = [(t, ds) for t, ds in run(engine, snap, T0, T0 + 15, 350.0) if ds]
    assert snap == before
    t, decisions = rounds[0]
    assert t == T0 + 11  # first tick above at T0+1, breachAfter 10s
    kinds = [(d.action, d.target) for d in decisions]
    # desired = ceil(1 * 3.5) = 4 → 3 more GPUs; 0 free → shrink elastic 7→4
    assert kinds == [("scale", "ml/elastic"), ("scale", "serving/chat")]
    shrink, scale = decisions
    assert isinstance(shrink, Scale)
    assert isinstance(scale, Scale)
    assert (shrink.from_replicas, shrink.to_replicas) == (7, 4)
    assert (scale.from_replicas, scale.to_replicas) == (1, 4)
    assert scale.explanation.rule == "slo-breach-scale-up"
    assert scale.explanation.inputs["p99_ms"] > 300
    assert scale.cause == "serving/chat"
    assert len(rounds) == 1  # cooldown holds the rest


def test_evicts_when_shrinking_is_not_enough() -> None:
    """A large breach shrinks elastic training to its minimum and evicts the rest in order."""
    engine = Engine(make_policy())
    snap = breach_cluster()
    decisions = next(ds for _, ds in run(engine, snap, T0, T0 + 15, 900.0) if ds)
    # desired = ceil(1 * 9.0) = 9 → 8 GPUs: shrink elastic 7→3 (4), then evict 4 rigid pods
    actions = [d.action for d in decisions]
    assert actions == ["scale"] + ["evict"] * 4 + ["scale"]
    evicts = [d for d in decisions if isinstance(d, Evict)]
    assert all(e.target.startswith("ml/rigid-") for e in evicts)
    assert all(e.grace_s == 15.0 for e in evicts)
    assert decisions[-1].to_replicas == 9  # type: ignore[union-attr]


def test_budget_caps_evictions() -> None:
    """Evictions stop at the budget; inference scales to what fits."""
    engine = Engine(make_policy())
    b = cluster(whole_nodes=2)
    training(b, "rigid", replicas=15, nodes=["w0", "w1"], priority=10)
    decisions = next(ds for _, ds in run(engine, b.build(), T0, T0 + 15, 2000.0) if ds)
    evicts = [d for d in decisions if d.action == "evict"]
    assert len(evicts) == 4  # budget: 4 per 10m
    # w0 holds 9 pods on 8 GPUs (the builder does not check fit); w1 has 1 free: 1 + 4 freed
    assert decisions[-1].to_replicas == 6  # type: ignore[union-attr]
    assert engine.budget_states(T0 + 15)[0].remaining == 0


def test_grow_training_when_idle() -> None:
    """Idle GPUs with no breach grow elastic training after growAfter, within max replicas."""
    engine = Engine(make_policy())
    b = cluster(whole_nodes=1)
    training(b, "elastic", replicas=3, nodes=["w0"], min_replicas=1, max_replicas=5)
    snap = b.build()
    grows = [(t, d) for t, ds in run(engine, snap, T0, T0 + 130, 20.0, step=5.0) for d in ds]
    assert grows[0][0] == T0 + 65  # free since T0+5, growAfter 60s
    d = grows[0][1]
    assert isinstance(d, Scale)
    assert (d.from_replicas, d.to_replicas) == (3, 4)
    assert d.explanation.rule == "grow-training"
    assert all(t2 - t1 >= 60 for (t1, _), (t2, _) in itertools.pairwise(grows))


def test_kill_switch_and_dry_run() -> None:
    """The kill switch yields no decisions; dryRun marks every decision dry-run."""
    snap = breach_cluster()
    killed = Engine(make_policy(killSwitch=True))
    assert not any(ds for _, ds in run(killed, snap, T0, T0 + 15, 900.0))
    assert killed.slo_state("serving/chat").state == "breaching"
    dry = Engine(make_policy(dryRun=True))
    decisions = [d for _, ds in run(dry, snap, T0, T0 + 15, 900.0) for d in ds]
    assert decisions
    assert all(d.dry_run for d in decisions)


def test_reload_refuses_invalid_and_keeps_old() -> None:
    """An invalid policy is refused with its errors and the old one stays active."""
    engine = Engine(make_policy())
    old = engine.policy
    bad = policy_dict()
    bad["spec"]["services"]["chat"]["pool"] = "nowhere"
    result = reload_sources(engine, [Source("new.yaml", to_yaml(bad))])
    assert not result.accepted
    assert any("new.yaml:" in e and "undefined pool 'nowhere'" in e for e in result.errors)
    assert engine.policy is old


def test_reload_keeps_windows_of_unchanged_services() -> None:
    """After a reload, an unchanged service keeps its window and SLO state."""
    engine = Engine(make_policy())
    snap = breach_cluster()
    for _ in run(engine, snap, T0, T0 + 12, 900.0):
        pass
    assert engine.slo_state("serving/chat").state == "breaching"
    data = policy_dict()
    data["spec"]["services"]["other"] = copy.deepcopy(data["spec"]["services"]["chat"])
    data["spec"]["services"]["other"]["namespace"] = "serving"
    result = reload_sources(engine, [Source("new.yaml", to_yaml(data))])
    assert result.accepted
    status = {s.key: s for s in engine.service_status(T0 + 12)}
    assert status["serving/chat"].state == "breaching"
    assert status["serving/chat"].samples > 0
    assert status["serving/other"].samples == 0


def test_all_latency_forms_feed_the_window() -> None:
    """Single, batch and histogram events all count toward the service's window."""
    engine = Engine(make_policy())
    assert engine.observe(latency(T0, 10.0))
    assert engine.observe(
        InferenceLatency(ts=T0, service="chat", namespace="serving", samples_ms=[1.0, 2.0, 3.0])
    )
    hist = LatencyHistogram(bounds_ms=[10.0, 100.0], counts=[5, 5, 0])
    assert engine.observe(
        InferenceLatency(ts=T0, service="chat", namespace="serving", histogram=hist)
    )
    assert not engine.observe(latency(T0, 10.0).__class__(ts=T0, service="nope", latency_ms=1.0))
    status = engine.service_status(T0 + 0.5)[0]
    assert status.samples == 14
    assert engine.unknown == 1


def test_late_events_are_refused() -> None:
    """An event older than the window is refused and counted as late."""
    engine = Engine(make_policy())
    feed_latency(engine, T0 + 100, T0 + 101, 10.0)
    assert not engine.observe(latency(T0, 10.0))
    assert engine.late == 1


def test_deterministic() -> None:
    """The same inputs give the same decisions, field for field."""

    def once() -> list[dict[str, object]]:
        engine = Engine(make_policy())
        snap = breach_cluster()
        return [decision_to_dict(d) for _, ds in run(engine, snap, T0, T0 + 60, 900.0) for d in ds]

    assert once() == once()


def test_snapshot_index_cached_by_value() -> None:
    """The same snapshot, or an equal one rebuilt, reuses its index; a different one does not."""
    engine = Engine(make_policy())
    snap = breach_cluster()
    engine.evaluate(T0, snap)
    first = engine._inventory
    engine.evaluate(T0 + 1, snap)
    assert engine._inventory is first
    engine.evaluate(T0 + 2, breach_cluster())
    assert engine._inventory is first
    b = cluster(whole_nodes=3)
    engine.evaluate(T0 + 3, b.build())
    assert engine._inventory is not first


def test_pool_status_and_gpu_utilization() -> None:
    """Pool status reports capacity, free GPUs and windowed utilization."""
    from policy_fixtures import util

    engine = Engine(make_policy())
    snap = breach_cluster()
    engine.evaluate(T0, snap)
    engine.observe(util(T0, "w0", 0, 50.0))
    engine.observe(util(T0, "w0", 1, 30.0))
    pools = {p.name: p for p in engine.pool_status(T0 + 1)}
    assert pools["whole"].capacity_gpus == 16
    assert pools["whole"].free_gpus == 0
    assert pools["whole"].util_pct == 40.0
    assert gpu_utilization(engine, T0 + 1)["w0/0"] == 50.0


def test_quantile_reads_the_service_percentile() -> None:
    """Engine.quantile is the windowed percentile service_status reports; None when empty."""
    engine = Engine(make_policy())
    assert engine.quantile("serving/chat", T0) is None
    for k in range(200):
        engine.observe(latency(T0 + k / 100, 10.0 + k))
    now = T0 + 2.5
    want = engine.service_status(now)[0].quantile_ms
    assert want is not None
    assert engine.quantile("serving/chat", now) == want


def test_observe_many_takes_each_event_once() -> None:
    """observe_many counts what it took, skips late and unknown events, and fills each GPU's,
    MIG instance's, pool's and service's window with exactly the batch's readings."""
    from policy_fixtures import util

    from streams.events import GpuUtilization

    def batch(t: float) -> list[object]:
        return [
            latency(t, 120.0),
            latency(t, 5.0, service="nope"),
            util(t, "w0", 0, 80.0),
            util(t, "w1", 3, 10.0),
            GpuUtilization(
                ts=t, node="w1", gpu=2, util_pct=40.0, mig_profile="1g.10gb", mig_instance=1
            ),
            latency(t - 500.0, 1.0),
        ]

    engine = Engine(make_policy())
    snap = breach_cluster()
    taken = []
    for t in (T0, T0 + 1):
        taken.append(engine.observe_many(batch(t)))  # type: ignore[arg-type]
        engine.evaluate(t + 0.5, snap)
    now = T0 + 1.5
    assert taken == [4, 4]
    assert (engine.observed, engine.late, engine.unknown) == (8, 2, 2)
    assert gpu_utilization(engine, now) == {"w0/0": 80.0, "w1/2/1": 40.0, "w1/3": 10.0}
    whole = next(p for p in engine.pool_status(now) if p.name == "whole")
    assert whole.util_pct == pytest.approx((80.0 + 10.0 + 40.0) / 3)
    (chat,) = engine.service_status(now)
    assert chat.samples == 2
    assert chat.quantile_ms == pytest.approx(120.0, rel=0.01)


def test_gpu_readings_follow_the_snapshot_pools() -> None:
    """A reading counts toward its node's pool once a snapshot placed the node in one."""
    from policy_fixtures import util

    engine = Engine(make_policy())
    engine.observe(util(T0, "w0", 0, 50.0))
    assert {p.name: p.util_pct for p in engine.pool_status(T0 + 1)}["whole"] is None
    engine.evaluate(T0, breach_cluster())
    engine.observe(util(T0 + 1, "w0", 0, 70.0))
    assert {p.name: p.util_pct for p in engine.pool_status(T0 + 1)}["whole"] == 70.0

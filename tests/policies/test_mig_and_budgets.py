"""MIG conversion and revert rules, and budgets/cooldowns that no event sequence can exceed."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_fixtures import (
    MIG,
    T0,
    WHOLE,
    cluster,
    latency,
    make_policy,
    policy_dict,
    training,
    util,
)

from policies.decisions import Decision, MigConvert, MigRevert
from policies.engine import Engine
from policies.snapshot import Snapshot, SnapshotBuilder


def idle_run(
    engine: Engine,
    snap: Snapshot,
    *,
    seconds: int,
    busy: dict[str, float] | None = None,
    step: int = 30,
) -> list[tuple[float, Decision]]:
    """GPU readings every ``step`` s for every node (busy nodes at their given time), and an
    evaluation after each round of readings."""
    busy = busy or {}
    out: list[tuple[float, Decision]] = []
    for s in range(0, seconds + 1, step):
        now = T0 + s
        for node in snap.nodes:
            for gpu in node.gpus:
                hot = node.name in busy and abs(busy[node.name] - s) < step
                engine.observe(util(now, node.name, gpu.index, 90.0 if hot else 1.0))
        out.extend((now, d) for d in engine.evaluate(now, snap))
    return out


def test_converts_only_nodes_idle_the_whole_period() -> None:
    """A node busy inside the last convertAfter is not converted; an idle one is, after T."""
    engine = Engine(make_policy())
    b = SnapshotBuilder()
    for i in range(3):
        b.node(f"w{i}", gpus=2, labels=WHOLE)
    snap = b.build()
    # w0 is busy at 300s; 10m idle periods end at 600s for w1/w2 and at 900s+ for w0
    got = idle_run(engine, snap, seconds=960, busy={"w0": 300.0})
    converts = [(t - T0, d.target) for t, d in got if isinstance(d, MigConvert)]
    assert converts[0] == (600.0, "w1")  # readings since 0s, all idle: 10m at 600s
    assert all(target != "w0" for _, target in converts if _ < 900)
    first = next(d for _, d in got if isinstance(d, MigConvert))
    assert first.profile == "all-1g.10gb"
    assert first.explanation.inputs["node_idle_s"] >= 600


def test_never_more_conversions_at_once_than_allowed() -> None:
    """With maxConcurrent 1, a second node waits until the first conversion is done."""
    engine = Engine(make_policy())
    b = SnapshotBuilder()
    for i in range(4):
        b.node(f"w{i}", gpus=2, labels=WHOLE)
    snap = b.build()
    got = idle_run(engine, snap, seconds=1200)
    converts = [d for _, d in got if isinstance(d, MigConvert)]
    assert len(converts) == 1  # the snapshot never shows it done, so no second one


def test_second_conversion_after_first_done() -> None:
    """Once the snapshot shows the first conversion done, the next idle node may follow."""
    engine = Engine(make_policy())
    b = SnapshotBuilder()
    for i in range(3):
        b.node(f"w{i}", gpus=2, labels=WHOLE)
    got = idle_run(engine, b.build(), seconds=660)
    assert [d.target for _, d in got if isinstance(d, MigConvert)] == ["w0"]
    done = SnapshotBuilder()
    done.node("w0", gpus=2, labels=MIG, mig_config="all-1g.10gb", mig_state="success")
    for i in (1, 2):
        done.node(f"w{i}", gpus=2, labels=WHOLE)
    later = engine.evaluate(T0 + 690, done.build())
    assert [d.target for d in later if isinstance(d, MigConvert)] == ["w1"]


@pytest.mark.parametrize(
    ("gated", "want"),
    [
        pytest.param(False, [(120, "m0")], id="waiting-pod-is-demand"),
        pytest.param(True, [], id="gated-pod-is-not-demand"),
    ],
)
def test_revert_on_sustained_whole_card_demand(gated: bool, want: list[tuple[int, str]]) -> None:
    """Pods pending for whole GPUs beyond free capacity for revertAfter revert one MIG node; a
    pod a scheduling gate holds (Kueue has not admitted it) is no demand and reverts nothing."""
    engine = Engine(make_policy())
    b = cluster(whole_nodes=1, gpus=8, mig_nodes=2)
    training(b, "busy", replicas=7, nodes=["w0"])
    b.pod("ml", "waiting", gpus=4, labels={"ebbtide.io/class": "training"}, gated=gated)
    snap = b.build()
    reverts: list[tuple[float, MigRevert]] = []
    for s in range(0, 200, 10):
        reverts += [(s, d) for d in engine.evaluate(T0 + s, snap) if isinstance(d, MigRevert)]
    assert [(s, d.target) for s, d in reverts] == want
    assert all(d.profile == "all-1g.10gb" for _, d in reverts)


def test_no_revert_when_demand_fits() -> None:
    """Pending pods that fit in free whole GPUs never revert a MIG node."""
    engine = Engine(make_policy())
    b = cluster(whole_nodes=1, gpus=8, mig_nodes=1)
    b.pod("ml", "waiting", gpus=2)
    snap = b.build()
    assert not any(engine.evaluate(T0 + s, snap) for s in range(0, 600, 30))


# -- budgets and cooldowns, whatever happens ---------------------------------------------------

POLICY = make_policy(
    budgets={
        "evictions": {"max": 3, "per": "2m"},
        "scaleSteps": {"max": 4, "per": "1m"},
        "migConversions": {"max": 1, "per": "10m"},
    }
)


def snapshot_variant(k: int) -> Snapshot:
    b = cluster(whole_nodes=2, gpus=8, mig_nodes=1)
    training(b, "a", replicas=4 + k % 3, nodes=["w0"], min_replicas=2, max_replicas=8, priority=5)
    training(b, "b", replicas=6, nodes=["w1"], priority=1 + k, created=float(k))
    if k % 2:
        b.pod("ml", "pending", gpus=8)
    return b.build()


SNAPSHOTS = [snapshot_variant(k) for k in range(4)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from([20.0, 95.0, 150.0, 900.0]),
            st.integers(min_value=0, max_value=3),
            st.integers(min_value=1, max_value=20),
        ),
        min_size=10,
        max_size=60,
    )
)
def test_budgets_and_cooldowns_never_exceeded(steps: list[tuple[float, int, int]]) -> None:
    """Across random latency levels, snapshots and gaps, no budget or cooldown is exceeded."""
    engine = Engine(POLICY)
    t = T0
    decisions: list[Decision] = []
    for ms, k, gap in steps:
        for i in range(gap):
            for j in range(5):
                engine.observe(latency(t + i + j / 5, ms))
        t += gap
        decisions += engine.evaluate(t, SNAPSHOTS[k])

    def check(ds: list[Decision], limit: int, per: float) -> None:
        times = sorted(d.at for d in ds)
        for i, start in enumerate(times):
            assert sum(1 for x in times[i:] if x < start + per) <= limit

    check([d for d in decisions if d.action == "evict"], 3, 120.0)
    check([d for d in decisions if d.action == "scale"], 4, 60.0)
    check([d for d in decisions if d.action in ("mig_convert", "mig_revert")], 1, 600.0)
    acted = sorted({d.at for d in decisions if d.cause == "serving/chat"})
    assert all(b - a >= 30.0 for a, b in itertools.pairwise(acted))


# -- flows under way, whoever started them ------------------------------------------------------


def mig_policy(**mig: object) -> object:
    spec = policy_dict()["spec"]["mig"] | mig
    return make_policy(mig=spec)


@pytest.mark.parametrize(
    ("w0", "mig", "want"),
    [
        pytest.param({}, {"minWholeNodes": 2, "maxConcurrent": 2}, ["w0"], id="one-spare"),
        pytest.param(
            {"cordoned": True},
            {"minWholeNodes": 2, "maxConcurrent": 2},
            [],
            id="cordoned-not-spare",
        ),
        pytest.param(
            {"cordoned": True, "mig_flow": True},
            {"minWholeNodes": 2, "maxConcurrent": 2},
            [],
            id="converting-not-spare",
        ),
        pytest.param(
            {"cordoned": True, "mig_flow": True},
            {"maxConcurrent": 1},
            [],
            id="flow-in-snapshot-fills-max-concurrent",
        ),
        pytest.param(
            {"mig_state": "pending", "mig_config": "all-1g.10gb"},
            {"maxConcurrent": 1},
            [],
            id="manager-pending-fills-max-concurrent",
        ),
    ],
)
def test_conversions_count_flows_from_the_snapshot(
    w0: dict[str, Any], mig: dict[str, Any], want: list[str]
) -> None:
    """A fresh engine (as after a restart) counts the flows the snapshot shows under way
    (``ebbtide.io/mig-flow`` record, MIG manager pending) against maxConcurrent, and keeps
    minWholeNodes of whole nodes that are schedulable and not being converted."""
    engine = Engine(mig_policy(**mig))  # type: ignore[arg-type]
    b = SnapshotBuilder().node("w0", gpus=2, labels=WHOLE, **w0)
    for i in (1, 2):
        b.node(f"w{i}", gpus=2, labels=WHOLE)
    got = idle_run(engine, b.build(), seconds=600)
    converts = [d.target for _, d in got if isinstance(d, MigConvert)]
    assert converts == want

"""The cluster port contract of the simulator: outcomes, dry-run, identity, determinism, speed."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from sim_builders import (
    DELAYS,
    MIG,
    T0,
    TRAINING,
    WHOLE,
    apply,
    cluster,
    convert,
    evict,
    pods,
    revert,
    scale,
    two_whole_nodes,
    where,
)

from controller.loop.port import Outcome
from controller.simcluster import PodTemplate, SimCluster
from policies.decisions import Decision
from policies.snapshot import FrozenMap, SnapshotBuilder


def busy() -> SimCluster:
    b = two_whole_nodes().workload(
        "ml", "train", replicas=2, gpus_per_replica=2, labels=TRAINING, priority=10
    )
    b.node("m0", gpus=1, labels=MIG, mig_config="all-1g.10gb")
    return cluster(b)


@pytest.mark.parametrize(
    ("decision", "outcome", "detail"),
    [
        pytest.param(evict("ml/nope"), Outcome.ALREADY_DONE, "the pod is gone", id="evict-gone"),
        pytest.param(scale("ml/train", 2), Outcome.ALREADY_DONE, "already at 2", id="scale-same"),
        pytest.param(scale("ml/nope", 3), Outcome.FAILED, "not found", id="scale-unknown"),
        pytest.param(scale("ml/train", -1), Outcome.FAILED, "cannot scale", id="scale-negative"),
        pytest.param(convert("m0"), Outcome.ALREADY_DONE, "is at all-1g.10gb", id="convert-done"),
        pytest.param(revert("w0"), Outcome.ALREADY_DONE, "is at all-disabled", id="revert-done"),
        pytest.param(convert("zz"), Outcome.FAILED, "node zz not found", id="convert-unknown"),
    ],
)
async def test_outcomes_without_change(decision: Decision, outcome: Outcome, detail: str) -> None:
    """Decisions that find the cluster already there (or impossible) change nothing."""
    c = busy()
    before = c.snapshot()
    [result] = await apply(c, decision)
    assert (result.outcome, result.decision) == (outcome, decision)
    assert detail in result.detail
    assert c.snapshot() is before
    assert c.effects == ()


async def test_repeated_decisions_are_idempotent() -> None:
    """A second evict of a terminating pod and a second convert of a converting node do nothing."""
    c = busy()
    first = await apply(c, evict("ml/train-0"), convert("w1"))
    again = await apply(c, evict("ml/train-0"), convert("w1"))
    assert [r.outcome for r in first] == [Outcome.APPLIED, Outcome.IN_PROGRESS]
    assert [r.outcome for r in again] == [Outcome.ALREADY_DONE, Outcome.IN_PROGRESS]
    assert again[0].detail == "the pod is terminating"


@pytest.mark.parametrize(
    "decision",
    [
        pytest.param(replace(evict("ml/train-0"), dry_run=True), id="evict"),
        pytest.param(replace(scale("ml/train", 4), dry_run=True), id="scale"),
        pytest.param(replace(convert("w0"), dry_run=True), id="convert"),
        pytest.param(replace(revert("m0"), dry_run=True), id="revert"),
    ],
)
async def test_dry_run_changes_nothing(decision: Decision) -> None:
    """A dry-run decision is reported DRY_RUN and leaves the snapshot and the future unchanged."""
    c = busy()
    before = c.snapshot()
    [result] = await apply(c, decision)
    assert result.outcome is Outcome.DRY_RUN
    assert result.detail.startswith("would ")
    c.advance(T0 + 3600)
    assert c.snapshot() is before
    assert c.effects == ()


async def test_apply_never_raises_for_one_decision() -> None:
    """An internal error becomes FAILED for that decision; the next one still runs."""
    c = busy()
    bad = replace(scale("ml/train", 3), workload=None)  # type: ignore[arg-type]
    results = await apply(c, bad, scale("ml/train", 1))
    assert [r.outcome for r in results] == [Outcome.FAILED, Outcome.APPLIED]


async def test_snapshot_is_the_same_object_until_something_changes() -> None:
    """Identity holds across advance() with nothing due, and breaks on a change."""
    c = busy()
    s1 = c.snapshot()
    c.advance(T0 + 500)
    assert c.snapshot() is s1
    await apply(c, scale("ml/train", 3, at=T0 + 500))
    s2 = c.snapshot()
    assert s2 is not s1
    assert s2.workloads[0].replicas == 3
    assert s2.nodes is s1.nodes  # unchanged parts are reused
    assert s1.workloads[0].replicas == 2  # old snapshots are never mutated


def test_scheduler_places_whole_and_mig_pods_on_fitting_nodes() -> None:
    """Whole-GPU pods go to whole cards, MIG pods to nodes with that profile; misfits wait."""
    b = SnapshotBuilder().node("w0", gpus=2, labels=WHOLE)
    b.node("m0", gpus=1, labels=MIG, mig_config="all-3g.40gb")
    b.pod("a", "whole", gpus=2)
    b.pod("a", "slice", mig={"3g.40gb": 2})
    b.pod("a", "too-many-slices", mig={"3g.40gb": 1})
    b.pod("a", "other-profile", mig={"1g.10gb": 1})
    placed = where(cluster(b))
    assert placed == {
        "a/whole": ("w0", "Running"),
        "a/slice": ("m0", "Running"),
        "a/too-many-slices": (None, "Pending"),
        "a/other-profile": (None, "Pending"),
    }


def test_scheduler_respects_cordon_and_pools() -> None:
    """Cordoned nodes get nothing; a pod whose workload names a pool only goes there."""
    b = SnapshotBuilder().node("w0", gpus=4, labels=WHOLE, cordoned=True)
    b.node("x0", gpus=4, labels={"ebbtide.io/pool": "other"})
    b.workload("s", "pinned", replicas=1)
    b.pod("s", "free", gpus=1)
    c = cluster(b, templates={"s/pinned": PodTemplate(node_selector=FrozenMap(WHOLE))})
    assert where(c) == {"s/free": ("x0", "Running"), "s/pinned-0": (None, "Pending")}


def test_scheduler_places_highest_priority_then_oldest_first() -> None:
    """With room for one pod, the high-priority one wins; among equals the oldest."""
    b = SnapshotBuilder().node("w0", gpus=1, labels=WHOLE)
    b.pod("a", "young-high", gpus=1, priority=100, created=T0 - 1)
    b.pod("a", "old-low", gpus=1, priority=1, created=T0 - 100)
    assert where(cluster(b))["a/young-high"][0] == "w0"
    b = SnapshotBuilder().node("w0", gpus=1, labels=WHOLE)
    b.pod("a", "young", gpus=1, created=T0 - 1)
    b.pod("a", "old", gpus=1, created=T0 - 100)
    assert where(cluster(b))["a/old"][0] == "w0"


def test_scheduler_packs_pods_onto_the_fullest_fitting_node() -> None:
    """Best fit: a 1-GPU pod goes where fewest GPUs are free, keeping whole nodes free."""
    b = SnapshotBuilder().node("w0", gpus=8, labels=WHOLE).node("w1", gpus=8, labels=WHOLE)
    b.pod("a", "big", node="w1", gpus=6)
    b.pod("a", "small", gpus=1)
    assert where(cluster(b))["a/small"][0] == "w1"


async def test_pending_pods_wait_until_gpus_free_up() -> None:
    """pending_pods() lists waiting pods; they are placed when an eviction frees GPUs."""
    b = two_whole_nodes(gpus=2).workload("ml", "train", replicas=2, gpus_per_replica=2)
    b.pod("s", "urgent", gpus=2, priority=1000)
    c = cluster(b)
    assert [p.key for p in c.pending_pods()] == ["ml/train-1"]  # urgent was placed first
    await apply(c, scale("ml/train", 1, frm=2))
    assert c.pending_pods() == ()


async def run_history(seed: int) -> list[tuple[float, str, str, str]]:
    delays = replace(DELAYS, mig_failure_probability=0.5)
    b = SnapshotBuilder()
    for i in range(8):
        b.node(f"w{i}", gpus=4, labels=WHOLE)
    b.workload("ml", "train", replicas=12, gpus_per_replica=2, labels=TRAINING)
    c = cluster(b, delays=delays, seed=seed)
    for i in range(8):
        at = T0 + 400 * i
        c.advance(at)
        await apply(c, convert(f"w{i}", at=at), evict(f"ml/train-{i}", at=at))
    c.advance(T0 + 10_000)
    return [(e.at, e.kind, e.target, e.detail) for e in c.effects]


async def test_same_seed_same_history() -> None:
    """Runs with the same seed give the same effects; another seed differs (MIG failures)."""
    first = await run_history(3)
    assert first == await run_history(3)
    outcomes = {seed: [k for _, k, _, _ in await run_history(seed)] for seed in range(4)}
    assert len({tuple(v) for v in outcomes.values()}) > 1


def test_advance_and_snapshot_are_cheap_on_a_large_idle_cluster() -> None:
    """1,000 GPUs and 200 services: advance()+snapshot() with nothing due is microseconds."""
    b = SnapshotBuilder()
    for i in range(125):
        b.node(f"w{i:03d}", gpus=8, labels=WHOLE)
    for i in range(200):
        b.workload("serving", f"svc-{i:03d}", replicas=3)
    b.workload("ml", "train", replicas=300, labels=TRAINING)
    start = time.perf_counter()
    c = cluster(b)
    built = time.perf_counter() - start
    c.snapshot()
    start = time.perf_counter()
    for i in range(10_000):
        c.advance(T0 + i)
        c.snapshot()
    per_call = (time.perf_counter() - start) / 10_000
    assert len(pods(c)) == 900
    print(f"build {built * 1000:.1f} ms, advance+snapshot {per_call * 1e6:.2f} us")
    assert per_call < 50e-6
    assert built < 2.0

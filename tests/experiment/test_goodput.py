"""Optimistic training goodput: each removed pod loses its work since its own checkpoint."""

from __future__ import annotations

import asyncio

import pytest

from controller.offline.experiment import Goodput, lost_work
from controller.offline.experiment.goodput import TrainingJob
from controller.simcluster import EPOCH, SimCluster, SimDelays
from policies.decisions import Evict, Explanation, Scale
from policies.snapshot import SnapshotBuilder

T0 = EPOCH
TRAINING = {"ebbtide.io/class": "training"}
WHY = Explanation.of("test", "a test decided it")


@pytest.mark.parametrize(
    ("origin", "at", "interval", "gpus", "shrink", "want"),
    [
        pytest.param(0, 600, 1800, 2, None, 1200, id="before-the-first-checkpoint"),
        pytest.param(0, 2000, 1800, 2, None, 400, id="after-a-checkpoint"),
        pytest.param(0, 3600, 1800, 4, None, 0, id="right-at-a-checkpoint"),
        pytest.param(100, 50, 1800, 1, None, 0, id="not-yet-running"),
        pytest.param(0, 600, 1800, 2, 60, 120, id="elastic-shrink-loses-at-most-shrink-loss"),
        pytest.param(0, 1830, 1800, 2, 60, 60, id="elastic-shrink-just-after-checkpoint"),
        pytest.param(0, 600, 0, 1, None, 600, id="never-checkpoints"),
    ],
)
def test_lost_work(
    origin: float, at: float, interval: float, gpus: int, shrink: float | None, want: float
) -> None:
    """gpus x time since the last checkpoint; an elastic shrink at most gpus x shrink_loss."""
    got = lost_work(origin=origin, at=at, interval=interval, gpus=gpus, shrink_loss=shrink)
    assert got == pytest.approx(want)


def run(*, elastic: bool, decision: str) -> Goodput:
    """A 2-replica training job of 2 GPUs per replica running from T0, checkpoint every 600 s;
    at T0 + 900 one replica is evicted (grace 30 s) or the job shrinks to 1."""
    b = (
        SnapshotBuilder()
        .priority_class("low", 10)
        .node("w0", gpus=8, labels={"pool": "w"})
        .workload("ml", "train", replicas=2, gpus_per_replica=2, labels=TRAINING, priority=10)
    )
    delays = SimDelays(eviction_grace_s=30, pod_startup_s=10, scale_up_create_s=2)
    sim = SimCluster(b.build(), delays=delays, start=T0)
    g = Goodput(
        sim,
        checkpoints={"ml/train": TrainingJob(600.0, 120.0, 60.0, elastic)},
        training_selector=TRAINING,
        start=T0,
    )
    sim.advance(T0 + 900)
    if decision == "evict":
        d: Evict | Scale = Evict(T0 + 900, "ml/train-1", None, None, 30.0, WHY)
    else:
        d = Scale(T0 + 900, "ml/train", "Job", 2, 1, "training", WHY)
    asyncio.run(sim.apply([d]))
    sim.advance(T0 + 2000)
    g.update()
    return g


@pytest.mark.parametrize(
    ("elastic", "decision", "want_gpu_s"),
    [
        pytest.param(True, "evict", 2 * 330, id="evicted-loses-since-checkpoint-and-grace"),
        pytest.param(True, "shrink", 2 * 60, id="elastic-shrink-loses-shrink-loss"),
        pytest.param(False, "shrink", 2 * 330, id="shrinking-a-rigid-job-is-an-eviction"),
    ],
)
def test_goodput_follows_the_cluster(elastic: bool, decision: str, want_gpu_s: float) -> None:
    """Replica Running since T0, checkpointed at 600; gone at 930 (grace 30 s): 330 s x 2 GPUs
    lost, or the shrink loss for an elastic job; the replacement pod has lost nothing yet."""
    g = run(elastic=elastic, decision=decision)
    assert g.lost_gpu_s == pytest.approx(want_gpu_s)
    assert g.losses == 1

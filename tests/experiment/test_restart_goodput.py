"""Restart-aware training goodput: a DDP/elastic job restarts from its last checkpoint on any
membership change (shrink, grow, eviction); a sweep task loses only its own work."""

from __future__ import annotations

import asyncio

import pytest

from controller.offline.experiment.goodput import SENSITIVITY, Goodput, TrainingJob, jobs_of
from controller.simcluster import EPOCH, SimCluster, SimDelays, load_scenario_text
from controller.simcluster.values import PodTemplate
from policies.decisions import Evict, Explanation, Scale
from policies.snapshot import SnapshotBuilder

T0 = EPOCH
END = T0 + 2000
TRAINING = {"ebbtide.io/class": "training"}
WHY = Explanation.of("test", "a test decided it")
#: Checkpoint every 600 s, restart in 120 s; 4 workers of 2 GPUs Running from T0.
DDP = TrainingJob(interval_s=600.0, restart_s=120.0, elastic=True, min_members=2)


def follow(job: TrainingJob, decision: str, *, kind: str = "PyTorchJob") -> Goodput:
    """Four workers of 2 GPUs from T0; at T0 + 900 ``decision`` (none, shrink, shrink2, grow,
    evict); grace 30 s, start-up 10 s, creation 2 s; the run ends at T0 + 2000."""
    b = (
        SnapshotBuilder()
        .node("w0", gpus=16)
        .workload("ml", "train", kind=kind, replicas=4, gpus_per_replica=2, labels=TRAINING)
    )
    delays = SimDelays(eviction_grace_s=30, pod_startup_s=10, scale_up_create_s=2)
    sim = SimCluster(b.build(), delays=delays, start=T0)
    g = Goodput(sim, checkpoints={"ml/train": job}, training_selector=TRAINING, start=T0)
    sim.advance(T0 + 900)
    target = {"shrink": 3, "shrink2": 2, "grow": 5}.get(decision)
    if target is not None:
        asyncio.run(sim.apply([Scale(T0 + 900, "ml/train", kind, 4, target, "training", WHY)]))
    elif decision == "evict":
        asyncio.run(sim.apply([Evict(T0 + 900, "ml/train-1", None, None, 30.0, WHY)]))
    sim.advance(END)
    g.update()
    return g


# Before T0 + 900 the job kept 8 GPUs x 600 s (its checkpoint at T0 + 600) = 4800 GPU-s.
@pytest.mark.parametrize(
    ("decision", "useful", "disruptions"),
    [
        pytest.param("none", 8 * 2000, 0, id="undisturbed-keeps-everything"),
        # 3 workers (6 GPUs) train again from 900 + 120 to 2000
        pytest.param("shrink", 4800 + 6 * (2000 - 1020), 1, id="shrink-restarts-the-job"),
        # two workers removed at one instant: one restart
        pytest.param("shrink2", 4800 + 4 * (2000 - 1020), 1, id="one-instant-one-restart"),
        # the 5th worker runs at 900 + 2 + 10: 10 GPUs from 912 + 120
        pytest.param("grow", 4800 + 10 * (2000 - 1032), 1, id="growth-restarts-the-job"),
        # the replacement (on free GPUs, Running at 910) joins the restart's rendezvous
        pytest.param("evict", 4800 + 8 * (2000 - 1020), 1, id="eviction-one-restart"),
    ],
)
def test_ddp_job_restarts_on_membership_change(decision: str, useful: float, disruptions: int):
    g = follow(DDP, decision)
    f = g.figures(END)
    assert f.useful_gpu_s == pytest.approx(useful)
    assert f.disruptions == disruptions
    assert f.restarts == disruptions


def test_growth_is_free_only_in_the_optimistic_model() -> None:
    """The optimistic model loses nothing on growth; the restart-aware one loses the work since
    the checkpoint (8 GPUs x 312 s) and the restart (the new 10 GPUs x 120 s)."""
    g = follow(DDP, "grow")
    f = g.figures(END)
    assert f.optimistic_lost_gpu_s == 0
    assert f.useful_gpu_s < 8 * 912 + 10 * (2000 - 912) - 8 * 312 + 1


def test_a_rigid_job_waits_for_its_replacement() -> None:
    """Without elastic bounds the job needs all 4 workers: it waits for the replacement
    (created at once on the free GPUs, Running at 910), then restarts: 8 GPUs from 1030."""
    rigid = TrainingJob(interval_s=600.0, restart_s=120.0, min_members=4)
    f = follow(rigid, "evict").figures(END)
    assert f.useful_gpu_s == pytest.approx(4800 + 8 * (2000 - 1030))
    assert f.disruptions == 1


def test_a_sweep_task_loses_only_its_own_work() -> None:
    """A Job's pods are independent: the evicted task keeps 2 GPUs x 600 s, its replacement
    trains from 910; the three others lose nothing; no job restart."""
    tasks = TrainingJob(interval_s=600.0, restart_s=120.0, tasks=True)
    f = follow(tasks, "evict", kind="Job").figures(END)
    assert f.useful_gpu_s == pytest.approx(3 * 2 * 2000 + 2 * 600 + 2 * (2000 - 910))
    assert f.disruptions == 1
    assert f.restarts == 0


def test_first_start_costs_a_restart_but_is_no_disruption() -> None:
    """A job whose workers come up after T0 trains from their start plus the restart time;
    workers that come up while it starts join that rendezvous."""
    b = (
        SnapshotBuilder()
        .node("w0", gpus=16)
        .workload("ml", "train", kind="PyTorchJob", replicas=0, gpus_per_replica=2, labels=TRAINING)
    )
    delays = SimDelays(eviction_grace_s=30, pod_startup_s=10, scale_up_create_s=2)
    sim = SimCluster(b.build(), delays=delays, start=T0)
    g = Goodput(sim, checkpoints={"ml/train": DDP}, training_selector=TRAINING, start=T0)
    asyncio.run(sim.apply([Scale(T0, "ml/train", "PyTorchJob", 0, 4, "training", WHY)]))
    sim.advance(END)
    g.update()
    f = g.figures(END)
    assert f.useful_gpu_s == pytest.approx(8 * (2000 - 12 - 120))
    assert f.disruptions == 0


def test_figures_are_taken_once() -> None:
    g = follow(DDP, "none")
    assert g.figures(END) == g.figures(END + 1000)


def test_sensitivity_grid_moves_the_right_way() -> None:
    """Each grid point reruns the model with every job's interval and restart replaced: a
    longer restart never keeps more work; the grid covers :data:`SENSITIVITY`."""
    f = follow(DDP, "shrink").figures(END)
    grid = {(i, r): u for i, r, u in f.sensitivity}
    assert list(grid) == list(SENSITIVITY)
    for interval in {i for i, _ in SENSITIVITY}:
        assert grid[interval, 60.0] > grid[interval, 120.0] > grid[interval, 300.0]
    # checkpoint every 600 s, restart 120 s: the scenario's own job
    assert grid[600.0, 120.0] == pytest.approx(f.useful_gpu_s)


SCENARIO = """
apiVersion: ebbtide.io/v1alpha1
kind: Scenario
metadata: {name: jobs}
spec:
  nodes: [{name: n0, gpus: 8}]
  workloads:
    - {name: pretrain, kind: PyTorchJob, replicas: 4, elastic: {min: 2, max: 6, gangMinimum: 3},
       checkpointInterval: 10m, restartTime: 3m}
    - {name: rigid, kind: PyTorchJob, replicas: 2}
    - {name: sweep, kind: Job, replicas: 3, elastic: {min: 1, max: 4}}
"""


def test_jobs_of_reads_the_scenario() -> None:
    jobs = jobs_of(load_scenario_text(SCENARIO))
    assert jobs["default/pretrain"] == TrainingJob(600.0, 180.0, 60.0, True, False, 3)
    assert jobs["default/rigid"] == TrainingJob(1800.0, 120.0, 60.0, False, False, 2)
    assert jobs["default/sweep"].tasks
    assert jobs["default/sweep"].min_members == 1


def test_a_workload_with_its_own_start_up_trains_from_running() -> None:
    """The cluster starts pods at once but the job's own take 60 s: it trains from 60 + 120,
    counted once (scheduling is not running)."""
    b = (
        SnapshotBuilder()
        .node("w0", gpus=16)
        .workload("ml", "train", kind="PyTorchJob", replicas=0, gpus_per_replica=2, labels=TRAINING)
    )
    sim = SimCluster(
        b.build(),
        delays=SimDelays(pod_startup_s=0, scale_up_create_s=0),
        start=T0,
        templates={"ml/train": PodTemplate(startup_s=60.0)},
    )
    g = Goodput(sim, checkpoints={"ml/train": DDP}, training_selector=TRAINING, start=T0)
    asyncio.run(sim.apply([Scale(T0, "ml/train", "PyTorchJob", 0, 4, "training", WHY)]))
    sim.advance(T0 + 30)
    g.update()
    sim.advance(END)
    g.update()
    f = g.figures(END)
    assert f.useful_gpu_s == pytest.approx(8 * (2000 - 60 - 120))
    assert f.disruptions == 0

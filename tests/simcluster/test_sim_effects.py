"""The simulated cluster's effects and their delays: evictions, scaling, MIG conversion."""

from __future__ import annotations

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
    kinds,
    pods,
    revert,
    scale,
    two_whole_nodes,
    where,
)

from controller.loop.port import Outcome
from controller.simcluster import SimDelays
from policies.snapshot import SnapshotBuilder


def training_cluster(replicas: int = 2, gpus: int = 2, delays: SimDelays = DELAYS):  # type: ignore[no-untyped-def]
    b = two_whole_nodes().workload(
        "ml", "train", replicas=replicas, gpus_per_replica=gpus, labels=TRAINING, priority=10
    )
    return cluster(b, delays=delays)


async def test_evict_keeps_gpus_for_the_grace_period_then_the_pod_is_gone() -> None:
    """An evicted pod is terminating (still holding its GPUs) until grace_s ends, then deleted."""
    c = training_cluster(replicas=1)
    [result] = await apply(c, evict("ml/train-0", grace=20))
    assert result.outcome is Outcome.APPLIED
    c.advance(T0 + 19.9)
    assert "ml/train-0" in pods(c)
    assert c.gpus_by_use()["whole"].training == 4  # it and its replacement (room on w1)
    c.advance(T0 + 20)
    assert "ml/train-0" not in pods(c)
    assert kinds(c, "ml/train-0") == [(0.0, "terminating"), (20.0, "deleted")]


async def test_evicting_a_workload_pod_only_moves_it() -> None:
    """The workload recreates an evicted pod at once (its ReplicaSet does not count a
    terminating pod); it waits for the GPUs the evicted one holds, is placed and starts."""
    c = training_cluster(replicas=4)  # fills w0 (4 GPUs) and w1 (4 GPUs)
    await apply(c, evict("ml/train-0", grace=5))
    c.advance(T0)
    assert where(c)["ml/train-4"] == (None, "Pending")  # created, no room until the grace ends
    c.advance(T0 + 5)
    assert where(c)["ml/train-4"][1] == "Pending"
    assert where(c)["ml/train-4"][0] is not None
    c.advance(T0 + 15)
    assert where(c)["ml/train-4"][1] == "Running"
    assert kinds(c, "ml/train-4") == [(0, "created"), (5, "scheduled"), (15, "running")]
    assert len(pods(c)) == 4


async def test_evicting_a_standalone_pod_removes_it_for_good() -> None:
    """A pod without a workload is not replaced."""
    c = cluster(two_whole_nodes().pod("ops", "probe", node="w0", gpus=1))
    await apply(c, evict("ops/probe", grace=0))
    c.advance(T0 + 60)
    assert pods(c) == {}


@pytest.mark.parametrize(
    ("start", "to", "running_after"),
    [
        pytest.param(2, 3, 3, id="up-by-one"),
        pytest.param(1, 4, 4, id="up-to-full"),
        pytest.param(4, 1, 1, id="down"),
        pytest.param(3, 0, 0, id="to-zero"),
    ],
)
async def test_scale_creates_and_removes_pods(start: int, to: int, running_after: int) -> None:
    """Scale changes replicas at once; pods appear after the create delay, extras terminate."""
    c = training_cluster(replicas=start)
    [result] = await apply(c, scale("ml/train", to, frm=start))
    assert result.outcome is Outcome.APPLIED
    wl = c.snapshot().workloads[0]
    assert wl.replicas == to
    c.advance(T0 + 60)
    phases = [p.phase for p in pods(c).values()]
    assert phases == ["Running"] * running_after


async def test_scale_down_removes_the_newest_pod_first() -> None:
    """Scaling down terminates the newest pods (by creation time), oldest survive."""
    b = two_whole_nodes()
    b.workload("ml", "train", replicas=3, labels=TRAINING)
    for i, created in enumerate([T0 - 30, T0 - 10, T0 - 20]):
        b.pod("ml", f"train-{i}", node="w0", gpus=1, workload="ml/train", created=created)
    c = cluster(b)
    await apply(c, scale("ml/train", 1, frm=3))
    gone = [e.target for e in c.effects if e.kind == "terminating"]
    assert gone == ["ml/train-1", "ml/train-2"]


async def test_scale_up_waits_for_the_create_delay_and_startup() -> None:
    """New replicas exist after scale_up_create_s and run after pod_startup_s more."""
    c = training_cluster(replicas=1)
    await apply(c, scale("ml/train", 2, frm=1))
    c.advance(T0 + 1.9)
    assert len(pods(c)) == 1
    c.advance(T0 + 100)
    assert kinds(c, "ml/train-1") == [(2, "created"), (2, "scheduled"), (12, "running")]


async def test_mig_convert_drains_reconfigures_and_moves_the_node_to_the_mig_pool() -> None:
    """Convert: cordon, evict pods with the default grace, reconfigure, relabel, uncordon."""
    c = training_cluster(replicas=2, gpus=4)  # one pod on each node
    on_w1 = next(k for k, (node, _) in where(c).items() if node == "w1")
    [result] = await apply(c, convert("w1"))
    assert result.outcome is Outcome.IN_PROGRESS
    node = {n.name: n for n in c.snapshot().nodes}["w1"]
    assert node.cordoned
    assert node.mig_state == "pending"
    assert node.mig_flow  # a restarted engine counts it against maxConcurrent
    assert not node.is_mig
    c.advance(T0 + 30)  # grace over: drained, reconfiguring
    assert on_w1 not in pods(c)
    assert c.gpus_by_use()["whole"].reconfiguring == 4
    c.advance(T0 + 149)
    assert {n.name: n for n in c.snapshot().nodes}["w1"].mig_config == "all-1g.10gb"
    c.advance(T0 + 150)
    node = {n.name: n for n in c.snapshot().nodes}["w1"]
    assert node.mig_state == "success"
    assert not node.cordoned
    assert not node.mig_flow
    assert dict(node.labels) == MIG
    assert node.mig_capacity() == {"1g.10gb": 28}
    assert c.gpus_by_use()["mig"].mig == 4
    assert kinds(c, "w1") == [
        (0, "cordoned"),
        (30, "mig_reconfiguring"),
        (150, "mig_done"),
        (150, "uncordoned"),
    ]


async def test_failed_mig_reconfiguration_rolls_the_node_back() -> None:
    """With failure probability 1 the node keeps its whole cards and pool, state failed."""
    c = training_cluster(delays=replace(DELAYS, mig_failure_probability=1.0))
    await apply(c, convert("w1"))
    c.advance(T0 + 1000)
    node = {n.name: n for n in c.snapshot().nodes}["w1"]
    assert (node.mig_config, node.mig_state, node.cordoned) == (None, "failed", False)
    assert dict(node.labels) == WHOLE
    assert node.whole_gpus == 4
    assert [k for _, k in kinds(c, "w1")][-2:] == ["mig_failed", "uncordoned"]


async def test_mig_revert_returns_whole_cards_and_the_whole_pool() -> None:
    """Revert: a MIG node becomes all-disabled whole cards labelled into the whole pool."""
    b = SnapshotBuilder().node("m0", gpus=2, labels=MIG, mig_config="all-1g.10gb")
    b.pod("ml", "small", node="m0", mig={"1g.10gb": 1}, labels=TRAINING)
    c = cluster(b)
    [result] = await apply(c, revert("m0"))
    assert result.outcome is Outcome.IN_PROGRESS
    c.advance(T0 + 1000)
    node = c.snapshot().nodes[0]
    assert (node.mig_config, node.mig_state, node.whole_gpus) == ("all-disabled", "success", 2)
    assert dict(node.labels) == WHOLE
    assert pods(c) == {}


async def test_a_node_cordoned_before_conversion_stays_cordoned() -> None:
    """The flow uncordons only nodes it cordoned itself."""
    b = SnapshotBuilder().node("w0", gpus=2, labels=WHOLE, cordoned=True)
    c = cluster(b)
    await apply(c, convert("w0"))
    c.advance(T0 + 1000)
    assert c.snapshot().nodes[0].cordoned
    assert c.snapshot().nodes[0].is_mig


async def test_mig_drain_evicts_only_gpu_training_pods() -> None:
    """A drain evicts the node's training GPU pods and leaves pods without GPUs (DaemonSet
    agents, kube-system) running, as the Kubernetes flow does; the conversion goes on."""
    b = SnapshotBuilder().node("w0", gpus=2, labels=WHOLE)
    b.pod("ml", "trainer", node="w0", gpus=1, labels=TRAINING)
    b.pod("kube-system", "agent", node="w0")
    c = cluster(b)
    [result] = await apply(c, convert("w0"))
    assert result.outcome is Outcome.IN_PROGRESS
    c.advance(T0 + 1000)
    assert where(c) == {"kube-system/agent": ("w0", "Running")}
    assert c.snapshot().nodes[0].mig_config == "all-1g.10gb"


@pytest.mark.parametrize(
    ("namespace", "labels", "workload", "why"),
    [
        pytest.param(
            "serving", {}, "serving/chat", "not training", id="inference-pod-blocks-the-drain"
        ),
        pytest.param(
            "kube-system",
            TRAINING,
            None,
            "namespace kube-system is protected",
            id="protected-gpu-pod-blocks-the-drain",
        ),
    ],
)
async def test_mig_drain_refused_like_a_real_cluster(
    namespace: str, labels: dict[str, str], workload: str | None, why: str
) -> None:
    """A GPU pod a real drain may not evict makes the flow fail before evicting anything: the
    node keeps its layout, its pool, its pods and its cordon state."""
    b = SnapshotBuilder().node("m0", gpus=2, labels=MIG, mig_config="all-1g.10gb")
    b.pod("ml", "trainer", node="m0", mig={"1g.10gb": 1}, labels=TRAINING)
    b.pod(namespace, "held", node="m0", mig={"1g.10gb": 1}, labels=labels, workload=workload)
    c = cluster(b)
    before = c.snapshot().nodes
    [result] = await apply(c, revert("m0"))
    assert result.outcome is Outcome.FAILED
    assert why in result.detail
    c.advance(T0 + 1000)
    assert c.snapshot().nodes == before
    assert {k: p for k, (_, p) in where(c).items()} == {
        "ml/trainer": "Running",
        f"{namespace}/held": "Running",
    }
    assert [k for _, k in kinds(c, "m0")] == ["mig_failed"]

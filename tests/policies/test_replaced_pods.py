"""Pods their owner recreates: shrunk instead of evicted, or evicted only for pods outranking them.

The replacement of an evicted pod waits in the kube-scheduler's queue for the GPU it was evicted
for (``PrioritySort.Less``: priority, then queue time), so an eviction frees that GPU only for
pods of higher priority; a Deployment Ebbtide grows back is shrunk instead (nothing recreated).
"""

from __future__ import annotations

import pytest
from policy_fixtures import TRAINING, WHOLE, plan

from policies.preemption import Fit
from policies.snapshot import Snapshot, SnapshotBuilder

PINNED = {"min_replicas": 4, "max_replicas": 4}
"""Elastic bounds at its size: shrinking never frees anything, only evictions (or a shrink in
their place) do."""


def one_node(kind: str = "Deployment", **bounds: int) -> Snapshot:
    """w0 (8 GPUs) running ml/train of ``kind``: 4 pods of 1 GPU at priority 100."""
    return train(SnapshotBuilder().node("w0", gpus=8, labels=WHOLE), 4, ["w0"], kind, **bounds)


def train(
    b: SnapshotBuilder, replicas: int, nodes: list[str | None], kind: str, **bounds: int
) -> Snapshot:
    """ml/train of ``kind`` with ``replicas`` pods on ``nodes``, elastic ``bounds``."""
    annotations = {f"ebbtide.io/{k.replace('_', '-')}": str(v) for k, v in bounds.items()}
    b.workload(
        "ml",
        "train",
        kind=kind,
        replicas=replicas,
        labels=TRAINING,
        annotations=annotations,
        priority=100,
        nodes=nodes,
    )
    return b.build()


def test_a_deployment_ebbtide_grows_back_is_shrunk_in_place_of_evictions() -> None:
    """At its elastic floor, two pods the plan would evict are taken by one shrink 4→2 naming
    them (the ReplicaSet removes those first): no eviction, whatever the claimant's priority."""
    for claimant in (0, 100, 1000):
        p = plan(one_node(**PINNED), 2, claimant=claimant)
        assert p.evictions == ()
        [step] = p.shrinks
        assert (step.workload, step.from_replicas, step.to_replicas) == ("ml/train", 4, 2)
        assert step.remove == ("ml/train-0", "ml/train-1")  # victim order: equal, by name
        assert step.gpus_freed == 2
        assert p.freed == 2


@pytest.mark.parametrize(
    ("claimant", "evicts"),
    [
        pytest.param(1000, True, id="outranked-evicted"),
        pytest.param(100, False, id="equal-priority-refused"),
        pytest.param(10, False, id="lower-priority-refused"),
        pytest.param(None, True, id="no-claimant-no-rule"),
    ],
)
def test_a_recreated_pod_is_evicted_only_for_pods_that_outrank_it(
    claimant: int | None, evicts: bool
) -> None:
    """Without a maximum to grow back to, a Deployment's pods are evicted only for pods of
    strictly higher priority; otherwise each is refused with the reason and nothing is freed."""
    p = plan(one_node(), 2, claimant=claimant)
    assert p.shrinks == ()
    assert [v.pod.key for v in p.evictions] == (["ml/train-0", "ml/train-1"] if evicts else [])
    if not evicts:
        assert p.freed == 0
        assert p.rejected
        assert all("would recreate it" in r.why_not for r in p.rejected)


@pytest.mark.parametrize("kind", ["StatefulSet", "PyTorchJob"])
def test_only_a_deployment_is_shrunk_instead(kind: str) -> None:
    """A StatefulSet cannot be told which pods go (its highest ordinals do), nor other owners:
    their pods fall under the priority rule, even with a maximum to grow back to."""
    assert plan(one_node(kind, **PINNED), 2, claimant=100).freed == 0
    p = plan(one_node(kind, **PINNED), 2, claimant=1000)
    assert p.shrinks == ()
    assert len(p.evictions) == 2


def test_without_a_scale_step_left_the_priority_rule_decides() -> None:
    """Shrinking instead takes a scale step; with none left, the pods are evicted only for pods
    that outrank them."""
    assert plan(one_node(**PINNED), 2, claimant=100, scales=0).freed == 0
    p = plan(one_node(**PINNED), 2, claimant=1000, scales=0)
    assert p.shrinks == ()
    assert len(p.evictions) == 2


def test_per_node_planning_says_why_a_recreated_pod_is_not_taken() -> None:
    """Planning node by node (a Fit) refuses the same pods and names the workload once."""
    fit = Fit(gpus=1, replicas=2, free={"w0": 0}, total={"w0": 4})
    snap = train(SnapshotBuilder().node("w0", gpus=4, labels=WHOLE), 4, ["w0"], "Deployment")
    assert plan(snap, 2, claimant=100, fit=fit).freed == 0
    why = [r for r in plan(snap, 2, claimant=100, fit=fit).rejected if "ml/train" in r.option]
    assert len(why) == 1
    assert "would recreate it" in why[0].why_not


def test_a_shrink_in_place_of_evictions_leaves_pending_pods_out_of_the_count() -> None:
    """Pending pods go first in a ReplicaSet's scale-down whatever is named, so the shrink
    counts from the pods holding GPUs: 5 replicas, 4 running, 2 taken → 2."""
    b = SnapshotBuilder().node("w0", gpus=8, labels=WHOLE)
    snap = train(b, 5, ["w0", "w0", "w0", "w0", None], "Deployment", min_replicas=5, max_replicas=5)
    [step] = plan(snap, 2, claimant=100).shrinks
    assert (step.from_replicas, step.to_replicas, len(step.remove)) == (5, 2, 2)


def test_pods_asking_for_the_checkpoint_handshake_are_not_shrunk_away() -> None:
    """A shrink gives no preemption notice, so a Deployment whose pods opt in to the checkpoint
    handshake is not shrunk instead: its pods are evicted (noticed first) when outranked."""
    b = SnapshotBuilder().node("w0", gpus=8, labels=WHOLE)
    b.workload(
        "ml",
        "train",
        replicas=4,
        labels=TRAINING,
        annotations={"ebbtide.io/min-replicas": "4", "ebbtide.io/max-replicas": "4"},
        priority=100,
        nodes=["w0"],
        pod_annotations={"ebbtide.io/checkpoint-handshake": "true"},
    )
    assert plan(b.build(), 2, claimant=100).freed == 0
    p = plan(b.build(), 2, claimant=1000)
    assert p.shrinks == ()
    assert len(p.evictions) == 2

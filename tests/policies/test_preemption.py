"""Victim selection: protected never chosen, lowest priority first, shrink before evict, gangs."""

from __future__ import annotations

import pytest
from policy_fixtures import TRAINING, WHOLE, make_policy, plan, training

from policies.inventory import Inventory
from policies.preemption import Fit, Plan
from policies.snapshot import Snapshot, SnapshotBuilder

POLICY = make_policy()


def nodes(n: int = 2) -> SnapshotBuilder:
    b = SnapshotBuilder()
    for i in range(n):
        b.node(f"w{i}", gpus=8, labels=WHOLE)
    return b


def evicted(p: Plan) -> list[str]:
    return [v.pod.key for v in p.evictions]


CASES = [
    pytest.param(
        training(
            nodes(), "elastic", replicas=6, nodes=["w0"], min_replicas=2, priority=100
        ).build(),
        3,
        [("ml/elastic", 6, 3)],
        [],
        id="shrink-only-when-enough",
    ),
    pytest.param(
        training(
            training(nodes(), "elastic", replicas=4, nodes=["w0"], min_replicas=3, priority=100),
            "rigid",
            replicas=4,
            nodes=["w1"],
            priority=100,
        ).build(),
        3,
        [("ml/elastic", 4, 3)],
        ["ml/rigid-0", "ml/rigid-1"],
        id="shrink-then-evict",
    ),
    pytest.param(
        training(
            training(nodes(), "high", replicas=2, nodes=["w0"], priority=1000),
            "low",
            replicas=2,
            nodes=["w1"],
            priority=10,
        ).build(),
        1,
        [],
        ["ml/low-0"],
        id="lowest-priority-first",
    ),
    pytest.param(
        training(
            training(nodes(), "old", replicas=1, nodes=["w0"], priority=10, created=100),
            "new",
            replicas=1,
            nodes=["w1"],
            priority=10,
            created=200,
        ).build(),
        1,
        [],
        ["ml/new-0"],
        id="newest-first-on-equal-priority",
    ),
    pytest.param(
        training(
            training(nodes(), "gang", replicas=4, nodes=["w0"], priority=1, gang=4),
            "solo",
            replicas=2,
            nodes=["w1"],
            priority=50,
        ).build(),
        1,
        [],
        ["ml/gang-0", "ml/gang-1", "ml/gang-2", "ml/gang-3"],
        id="gang-evicted-whole",
    ),
    pytest.param(
        training(nodes(), "gang", replicas=6, nodes=["w0"], min_replicas=1, gang=4).build(),
        4,
        [("ml/gang", 6, 4)],
        [],  # a workload being shrunk is not also evicted from in the same plan
        id="shrink-stops-at-gang-minimum",
    ),
    pytest.param(
        training(
            training(
                nodes(),
                "pinned",
                replicas=2,
                nodes=["w0"],
                priority=1,
                annotations={"ebbtide.io/do-not-disrupt": "true"},
                min_replicas=0,
            ),
            "other",
            replicas=2,
            nodes=["w1"],
            priority=100,
        ).build(),
        1,
        [],
        ["ml/other-0"],
        id="do-not-disrupt-never-chosen",
    ),
    pytest.param(
        training(
            training(nodes(), "sys", replicas=2, nodes=["w0"], priority=1, namespace="kube-system"),
            "other",
            replicas=2,
            nodes=["w1"],
            priority=100,
        ).build(),
        1,
        [],
        ["ml/other-0"],
        id="protected-namespace-never-chosen",
    ),
]


@pytest.mark.parametrize(("snapshot", "needed", "shrinks", "evictions"), CASES)
def test_victim_selection(
    snapshot: Snapshot, needed: int, shrinks: list[tuple[str, int, int]], evictions: list[str]
) -> None:
    """The plan shrinks and evicts exactly the expected workloads and pods, in order."""
    got = plan(snapshot, needed)
    assert [(s.workload, s.from_replicas, s.to_replicas) for s in got.shrinks] == shrinks
    assert evicted(got) == evictions


def test_inference_pods_never_chosen() -> None:
    """Pods of inference services are never victims, even at the lowest priority."""
    b = nodes()
    b.workload("serving", "chat", replicas=8, nodes=["w0"], priority=0, labels=TRAINING)
    training(b, "t", replicas=2, nodes=["w1"], priority=100)
    got = plan(b.build(), 8)
    assert all(not v.pod.key.startswith("serving/") for v in got.evictions)
    assert got.freed == 2


def test_gang_skipped_when_budget_too_small() -> None:
    """A gang needing more evictions than the budget holds is skipped with its reason."""
    b = training(nodes(), "gang", replicas=4, nodes=["w0"], priority=1, gang=4)
    training(b, "solo", replicas=2, nodes=["w1"], priority=50)
    got = plan(b.build(), 1, evictions=2)
    assert evicted(got) == ["ml/solo-0"]
    assert any("budget" in a.why_not for a in got.rejected)


def test_budgets_limit_plan() -> None:
    """The plan never uses more scale steps or evictions than given."""
    b = nodes()
    for i in range(4):
        training(b, f"t{i}", replicas=4, nodes=[f"w{i % 2}"], priority=i, min_replicas=3)
    got = plan(b.build(), 12, evictions=3, scales=2)
    assert [(s.workload, s.to_replicas) for s in got.shrinks] == [("ml/t0", 3), ("ml/t1", 3)]
    assert evicted(got) == ["ml/t2-0", "ml/t2-1", "ml/t2-2"]  # the budget, not the need, stops it
    assert got.freed == 5 < 12


@pytest.mark.parametrize(
    "held",
    [
        pytest.param("ml/gang-0", id="first-gang-member-held"),
        pytest.param("ml/gang-2", id="later-gang-member-held"),
    ],
)
def test_pdb_held_pod_is_not_taken_through_its_gang(held: str) -> None:
    """A pod the cluster refused to evict (PDB) is not evicted again as part of its gang: the
    whole gang is skipped with the hold as the reason, and the next victim is taken."""
    b = training(nodes(), "gang", replicas=4, nodes=["w0"], priority=1, gang=4)
    training(b, "solo", replicas=2, nodes=["w1"], priority=50)
    got = plan(b.build(), 1, held={held: "PodDisruptionBudget refused the eviction"})
    assert evicted(got) == ["ml/solo-0"]
    assert any("PodDisruptionBudget" in a.why_not for a in got.rejected)


# -- per node: a replica needs its GPUs on one node ------------------------------------------


def scattered() -> Snapshot:
    """Four whole nodes of 8 GPUs, each with 1 free: training pods hold 7 (one 4-GPU pod and
    three 1-GPU pods of different priority). Chat runs 2-GPU replicas elsewhere."""
    b = SnapshotBuilder()
    for i in range(4):
        b.node(f"w{i}", gpus=8, labels=WHOLE)
        b.pod("ml", f"big-{i}", node=f"w{i}", gpus=4, labels=TRAINING, priority=50)
        for j in range(3):
            b.pod("ml", f"small-{i}-{j}", node=f"w{i}", gpus=1, labels=TRAINING, priority=10 + i)
    b.node("s0", gpus=8, labels={**WHOLE, "role": "serving"})
    b.workload("serving", "chat", replicas=4, gpus_per_replica=2, nodes=["s0"])
    return b.build()


def test_pool_counts_say_enough_but_no_node_fits_so_one_node_is_freed() -> None:
    """4 GPUs free as 1+1+1+1: a 2-GPU replica fits nowhere. The pool-level plan frees nothing
    (4 free >= 2 needed); the per-node plan evicts one 1-GPU pod on the node with the least
    important victims, so 2 GPUs are free on that one node."""
    snap = scattered()
    inv = Inventory(snap, POLICY)
    assert inv.free["whole"] == 4
    space = {f"w{i}": 1 for i in range(4)}
    assert plan(snap, 0).evictions == ()
    got = plan(snap, 2, fit=Fit(2, 1, space, dict.fromkeys(space, 8)))
    assert [v.pod.key for v in got.evictions] == ["ml/small-0-0"]
    assert dict(got.by_node) == {"w0": 1}


def test_a_shrink_counts_where_its_highest_pods_run() -> None:
    """An elastic workload shrunk by one gives back its highest-named pod's GPUs, on that
    pod's node: that node gets room for the 2-GPU replica, so one step is enough."""
    b = nodes(3)
    training(b, "elastic", replicas=3, nodes=["w0", "w1", "w2"], min_replicas=1, priority=5)
    for i in range(3):
        b.pod("ml", f"fill-{i}", node=f"w{i}", gpus=6, labels=TRAINING, priority=100)
    space = {f"w{i}": 1 for i in range(3)}
    got = plan(b.build(), 2, fit=Fit(2, 1, space, dict.fromkeys(space, 8)))
    assert [(s.workload, s.to_replicas) for s in got.shrinks] == [("ml/elastic", 2)]
    assert got.evictions == ()
    assert dict(got.by_node) == {"w2": 1}

"""Scheduler preemption in the simulated cluster: kube-scheduler's DefaultPreemption."""

from __future__ import annotations

import pytest
from sim_builders import DELAYS, T0, TRAINING, WHOLE, apply, cluster, kinds, scale, where

from controller.simcluster import SimCluster
from controller.simcluster.nodeindex import NodeRec, PodRec, preemption_plan
from policies.snapshot import ANYWHERE, Node, Pod, SnapshotBuilder


def two_nodes() -> SnapshotBuilder:
    """Priority classes low (10), mid (100), high (1000) and two empty 4-GPU whole nodes."""
    return (
        SnapshotBuilder()
        .priority_class("low", 10)
        .priority_class("mid", 100)
        .priority_class("high", 1000)
        .node("w0", gpus=4, labels=WHOLE)
        .node("w1", gpus=4, labels=WHOLE)
    )


def busy_cluster(*, preemption: bool = True) -> SimCluster:
    """w0 holds low-a (1 GPU), low-b (1), mid (2); w1 holds mid2 (2), low-c (2): both full; a
    serving workload (priority 1000, 2 GPUs per replica) at 0 replicas."""
    b = (
        two_nodes()
        .pod("ml", "low-a", node="w0", gpus=1, priority=10, labels=TRAINING)
        .pod("ml", "low-b", node="w0", gpus=1, priority=10, labels=TRAINING)
        .pod("ml", "mid", node="w0", gpus=2, priority=100, labels=TRAINING)
        .pod("ml", "mid2", node="w1", gpus=2, priority=100, labels=TRAINING)
        .pod("ml", "low-c", node="w1", gpus=2, priority=10, labels=TRAINING)
        .workload("serving", "chat", replicas=0, gpus_per_replica=2, priority=1000)
    )
    c = cluster(b)
    c.preemption = preemption
    return c


async def test_a_pending_high_priority_pod_preempts_the_fewest_lowest_victims() -> None:
    """A 2-GPU serving pod preempts on w1 (one low victim of 2 GPUs) rather than w0 (two low
    victims of 1 GPU: same highest priority, higher sum); victims keep their GPUs for the
    grace period, then the pod is placed on the nominated node."""
    c = busy_cluster()
    await apply(c, scale("serving/chat", 1))
    c.advance(T0 + DELAYS.scale_up_create_s)
    assert kinds(c, "ml/low-c") == [(2.0, "terminating")]
    assert c.preemptions == 1
    for k in ("ml/low-a", "ml/low-b", "ml/mid", "ml/mid2"):
        assert kinds(c, k) == []
    c.advance(T0 + 2 + DELAYS.eviction_grace_s - 0.1)
    assert where(c)["serving/chat-0"] == (None, "Pending")  # grace honoured
    c.advance(T0 + 2 + DELAYS.eviction_grace_s)
    assert where(c)["serving/chat-0"] == ("w1", "Pending")
    assert "ml/low-c" not in where(c)


async def test_a_pod_waiting_for_its_victims_preempts_nothing_more() -> None:
    """While the nominated node's victims terminate, later scheduler passes evict no one else;
    a second pending pod of the same shape preempts on the other node."""
    c = busy_cluster()
    await apply(c, scale("serving/chat", 2))
    c.advance(T0 + 2)
    c.advance(T0 + 10)
    victims = sorted(e.target for e in c.effects if e.kind == "terminating")
    assert victims == ["ml/low-a", "ml/low-b", "ml/low-c"]
    assert c.preemptions == 3


async def test_no_preemption_when_it_is_off_or_nothing_lower_priority_frees_enough() -> None:
    """Off: the pod stays pending. On: a pod that only higher-or-equal pods block stays too."""
    off = busy_cluster(preemption=False)
    await apply(off, scale("serving/chat", 1))
    off.advance(T0 + 60)
    assert where(off)["serving/chat-0"] == (None, "Pending")
    assert off.preemptions == 0
    on = busy_cluster()
    await apply(on, scale("ml/never", 1))  # unknown workload: nothing happens
    assert on.preemptions == 0


def rec(node: str, gpus: int) -> NodeRec:
    return NodeRec.of(Node(node, tuple(), labels=WHOLE) if gpus == 0 else _node(node, gpus))


def _node(name: str, gpus: int) -> Node:
    from policies.snapshot import Gpu

    return Node(name, tuple(Gpu(i, "A100-80GB") for i in range(gpus)), labels=WHOLE)


def _pod(name: str, node: str | None, gpus: int, prio: int) -> Pod:
    return Pod("ml", name, node, "Running" if node else "Pending", gpus, priority=prio)


@pytest.mark.parametrize(
    ("placed", "want_node", "want_victims"),
    [
        pytest.param(
            {"a": [("x", 2, 10), ("y", 2, 10)], "b": [("z", 2, 50), ("w", 2, 5)]},
            "b",
            ["w"],
            id="lowest-highest-victim-priority-wins",
        ),
        pytest.param(
            {"a": [("x", 1, 10), ("y", 1, 10), ("v", 2, 5)]},
            "a",
            ["v"],
            id="reprieve-keeps-the-more-important",
        ),
        pytest.param(
            {"a": [("x", 2, 2000), ("y", 2, 2000)], "b": [("z", 4, 2000)]},
            None,
            [],
            id="equal-or-higher-priority-is-never-a-victim",
        ),
        pytest.param(
            {"a": [("x", 1, 10), ("y", 1, 10), ("v", 2, 500)], "b": [("z", 2, 10), ("w", 2, 10)]},
            "b",
            ["z"],
            id="fewer-victims-across-nodes-reprieve-by-name",
        ),
    ],
)
def test_preemption_plan_picks_node_and_victims(
    placed: dict[str, list[tuple[str, int, int]]], want_node: str | None, want_victims: list[str]
) -> None:
    """preemption_plan (pure): the chosen node and the victims, inputs unchanged."""
    nodes = {n: rec(n, 4) for n in placed}
    pods: dict[str, PodRec] = {}
    for n, lst in placed.items():
        for name, gpus, prio in lst:
            p = _pod(name, n, gpus, prio)
            pods[p.key] = PodRec(p, ANYWHERE, (-prio, 0.0, len(pods)))
            nodes[n].hold(p, +1)
    before = {n: (r.used, dict(r.pods)) for n, r in nodes.items()}
    plan = preemption_plan(_pod("new", None, 2, 1000), ANYWHERE, nodes.values(), pods, {})
    if want_node is None:
        assert plan is None
    else:
        assert plan is not None
        assert plan[0].node.name == want_node
        assert sorted(v.pod.name for v in plan[1]) == want_victims
    assert {n: (r.used, dict(r.pods)) for n, r in nodes.items()} == before


async def test_what_a_nominated_pod_will_take_is_not_free_to_less_important_pods() -> None:
    """w0 has one free GPU and a 1-GPU low pod; a 2-GPU serving pod preempts that pod and is
    nominated to w0. A low-priority pod created meanwhile may not take the free GPU (kube
    counts the nominee as if running), so the serving pod lands on w0 when its victim is gone."""
    b = (
        two_nodes()
        .pod("ml", "x", node="w0", gpus=1, priority=10, labels=TRAINING)
        .pod("ml", "m0", node="w0", gpus=2, priority=100, labels=TRAINING)
        .pod("ml", "m1", node="w1", gpus=4, priority=100, labels=TRAINING)
        .workload("serving", "chat", replicas=0, gpus_per_replica=2, priority=1000)
        .workload("ml", "sweep", replicas=0, gpus_per_replica=1, priority=10, labels=TRAINING)
    )
    c = cluster(b)
    c.preemption = True
    await apply(c, scale("serving/chat", 1))
    c.advance(T0 + 2)
    assert kinds(c, "ml/x") == [(2.0, "terminating")]
    await apply(c, scale("ml/sweep", 1, at=T0 + 3))
    c.advance(T0 + 10)
    assert where(c)["ml/sweep-0"] == (None, "Pending")
    c.advance(T0 + 2 + DELAYS.eviction_grace_s)
    assert where(c)["serving/chat-0"] == ("w0", "Pending")
    assert where(c)["ml/sweep-0"] == (None, "Pending")
    assert c.preemptions == 1

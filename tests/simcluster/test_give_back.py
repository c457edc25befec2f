"""Giving GPUs back so whole nodes empty: the engine's scale-down names the replicas to remove
(:func:`policies.placement.give_back`) and the simulated cluster removes exactly those."""

from __future__ import annotations

from sim_builders import DELAYS, POOLS, T0, WHOLE

from controller.simcluster import SimCluster
from policies.decisions import Scale
from policies.engine import Engine
from policies.model import Policy
from policies.placement import give_back
from policies.snapshot import Snapshot, SnapshotBuilder
from streams.events import InferenceLatency

CHAT = {
    "namespace": "serving",
    "pool": "whole",
    "gpusPerReplica": 1,
    "replicas": {"min": 2, "max": 10},
    "slo": {
        "percentile": 99,
        "objectiveMs": 100,
        "window": "30s",
        "recoverAfter": "20s",
        "minSamples": 10,
    },
    "scale": {"down": {"stabilization": "60s", "below": "50%", "maxStep": 2, "cooldown": "30s"}},
    "cooldown": "30s",
}


def spread_chat(kind: str = "Deployment") -> Snapshot:
    """chat's six replicas round-robin on three 2-GPU nodes: the newest two run on w1 and w2,
    so removing the newest (the ReplicaSet's own choice) empties no node."""
    b = SnapshotBuilder()
    for name in ("w0", "w1", "w2"):
        b.node(name, gpus=2, labels=WHOLE)
    b.workload("serving", "chat", kind=kind, replicas=6, nodes=["w0", "w1", "w2"])
    return b.build()


def engine() -> Engine:
    spec = {"pools": {"whole": {"nodeSelector": dict(WHOLE)}}, "services": {"chat": CHAT}}
    meta = {"name": "test"}
    return Engine(
        Policy.model_validate(
            {"apiVersion": "ebbtide.io/v1alpha1", "kind": "Policy", "metadata": meta, "spec": spec}
        )
    )


async def scale_down_once(snapshot: Snapshot) -> tuple[Scale, SimCluster]:
    """Quiet traffic until the first scale-down, applied to the simulated cluster, which then
    runs past the removed pods' grace period."""
    c = SimCluster(snapshot, delays=DELAYS, seed=0, start=T0, pools=POOLS)
    e = engine()
    for second in range(120):
        for k in range(20):  # 20 requests a second at 20ms: a fifth of the objective
            e.observe(InferenceLatency(T0 + second + k / 20, "chat", "serving", latency_ms=20.0))
        now = T0 + second + 1
        c.advance(now)
        downs = [d for d in e.evaluate(now, c.snapshot()) if isinstance(d, Scale)]
        if downs:
            await c.apply(downs)
            c.advance(now + DELAYS.eviction_grace_s + 1)
            return downs[0], c
    raise AssertionError("no scale-down")


def empty_nodes(c: SimCluster) -> list[str]:
    snap = c.snapshot()
    busy = {p.node for p in snap.pods if p.holds_gpus and p.gpus}
    return sorted(n.name for n in snap.nodes if n.name not in busy)


async def test_scale_down_empties_a_whole_node() -> None:
    """Regression: the ReplicaSet's newest-first removal left one hole on each of w1 and w2;
    naming the replicas empties w0, the node with none other than chat's pods."""
    d, c = await scale_down_once(spread_chat())
    assert (d.from_replicas, d.to_replicas) == (6, 4)
    assert d.remove == ("serving/chat-0", "serving/chat-3")
    assert "empties w0" in d.explanation.reason
    assert d.explanation.inputs["remove"] == "serving/chat-0, serving/chat-3"
    assert empty_nodes(c) == ["w0"]
    assert len([p for p in c.snapshot().pods if p.holds_gpus]) == 4


async def test_a_statefulset_scale_down_names_no_pods_and_says_why() -> None:
    """A StatefulSet removes its highest ordinals whatever is asked: nothing is named."""
    d, _ = await scale_down_once(spread_chat("StatefulSet"))
    assert d.remove == ()
    assert "highest ordinals" in d.explanation.reason


def test_give_back_prefers_nodes_that_empty_then_nvlink_domains() -> None:
    """Fewest other GPU pods first; a node whose pods all fit before one left with a hole;
    then the NVLink domain with the most GPUs free; freed GPUs gather there."""
    ours = {"a": ["p/a1", "p/a2", "p/a3"], "b": ["p/b1", "p/b2"], "c": ["p/c1"], "d": ["p/d1"]}
    others = {"a": 0, "b": 0, "c": 1, "d": 0}
    free = {"a": 0, "b": 0, "c": 0, "d": 0, "e": 4}
    # d and b empty within 3; a (3 of ours) would keep a hole; c has another pod
    assert give_back(ours, others, free, 3) == ["p/d1", "p/b1", "p/b2"]
    assert give_back(ours, others, free, 4) == ["p/d1", "p/b1", "p/b2", "p/a1"]
    assert give_back(ours, others, free, 9)[-1] == "p/c1"
    # between equals, the node beside free GPUs in its NVLink domain (e in x) goes first
    pair = {"b": ["p/b1"], "d": ["p/d1"]}
    assert give_back(pair, others, free, 1) == ["p/b1"]
    assert give_back(pair, others, free, 1, domains={"b": "y", "d": "x", "e": "x"}) == ["p/d1"]

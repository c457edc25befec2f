"""The simulated scheduler places by the engine's fit rules, and the engine's per-node plans
work there: scattered free GPUs are not room for a multi-GPU replica in either runtime."""

from __future__ import annotations

from sim_builders import DELAYS, T0, TRAINING, WHOLE, apply, cluster, evict, scale, where

from policies.decisions import Decision, Evict, Scale
from policies.engine import Engine
from policies.loader import load_policy_text
from policies.snapshot import Placement, SnapshotBuilder, Taint, Toleration
from streams.events import InferenceLatency

GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")
H100 = {"nvidia.com/gpu.product": "H100"}
ON_H100 = Placement(H100, (Toleration("nvidia.com/gpu", "Exists"),))

POLICY = """
apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata: {name: fit}
spec:
  pools: {whole: {nodeSelector: {ebbtide.io/pool: whole}, kind: whole}}
  services:
    chat: {namespace: serving, pool: whole, gpusPerReplica: 2, replicas: {min: 1, max: 10},
           scale: {tolerance: 10%},
           slo: {percentile: 99, objectiveMs: 100, window: 30s, resolution: 1s, breachAfter: 10s,
                 recoverBelow: 80%, recoverAfter: 20s, minSamples: 10}}
  training: {selector: {ebbtide.io/class: training}, victimOrder: [priority, newest],
             gracePeriod: 30s}
  budgets: {evictions: {max: 4, per: 10m}, scaleSteps: {max: 20, per: 10m}}
"""


async def test_taints_and_template_placement_hold_in_the_simulated_scheduler() -> None:
    """A replica without the toleration stays pending beside a free tainted node; one whose
    workload template tolerates the taint and selects the model is placed there."""
    b = SnapshotBuilder().node("t0", gpus=4, labels={**WHOLE, **H100}, taints=(GPU_TAINT,))
    b.workload("serving", "plain", replicas=0, gpus_per_replica=2)
    b.workload("serving", "chat", replicas=0, gpus_per_replica=2, placement=ON_H100)
    c = cluster(b)
    await apply(c, scale("serving/plain", 1), scale("serving/chat", 1))
    c.advance(T0 + DELAYS.scale_up_create_s)
    assert where(c)["serving/plain-0"] == (None, "Pending")
    assert where(c)["serving/chat-0"] == ("t0", "Pending")


def scattered() -> SnapshotBuilder:
    """Four tainted H100 nodes with 1 GPU free each (a 6-GPU and a 1-GPU training pod), an
    untainted node without H100 that is all free, chat's first replica outside the pool."""
    b = SnapshotBuilder()
    for i in range(4):
        b.node(f"w{i}", gpus=8, labels={**WHOLE, **H100}, taints=(GPU_TAINT,))
        b.pod("ml", f"big-{i}", node=f"w{i}", gpus=6, labels=TRAINING, priority=50)
        b.pod("ml", f"small-{i}", node=f"w{i}", gpus=1, labels=TRAINING, priority=10 + i)
    b.node("x0", gpus=8, labels=WHOLE)
    b.node("s0", gpus=2, labels=H100, taints=(GPU_TAINT,))
    b.workload("serving", "chat", replicas=1, gpus_per_replica=2, nodes=["s0"], placement=ON_H100)
    return b


async def test_engine_frees_one_node_and_the_simulated_cluster_places_the_replicas() -> None:
    """Pool counts say 12 free GPUs, but no H100 node has 2: the engine evicts one small pod on
    each of two nodes and scales chat 1→3; the simulated scheduler then places both new
    replicas on exactly those nodes once the victims are gone."""
    c = cluster(scattered())
    engine = Engine(load_policy_text(POLICY, "fit.yaml"))
    decisions: list[Decision] = []
    for s in range(1, 20):
        for k in range(20):
            engine.observe(InferenceLatency(T0 + s - 1 + k / 20, "chat", "serving", 250.0))
        decisions = engine.evaluate(T0 + s, c.snapshot())
        if decisions:
            break
    assert [d.pod for d in decisions if isinstance(d, Evict)] == ["ml/small-0", "ml/small-1"]
    assert [(d.workload, d.to_replicas) for d in decisions if isinstance(d, Scale)] == [
        ("serving/chat", 3)
    ]
    at = decisions[0].at
    await c.apply(decisions)
    c.advance(at + 30 + DELAYS.scale_up_create_s)
    placed = {k: v for k, v in where(c).items() if k.startswith("serving/chat-")}
    assert placed == {
        "serving/chat-0": ("s0", "Running"),
        "serving/chat-1": ("w0", "Pending"),
        "serving/chat-2": ("w1", "Pending"),
    }


MIG_POLICY = POLICY.replace(
    "  pools: {whole: {nodeSelector: {ebbtide.io/pool: whole}, kind: whole}}",
    "  pools: {whole: {nodeSelector: {ebbtide.io/pool: whole}, kind: whole},\n"
    "          mig: {nodeSelector: {ebbtide.io/pool: mig}, kind: mig}}\n"
    "  mig: {fromPool: whole, toPool: mig, convertBelow: 20%, convertAfter: 10m,\n"
    "        profiles: {A100-80GB: all-1g.10gb}, revertAfter: 2m}",
).replace("gpusPerReplica: 2", "gpusPerReplica: 1")


async def test_an_evicted_pods_replacement_does_not_revert_a_mig_node() -> None:
    """Regression, in the simulated cluster: a breach evicts rigid training; its Job recreates
    the pods, which wait. They are Ebbtide's own doing, so no MIG node is reverted to serve
    them (which would undo the eviction) over the next ten minutes."""
    b = SnapshotBuilder().node("w0", gpus=8, labels=WHOLE)
    b.node("m0", gpus=8, labels={"ebbtide.io/pool": "mig"}, mig_config="all-1g.10gb")
    b.workload("serving", "chat", replicas=2, nodes=["w0"], priority=1000)
    b.workload("ml", "batch", kind="Job", replicas=6, labels=TRAINING, nodes=["w0"], priority=10)
    c = cluster(b)
    engine = Engine(load_policy_text(MIG_POLICY, "mig.yaml"))
    made: list[Decision] = []
    for s in range(1, 600):
        if s <= 20:
            for k in range(20):
                engine.observe(InferenceLatency(T0 + s - 1 + k / 20, "chat", "serving", 250.0))
        c.advance(T0 + s)
        decisions = engine.evaluate(T0 + s, c.snapshot())
        made += decisions
        await c.apply(decisions)
    evicted = [d.pod for d in made if isinstance(d, Evict)]
    assert evicted
    assert [d.action for d in made if d.action.startswith("mig")] == []
    assert [p for p in c.pending_pods() if p.workload == "ml/batch"]  # replacements wait


async def test_quota_admission_caps_pods_and_the_snapshot_reports_its_use() -> None:
    """A namespace's GPU quota stops pod creation at ``hard``, the snapshot shows the use, and a
    pod leaving the namespace lets its workload catch up."""
    b = SnapshotBuilder().node("w0", gpus=8, labels=WHOLE).quota("ml", hard=3)
    b.workload("ml", "train", replicas=2, labels=TRAINING, nodes=["w0"])
    c = cluster(b)
    assert [(q.namespace, q.hard, q.used) for q in c.snapshot().quotas] == [("ml", 3, 2)]
    await apply(c, scale("ml/train", 5, frm=2))
    c.advance(T0 + DELAYS.scale_up_create_s + 1)
    assert sorted(k for k in where(c) if k.startswith("ml/")) == [
        "ml/train-0",
        "ml/train-1",
        "ml/train-2",
    ]
    assert c.snapshot().quotas[0].used == 3
    await apply(c, evict("ml/train-0", grace=1.0, at=T0 + 5))
    c.advance(T0 + 5 + 1 + DELAYS.scale_up_create_s)
    assert "ml/train-0" not in where(c)
    assert len([k for k in where(c) if k.startswith("ml/")]) == 3

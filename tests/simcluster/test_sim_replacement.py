"""Every replica a scale-up asks for lands, though the training it freed GPUs from is recreated.

The engine decides against the simulated cluster, whose scheduler pops pending pods as the
kube-scheduler does (priority, then age: ``PrioritySort.Less``, kubernetes
``pkg/scheduler/framework/plugins/queuesort/priority_sort.go``) and whose workloads recreate a
terminating pod at once, as a ReplicaSet does (``FilterActivePods`` in
``pkg/controller/replicaset/replica_set.go``). Training's pods exit within their 1 s grace,
before chat's new replicas exist (the Deployment controller creates them 2 s after the write):
a replacement of an evicted pod is the only pod waiting when the GPU frees.
"""

from __future__ import annotations

from sim_builders import POOLS, T0, TRAINING, WHOLE

from controller.simcluster import SimCluster, SimDelays
from controller.simcluster.scenario import DelaysSpec
from policies.decisions import Decision, Scale
from policies.engine import Engine
from policies.loader import load_policy_text
from policies.snapshot import SnapshotBuilder
from streams.events import InferenceLatency

POLICY = """
apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata: {name: landing}
spec:
  pools:
    whole: {nodeSelector: {ebbtide.io/pool: whole}, kind: whole}
  services:
    chat:
      namespace: serving
      pool: whole
      gpusPerReplica: 1
      replicas: {min: 2, max: 6}
      slo: {percentile: 99, objectiveMs: 300, window: 4s, resolution: 1s, breachAfter: 2s,
            recoverBelow: 80%, recoverAfter: 2s, minSamples: 10}
      scale: {tolerance: 10%, maxStep: 2}
  training:
    selector: {ebbtide.io/class: training}
    victimOrder: [priority, newest]
    gracePeriod: 1s
    elastic: {growAfter: 1h}
  budgets:
    evictions: {max: 4, per: 1m}
    scaleSteps: {max: 20, per: 1m}
"""
DELAYS = SimDelays(eviction_grace_s=1, pod_startup_s=1, scale_up_create_s=2, replace_create_s=0)
CHAT = {"app": "chat"}


def world(
    *, train: int, chat_priority: int, bounds: dict[str, str] | None = None
) -> SnapshotBuilder:
    """w0 and w1, 4 GPUs each: chat (2 replicas on w0, at ``chat_priority``) and the ml/train
    Deployment (``train`` replicas, priority 100, Ebbtide's elastic ``bounds``) after it."""
    b = SnapshotBuilder().node("w0", gpus=4, labels=WHOLE).node("w1", gpus=4, labels=WHOLE)
    b.workload("serving", "chat", replicas=2, labels=CHAT, priority=chat_priority, nodes=["w0"])
    b.workload(
        "ml",
        "train",
        replicas=train,
        labels=TRAINING,
        annotations=bounds,
        priority=100,
        nodes=["w0", "w0", "w1", "w1", "w1", "w1"][:train],
    )
    return b


async def breach(b: SnapshotBuilder, *, preemption: bool = False) -> tuple[SimCluster, Scale]:
    """Slow chat until the engine decides; carry its decisions out, let the cluster settle for
    a minute; the cluster and the chat scale-up decided."""
    policy = load_policy_text(POLICY, "landing.yaml")
    engine = Engine(policy)
    c = SimCluster(b.build(), delays=DELAYS, start=T0, pools=POOLS, preemption=preemption)
    decided: list[Decision] = []
    t = T0
    while not decided:
        assert t < T0 + 30, "no decision in 30 s of breach"
        for k in range(20):
            engine.observe(InferenceLatency(t + k / 20, "chat", "serving", 900.0))
        t += 1
        c.advance(t)
        decided = engine.evaluate(t, c.snapshot())
    await c.apply(decided)
    c.advance(t + 60)
    up = [d for d in decided if isinstance(d, Scale) and d.workload == "serving/chat"]
    assert len(up) == 1, decided
    return c, up[0]


def chat_pods(c: SimCluster) -> dict[str, tuple[str | None, str]]:
    return {p.key: (p.node, p.phase) for p in c.snapshot().pods if p.workload == "serving/chat"}


async def test_a_pinned_deployment_is_shrunk_not_evicted_and_every_replica_lands() -> None:
    """Regression (issue 21, item 6): training pinned at its floor (min = max = 6) used to lose
    two pods to evictions its ReplicaSet undid at once, the replacements took the freed GPUs
    and two new chat replicas stayed Pending. Now it is shrunk 6→4, naming those pods, and
    chat's 4 replicas all run."""
    c, up = await breach(
        world(
            train=6,
            chat_priority=100_000,
            bounds={"ebbtide.io/min-replicas": "6", "ebbtide.io/max-replicas": "6"},
        )
    )
    assert (up.from_replicas, up.to_replicas) == (2, 4)
    pods = chat_pods(c)
    assert len(pods) == 4
    assert all(node is not None and phase == "Running" for node, phase in pods.values()), pods
    (train,) = [w for w in c.snapshot().workloads if w.key == "ml/train"]
    assert train.replicas == 4


async def test_at_equal_priority_nothing_is_evicted_and_chat_scales_to_what_fits() -> None:
    """Regression: at chat's own priority the replacement of an evicted pod wins the queue as
    often as not, so nothing is evicted from a Deployment Ebbtide does not grow back; chat
    scales by the one replica that fits (the decision says why not more) and it runs."""
    c, up = await breach(world(train=5, chat_priority=100))
    assert not [e for e in c.effects if e.kind == "terminating"]
    assert (up.from_replicas, up.to_replicas) == (2, 3)
    assert any("recreate" in a.why_not for a in up.explanation.alternatives)
    pods = chat_pods(c)
    assert len(pods) == 3
    assert all(node is not None and phase == "Running" for node, phase in pods.values()), pods


async def test_an_outranking_service_gets_its_gpus_back_through_scheduler_preemption() -> None:
    """Evicted for chat that outranks it, a non-elastic Deployment's replacement may still be
    bound first (the pod exited before chat's replicas existed); kube-scheduler's
    DefaultPreemption then takes the GPU back for chat, and every replica lands."""
    c, up = await breach(world(train=6, chat_priority=100_000), preemption=True)
    assert (up.from_replicas, up.to_replicas) == (2, 4)
    assert c.preemptions >= 1
    pods = chat_pods(c)
    assert len(pods) == 4
    assert all(node is not None and phase == "Running" for node, phase in pods.values()), pods
    assert [e for e in c.effects if e.kind == "terminating" and "evicted" in e.detail]
    assert not [e for e in c.effects if e.kind == "scaled" and e.target == "ml/train"]


def test_a_scenario_says_how_soon_a_replacement_exists() -> None:
    """``spec.delays.replaceCreate`` in a scenario file reaches the cluster (default: at once)."""
    assert DelaysSpec().to_delays().replace_create_s == 0.0
    spec = DelaysSpec.model_validate({"replaceCreate": "3s", "scaleUpCreate": "5s"})
    assert (spec.to_delays().replace_create_s, spec.to_delays().scale_up_create_s) == (3.0, 5.0)

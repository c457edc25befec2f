"""The cluster inferred from a recording and a policy, when no scenario is given."""

from __future__ import annotations

from pathlib import Path

from replay_builders import T0, write_recording

from controller.offline.replay.inferred import infer_cluster
from policies.loader import load_policy_text
from streams.events import Event, GpuUtilization, InferenceLatency

POLICY = """\
apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata: {name: inventory}
spec:
  pools:
    whole: {nodeSelector: {pool: whole}, kind: whole}
    mig: {nodeSelector: {pool: mig}, kind: mig}
  services:
    chat: {namespace: serving, pool: whole, replicas: {min: 2, max: 6},
           slo: {percentile: 99, objectiveMs: 100}}
    embed: {namespace: serving, pool: whole, slo: {percentile: 99, objectiveMs: 50}}
  training: {selector: {class: training}}
  mig:
    fromPool: whole
    toPool: mig
    convertBelow: 20%
    convertAfter: 30m
    profiles: {A100-80GB: all-1g.10gb}
    revertAfter: 5m
"""


def events() -> list[Event]:
    out: list[Event] = []
    for s in range(10):
        ts = T0 + s
        # a100-0: GPU 0 serves chat, 1-2 train ml/bert, 3-5 busy unattributed, 6-7 idle
        out.append(GpuUtilization(ts=ts, node="a100-0", gpu=0, util_pct=70, pod="serving/chat-x"))
        out += [GpuUtilization(ts=ts, node="a100-0", gpu=g, util_pct=90, pod="ml/bert-0")
                for g in (1, 2)]  # fmt: skip
        out += [GpuUtilization(ts=ts, node="a100-0", gpu=g, util_pct=80) for g in (3, 4, 5)]
        out += [GpuUtilization(ts=ts, node="a100-0", gpu=g, util_pct=0) for g in (6, 7)]
        # h100-1: idle whole cards; gpu-mig-2: MIG instances
        out += [GpuUtilization(ts=ts, node="h100-1", gpu=g, util_pct=1) for g in range(4)]
        out += [GpuUtilization(ts=ts, node="gpu-mig-2", gpu=0, mig_profile="1g.10gb",
                               mig_instance=i, util_pct=30) for i in range(7)]  # fmt: skip
        out.append(InferenceLatency(ts=ts, service="embed", namespace="serving", latency_ms=5,
                                    pod="serving/embed-a"))  # fmt: skip
        out.append(InferenceLatency(ts=ts, service="other", namespace="x", latency_ms=5))
    return out


def test_inventory_is_inferred_from_events_and_policy(tmp_path: Path) -> None:
    """Nodes, pools, GPU counts, MIG layout, service replicas and training come out as the
    inventory rules say."""
    policy = load_policy_text(POLICY)
    path = write_recording(tmp_path / "r.jsonl", events())
    inferred = infer_cluster(path, policy)
    snap = inferred.snapshot
    nodes = {n.name: n for n in snap.nodes}
    assert sorted(nodes) == ["a100-0", "gpu-mig-2", "h100-1"]
    assert dict(nodes["a100-0"].labels) == {"pool": "whole"}  # mig.fromPool
    assert len(nodes["a100-0"].gpus) == 8
    assert nodes["h100-1"].gpu_model == "H100-80GB"
    assert dict(nodes["gpu-mig-2"].labels) == {"pool": "mig"}  # a word of its name
    assert nodes["gpu-mig-2"].mig_config == "all-1g.10gb"
    workloads = {w.key: w for w in snap.workloads}
    # chat: one pod seen, raised to replicas.min; embed: one pod named by latency events
    assert workloads["serving/chat"].replicas == 2
    assert workloads["serving/embed"].replicas == 1
    assert workloads["ml/bert"].replicas == 1
    assert workloads["ml/bert"].gpus_per_replica == 2
    # the three busy, unattributed GPUs are one elastic training workload; idle ones stay free
    inferred_training = workloads["training/inferred-whole"]
    assert inferred_training.replicas == 3
    assert inferred_training.annotations["ebbtide.io/min-replicas"] == "0"
    pods = {p.key: p for p in snap.pods}
    assert pods["serving/chat-x"].node == "a100-0"
    assert pods["ml/bert-0"].gpus == 2
    assert dict(pods["ml/bert-0"].labels) == {"class": "training"}
    # chat's second replica and embed's go to the busiest node's free GPUs, training fills it
    assert sum(p.gpus for p in snap.pods if p.node == "a100-0") == 8
    cluster = inferred.simulate(T0)
    use = cluster.gpus_by_use()
    assert (use["whole"].inference, use["whole"].training, use["whole"].idle) == (3, 5, 4)
    assert use["mig"].mig == 1
    assert "service serving/chat: 2 replicas (pods seen on GPUs)" in inferred.notes
    assert any("x/other" in n for n in inferred.notes)  # named by events, not by the policy


def test_the_scan_finds_the_recordings_span(tmp_path: Path) -> None:
    """The span a replay sizes its report's buckets by: the first event's time in file order
    (where the replay starts) and the latest, though a late event comes after it."""
    late = GpuUtilization(ts=T0 - 30, node="a100-0", gpu=0, util_pct=50)
    path = write_recording(tmp_path / "r.jsonl", [*events(), late])
    assert infer_cluster(path, load_policy_text(POLICY)).span == (T0, T0 + 9)
    empty = write_recording(tmp_path / "e.jsonl", [])
    assert infer_cluster(empty, load_policy_text(POLICY)).span is None

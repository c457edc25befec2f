"""Leading indicators (``scale.leading``) and ``scale.readyEndsCooldown``, through the engine:
the request rate scales a service up before its P99 turns, holds its replicas against
scale-down, and a scale-up's cooldown ends once its replicas run."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest
from policy_fixtures import T0, feed_latency, plan, policy_dict, to_yaml, training

from policies.casetest import load_cases, run_cases
from policies.decisions import Decision, Evict, Scale
from policies.engine import Engine
from policies.loader import PolicyLoadError, Source, load_policy, load_policy_text, read_sources
from policies.model import Policy
from policies.snapshot import Snapshot, SnapshotBuilder

WHOLE = {"ebbtide.io/pool": "whole"}


def chat_policy(**scale: Any) -> Policy:
    """The base test policy (objective 100ms, window 30s, breachAfter 10s, cooldown 30s) with
    chat's ``scale`` extended by ``scale``."""
    data = policy_dict()
    data["spec"]["services"]["chat"]["scale"].update(scale)
    return load_policy_text(to_yaml(data), "test.yaml")


def cluster(replicas: int, *, running: bool = True) -> Snapshot:
    """chat with ``replicas`` on w0 (Pending when not ``running``), elastic training on w1."""
    b = SnapshotBuilder()
    for name in ("w0", "w1"):
        b.node(name, gpus=8, labels=WHOLE)
    b.workload("serving", "chat", replicas=replicas, nodes=["w0"])
    training(b, "elastic", replicas=4, nodes=["w1"], min_replicas=1, max_replicas=8)
    snap = b.build()
    if running:
        return snap
    pods = tuple(
        dataclasses.replace(p, phase="Pending") if p.workload == "serving/chat" else p
        for p in snap.pods
    )
    return dataclasses.replace(snap, pods=pods)


def ups(decisions: list[Decision]) -> list[tuple[str, int, int]]:
    return [
        (d.explanation.rule, d.from_replicas, d.to_replicas)
        for d in decisions
        if isinstance(d, Scale) and d.role == "inference"
    ]


def fast_and_busy(engine: Engine, snap: Snapshot, seconds: int, per_s: int) -> list[Decision]:
    """``per_s`` requests/s, every one at 20ms (far inside the 100ms objective)."""
    out: list[Decision] = []
    for s in range(seconds):
        feed_latency(engine, T0 + s, T0 + s + 1, 20.0, per_s=per_s)
        out += engine.evaluate(T0 + s + 1, snap)
    return out


def test_request_rate_scales_up_before_the_p99_turns() -> None:
    """60 requests/s at 10 a replica wants 6; chat has 2 and its P99 is 20ms: scale 2→6 on the
    rate alone. The same load without ``leading`` does nothing."""
    decisions = fast_and_busy(
        Engine(chat_policy(leading={"ratePerReplica": 10})), cluster(2), 31, 60
    )
    assert ups(decisions)[:1] == [("leading-scale-up", 2, 6)]
    first = next(d for d in decisions if isinstance(d, Scale) and d.role == "inference")
    assert first.explanation.inputs["leading_replicas"] == 6
    assert first.explanation.thresholds["rate_per_replica"] == 10
    assert "request rate" in first.explanation.reason
    assert ups(fast_and_busy(Engine(chat_policy()), cluster(2), 31, 60)) == []


def test_rate_within_capacity_does_nothing() -> None:
    """30 requests/s at 10 a replica wants 3 and chat has 4: no action, no cooldown spent."""
    engine = Engine(chat_policy(leading={"ratePerReplica": 10}))
    assert ups(fast_and_busy(engine, cluster(4), 40, 30)) == []


@pytest.mark.parametrize(
    ("per_s", "tolerance", "want"),
    [
        (42, "5%", []),  # 5% over what 4 replicas serve at 10 a replica: held
        (42, "0%", [("leading-scale-up", 4, 5)]),  # no tolerance: one more at once
        (44, "5%", [("leading-scale-up", 4, 5)]),  # 10% over: past it
    ],
)
def test_a_rate_within_the_tolerance_asks_for_no_more(
    per_s: int, tolerance: str, want: list[tuple[str, int, int]]
) -> None:
    """``leading.tolerance`` holds a scale-up ask at the current replicas while the rate is
    within it above what they serve; the threshold is in the explanation once it is past."""
    lead = {"ratePerReplica": 10, "tolerance": tolerance}
    decisions = fast_and_busy(Engine(chat_policy(leading=lead)), cluster(4), 40, per_s)
    assert ups(decisions)[:1] == want  # the snapshot stays at 4: the ask repeats after cooldown
    first = next((d for d in decisions if isinstance(d, Scale) and d.role == "inference"), None)
    if first is not None and tolerance != "0%":
        assert first.explanation.thresholds["rate_tolerance"] == tolerance


def test_scale_down_never_goes_below_the_rate() -> None:
    """chat at 8 replicas, 20ms at 40 requests/s: the P99 alone would shrink it towards the
    minimum, the rate (10 a replica, raised by the 10% tolerance: 44/s) holds it at 5."""
    down = {"stabilization": "20s", "below": "50%", "maxStep": 8, "cooldown": "1s"}
    replicas, got, reasons = 8, [], ""
    engine = Engine(chat_policy(leading={"ratePerReplica": 10}, down=down))
    without = Engine(chat_policy(down=down))
    plain = []
    for s in range(120):
        feed_latency(engine, T0 + s, T0 + s + 1, 20.0, per_s=40)
        feed_latency(without, T0 + s, T0 + s + 1, 20.0, per_s=40)
        for d in engine.evaluate(T0 + s + 1, cluster(replicas)):
            if isinstance(d, Scale) and d.role == "inference":
                got.append(d.to_replicas)
                reasons += d.explanation.reason
                replicas = d.to_replicas
        plain += [
            d.to_replicas for d in without.evaluate(T0 + s + 1, cluster(8)) if isinstance(d, Scale)
        ]
    assert got, got
    assert min(got) == 5
    assert "desired ceil(40.0 * 1.1 / 10) = 5" in reasons  # a set rate: raised by the tolerance
    assert plain, plain
    assert min(plain) < 5


@pytest.mark.parametrize("ready", [True, False])
def test_cooldown_ends_once_the_replicas_run(ready: bool) -> None:
    """Breaching for good at 2 replicas (maxStep 1): with ``readyEndsCooldown`` the next step
    comes ``breachAfter`` (10s) after the last once its replicas run, well inside the 30s
    cooldown; while they are still Pending, or without the flag, only after the cooldown."""
    for flag in (True, False):
        engine = Engine(chat_policy(maxStep=1, readyEndsCooldown=flag))
        replicas, times = 2, []
        for s in range(80):
            feed_latency(engine, T0 + s, T0 + s + 1, 500.0)
            for d in engine.evaluate(T0 + s + 1, cluster(replicas, running=ready)):
                if isinstance(d, Scale) and d.role == "inference":
                    times.append(s + 1)
                    replicas = d.to_replicas
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps, times
        if flag and ready:
            assert max(gaps) < 30
            assert min(gaps) >= 10
        else:
            assert min(gaps) >= 30


def test_leading_spec_is_checked() -> None:
    with pytest.raises(PolicyLoadError, match="ratePerReplica"):
        chat_policy(leading={"ratePerReplica": 0})
    with pytest.raises(PolicyLoadError, match="tolerance must be below 100%"):
        chat_policy(leading={"ratePerReplica": 10, "tolerance": "100%"})


def packed(training_replicas: int, training_pods: int) -> Snapshot:
    """One 16-GPU node: chat (2 replicas) and elastic training (``training_pods`` pods, of
    which ``training_replicas`` are wanted: the rest are a shrink's pods in their grace)."""
    b = SnapshotBuilder()
    b.node("w0", gpus=16, labels=WHOLE)
    b.workload("serving", "chat", replicas=2, nodes=["w0"])
    training(b, "elastic", replicas=training_pods, nodes=["w0"], min_replicas=2, max_replicas=14)
    snap = b.build()
    workloads = tuple(
        dataclasses.replace(w, replicas=training_replicas) if w.name == "elastic" else w
        for w in snap.workloads
    )
    return dataclasses.replace(snap, workloads=workloads)


@pytest.mark.parametrize("first", [True, False])
def test_shrink_first_scales_only_into_gpus_already_free(first: bool) -> None:
    """chat breaching at 5x its objective on a full node wants 10 replicas (8 GPUs): training
    shrinks 14→6. Without shrinkFirst chat goes 2→10 in the same round (its pods would wait
    for, or preempt, GPUs still held); with it chat waits, shrinks nothing more while the
    shrink's pods hold their GPUs, and scales 2→10 once they are free."""
    engine = Engine(chat_policy(readyEndsCooldown=True, shrinkFirst=first))
    phases = [(packed(14, 14), 12), (packed(6, 14), 8), (packed(6, 6), 12)]
    seen: list[tuple[int, str, int, int]] = []
    s = 0
    for snap, seconds in phases:
        for _ in range(seconds):
            feed_latency(engine, T0 + s, T0 + s + 1, 500.0)
            s += 1
            seen += [
                (s, d.target, d.from_replicas, d.to_replicas)
                for d in engine.evaluate(T0 + s, snap)
                if isinstance(d, Scale)
            ]
    targets = [(t, a, b) for _, t, a, b in seen]
    assert targets[0] == ("ml/elastic", 14, 6)
    if first:
        assert targets[:2] == [("ml/elastic", 14, 6), ("serving/chat", 2, 10)]
        assert seen[1][0] > 20  # only once the GPUs were free (the snapshot never shows chat
        # scaled, so chat's step repeats after it: not a concern here)
    else:
        assert targets[:2] == [("ml/elastic", 14, 6), ("serving/chat", 2, 10)]
        assert seen[1][0] == seen[0][0]


def test_shrink_first_needs_ready_ends_cooldown() -> None:
    with pytest.raises(PolicyLoadError, match="shrinkFirst needs readyEndsCooldown"):
        chat_policy(shrinkFirst=True)


def test_the_proactive_example_passes_its_cases() -> None:
    """examples/policy-proactive.yaml (the policy of BENCHMARKS.md's proactive rows) against
    its case file: the rate scales chat up with the P99 at a third of the objective, and with
    nothing free training shrinks while chat waits."""
    root = Path(__file__).resolve().parents[2] / "examples"
    policy = load_policy(read_sources((root / "policy-proactive.yaml",)))
    path = root / "policy-proactive.cases.yaml"
    cases, errors = load_cases(Source(str(path), path.read_text()))
    assert not errors
    assert cases is not None
    results = run_cases(policy, cases)
    assert [r.name for r in results if not r.passed] == []
    assert len(results) == 2


def test_shrink_first_frees_the_whole_climb_at_once() -> None:
    """maxStep 2 and chat wanting 10 from 2: the shrink frees the GPUs of the whole climb (8)
    in one go, since each freeing costs a grace period whatever its size; the scale-ups then
    climb 2 at a time into GPUs already free."""
    engine = Engine(chat_policy(readyEndsCooldown=True, shrinkFirst=True, maxStep=2))
    shrinks = []
    for s in range(12):
        feed_latency(engine, T0 + s, T0 + s + 1, 500.0)
        shrinks += [
            (d.from_replicas, d.to_replicas)
            for d in engine.evaluate(T0 + s + 1, packed(14, 14))
            if isinstance(d, Scale) and d.role == "training"
        ]
    assert shrinks == [(14, 6)]


@pytest.mark.parametrize("first", [True, False])
def test_shrink_first_evicts_no_pod_its_owner_recreates(first: bool) -> None:
    """chat (priority 1000) breaching on a full node whose training (priority 10) is at its
    floor: only evictions could free GPUs. Without shrinkFirst chat's new pods are queued at
    once and outrank the replacement the training's owner creates, so its pods are evicted.
    With shrinkFirst chat's replicas are created only once the GPUs are free: the replacement
    would take the GPU back at once and the next round evict again, so nothing is evicted,
    and the plan says why."""
    b = SnapshotBuilder()
    b.node("w0", gpus=8, labels=WHOLE)
    b.workload("serving", "chat", replicas=2, nodes=["w0"], priority=1000)
    training(b, "elastic", replicas=6, nodes=["w0"], min_replicas=6, max_replicas=8, priority=10)
    engine = Engine(chat_policy(readyEndsCooldown=True, shrinkFirst=first))
    decisions: list[Decision] = []
    for s in range(20):
        feed_latency(engine, T0 + s, T0 + s + 1, 500.0)
        decisions += engine.evaluate(T0 + s + 1, b.build())
    evicted = [d for d in decisions if isinstance(d, Evict)]
    if not first:
        assert evicted
        return
    assert evicted == []
    waits = plan(b.build(), 1, claimant=1000, claimant_waits=True)
    assert waits.evictions == ()
    said = [a.why_not for a in waits.rejected]
    assert any("shrinkFirst" in w and "PyTorchJob would recreate it" in w for w in said), said
    assert len(plan(b.build(), 1, claimant=1000).evictions) == 1

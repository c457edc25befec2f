"""A training shrink that failed is not planned again for a while: the breach moves on to other
victims (issue 21, item 3: a resize that keeps failing must not block the scale-up)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from policy_fixtures import T0, cluster, feed_latency, make_policy, run, training

from controller.loop.feedback import RESIZE_FAILED_HOLD_OFF_S, RETRY_HOLD_OFF_S, feed_back, settle
from controller.loop.gate import SafetyGate
from controller.loop.port import NOT_FREED, NOT_LEADER, ActionResult, Outcome, Why
from controller.loop.tick import Loop
from controller.simcluster import SimCluster, SimDelays
from controller.simcluster.sim_runtime import SimRuntime
from policies.decisions import Decision, Evict, Scale
from policies.engine import Engine
from policies.model import PoolSpec
from policies.snapshot import Snapshot, SnapshotBuilder

#: A webhook's refusal as the actuator reports it (JobSet's: replicatedJobs is immutable).
REFUSED_BY_WEBHOOK = (
    'API error: 403 Forbidden: admission webhook "vjobset.kb.io" denied the request: '
    "spec.replicatedJobs: Invalid value: …: field is immutable"
)


def full_node() -> SnapshotBuilder:
    """One 8-GPU node, full: chat (1), elastic training (4, min 2), rigid training (3, low)."""
    b = cluster(whole_nodes=1)
    training(b, "elastic", replicas=4, nodes=["w0"], min_replicas=2, max_replicas=4, priority=50)
    training(b, "rigid", replicas=3, nodes=["w0"], priority=10)
    return b


def shrinks(decisions: Sequence[Decision]) -> list[str]:
    return [d.workload for d in decisions if isinstance(d, Scale) and d.role == "training"]


def answer(decisions: Sequence[Decision], shrink: ActionResult | None) -> list[ActionResult]:
    """The shrink ends as ``shrink`` says, evictions are applied, and a scale-up whose GPUs were
    not freed is refused, as the tick does (``controller.loop.tick``)."""
    out = []
    for d in decisions:
        if isinstance(d, Scale) and d.role == "training" and shrink is not None:
            out.append(dataclasses.replace(shrink, decision=d))
        elif isinstance(d, Scale) and d.role != "training" and shrink is not None:
            detail = f"{NOT_FREED}: scale {shrink.outcome}"
            out.append(ActionResult(d, Outcome.REFUSED, detail, why=Why.NOT_FREED))
        else:
            out.append(ActionResult(d, Outcome.APPLIED, "done"))
    return out


@pytest.mark.parametrize(
    ("outcome", "detail", "transient", "why", "shrunk_again"),
    [
        pytest.param(
            Outcome.FAILED, REFUSED_BY_WEBHOOK, False, None, False, id="failed-is-held-off"
        ),
        pytest.param(
            Outcome.FAILED,
            "API error: 409 Conflict",
            True,
            None,
            True,
            id="failed-transiently-is-retried",
        ),
        pytest.param(
            Outcome.REFUSED, NOT_LEADER, False, Why.NOT_LEADER, True, id="not-leader-is-tried-again"
        ),
        pytest.param(
            Outcome.BLOCKED, "refused by a PDB", False, None, True, id="blocked-is-tried-again"
        ),
    ],
)
def test_a_failed_shrink_is_not_planned_again_and_other_victims_are(
    outcome: Outcome, detail: str, transient: bool, why: Why | None, shrunk_again: bool
) -> None:
    """After a FAILED shrink the next try evicts instead and says why the workload was passed
    over; an outcome that may well succeed next time (not the leader, a conflict or a server
    error) shrinks it again."""
    engine = Engine(make_policy())
    snap = full_node().build()
    t, first = next((t, ds) for t, ds in run(engine, snap, T0, T0 + 30, 150.0) if ds)
    assert shrinks(first) == ["ml/elastic"]
    result = ActionResult(first[0], outcome, detail, transient=transient, why=why)
    feed_back(engine, settle(answer(first, result), now=t))
    t2, second = next((t2, ds) for t2, ds in run(engine, snap, t, t + 200, 150.0) if ds)
    assert t2 <= t + RETRY_HOLD_OFF_S + 1
    if shrunk_again:
        assert shrinks(second) == ["ml/elastic"]
        return
    assert shrinks(second) == []
    evicted = [d for d in second if isinstance(d, Evict)]
    assert [d.pod for d in evicted] == ["ml/rigid-0"]
    why = {a.option: a.why_not for a in evicted[0].explanation.alternatives}
    assert why["shrink ml/elastic"] == f"held off after its resize failed: {REFUSED_BY_WEBHOOK}"
    assert any(isinstance(d, Scale) and d.workload == "serving/chat" for d in second)


def test_the_hold_off_ends() -> None:
    """Once :data:`RESIZE_FAILED_HOLD_OFF_S` has passed the workload is a shrink victim again."""
    engine = Engine(make_policy())
    snap = full_node().build()
    t, first = next((t, ds) for t, ds in run(engine, snap, T0, T0 + 30, 150.0) if ds)
    failed = ActionResult(first[0], Outcome.FAILED, REFUSED_BY_WEBHOOK)
    feed_back(engine, settle(answer(first, failed), now=t))
    later = t + RESIZE_FAILED_HOLD_OFF_S
    again = [ds for _, ds in run(engine, snap, later - 5, later + 60, 150.0, step=5.0) if ds]
    assert again
    assert shrinks(again[0]) == ["ml/elastic"]


class _RigidOwner(SimCluster):
    """A simulated cluster whose training owner refuses every resize (JobSet's webhook)."""

    def _apply_scale(self, d: Scale) -> tuple[Outcome, str]:
        if d.role == "training":
            return Outcome.FAILED, REFUSED_BY_WEBHOOK
        return super()._apply_scale(d)


async def test_through_the_simulated_cluster_a_resize_that_always_fails_does_not_block() -> None:
    """Ten minutes of a breach whose only elastic victim can never be resized: one failed
    shrink (not one per hold-off), then evictions, and the service is scaled up."""
    snap: Snapshot = full_node().build()
    pools = {"whole": PoolSpec(node_selector={"ebbtide.io/pool": "whole"}, kind="whole")}
    sim = _RigidOwner(
        snap, delays=SimDelays(eviction_grace_s=15, pod_startup_s=5), start=T0, pools=pools
    )
    policy = make_policy()
    engine = Engine(policy)
    gate = SafetyGate(policy, clock=lambda: sim.now, ledger=engine.ledger)
    loop = Loop(engine, SimRuntime(sim, gate))
    results: list[ActionResult] = []
    for t in range(int(T0) + 5, int(T0) + 605, 5):
        feed_latency(engine, t - 5, t, 150.0)
        results += await loop.tick(t)
    failed = [r for r in results if r.outcome is Outcome.FAILED]
    evicted = [r for r in results if isinstance(r.decision, Evict) and r.outcome is Outcome.APPLIED]
    (chat,) = (w for w in sim.snapshot().workloads if w.key == "serving/chat")
    assert len(failed) == 1
    assert evicted
    assert chat.replicas > 1

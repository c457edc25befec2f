"""One checkpoint notice per need at a time (issue 21, item 5b): a breach whose victim is
writing its checkpoint does not notice another pod at every try; pods that need no notice may
still be evicted meanwhile."""

from __future__ import annotations

from collections.abc import Sequence

from policy_fixtures import T0, TRAINING, cluster, make_policy, run

from controller.loop.feedback import feed_back, settle
from controller.loop.port import NOT_FREED, ActionResult, Outcome, Why
from policies.checkpoint import FOR, HANDSHAKE, NOTICE, stamp
from policies.decisions import Decision, Evict, Explanation, Scale
from policies.engine import Engine
from policies.snapshot import Snapshot

ASKED = {HANDSHAKE: "true"}
NOTICED = (Outcome.IN_PROGRESS, "preemption notice given; checkpoint within 300s")
WAIT = (Outcome.BLOCKED, "waiting for a checkpoint acknowledgement until 2026-01-01T00:05:00Z")


def node(noticed_at: float | None = None, *, gone: Sequence[str] = ()) -> Snapshot:
    """One full 8-GPU node: chat (1), five opted-in training pods ``ask-0…4`` (priority 10,
    first victims) and two plain ones ``plain-0, plain-1`` (priority 20). With ``noticed_at``,
    ``ask-0`` carries chat's notice from then; pods in ``gone`` were evicted."""
    b = cluster(whole_nodes=1)
    for i in range(5):
        notice = {NOTICE: stamp(noticed_at), FOR: "serving/chat"} if noticed_at and i == 0 else {}
        b.pod("ml", f"ask-{i}", node="w0", gpus=1, priority=10, labels=TRAINING,
              annotations={**ASKED, **notice})  # fmt: skip
    for i in range(2):
        if f"ml/plain-{i}" not in gone:
            b.pod("ml", f"plain-{i}", node="w0", gpus=1, priority=20, labels=TRAINING)
    return b.build()


def evicted(decisions: Sequence[Decision]) -> list[str]:
    return [d.pod for d in decisions if isinstance(d, Evict)]


def outcomes(decisions: Sequence[Decision], notice: str) -> list[ActionResult]:
    """The actuator's answers: the notice under way (the pod checkpoints), a wait blocked,
    other evictions applied, the scale-up refused while its GPUs are not free."""
    out = []
    for d in decisions:
        if isinstance(d, Evict) and d.pod == "ml/ask-0":
            out.append(ActionResult(d, *(WAIT if notice == "wait" else NOTICED)))
        elif isinstance(d, Evict):
            out.append(ActionResult(d, Outcome.APPLIED, "evicted"))
        elif isinstance(d, Scale):
            detail = f"{NOT_FREED}: evict in_progress"
            out.append(ActionResult(d, Outcome.REFUSED, detail, why=Why.NOT_FREED))
    return out


def test_one_notice_per_need_at_a_time_across_tries() -> None:
    """Two GPUs needed, five opted-in victims first in order: one is noticed, a plain pod is
    evicted beside it; while the notice stands (its pod held after a "wait") the next tries
    notice no other pod, and the notice keeps its eviction unit."""
    engine = Engine(make_policy())
    t, first = next((t, ds) for t, ds in run(engine, node(), T0, T0 + 30, 250.0) if ds)
    assert evicted(first) == ["ml/ask-0", "ml/plain-0"]
    why = {
        a.option: a.why_not
        for d in first
        if isinstance(d, Evict)
        for a in d.explanation.alternatives
    }
    assert why["evict ml/ask-1"] == "one checkpoint notice per need at a time: waiting on ml/ask-0"
    feed_back(engine, settle(outcomes(first, "notice"), now=t))
    assert engine.budget_states(t)[0].used == 2  # the notice counts: it is under way
    snap = node(t, gone=["ml/plain-0"])  # the watch shows the notice on ask-0
    t2, second = next((t2, ds) for t2, ds in run(engine, snap, t, t + 30, 250.0) if ds)
    assert evicted(second) == ["ml/ask-0"]  # the noticed pod again: the actuator waits
    feed_back(engine, settle(outcomes(second, "wait"), now=t2))  # ask-0 is held off for a while
    later = [ds for _, ds in run(engine, snap, t2, t2 + 50, 250.0) if ds]
    noticed = {p for ds in later for p in evicted(ds) if p.startswith("ml/ask-")}
    assert noticed == set(), f"another pod was noticed while ask-0's notice stands: {noticed}"
    assert evicted(later[0]) == ["ml/plain-1"]  # a pod that needs no notice may go


def test_a_restarted_engine_reads_the_notice_from_the_pod_and_an_expired_one_is_none() -> None:
    """A fresh engine (a restarted controller) finds chat's standing notice on ask-0 and
    notices no other pod; a notice days old stands for nothing: ask-0 is noticed afresh."""
    for noticed_at, standing in ((T0, True), (T0 - 3 * 86400, False)):
        engine = Engine(make_policy())
        if standing:  # the actuator said "wait" since the restart: ask-0 is held off
            why = "waiting for a checkpoint acknowledgement"
            engine.not_done(_evict("ml/ask-0"), reason=why, hold_until=T0 + 600)
        snap = node(noticed_at)
        _, first = next((t, ds) for t, ds in run(engine, snap, T0, T0 + 30, 250.0) if ds)
        asked = [p for p in evicted(first) if p.startswith("ml/ask-")]
        assert asked == ([] if standing else ["ml/ask-0"])


def _evict(pod: str) -> Evict:
    return Evict(T0, pod, "w0", None, 15.0, Explanation.of("test", "a test decided it"))

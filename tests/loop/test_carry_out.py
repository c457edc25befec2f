"""The tick's carry-out, as a table (as Kueue tests its preemption): for a round of decisions
and what the cluster answers, which are applied, which refused and why, and which refusals
the cluster adapter is told of."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from controller.loop.port import NOT_FREED, NOT_LEADER, ActionResult, Cluster, Outcome, Why
from controller.loop.tick import Loop, run_now
from policies.decisions import Decision, Evict, Explanation, Scale
from policies.engine import Engine
from policies.loader import load_policy_text
from policies.model import Policy
from policies.snapshot import Snapshot, SnapshotBuilder

WHY = Explanation.of("test", "test")
LIBRARY = Path(__file__).resolve().parents[2] / "policies" / "library"


@cache
def policy_for_loop() -> Policy:
    return load_policy_text((LIBRARY / "balanced.yaml").read_text(), "balanced.yaml")


T = 1_800_000_000.0


def evict(pod: str, cause: str = "serving/chat") -> Evict:
    return Evict(T, pod, "gpu-0", "ml/train", 30.0, WHY, cause=cause)


def up(service: str = "serving/chat", cause: str = "serving/chat") -> Scale:
    return Scale(T, service, "Deployment", 1, 2, "inference", WHY, cause=cause)


def down(service: str = "serving/chat", cause: str = "serving/chat") -> Scale:
    return Scale(T, service, "Deployment", 2, 1, "inference", WHY, cause=cause)


def shrink(workload: str = "ml/train", cause: str = "serving/chat") -> Scale:
    return Scale(T, workload, "PyTorchJob", 4, 2, "training", WHY, cause=cause)


@dataclass
class ScriptedCluster:
    """Answers each decision as scripted by its target (default: applied)."""

    answers: dict[str, Outcome | Exception]
    applied: list[str] = field(default_factory=list)
    reported: list[tuple[str, Why | None]] = field(default_factory=list)

    @property
    def synced(self) -> bool:
        return True

    def snapshot(self) -> Snapshot:
        return SnapshotBuilder().build()

    async def apply(self, decisions: Sequence[Decision]) -> list[ActionResult]:
        out = []
        for d in decisions:
            answer = self.answers.get(d.target, Outcome.APPLIED)
            if isinstance(answer, Exception):
                raise answer
            self.applied.append(d.target)
            out.append(ActionResult(d, answer, answer.value))
        return out

    async def report(self, result: ActionResult) -> None:
        self.reported.append((result.decision.target, result.why))


@dataclass
class Runtime:
    cluster_: ScriptedCluster
    leader: bool = True

    @property
    def cluster(self) -> Cluster:
        return self.cluster_

    def is_leader(self) -> bool:
        return self.leader

    def reconfigure(self, policy: Policy) -> None: ...

    async def run(self) -> None: ...

    async def tick(self, now: float) -> list[ActionResult]:
        return []

    async def close(self) -> None: ...


@dataclass
class Journal:
    unrestored: str | None = None
    intent_fails: str | None = None
    intended: list[str] = field(default_factory=list)

    def refusal(self) -> str | None:
        return self.unrestored

    async def intend(self, decision: Decision) -> str | None:
        if self.intent_fails is None:
            self.intended.append(decision.target)
        return self.intent_fails

    def settle(self, results: Sequence[ActionResult]) -> None: ...


CASES = [
    pytest.param(
        [evict("ml/p0"), up()], {}, {}, ["applied", "applied"], [None, None], [], id="all-applied"
    ),
    pytest.param(
        [evict("ml/p0"), up()],
        {"ml/p0": Outcome.BLOCKED},
        {},
        ["blocked", "refused"],
        [None, Why.NOT_FREED],
        [("serving/chat", Why.NOT_FREED)],
        id="freeing-blocked-scale-up-refused",
    ),
    pytest.param(
        [evict("ml/p0"), up()],
        {"ml/p0": Outcome.IN_PROGRESS},
        {},
        ["in_progress", "refused"],
        [None, Why.NOT_FREED],
        [("serving/chat", Why.NOT_FREED)],
        id="checkpoint-notice-under-way-scale-up-waits",
    ),
    pytest.param(
        [shrink(), up()],
        {"ml/train": Outcome.FAILED},
        {},
        ["failed", "refused"],
        [None, Why.NOT_FREED],
        [("serving/chat", Why.NOT_FREED)],
        id="shrink-failed-scale-up-refused",
    ),
    pytest.param(
        [evict("ml/p0"), down()],
        {"ml/p0": Outcome.BLOCKED},
        {},
        ["blocked", "applied"],
        [None, None],
        [],
        id="only-a-scale-up-waits-for-freeing",
    ),
    pytest.param(
        [evict("ml/p0", cause="serving/other"), up()],
        {"ml/p0": Outcome.BLOCKED},
        {},
        ["blocked", "applied"],
        [None, None],
        [],
        id="another-services-freeing-does-not-matter",
    ),
    pytest.param(
        [evict("ml/p0"), up()],
        {},
        {"leader": False},
        ["refused", "refused"],
        [Why.NOT_LEADER, Why.NOT_LEADER],
        [],
        id="a-follower-refuses-silently",
    ),
    pytest.param(
        [up()],
        {},
        {"unrestored": "the decisions log was not read back: timeout"},
        ["refused"],
        [Why.NOT_RESTORED],
        [],
        id="not-read-back-no-action",
    ),
    pytest.param(
        [up()],
        {},
        {"intent_fails": "broker down"},
        ["refused"],
        [Why.NOT_JOURNALED],
        [("serving/chat", Why.NOT_JOURNALED)],
        id="intent-not-recorded-refused-and-reported",
    ),
    pytest.param(
        [evict("ml/p0"), up()],
        {"ml/p0": RuntimeError("bug")},
        {},
        ["failed", "refused"],
        [None, Why.NOT_FREED],
        [("serving/chat", Why.NOT_FREED)],
        id="an-adapter-crash-fails-the-decision-only",
    ),
]


@pytest.mark.parametrize(("decisions", "answers", "setup", "outcomes", "whys", "reported"), CASES)
def test_carry_out(
    decisions: list[Decision],
    answers: dict[str, Outcome | Exception],
    setup: dict[str, object],
    outcomes: list[str],
    whys: list[Why | None],
    reported: list[tuple[str, Why | None]],
) -> None:
    cluster = ScriptedCluster(answers)
    runtime = Runtime(cluster, leader=bool(setup.get("leader", True)))
    journal = Journal(
        unrestored=setup.get("unrestored"),  # type: ignore[arg-type]
        intent_fails=setup.get("intent_fails"),  # type: ignore[arg-type]
    )
    loop = Loop(Engine(policy_for_loop()), runtime, journal=journal)  # type: ignore[arg-type]
    results = run_now(loop.carry_out(decisions))
    assert [r.outcome.value for r in results] == outcomes
    assert [r.why for r in results] == whys
    assert cluster.reported == reported
    refused_before = {r.decision.target for r in results if r.why is not None}
    assert not refused_before & set(cluster.applied), "a refused decision reached the cluster"
    for r in results:
        if r.why is Why.NOT_FREED:
            assert r.detail.startswith(NOT_FREED)
        if r.why is Why.NOT_LEADER:
            assert r.detail == NOT_LEADER


def test_a_dry_run_process_marks_every_decision_before_the_cluster_sees_it() -> None:
    seen: list[bool] = []

    class Recording(ScriptedCluster):
        async def apply(self, decisions: Sequence[Decision]) -> list[ActionResult]:
            seen.extend(d.dry_run for d in decisions)
            return await super().apply(decisions)

    class OneDecision(Engine):
        def evaluate(self, now: float, snapshot: Snapshot) -> list[Decision]:
            return [up()]

    runtime = Runtime(Recording({}))
    loop = Loop(OneDecision(policy_for_loop()), runtime, dry_run=True)  # type: ignore[arg-type]
    run_now(loop.tick(T))
    assert seen == [True]


def test_run_now_refuses_a_coroutine_that_waits() -> None:
    class Suspend:
        """What awaiting a socket does: give control back to the event loop."""

        def __await__(self) -> Generator[None, None, None]:
            yield

    async def waits() -> None:
        await Suspend()

    with pytest.raises(RuntimeError, match="waited on I/O"):
        run_now(waits())


def test_a_held_decision_is_refused_before_its_intent_and_frees_nothing() -> None:
    """A paused service (``hold``) refuses its own decisions before the intent is written, and
    a scale-up waiting on a held eviction is refused as not freed."""
    cluster = ScriptedCluster({})
    journal = Journal()
    held = {"ml/p0": "serving/chat is paused (ebbtide.io/paused)"}
    loop = Loop(
        Engine(policy_for_loop()),
        Runtime(cluster),  # type: ignore[arg-type]
        journal=journal,
        hold=lambda d: held.get(d.target),
    )
    results = run_now(loop.carry_out([evict("ml/p0"), up()]))
    assert (results[0].outcome.value, results[0].detail) == ("refused", held["ml/p0"])
    assert results[1].why is Why.NOT_FREED
    assert journal.intended == []
    assert cluster.applied == []

"""The ledger: one verdict per decision id, read the same way from the engine, the gate's
outcomes and the decisions log; and an action that did not happen starts no cooldown."""

from __future__ import annotations

import pytest
from policy_fixtures import T0, cluster, make_policy, run, training, util
from test_engine import breach_cluster

from policies.budgets import Ledger, LogRecord
from policies.decisions import Evict, Explanation, Scale, decision_to_dict
from policies.engine import Engine
from support.engine_probes import cooldown_remaining

SPEC = make_policy().spec.budgets  # evictions 4/10m, scale 20/10m, MIG 2/1h


def rec(outcome: str, *, id: str, at: float = T0, action: str = "evict") -> LogRecord:
    return LogRecord(id=id, at=at, action=action, cause=None, outcome=outcome)


def used(ledger: Ledger, action: str, now: float = T0 + 1) -> int:
    return ledger.budgets.for_action(action).used(now)


@pytest.mark.parametrize(
    ("records", "evictions"),
    [
        pytest.param(
            [rec("intent", id=f"evict:ml/p{i}@{T0:.3f}") for i in range(4)],
            4,
            id="four-evictions-in-one-round-count-four",
        ),
        pytest.param(
            [rec("intent", id="a"), rec("applied", id="a"), rec("intent", id="a")],
            1,
            id="intent-outcome-and-echo-count-once",
        ),
        pytest.param(
            [rec("intent", id="a"), rec("blocked", id="a"), rec("intent", id="a")],
            0,
            id="a-refusal-is-final-an-intent-echo-after-it-changes-nothing",
        ),
        pytest.param([rec("intent", id="a")], 1, id="an-intent-without-outcome-counts"),
        pytest.param(
            [rec("intent", id="a"), rec("dry_run", id="a")], 1, id="unknown-outcomes-are-ignored"
        ),
    ],
)
def test_log_records_give_one_verdict_per_decision(
    records: list[LogRecord], evictions: int
) -> None:
    """However often and in whatever order a decision's records are read, it counts once,
    and not at all once an outcome says it did not happen."""
    ledger = Ledger(SPEC)
    for r in records:
        ledger.record(r)
    assert used(ledger, "evict") == evictions


def test_a_mig_flow_finished_on_a_later_tick_counts_once_and_a_failed_one_not_at_all() -> None:
    """Intent at decision time, in_progress when the flow starts, the outcome minutes later:
    all under one id, one conversion. A flow that rolled back gives its unit back."""
    ledger = Ledger(SPEC)
    for outcome, at in (("intent", T0), ("in_progress", T0 + 0.2), ("applied", T0 + 300)):
        ledger.record(rec(outcome, id="conv-1", at=at, action="mig_convert"))
    assert used(ledger, "mig_convert", T0 + 301) == 1
    for outcome, at in (("intent", T0 + 400), ("in_progress", T0 + 400), ("failed", T0 + 900)):
        ledger.record(rec(outcome, id="conv-2", at=at, action="mig_convert"))
    assert used(ledger, "mig_convert", T0 + 901) == 1


def test_records_from_before_decision_ids_get_the_id_the_decision_now_has() -> None:
    """A record written without ``id`` joins the records of the same decision that have one."""
    d = Evict(T0, "ml/p0", "w0", "ml/job", 15.0, Explanation.of("r", "why"))
    old = decision_to_dict(d) | {"outcome": "intent"}
    del old["id"]
    assert LogRecord.of(old).id == d.id
    ledger = Ledger(SPEC)
    ledger.record(LogRecord.of(old))
    ledger.record(LogRecord.of(decision_to_dict(d) | {"outcome": "refused"}))
    assert used(ledger, "evict") == 0


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param({"action": "evict", "target": "x", "outcome": "intent"}, id="no-ts"),
        pytest.param({"ts": "soon", "action": "evict", "target": "x", "outcome": "x"}, id="bad-ts"),
        pytest.param({"ts": 1.0, "target": "x", "outcome": "intent"}, id="no-action"),
    ],
)
def test_a_malformed_record_is_a_value_error(raw: dict[str, object]) -> None:
    """The caller logs and skips it; it never crashes the reader."""
    with pytest.raises(ValueError, match=r"decisions-log record|could not convert"):
        LogRecord.of(raw)


def test_engine_and_a_restored_ledger_agree() -> None:
    """A new engine that reads back another replica's intents refuses past the budget what the
    first engine would: one ledger, read the same way."""
    first = Engine(make_policy())
    decisions = [
        d for _, ds in run(first, breach_cluster(), T0, T0 + 15, 900.0) for d in ds if d.action
    ]
    evicts = [d for d in decisions if isinstance(d, Evict)]
    assert len(evicts) == 4
    second = Engine(make_policy())
    for d in decisions:
        second.record(LogRecord.of(decision_to_dict(d) | {"outcome": "intent"}))
    (evictions, *_) = second.budget_states(T0 + 16)
    assert (evictions.used, evictions.remaining) == (4, 0)
    assert cooldown_remaining(second, "serving/chat", T0 + 16) == pytest.approx(25.0)


def test_a_refused_response_retries_after_the_hold_off_not_the_cooldown() -> None:
    """A breach response whose actions were refused (a PDB said no, so the scale-up was not
    applied) gives back its budget and its cooldown: the service is decided for again once the
    hold-off has passed, not a whole cooldown later; a response that happened keeps it."""
    policy = make_policy(cooldowns={"service": "5m", "trainingGrow": "60s"})
    engine = Engine(policy)
    snap = breach_cluster()
    rounds = [(t, ds) for t, ds in run(engine, snap, T0, T0 + 12, 900.0) if ds]
    t, decisions = rounds[0]
    assert cooldown_remaining(engine, "serving/chat", t) > 0
    for d in decisions:
        engine.not_done(d, reason="blocked by a PodDisruptionBudget", retry_at=t + 20)
    assert cooldown_remaining(engine, "serving/chat", t + 1) == pytest.approx(19.0)
    assert engine.budget_states(t)[0].used == 0
    again = [(t2, ds) for t2, ds in run(engine, snap, t + 1, t + 25, 900.0) if ds]
    assert again, "the service was not decided for again after the hold-off"
    assert again[0][0] == t + 20


def test_a_failed_mig_flow_gives_its_unit_back_but_holds_its_node_off() -> None:
    """A conversion that failed no longer counts against the MIG budget, but its node is not
    planned again before the hold ends (another try would drain its training and likely fail
    again); other nodes may be converted meanwhile."""
    from test_mig_and_budgets import idle_run

    from policies.decisions import MigConvert
    from policies.snapshot import SnapshotBuilder

    engine = Engine(make_policy())
    b = SnapshotBuilder()
    for i in range(2):
        b.node(f"w{i}", gpus=2, labels={"ebbtide.io/pool": "whole"})
    snap = b.build()
    first = next(d for _, d in idle_run(engine, snap, seconds=600) if isinstance(d, MigConvert))
    engine.not_done(first, reason="the MIG manager reported failed", hold_until=T0 + 4000)
    assert engine.budget_states(T0 + 601)[2].used == 0
    later = []
    for s in range(630, 1800, 30):
        for node in snap.nodes:
            for gpu in node.gpus:
                engine.observe(util(T0 + s, node.name, gpu.index, 1.0))
        later += [d.target for d in engine.evaluate(T0 + s, snap) if isinstance(d, MigConvert)]
    assert later, "the other node was not converted meanwhile"
    assert first.target not in later


def grow_cluster() -> object:
    """Chat on w0, elastic training on w1 with six GPUs idle beside it, room to grow."""
    b = cluster(whole_nodes=2)
    training(b, "batch", replicas=2, nodes=["w1"], max_replicas=4)
    return b.build()


@pytest.mark.parametrize(
    ("outcome", "next_grow"),
    [
        pytest.param("applied", T0 + 360, id="a-grow-that-happened-holds-the-pool-cooldown"),
        pytest.param("refused", T0 + 121, id="a-refused-grow-gives-the-pool-cooldown-back"),
    ],
)
def test_a_grow_read_back_holds_its_pools_grow_cooldown(outcome: str, next_grow: float) -> None:
    """A new engine that reads back another replica's grow does not grow that pool again
    within ``cooldowns.trainingGrow`` of it (issue 21, item 13); a refused grow does not hold."""
    policy = make_policy(mig=None, cooldowns={"service": "30s", "trainingGrow": "5m"})
    snap = grow_cluster()
    first = Engine(policy)
    assert first.evaluate(T0, snap) == []  # the pool's GPUs go free: growAfter 60s from now
    (grow,) = first.evaluate(T0 + 60, snap)
    assert isinstance(grow, Scale)
    assert grow.explanation.rule == "grow-training"
    second = Engine(policy)
    for written in ("intent", outcome):
        second.record(LogRecord.of(decision_to_dict(grow) | {"outcome": written}))
    assert second.evaluate(T0 + 61, snap) == []  # its own growAfter starts
    grows = [t for t in range(int(T0) + 62, int(T0) + 400) if second.evaluate(t, snap)]
    assert grows[0] == next_grow


def test_a_grow_refused_here_waits_the_hold_off_not_the_pools_cooldown() -> None:
    """A grow the cluster refused starts no training-grow cooldown: the pool is grown again
    once the hold-off has passed, as a read-back refusal would allow."""
    elastic = {"growAfter": "10s", "growStep": 1}
    policy = make_policy(
        mig=None,
        cooldowns={"service": "30s", "trainingGrow": "5m"},
        training={"selector": {"ebbtide.io/class": "training"}, "elastic": elastic},
    )
    snap = grow_cluster()
    engine = Engine(policy)
    assert engine.evaluate(T0, snap) == []
    (grow,) = engine.evaluate(T0 + 10, snap)
    engine.not_done(grow, reason="refused", retry_at=T0 + 70)
    grows = [t for t in range(int(T0) + 11, int(T0) + 400) if engine.evaluate(t, snap)]
    assert grows[0] == T0 + 70

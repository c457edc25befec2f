"""Restart-aware training decisions, decided on a snapshot (Kueue-style tables).

A DDP/elastic job (any kind but ``Job``) restarts every worker from its last checkpoint on any
membership change; a ``Job``'s pods are sweep tasks that restart alone. The tables check the
decisions that follow from pricing that: tasks preempted before a DDP job is resized when that
loses less, one grow into every idle GPU instead of steps, no grow back within
``regrowAfter`` of a shrink, a grow deferred to just after a checkpoint due soon, and a grow
refused when the GPUs it adds do not pay its restart back.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from policy_fixtures import BASE, T0, TRAINING, WHOLE, make_policy, plan

from policies.budgets import Budgets, Cooldowns
from policies.checkpoint import LAST_CHECKPOINT, Notices, stamp
from policies.decisions import Scale
from policies.inventory import Inventory
from policies.loader import PolicyLoadError
from policies.pool_rules import grow_training
from policies.preemption import Plan
from policies.rules import Round
from policies.snapshot import Snapshot, SnapshotBuilder

CLAIMANT = 1000
"""Priority of the pods GPUs are freed for (above every training pod here)."""


def policy(elastic: dict[str, Any] | None = None, restarts: dict[str, Any] | None = None) -> Any:
    spec = copy.deepcopy(BASE["spec"]["training"])
    spec["elastic"] = {**spec["elastic"], **(elastic or {})}
    if restarts is not None:
        spec["restarts"] = restarts
    return make_policy(training=spec)


def sweep(
    b: SnapshotBuilder,
    *,
    replicas: int,
    node: str,
    created: float,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
) -> SnapshotBuilder:
    """A ``Job`` of one-GPU sweep tasks at priority 10."""
    ann = {}
    if min_replicas is not None:
        ann["ebbtide.io/min-replicas"] = str(min_replicas)
    if max_replicas is not None:
        ann["ebbtide.io/max-replicas"] = str(max_replicas)
    return b.workload(
        "ml",
        "sweep",
        kind="Job",
        replicas=replicas,
        labels=TRAINING,
        annotations=ann,
        priority=10,
        created=created,
        nodes=[node],
    )


def nodes(n: int) -> SnapshotBuilder:
    b = SnapshotBuilder()
    for i in range(n):
        b.node(f"w{i}", gpus=8, labels=WHOLE)
    return b


def free(snap: Snapshot, needed: int, *, now: float, restarts: dict[str, Any] | None) -> Plan:
    return plan(
        snap,
        needed,
        policy=policy(restarts=restarts),
        notices=Notices("serving/chat", now, 300.0),
        claimant=CLAIMANT,
    )


NOW = T0 + 7200.0
TASKS_FIRST = {"tasksFirst": True}


def pretrain(b: SnapshotBuilder, *, replicas: int = 8, checkpointed: float | None = None) -> Any:
    """A PyTorchJob of one-GPU workers on w0 (elastic 4..8), started 20 minutes before NOW;
    with ``checkpointed``, its workers report that checkpoint."""
    return b.workload(
        "ml",
        "pretrain",
        kind="PyTorchJob",
        replicas=replicas,
        labels=TRAINING,
        annotations={"ebbtide.io/min-replicas": "4", "ebbtide.io/max-replicas": "8"},
        priority=100,
        created=NOW - 1200,
        nodes=["w0"],
        pod_annotations=None if checkpointed is None else {LAST_CHECKPOINT: stamp(checkpointed)},
    )


PLANS = [
    pytest.param(
        sweep(pretrain(nodes(2)), replicas=4, node="w1", created=NOW - 600, min_replicas=4),
        2,
        TASKS_FIRST,
        [],
        ["ml/sweep-0", "ml/sweep-1"],
        "resize ml/pretrain",
        id="tasks-before-ddp-resize",
    ),
    pytest.param(
        sweep(pretrain(nodes(2)), replicas=4, node="w1", created=NOW - 600, min_replicas=4),
        2,
        None,
        [("ml/pretrain", 8, 6)],
        [],
        None,
        id="off-by-default-ddp-shrinks",
    ),
    pytest.param(
        # the job checkpointed just now: its restart loses 8 GPUs x 2m = 0.27 GPU-h; two tasks
        # 25m into their half hour lose 0.83 GPU-h
        sweep(
            pretrain(nodes(2), checkpointed=NOW),
            replicas=4,
            node="w1",
            created=NOW - 1500,
            min_replicas=4,
        ),
        2,
        TASKS_FIRST,
        [("ml/pretrain", 8, 6)],
        [],
        "preempt tasks instead of resizing ml/pretrain",
        id="ddp-resize-when-cheaper",
    ),
    pytest.param(
        sweep(pretrain(nodes(2)), replicas=1, node="w1", created=NOW - 600, min_replicas=1),
        3,
        TASKS_FIRST,
        [("ml/pretrain", 8, 5)],
        [],
        "tasks alone free too little",
        id="tasks-too-few",
    ),
]


@pytest.mark.parametrize(("snap", "needed", "restarts", "shrinks", "evicts", "note"), PLANS)
def test_victims_priced(
    snap: SnapshotBuilder,
    needed: int,
    restarts: dict[str, Any] | None,
    shrinks: list[tuple[str, int, int]],
    evicts: list[str],
    note: str | None,
) -> None:
    """A plan that would restart a DDP job is weighed against preempting sweep tasks."""
    p = free(snap.build(), needed, now=NOW, restarts=restarts)
    assert [(s.workload, s.from_replicas, s.to_replicas) for s in p.shrinks] == shrinks
    assert sorted(v.pod.key for v in p.evictions) == evicts
    assert p.freed >= needed
    said = " | ".join(f"{a.option}: {a.why_not}" for a in p.rejected)
    if note is None:
        assert "resiz" not in said
    else:
        assert note in said


def grow(
    snap: Snapshot,
    *,
    elastic: dict[str, Any] | None = None,
    restarts: dict[str, Any] | None = None,
    shrunk_at: float | None = None,
    now: float = NOW,
) -> tuple[list[tuple[str, int, int]], float, str]:
    """The grows one round decides with the pool idle since long before ``now``, the round's
    hold time, and its alternatives."""
    pol = policy(elastic, restarts)
    rnd = Round(
        now=now,
        policy=pol,
        inv=Inventory(snap, pol),
        budgets=Budgets(pol.spec.budgets),
        cooldowns=Cooldowns(),
        disrupted={} if shrunk_at is None else {"ml/pretrain": (shrunk_at,)},
    )
    held = grow_training(rnd, busy_pools=set(), free_since={"whole": now - 3600})
    scales = [d for d in rnd.decisions if isinstance(d, Scale)]
    why = " | ".join(f"{a.option}: {a.why_not}" for d in scales for a in d.explanation.alternatives)
    return [(d.workload, d.from_replicas, d.to_replicas) for d in scales], held, why


def idle_cluster(*, checkpointed: float | None = None) -> Snapshot:
    """pretrain at 4 of 8 on w0 (4 GPUs idle there), sweep at 2 of 6 on w1 (6 idle)."""
    b = pretrain(nodes(2), replicas=4, checkpointed=checkpointed)
    return sweep(b, replicas=2, node="w1", created=NOW - 600, max_replicas=6).build()


GROWS = [
    pytest.param({}, None, None, [("ml/pretrain", 4, 5)], math.inf, id="step-by-default"),
    pytest.param({"growTo": "idle"}, None, None, [("ml/pretrain", 4, 8)], math.inf, id="once"),
    pytest.param(
        {"growTo": "idle"},
        None,
        NOW - 1800,
        [("ml/sweep", 2, 6)],
        NOW - 1800 + 3600,
        id="hysteresis-sweep-instead",
    ),
    pytest.param(
        {"growTo": "idle", "regrowAfter": "20m"},
        None,
        NOW - 1800,
        [("ml/pretrain", 4, 8)],
        math.inf,
        id="hysteresis-over",
    ),
    pytest.param(
        # +4 GPUs for 1h = 4 GPU-h; its restart: 8 GPUs x 2m + its 4 GPUs x the 18m since it
        # started training (created 20m ago, 2m restart) = 1.5 GPU-h
        {"growTo": "idle"},
        {"payback": "1h"},
        None,
        [("ml/pretrain", 4, 8)],
        math.inf,
        id="payback-met",
    ),
    pytest.param(
        # +1 GPU for 1h = 1 GPU-h < the 1.4 GPU-h its restart loses: the sweep grows instead,
        # and the rule looks again at its next checkpoint, 30m - 18m from now
        {"growStep": 1},
        {"payback": "1h"},
        None,
        [("ml/sweep", 2, 3)],
        NOW + 720,
        id="payback-not-met",
    ),
]


@pytest.mark.parametrize(("elastic", "restarts", "shrunk_at", "grows", "held"), GROWS)
def test_grows_priced(
    elastic: dict[str, Any],
    restarts: dict[str, Any] | None,
    shrunk_at: float | None,
    grows: list[tuple[str, int, int]],
    held: float,
) -> None:
    """How much a DDP job grows, and when it yields the idle GPUs to sweep tasks."""
    got, until, _ = grow(idle_cluster(), elastic=elastic, restarts=restarts, shrunk_at=shrunk_at)
    assert got == grows
    assert until == held


def test_grow_deferred_to_a_checkpoint_due() -> None:
    """A checkpoint due within checkpointHorizon defers the grow until it (the sweep takes
    nothing meanwhile only when it is at its maximum, so here it grows), and the rule says so."""
    restarts = {"checkpointHorizon": "5m", "checkpointEvery": "30m"}
    snap = idle_cluster(checkpointed=NOW - 1680)  # the next one is due in 2m
    got, until, why = grow(snap, elastic={"growTo": "idle"}, restarts=restarts)
    assert until == NOW + 120
    assert got == [("ml/sweep", 2, 6)]
    assert "next checkpoint is due in 2m" in why
    # just after it, the job reports the new checkpoint and grows at once
    after = idle_cluster(checkpointed=NOW + 125)
    assert grow(after, elastic={"growTo": "idle"}, restarts=restarts, now=NOW + 125)[0] == [
        ("ml/pretrain", 4, 8)
    ]


def test_horizon_longer_than_checkpoints_is_refused() -> None:
    """A horizon as long as the checkpoint interval would defer every grow: one clear line."""
    with pytest.raises(PolicyLoadError, match=r"checkpointHorizon \(30m\) must be shorter"):
        policy(restarts={"checkpointHorizon": "30m", "checkpointEvery": "30m"})

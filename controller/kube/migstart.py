"""How a MIG flow starts, decided on the node as read: no API call, no clock, no gate.

The first step of a flow (:mod:`controller.kube.migflow`, step 1) reads the node, then decides
whether a flow is already there (resume it, or wait for another one), whether the target config
names a layout the node's MIG strategy can advertise, whether the node is already where the
decision wants it, and otherwise builds the flow's record and the one patch that starts it:
cordon, record, autoscaler holds. :func:`first_step` makes those decisions on plain inputs; the
executor asks the safety gate (target checks, the budget, dry-run, the write check) between the
decision and the write, because those claim budget and must run once, in that order.
:func:`controller.kube.migstep.next_step` decides every later step the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.kube.migannotation import (
    AUTOSCALER_HOLD,
    CONFIG_LABEL,
    FLOW_ANNOTATION,
    STATE_LABEL,
    Direction,
    FlowRecord,
    MigDecision,
    annotations_of,
    gpu_count,
    gpu_resources,
    is_cordoned,
    labels_of,
    record_of,
)
from controller.kube.migstep import MigFlowSettings, Wait
from controller.loop.port import Outcome
from policies.decisions import MigConvert
from policies.miglayout import expected_resources, layout_of, strategy_of
from policies.model import Policy, PoolSpec
from policies.snapshot import MIG_DISABLED

__all__ = ["Begin", "Finish", "Resume", "Start", "first_step"]

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Resume:
    """The node already runs this flow: advance it."""


@dataclass(frozen=True, slots=True)
class Finish:
    """Nothing to start: report ``outcome`` (recorded) with ``detail``."""

    outcome: Outcome
    detail: str


@dataclass(frozen=True, slots=True)
class Begin:
    """Start the flow with one patch, once the gate allows it (``plan`` says what it will do)."""

    record: FlowRecord
    patch: Obj
    plan: str


Start = Resume | Wait | Finish | Begin


def first_step(
    decision: MigDecision,
    node: Obj,
    *,
    now: float,
    settings: MigFlowSettings,
    policy: Policy,
) -> Start:
    """What starting ``decision`` on ``node`` (as read) takes; reads its inputs only."""
    name = decision.node
    direction: Direction = "convert" if isinstance(decision, MigConvert) else "revert"
    target = decision.profile if direction == "convert" else MIG_DISABLED
    try:
        record = record_of(node)
    except ValueError as exc:
        return Finish(Outcome.FAILED, str(exc))
    if record is not None:
        if record.direction == direction and record.target == target:
            return Resume()
        return Wait(f"another MIG flow ({record.direction} to {record.target}) is in progress")
    labels = labels_of(node)
    src, dst = _pools(policy, direction)
    pool = _pool_move(src, dst)
    configs = policy.spec.mig.configs if policy.spec.mig else {}
    try:
        expect = expected_resources(
            layout_of(target, configs), gpu_count(node, configs), strategy=strategy_of(labels)
        )
    except ValueError as exc:
        return Finish(Outcome.FAILED, str(exc))
    if _already_done(node, target, pool):
        return Finish(Outcome.ALREADY_DONE, f"{name} is at {target}")
    record = FlowRecord.for_decision(
        decision,
        direction=direction,
        phase="draining",
        target=target,
        previous=labels.get(CONFIG_LABEL),
        pool=pool,
        previous_pool={k: labels.get(k) for k in pool},
        was_cordoned=is_cordoned(node),
        started=now,
        deadline=now + settings.drain_timeout_s,
        expect=expect,
        previous_resources=gpu_resources(node),
        taints=_taint_move(src, dst),
        held_annotations={k: annotations_of(node).get(k) for k in AUTOSCALER_HOLD},
    )
    hold = dict.fromkeys(AUTOSCALER_HOLD, "true")
    patch: Obj = {
        "metadata": {"annotations": {FLOW_ANNOTATION: record.to_json(), **hold}},
        "spec": {"unschedulable": True},
    }
    return Begin(record, patch, f"cordon {name}, drain its GPU pods, set {CONFIG_LABEL}={target}")


def _pools(policy: Policy, direction: Direction) -> tuple[PoolSpec | None, PoolSpec | None]:
    """The source and destination pools of a flow in ``direction`` (``None``: no such
    pool in the policy)."""
    spec = policy.spec
    if spec.mig is None:
        return None, None
    src, dst = (spec.mig.from_pool, spec.mig.to_pool)
    if direction == "revert":
        src, dst = dst, src
    return spec.pools.get(src), spec.pools.get(dst)


def _pool_move(src: PoolSpec | None, dst: PoolSpec | None) -> dict[str, str | None]:
    """Labels that move a node into the destination pool and out of the source pool."""
    move: dict[str, str | None] = dict(dst.node_selector) if dst is not None else {}
    for key in src.node_selector if src is not None else {}:
        move.setdefault(key, None)
    return move


def _taint_move(src: PoolSpec | None, dst: PoolSpec | None) -> dict[str, str | None]:
    """Taints (``key:effect`` → value, ``None`` removes) that go with the pool move: the
    destination pool's, and the source pool's it does not also list, removed."""
    move: dict[str, str | None] = {
        f"{t.key}:{t.effect}": t.value for t in (dst.taints if dst is not None else [])
    }
    for t in src.taints if src is not None else []:
        move.setdefault(f"{t.key}:{t.effect}", None)
    return move


def _already_done(node: Obj, target: str, pool: Mapping[str, str | None]) -> bool:
    """The node is at ``target``, settled, in the destination pool and schedulable."""
    labels = labels_of(node)
    config = labels.get(CONFIG_LABEL) or MIG_DISABLED
    in_pool = all(labels.get(k) == v for k, v in pool.items())
    settled = labels.get(STATE_LABEL) == "success" or (
        target == MIG_DISABLED and STATE_LABEL not in labels
    )
    return config == target and settled and in_pool and not is_cordoned(node)

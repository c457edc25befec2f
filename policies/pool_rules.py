"""The pool rules: elastic training grows into idle GPUs; MIG nodes convert and revert.

Design:

* Both run after the service rules in the same :class:`~policies.rules.Round`, so they see
  what the services claimed this round (the order of rules is the only coupling).
* Each rule owns its answer to "until when can I only hold?" beside it
  (:func:`grow_quiet_until`, :func:`mig_quiet_until`): having decided nothing, with the same
  snapshot, policy and busy pools, until when would it go on deciding nothing? The engine's
  incremental schedule (:mod:`policies.scheduling`) skips the pool rules until then, and
  because the answer lives here, a change to a rule's timers is a change to its answer.
* MIG: elastic training below its maximum is whole-card demand too, so a MIG node converted at
  night comes back once services have taken training's GPUs in the morning; a node brought
  back is idle only from then on. Unmet whole-card demand converts nothing.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Final

from policies.budgets import Budgets, Cooldowns
from policies.checkpoint import next_checkpoint
from policies.decisions import Alternative, Explanation, MigConvert, MigRevert, Scale
from policies.inventory import Inventory, TrainingView
from policies.mig import IdleTracker, MigFlights, plan_conversions, plan_reverts
from policies.model import MigSpec, Policy, VictimKey, format_duration
from policies.placement import slots
from policies.preemption import (
    membership_price,
    restarts_on_change,
    victim_sort_key,
    work_at_stake,
)
from policies.rules import Round, quota_note
from policies.snapshot import MIG_DISABLED
from policies.windows import UtilizationWindow

__all__ = [
    "convert_margin",
    "converts_below",
    "gave_back_key",
    "grow_quiet_until",
    "grow_training",
    "mig_quiet_until",
    "run_mig",
    "training_wants",
]


def grow_training(rnd: Round, *, busy_pools: set[str], free_since: dict[str, float]) -> float:
    """Grow elastic training into GPUs that stayed free while no service of the pool needed
    them; one workload, one step, per pool per round. Returns until when a grow it held back
    (hysteresis, a checkpoint due, a restart not yet paid back) holds (``inf``: none).

    A DDP/elastic job restarts every worker on a membership change, so with the policy's
    ``training.elastic``/``training.restarts`` settings it is not grown back within
    ``regrowAfter`` of Ebbtide shrinking it, waits for a checkpoint due within
    ``checkpointHorizon``, and is grown only when the GPUs added, kept ``payback``, compute more
    than the restart loses (:func:`~policies.preemption.membership_price`); the next workload
    in order (a sweep, whose tasks restart alone) may take the GPUs instead."""
    training = rnd.policy.spec.training
    now, inv = rnd.now, rnd.inv
    held_until = math.inf
    if training is None:
        free_since.clear()
        return held_until
    pools = sorted(training.pools or rnd.policy.spec.pools)
    for pool in pools:
        spare = rnd.free(pool) - inv.pending_whole_gpus
        if spare <= 0 or pool in busy_pools:
            free_since.pop(pool, None)
            continue
        since = free_since.setdefault(pool, now)
        grow_after = training.elastic.grow_after
        cooldown = rnd.policy.spec.cooldowns.training_grow
        given = rnd.cooldowns.last(gave_back_key(pool))
        # GPUs that went free just after a service's scale-down gave them back: its
        # stabilization held them longer than growAfter already
        given_back = given is not None and since - grow_after <= given <= now
        waited = now - since >= grow_after or given_back
        if not waited or not rnd.cooldowns.ready(f"pool:{pool}", now, cooldown):
            continue
        if rnd.budgets.scale_steps.remaining(now) < 1:
            continue
        views = [
            v
            for v in inv.training.values()
            if v.pool_gpus.get(pool, 0) > 0
            and v.protected is None
            and v.workload.replicas < v.max_replicas
            and v.workload.gpus_per_replica <= spare
            and v.key not in rnd.taken
        ]
        if not views:
            continue
        views.sort(
            key=lambda v: _value(v, training.victim_order), reverse=True
        )  # the last victim is the first to grow back
        refused: list[Alternative] = []
        chosen = 0
        for view in views:
            w = view.workload
            gpr = max(1, w.gpus_per_replica)
            space = rnd.room(pool, w.placement, gpus=gpr)
            room = view.max_replicas - w.replicas
            wanted = (
                room
                if training.elastic.grow_to == "idle"
                else min(training.elastic.grow_step, room)
            )
            step, why = _grow_step(
                wanted,
                spare=spare,
                gpr=gpr,
                fits=slots(space, gpr),
                left=rnd.quota_left(w.namespace),
            )
            if w.placement.unknown is not None:  # admitted nowhere: say why, not "0 fit"
                step, why = 0, f"where it may run is unknown: {w.placement.unknown}"
            if step > 0 and restarts_on_change(view):
                wait, reason = _restart_hold(rnd, view, step * gpr)
                if wait is not None:
                    held_until = min(held_until, wait)
                    step, why = 0, reason
            if step > 0:
                break
            refused.append(Alternative(f"grow {w.key}", why))
            chosen += 1
        if step <= 0:
            continue
        later = [
            Alternative(f"grow {o.key}", "later in victim order")
            for o in views[chosen + 1 : chosen + 4]
        ]
        if step < wanted:
            refused.append(Alternative(f"grow {w.key} by {wanted}", why))
        inputs: dict[str, str | int | float | bool | None] = {
            "free_gpus": spare,
            "idle_s": round(now - since, 1),
            "replicas_fit": slots(space, gpr),
        }
        idle = f"idle in {pool} for {format_duration(now - since)}"
        if given_back and given is not None and now - since < grow_after:
            inputs["given_back_s"] = round(now - given, 1)
            idle = (
                f"in {pool} given back by a service's scale-down "
                f"{format_duration(now - given)} ago (its stabilization waited out growAfter)"
            )
        left = rnd.quota_left(w.namespace)
        if left is not None:
            inputs["quota_gpus_left"] = left
        rnd.emit(
            Scale(
                now,
                w.key,
                w.kind,
                w.replicas,
                w.replicas + step,
                "training",
                Explanation.of(
                    "grow-training",
                    f"{spare} GPUs {idle} with no service breaching; "
                    f"grow {w.key} {w.replicas}→{w.replicas + step}",
                    inputs=inputs,
                    thresholds={
                        "grow_after": format_duration(grow_after),
                        "max_replicas": view.max_replicas,
                        "cooldown": format_duration(cooldown),
                    },
                    alternatives=(*refused, *later),
                ),
                dry_run=rnd.dry_run,
                pool=pool,
            )
        )
        rnd.claim(pool, space, gpus=gpr, replicas=step)
        rnd.charge_quota(w.namespace, step * gpr)
        rnd.cooldowns.mark(f"pool:{pool}", now)
        rnd.taken.add(w.key)
        free_since[pool] = now
    return held_until


def gave_back_key(pool: str) -> str:
    """The :class:`~policies.budgets.Cooldowns` key marked when a service of ``pool`` is
    scaled down: training may grow into what it gave back without waiting ``growAfter``."""
    return f"gave-back:{pool}"


def _restart_hold(rnd: Round, view: TrainingView, gpus: int) -> tuple[float | None, str]:
    """Whether a grow of DDP/elastic ``view`` by ``gpus`` waits, until when, and why: shrunk by
    Ebbtide within ``regrowAfter``, a reported checkpoint due within ``checkpointHorizon``, or
    a restart the added GPUs would not pay back within ``payback``. ``(None, "")``: grow now."""
    training = rnd.policy.spec.training
    assert training is not None  # grow_training returns first without training
    now, elastic, spec = rnd.now, training.elastic, training.restarts
    shrunk = max(rnd.disrupted.get(view.key, ()), default=None)
    if shrunk is not None and now - shrunk < elastic.regrow_after:
        return shrunk + elastic.regrow_after, (
            f"shrunk or evicted from {format_duration(now - shrunk)} ago: not grown back within "
            f"regrowAfter {format_duration(elastic.regrow_after)} (each grow restarts it)"
        )
    annotations = [p.annotations for p in view.pods]
    due = next_checkpoint(annotations, every=spec.checkpoint_every)
    if due is not None and now < due <= now + spec.checkpoint_horizon:
        return due, (
            f"its next checkpoint is due in {format_duration(due - now)}: grow just after it "
            f"(checkpointHorizon {format_duration(spec.checkpoint_horizon)})"
        )
    if spec.payback > 0:
        lost = membership_price(view, now=now, spec=spec, changed=shrunk) + gpus * spec.restart_cost
        gained = gpus * spec.payback
        if gained < lost:
            # the work at stake drops to nothing at its next checkpoint: look again then
            at_stake = work_at_stake(view, now=now, spec=spec, changed=shrunk)
            return now + max(1.0, spec.checkpoint_every - at_stake), (
                f"adds {gpus} GPUs: {gained / 3600:.1f} GPU-h over payback "
                f"{format_duration(spec.payback)}, less than the {lost / 3600:.1f} GPU-h its "
                "restart loses"
            )
    return None, ""


def _grow_step(
    wanted: int, *, spare: int, gpr: int, fits: int, left: int | None
) -> tuple[int, str]:
    """Replicas a grow of ``wanted`` may add, and what limits it: GPUs left once pending pods
    are served, replicas that fit on one node each, the namespace's GPU quota."""
    limits = [
        (spare // gpr, f"{spare} spare GPUs in the pool"),
        (fits, f"only {fits} replicas of {gpr} GPUs fit, each on one node"),
    ]
    if left is not None:
        limits.append((left // gpr, quota_note(left, gpr)))
    step, why = min(limits, key=lambda lim: lim[0])
    return (wanted, "") if step >= wanted else (step, why)


def _value(view: TrainingView, order: Sequence[VictimKey]) -> tuple[float | str, ...]:
    w = view.workload
    return victim_sort_key(
        order, priority=w.priority, created=w.created, progress=view.progress, name=view.key
    )


def training_wants(inv: Inventory, pool: str) -> int:
    """Whole GPUs elastic training in ``pool`` would grow back into (up to its maximum): the
    demand that brings MIG nodes back in the morning, once services have taken what it had."""
    total = 0
    for v in inv.training.values():
        w = v.workload
        if v.pool_gpus.get(pool, 0) > 0 and v.protected is None and w.placement.unknown is None:
            total += max(0, v.max_replicas - w.replicas) * w.gpus_per_replica
    return total


def run_mig(
    rnd: Round,
    *,
    mig: MigSpec,
    pool_window: UtilizationWindow,
    idle: IdleTracker,
    flights: MigFlights,
    demand_since: list[float | None],
    stale_s: float,
    breaching: bool,
) -> None:
    """Revert MIG nodes on sustained whole-card demand, else convert idle whole-card nodes."""
    now, inv = rnd.now, rnd.inv
    flights.settle(inv.nodes, now, mig.stuck_after)
    wants = training_wants(inv, mig.from_pool)
    unmet = inv.pending_whole_gpus + wants - inv.free.get(mig.from_pool, 0)
    if unmet > 0:
        if demand_since[0] is None:
            demand_since[0] = now
    else:
        demand_since[0] = None
    slots = min(
        mig.max_concurrent - flights.count(inv.nodes),
        rnd.budgets.mig_conversions.remaining(now),
    )
    if slots <= 0:
        return
    reverts, unmet = plan_reverts(
        now=now,
        spec=mig,
        inv=inv,
        demand_since=demand_since[0],
        slots=slots,
        flights=flights,
        training_wants=wants,
    )
    waited = demand_since[0] or now
    for c in reverts:
        rnd.emit(
            MigRevert(
                now,
                c.node.name,
                c.profile,
                Explanation.of(
                    "mig-revert",
                    f"pods and training have waited {format_duration(now - waited)}"
                    f" for {unmet} whole GPUs more than {mig.from_pool} has free; "
                    f"revert {c.node.name}",
                    inputs={**c.inputs, "training_wants_gpus": wants},
                    thresholds={
                        "revert_after": format_duration(mig.revert_after),
                        "max_concurrent": mig.max_concurrent,
                    },
                ),
                dry_run=rnd.dry_run,
            )
        )
        flights.start(c.node.name, now, MIG_DISABLED)
    if reverts:  # whole again: idle only from now on, not since before it was partitioned
        back = {c.node.name for c in reverts}
        idle.forget({n: None for n in inv.nodes if n not in back})
    if reverts or unmet > 0 or breaching:
        return
    oldest = pool_window.oldest(now)
    # observed for the whole period, give or take one missed reading
    covered = oldest is not None and oldest <= now - mig.convert_after + stale_s
    converts, rejected = plan_conversions(
        now=now,
        spec=mig,
        inv=inv,
        pool_util_pct=pool_window.mean(now),
        pool_covered=covered,
        idle=idle,
        stale_s=stale_s,
        slots=slots,
        flights=flights,
    )
    for c in converts:
        rnd.emit(
            MigConvert(
                now,
                c.node.name,
                c.profile,
                c.node.gpu_model,
                Explanation.of(
                    "mig-convert",
                    f"{mig.from_pool} below {mig.convert_below:.0%} utilization and "
                    f"{c.node.name} idle for {format_duration(mig.convert_after)}: "
                    f"partition as {c.profile}",
                    inputs=c.inputs,
                    thresholds={
                        "convert_below": f"{mig.convert_below:.0%}",
                        "node_idle_below": f"{mig.node_idle_below:.0%}",
                        "convert_after": format_duration(mig.convert_after),
                        "max_concurrent": mig.max_concurrent,
                        "min_whole_nodes": mig.min_whole_nodes,
                    },
                    alternatives=tuple(rejected),
                ),
                dry_run=rnd.dry_run,
            )
        )
        flights.start(c.node.name, now, f"{c.profile}")


def grow_quiet_until(
    now: float,
    policy: Policy,
    *,
    budgets: Budgets,
    cooldowns: Cooldowns,
    free_since: dict[str, float],
    held_until: float = math.inf,
) -> float:
    """Until when :func:`grow_training`, having just decided nothing, would go on deciding
    nothing with the same snapshot and busy pools: the first of its timers to run out
    (``growAfter`` from when a pool's GPUs went free, the pool's cooldown, ``held_until``: what
    :func:`grow_training` returned for the grows it held back); ``-math.inf``
    (every tick) while the scale-step budget is spent, a sliding window the engine does not
    follow."""
    training = policy.spec.training
    if training is None:
        return math.inf
    if budgets.scale_steps.remaining(now) < 1:
        return -math.inf
    until = held_until
    grow_after = training.elastic.grow_after
    cooldown = policy.spec.cooldowns.training_grow
    for pool, since in free_since.items():
        if since + grow_after > now:
            until = min(until, since + grow_after)
        left = cooldowns.remaining_s(f"pool:{pool}", now, cooldown)
        if left > 0:
            until = min(until, now + left)
    return until


def converts_below(mig: MigSpec, pool_window: UtilizationWindow, now: float) -> bool:
    """Whether the whole-card pool's mean utilization is below ``convertBelow`` at ``now``
    (:func:`~policies.mig.plan_conversions` may convert); unknown is not below."""
    return convert_margin(mig, pool_window, now) < 0


#: How far below its true value a float sum of readings may fall, relatively: summing ``n``
#: non-negative readings rounds by at most ``n`` ulps, far under this for a billion readings.
_SUM_SLACK: Final = 1e-6


def convert_margin(mig: MigSpec, pool_window: UtilizationWindow, now: float) -> int:
    """``-1`` when :func:`converts_below`; otherwise how many more readings the pool's window
    may take, read at the same slot of ``now`` and with no interval leaving or put whole
    (:attr:`~policies.windows.UtilizationWindow.epoch`), before its mean could fall below
    ``convertBelow``: readings are never negative, so the mean stays at least the sum over the
    readings then counted (``sys.maxsize``: never, with ``convertBelow`` at 0). The
    engine's schedule reads the mean again only past that many readings."""
    total, n = pool_window.totals(now)
    limit = mig.convert_below * 100.0
    if n and total / n < limit:
        return -1
    if limit <= 0.0:
        return sys.maxsize
    floor = total * (1.0 - _SUM_SLACK) / (limit * (1.0 + _SUM_SLACK))
    return max(0, math.floor(floor) - n)


def mig_quiet_until(
    now: float,
    *,
    mig: MigSpec,
    inv: Inventory,
    flights: MigFlights,
    demand_since: list[float | None],
    pool_window: UtilizationWindow,
    breaching: bool,
    held_until: float,
) -> tuple[float, bool]:
    """Until when :func:`run_mig`, having just decided nothing, would go on deciding nothing
    with the same snapshot and busy pools, and whether whole-card demand is unmet (then it
    converts nothing, so the pool's mean need not be read). Its timers: ``revertAfter`` of
    unmet demand, the window's next slot (the mean moves), a MIG node's hold after a failed
    flow. ``-math.inf`` (every tick) while a timer it does not follow may run: a flight is
    under way, demand has been unmet for ``revertAfter`` while a MIG node could be reverted
    (the MIG budget and slots may free up any time), or the mean is below ``convertBelow``
    (nodes' idle times)."""
    if flights.count({}):
        return -math.inf, False
    until = math.inf
    unmet = False
    demand = inv.pending_whole_gpus + training_wants(inv, mig.from_pool)
    if demand > inv.free.get(mig.from_pool, 0):
        unmet = True
        if any(n.is_mig for n in inv.pool_nodes.get(mig.to_pool, ())):
            unmet_since = demand_since[0]
            if unmet_since is None or now - unmet_since >= mig.revert_after:
                return -math.inf, True
            until = unmet_since + mig.revert_after
    elif not breaching:
        if converts_below(mig, pool_window, now):
            return -math.inf, False
        until = pool_window.steady_until(now)
    if held_until > now:
        until = min(until, held_until)
    return until, unmet

"""The engine's rules, one function each, sharing one evaluation :class:`Round`.

Design:

* A :class:`Round` carries what one ``evaluate`` call knows and has decided so far: the time,
  policy, snapshot inventory, budgets and cooldowns, the GPUs already claimed and the workloads
  and pods already taken by earlier rules. Rules append decisions to it; nothing else is
  shared, so the order of rules (breaches, then growth, then MIG) is the only coupling.
* Every decision is emitted through :meth:`Round.emit`, which spends the matching budget, so a
  rule cannot forget to. Rules check the budget before planning and explain refusals.
* A namespace's GPU quota is shared by the round too (:meth:`Round.quota_left`,
  :meth:`Round.charge_quota`): the snapshot's quota use knows nothing of the replicas this
  round already added, so two grows (or a scale-up and a grow) never both take its last GPU.
* Breach response follows the Kubernetes HPA: ``desired = ceil(replicas * p / objective)``,
  nothing while ``p / objective`` is within ``1 + tolerance``, bounded by the service's replica
  bounds and ``maxStep``, and further by the GPUs that can be found (free, then freed by
  :func:`~policies.preemption.plan_capacity`). Without a scale target, the GPUs the service's
  pending pods wait for are freed instead. A service with ``scale.leading`` also asks for what
  its request rate needs, breaching or not (:mod:`policies.indicators`); with
  ``scale.shrinkFirst`` it scales only into GPUs free now and frees the whole climb's GPUs at
  once, so its new replicas never wait in the scheduler (and preempt training) for GPUs a
  shrink is still releasing.
* A workload whose placement Ebbtide cannot read (:attr:`~policies.snapshot.Placement.
  unknown`) has nothing freed for it: a breaching service scales only into free GPUs and says
  why among its alternatives, training does not grow, and it is no MIG revert demand.
* MIG: elastic training below its maximum is whole-card demand too, so a MIG node converted at
  night comes back once services have taken training's GPUs in the morning; a node brought
  back is idle only from then on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from policies.budgets import Budgets, Cooldowns
from policies.checkpoint import Notices
from policies.decisions import (
    Alternative,
    Decision,
    Evict,
    Explanation,
    MigConvert,
    MigRevert,
    Scale,
)
from policies.indicators import leading_replicas, request_rate
from policies.inventory import Inventory, TrainingView, note_disrupted
from policies.mig import IdleTracker, MigFlights, plan_conversions, plan_reverts
from policies.model import MigSpec, Policy, ServiceSpec, VictimKey, format_duration
from policies.placement import NVLINK_DOMAIN_LABEL, place, room, slots
from policies.preemption import Fit, plan_capacity, victim_sort_key
from policies.slo import SloState
from policies.snapshot import MIG_DISABLED, Placement, Workload
from policies.windows import LatencyWindow, UtilizationWindow

__all__ = ["Round", "grow_training", "respond_to_breach", "run_mig", "training_wants"]


@dataclass(slots=True)
class Round:
    """One evaluation: its inputs, the decisions so far and what they claimed."""

    now: float
    policy: Policy
    inv: Inventory
    budgets: Budgets
    cooldowns: Cooldowns
    decisions: list[Decision] = field(default_factory=list)
    claimed: dict[str, int] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    held: Mapping[str, str] = field(default_factory=dict)
    """Pods the cluster refused to evict lately, with why: skipped as victims for a while."""
    resize_held: Mapping[str, str] = field(default_factory=dict)
    """Training workloads whose shrink failed lately, with why: not shrunk for a while."""
    disrupted: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Workloads Ebbtide evicted from or shrank, with when (the engine's, kept across rounds):
    their replacement pods are no demand (:class:`~policies.inventory.Inventory`)."""
    node_claimed: dict[str, int] = field(default_factory=dict)
    """Free whole GPUs per node that decisions of this round will take."""
    quota_claimed: dict[str, int] = field(default_factory=dict)
    """GPUs of each namespace's quota that replicas added by this round will take."""

    @property
    def dry_run(self) -> bool:
        return self.policy.spec.dry_run

    def emit(self, decision: Decision) -> None:
        """Record ``decision`` and spend its budget (raises if the rule forgot to check)."""
        self.budgets.for_action(decision.action).spend(self.now, key=decision.id)
        self.decisions.append(decision)
        if not decision.dry_run and decision.disrupts is not None:
            note_disrupted(self.disrupted, decision.disrupts, self.now)

    def free(self, pool: str) -> int:
        return max(0, self.inv.free.get(pool, 0) - self.claimed.get(pool, 0))

    def room(self, pool: str, where: Placement, *, gpus: int) -> dict[str, int]:
        """Free whole GPUs per node of ``pool`` where a ``gpus``-GPU replica placed by
        ``where`` may land, less what this round already took."""
        inv, claimed = self.inv, self.node_claimed
        free = {n: f - claimed.get(n, 0) for n, f in inv.node_free.items()}
        return room(inv.pool_nodes.get(pool, ()), free, where, gpus=gpus)

    def quota_left(self, namespace: str) -> int | None:
        """GPUs ``namespace``'s quota still allows once this round's additions are in;
        ``None`` without a quota."""
        left = self.inv.quota_left(namespace)
        return None if left is None else max(0, left - self.quota_claimed.get(namespace, 0))

    def charge_quota(self, namespace: str, gpus: int) -> None:
        """Replicas added in ``namespace`` will take ``gpus`` of its quota when created. A GPU
        freed in the round gives none back: an evicted or shrunk pod counts against the quota
        until its grace period has passed (kubernetes ``pkg/quota/v1/evaluator/core/pods.go``,
        ``QuotaV1Pod``)."""
        self.quota_claimed[namespace] = self.quota_claimed.get(namespace, 0) + gpus

    def claim(self, pool: str, room: Mapping[str, int], *, gpus: int, replicas: int) -> None:
        """Take ``replicas`` of ``gpus`` GPUs out of ``room`` (best fit) and out of ``pool``."""
        for node, n in place(room, gpus, replicas).items():
            self.node_claimed[node] = self.node_claimed.get(node, 0) + n
            self.claimed[pool] = self.claimed.get(pool, 0) + n


def respond_to_breach(
    rnd: Round,
    key: str,
    spec: ServiceSpec,
    slo: SloState,
    window: LatencyWindow,
    *,
    requests: int = 0,
) -> None:
    """Scale a breaching service up, or one whose request rate (``requests`` over the SLO
    window, :mod:`policies.indicators`) wants more replicas, and free the GPUs that takes."""
    now, pspec = rnd.now, rnd.policy.spec
    breaching = slo.state == "breaching"
    workload = rnd.inv.service_workload.get(key)
    lead = leading_replicas(spec, requests, window, now)
    if not breaching and (lead is None or workload is None or lead <= workload.replicas):
        return
    bounds = spec.replicas
    at_max = workload is not None and bounds is not None and workload.replicas >= bounds.max
    if lead is None and spec.scale is not None and at_max:
        return  # nothing to add: no need to read the percentile
    cooldown = spec.cooldown if spec.cooldown is not None else pspec.cooldowns.service
    if not rnd.cooldowns.ready(key, now, cooldown) and not _served(rnd, key, spec, workload):
        return
    q = spec.slo.percentile / 100.0
    p = window.quantile(now, q)
    if p is None and lead is None:
        return
    # In a histogram's overflow bucket the percentile is only known to exceed the last bound.
    floor = window.above_bound(now, q)
    objective = spec.slo.objective_ms
    ratio = p / objective if p is not None else 0.0
    pool = spec.pool
    gpr = spec.gpus_per_replica
    pct = f"p{spec.slo.percentile:g}"
    inputs: dict[str, str | int | float | bool | None] = {
        f"{pct}_ms": None if p is None else round(p, 2),
        "ratio": round(ratio, 3),
        "breaching_since": slo.since if breaching else None,
        "free_gpus": rnd.free(pool),
    }
    if floor is not None:
        inputs[f"{pct}_above_last_bound_ms"] = floor
    thresholds: dict[str, str | int | float | bool | None] = {
        "objective_ms": objective,
        "breach_after": format_duration(spec.slo.breach_after),
    }
    alternatives: list[Alternative] = []
    current = desired = ahead = 0
    led = False
    if spec.scale is not None:
        if workload is None or spec.replicas is None:
            return
        tolerance = spec.scale.tolerance
        thresholds["tolerance"] = f"{tolerance:.0%}"
        current = workload.replicas
        desired = current
        if breaching and floor is not None:
            # the ratio is a floor: at least one more replica, however close to 1 it reads
            desired = max(math.ceil(max(current, 1) * ratio), current + 1)
        elif breaching and ratio > 1.0 + tolerance:
            desired = math.ceil(max(current, 1) * ratio)
        if lead is not None and spec.scale.leading is not None:
            inputs["request_rate"] = round(request_rate(spec, requests, window, now), 2)
            inputs["leading_replicas"] = lead
            thresholds["rate_per_replica"] = spec.scale.leading.rate_per_replica
            led = lead > desired
            desired = max(desired, lead)
        if desired <= current:
            return
        bounds = spec.replicas
        thresholds.update(min_replicas=bounds.min, max_replicas=bounds.max)
        desired = min(max(bounds.min, desired), bounds.max)
        ahead = (desired - current) * gpr  # what the whole climb takes, past this step
        if spec.scale.max_step is not None:
            desired = min(desired, current + spec.scale.max_step)
            thresholds["max_step"] = spec.scale.max_step
        if desired <= current:
            return
        if rnd.budgets.scale_steps.remaining(now) < 1:
            return
        needed = (desired - current) * gpr
        inputs.update(replicas=current, desired=desired)
    elif not breaching:
        return
    else:
        needed = rnd.inv.service_pending_gpus.get(key, 0)
        inputs["pending_gpus"] = needed
    free = rnd.free(pool)
    first = spec.scale is not None and spec.scale.shrink_first
    soon = _being_freed(rnd.inv, pool) if first else 0
    if first:
        inputs["gpus_being_freed"] = soon
    shortfall = max(0, needed - free - soon)
    left = rnd.quota_left(workload.namespace) if workload is not None else None
    if spec.scale is not None and left is not None and gpr > 0 and needed > left:
        # replicas the quota refuses would only wait: never free (or evict) GPUs for them
        inputs["quota_gpus_left"] = left
        alternatives.append(Alternative(f"scale to {desired}", _quota_note(left, gpr)))
        desired = current + left // gpr
        needed = (desired - current) * gpr
        if desired <= current:
            return
    if first:
        # freeing takes a grace period whatever its size: free the whole climb's GPUs now, so
        # the later steps find them free instead of waiting a grace period each
        climb = ahead if left is None else min(ahead, left)
        shortfall = max(0, max(needed, climb) - free - soon)
    unknown = workload.placement.unknown if workload is not None else None
    if unknown is not None:
        # the scheduler knows where it may run, Ebbtide does not: what it frees could be on
        # nodes the replicas can never use, so it frees nothing and scales only into free GPUs
        inputs["placement_unknown"] = unknown
        alternatives.append(
            Alternative("free GPUs from training", f"where {key} may run is unknown: {unknown}")
        )
        if spec.scale is None or gpr <= 0:
            return
        desired = min(desired, current + free // gpr)
        if desired <= current:
            return
        shortfall = 0
    fit: Fit | None = None
    if workload is not None and gpr > 0 and unknown is None:
        # each new (or pending) replica needs gpr GPUs on one node: count where it lands
        want = desired - current if spec.scale is not None else needed // gpr
        if first:
            want = max(want, climb // gpr)
        space = rnd.room(pool, workload.placement, gpus=gpr)
        fits_now = slots(space, gpr)
        inputs["replicas_fit_now"] = fits_now
        shortfall = max(0, (want - fits_now) * gpr - soon)
        nodes = rnd.inv.nodes
        fit = Fit(
            gpr,
            want,
            space,
            {n: nodes[n].whole_gpus for n in space},
            {n: d for n in space if (d := nodes[n].labels.get(NVLINK_DOMAIN_LABEL))},
        )
    training = rnd.policy.spec.training
    plan = None
    if shortfall > 0 and training is not None:
        allowed = set(training.pools) or set(pspec.pools)
        if pool in allowed:
            plan = plan_capacity(
                needed=shortfall,
                pool=pool,
                training=rnd.inv.training.values(),
                loose_pods=rnd.inv.loose_training_pods,
                pod_pool=rnd.inv.node_pool,
                victim_order=training.victim_order,
                protected_namespaces=frozenset(pspec.protected_namespaces),
                scale_budget=rnd.budgets.scale_steps.remaining(now) - (1 if spec.scale else 0),
                eviction_budget=rnd.budgets.evictions.remaining(now),
                taken=frozenset(rnd.taken),
                held=rnd.held,
                resize_held=rnd.resize_held,
                notices=Notices(key, now, training.checkpoint.deadline),
                fit=fit,
                claimant_priority=None if workload is None else workload.priority,
            )
            alternatives.extend(plan.rejected)
    freed = plan.freed if plan is not None else 0
    target = current
    if spec.scale is not None:
        grow = desired - current
        if fit is not None:
            gained = plan.by_node if plan is not None and not first else {}
            grow = min(grow, slots({n: f + gained.get(n, 0) for n, f in fit.free.items()}, gpr))
        target = current + grow
        if grow <= 0 and freed == 0:
            return
        if target < desired:
            why = (
                f"only {grow} more replicas of {gpr} GPUs fit, each on one node "
                f"({free + freed} GPUs free or freed in {pool})"
            )
            if first:
                why = f"{free} GPUs are free now, {freed + soon} more once training lets go"
            alternatives.append(Alternative(f"scale to {desired}", why))
    elif plan is None or freed == 0:
        return
    inputs["gpus_freed"] = freed
    p_now = "no verdict yet" if p is None else f"P{spec.slo.percentile:g} {p:.0f}ms"
    rule, cause_text = (
        "slo-breach-scale-up",
        f"{key} breaching ({p_now} > objective {objective:g}ms)",
    )
    how = f"desired ceil({current} * {ratio:.2f}) bounded = {desired}"
    if floor is not None:
        p_now = f"P{spec.slo.percentile:g} > {floor:g}ms (above the histogram's last bound)"
        cause_text = f"{key} breaching ({p_now}; objective {objective:g}ms)"
        how = f"desired max(ceil({current} * {ratio:.2f}), {current} + 1) bounded = {desired}"
    if led and spec.scale is not None and spec.scale.leading is not None:
        rate, per = request_rate(spec, requests, window, now), spec.scale.leading.rate_per_replica
        rule = "leading-scale-up"
        cause_text = f"{key} request rate {rate:.1f}/s wants {lead} replicas ({p_now})"
        how = f"desired ceil({rate:.1f} / {per:g}) bounded = {desired}"
    if plan is not None:
        grace = training.grace_period if training is not None else 30.0
        for s in plan.shrinks:
            instead = (
                f" instead of evicting {', '.join(s.remove)} (its ReplicaSet would recreate "
                "them to race the new replicas for the GPUs)"
                if s.remove
                else ""
            )
            rnd.emit(
                Scale(
                    now,
                    s.workload,
                    s.kind,
                    s.from_replicas,
                    s.to_replicas,
                    "training",
                    Explanation.of(
                        "free-gpus-shrink-training",
                        f"{cause_text}; shrink {s.workload} "
                        f"{s.from_replicas}→{s.to_replicas} to free {s.gpus_freed} GPUs in "
                        f"{pool}{instead}",
                        alternatives=tuple(alternatives),
                        inputs=inputs,
                        thresholds=thresholds,
                    ),
                    cause=key,
                    dry_run=rnd.dry_run,
                    remove=s.remove,
                )
            )
            rnd.taken.add(s.workload)
        for v in plan.evictions:
            why = (
                "its gang would drop below its minimum" if v.whole_gang else "next in victim order"
            )
            rnd.emit(
                Evict(
                    now,
                    v.pod.key,
                    v.pod.node,
                    v.workload,
                    grace,
                    Explanation.of(
                        "free-gpus-evict-training",
                        f"{cause_text}; shrinking was not enough: evict "
                        f"{v.pod.key} (priority {v.pod.priority}, {why}) to free "
                        f"{v.gpus_freed} GPUs in {pool}",
                        alternatives=tuple(alternatives),
                        inputs=inputs,
                        thresholds=thresholds,
                    ),
                    cause=key,
                    dry_run=rnd.dry_run,
                )
            )
            rnd.taken.add(v.pod.key)
    if fit is not None:
        landing = target - current if spec.scale is not None else fit.replicas
        rnd.claim(pool, fit.free, gpus=gpr, replicas=landing)
    else:
        consumed = needed if spec.scale is None else (target - current) * gpr
        rnd.claimed[pool] = rnd.claimed.get(pool, 0) + max(0, min(consumed, free))
    if spec.scale is not None and workload is not None and target > current:
        rnd.charge_quota(workload.namespace, (target - current) * gpr)
        rnd.emit(
            Scale(
                now,
                workload.key,
                spec.scale.kind,
                current,
                target,
                "inference",
                Explanation.of(
                    rule,
                    f"{cause_text}: {how}; scale {current}→{target}",
                    alternatives=tuple(alternatives),
                    inputs=inputs,
                    thresholds=thresholds,
                ),
                cause=key,
                dry_run=rnd.dry_run,
            )
        )
    rnd.cooldowns.mark(key, now)
    rnd.cooldowns.mark(f"pool:{pool}", now)


def _being_freed(inv: Inventory, pool: str) -> int:
    """GPUs in ``pool`` that training pods still hold beyond their workloads' replicas: a
    shrink's pods in their grace period, free soon."""
    total = 0
    for view in inv.training.values():
        in_pool = view.pool_gpus.get(pool, 0)
        if in_pool:
            w = view.workload
            excess = sum(p.gpus for p in view.pods) - w.replicas * w.gpus_per_replica
            total += min(in_pool, max(0, excess))
    return total


def _served(rnd: Round, key: str, spec: ServiceSpec, workload: Workload | None) -> bool:
    """With ``scale.readyEndsCooldown``, the service's cooldown ends early: every replica of its
    last scale-up is Running and has had ``breachAfter`` since the action to show in the
    percentile, so a burst is met at the pace pods start, not one step per fixed cooldown."""
    last = rnd.cooldowns.last(key)
    if spec.scale is None or not spec.scale.ready_ends_cooldown:
        return False
    if workload is None or last is None or rnd.now - last < spec.slo.breach_after:
        return False
    pods = rnd.inv.pods_by_workload.get(workload.key, ())
    return sum(1 for p in pods if p.phase == "Running" and p.node is not None) >= workload.replicas


def grow_training(rnd: Round, *, busy_pools: set[str], free_since: dict[str, float]) -> None:
    """Grow elastic training into GPUs that stayed free while no service of the pool needed
    them; one workload, one step, per pool per round."""
    training = rnd.policy.spec.training
    now, inv = rnd.now, rnd.inv
    if training is None:
        free_since.clear()
        return
    pools = sorted(training.pools or rnd.policy.spec.pools)
    for pool in pools:
        spare = rnd.free(pool) - inv.pending_whole_gpus
        if spare <= 0 or pool in busy_pools:
            free_since.pop(pool, None)
            continue
        since = free_since.setdefault(pool, now)
        grow_after = training.elastic.grow_after
        cooldown = rnd.policy.spec.cooldowns.training_grow
        if now - since < grow_after or not rnd.cooldowns.ready(f"pool:{pool}", now, cooldown):
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
            wanted = min(training.elastic.grow_step, view.max_replicas - w.replicas)
            step, why = _grow_step(
                wanted,
                spare=spare,
                gpr=gpr,
                fits=slots(space, gpr),
                left=rnd.quota_left(w.namespace),
            )
            if w.placement.unknown is not None:  # admitted nowhere: say why, not "0 fit"
                step, why = 0, f"where it may run is unknown: {w.placement.unknown}"
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
                    f"{spare} GPUs idle in {pool} for {format_duration(now - since)} with no "
                    f"service breaching; grow {w.key} {w.replicas}→{w.replicas + step}",
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
        limits.append((left // gpr, _quota_note(left, gpr)))
    step, why = min(limits, key=lambda lim: lim[0])
    return (wanted, "") if step >= wanted else (step, why)


def _quota_note(left: int, gpr: int) -> str:
    return f"namespace GPU quota has {left} left, a replica needs {gpr}"


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

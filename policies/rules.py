"""The engine's service rules, one function each, sharing one evaluation :class:`Round`.

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
* With a confident learned capacity (``leading.learn``) a breach is sized by the request rate
  at that capacity instead: in overload a queue's percentile grows with the time spent there,
  not with the replicas missing (30 s at a flash crowd asks for a hundredfold), and a window
  that began before the last step's replicas served counts the same shortfall again at every
  early step ``readyEndsCooldown`` allows. Where the rate asks for no more than the replicas,
  the breach still climbs one replica a step (the capacity may be learned wrong), but only
  from a window that began once the last action's replicas could serve (a start-up and a
  window after it).
* A workload whose placement Ebbtide cannot read (:attr:`~policies.snapshot.Placement.
  unknown`) has nothing freed for it: a breaching service scales only into free GPUs and says
  why among its alternatives, training does not grow, and it is no MIG revert demand.
* The pool rules (training growth, MIG) share the round and live in :mod:`policies.pool_rules`.
* Each rule answers "until when can I only hold?" beside itself
  (:func:`breach_quiet_until`, and after a round :func:`breach_wait_until`, which counts a
  running cooldown): the engine's incremental schedule asks the rule, never a copy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.budgets import Budgets, Cooldowns
from policies.checkpoint import Notices
from policies.decisions import (
    Alternative,
    Decision,
    Evict,
    Explanation,
    Scale,
)
from policies.headroom import ServiceLoad
from policies.indicators import LeadingAsk, leading_ask
from policies.inventory import Inventory, note_disrupted
from policies.loadsignals import Ask, ServiceSignals, Verdicts, verdicts
from policies.model import Policy, ServiceSpec, SloSpec, format_duration
from policies.placement import NVLINK_DOMAIN_LABEL, place, room, slots
from policies.preemption import TASK_KINDS, Fit, plan_capacity
from policies.slo import SloState
from policies.snapshot import Placement, Workload
from policies.windows import LatencyWindow

__all__ = [
    "Round",
    "breach_quiet_read",
    "breach_quiet_static",
    "breach_quiet_until",
    "breach_wait_until",
    "leading_inputs",
    "quota_note",
    "respond_to_breach",
    "responds",
]


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
    signals: Mapping[str, ServiceSignals] = field(default_factory=dict)
    """The intake's further objectives, load gauges and work-bound checks, by service key
    (:mod:`policies.loadsignals`)."""
    pod_util: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """The intake's last GPU reading per pod that names it: (time, percent)."""

    def verdicts(
        self, key: str, spec: ServiceSpec, replicas: int, *, margin: float
    ) -> Verdicts | None:
        """What ``key``'s signals say this round (``None`` for a service without any)."""
        sig = self.signals.get(key)
        if sig is None:
            return None
        workload = self.inv.service_workload.get(key)
        pods = () if workload is None else self.inv.pods_by_workload.get(workload.key, ())
        return verdicts(
            sig,
            spec,
            self.now,
            replicas,
            gpu_util=self.pod_util,
            pods=[p.key for p in pods if p.phase == "Running"],
            margin=margin,
        )

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


def breach_quiet_until(spec: ServiceSpec, slo: SloState, workload: Workload | None) -> float:
    """Until when :func:`respond_to_breach` can only hold, whatever the clock, while ``slo``,
    the service's window and the snapshot (``workload``) stay as they are: for ever
    (``math.inf``) when it is not breaching and has no leading indicator, or when it scales by
    the percentile alone and is at ``replicas.max`` already; else ``-math.inf`` (any tick may
    act: a cooldown or a scale-step budget runs out, ready replicas end a cooldown, a request
    rate's span grows). The rule itself starts from this answer, so the engine's incremental
    schedule (:mod:`policies.scheduling`) cannot drift from it. In two parts, so the schedule
    works the first out once per spec: :func:`breach_quiet_static` and
    :func:`breach_quiet_read`."""
    static = breach_quiet_static(spec)
    if static is not None:
        return static
    return breach_quiet_read(spec, slo, workload)


def breach_quiet_static(spec: ServiceSpec) -> float | None:
    """:func:`breach_quiet_until`'s answer where ``spec`` alone decides it (``-math.inf``: a
    leading indicator or signals), or ``None`` where the state must be read
    (:func:`breach_quiet_read`)."""
    scale = spec.scale
    if (scale is not None and scale.leading is not None) or spec.has_signals():
        return -math.inf
    return None


def breach_quiet_read(spec: ServiceSpec, slo: SloState, workload: Workload | None) -> float:
    """:func:`breach_quiet_until` for a service whose :func:`breach_quiet_static` is ``None``:
    read from its SLO state and replicas."""
    if slo.state != "breaching":
        return math.inf
    bounds = spec.replicas
    at_max = workload is not None and bounds is not None and workload.replicas >= bounds.max
    return math.inf if spec.scale is not None and at_max else -math.inf


def breach_wait_until(
    rnd: Round, key: str, spec: ServiceSpec, slo: SloState, workload: Workload | None
) -> float:
    """Until when :func:`respond_to_breach`, having run this round, can only hold while
    ``slo``, the window and the snapshot (``workload``) stay as they are and no feedback comes:
    :func:`breach_quiet_until` where that is for ever; else the end of the service's cooldown
    while one runs, since a breaching service in its cooldown returns before anything else
    (not with ``scale.readyEndsCooldown``, whose early end reads the clock against
    ``breachAfter``); else ``-math.inf`` (any tick may act: a budget, free GPUs, victims)."""
    quiet = breach_quiet_until(spec, slo, workload)
    if quiet == math.inf or breach_quiet_static(spec) is not None:
        return quiet
    if spec.scale is not None and spec.scale.ready_ends_cooldown:
        return -math.inf
    cooldown = spec.cooldown if spec.cooldown is not None else rnd.policy.spec.cooldowns.service
    left = rnd.cooldowns.remaining_s(key, rnd.now, cooldown)
    return rnd.now + left if left > 0.0 else -math.inf


def responds(spec: ServiceSpec, slo: SloState) -> bool:
    """Whether :func:`respond_to_breach` runs for the service this round: it breaches, or it
    scales on more than its percentile (a leading indicator, load signals, further
    objectives)."""
    scale = spec.scale
    return (
        slo.state == "breaching"
        or (scale is not None and scale.leading is not None)
        or spec.has_signals()
    )


def _top(asks: list[Ask]) -> Ask | None:
    """The ask for the most replicas (the first named on a tie: the request rate, then the
    signals in their documented order)."""
    best: Ask | None = None
    for a in asks:
        if best is None or a.replicas > best.replicas:
            best = a
    return best


def respond_to_breach(
    rnd: Round,
    key: str,
    spec: ServiceSpec,
    slo: SloState,
    window: LatencyWindow,
    *,
    requests: int = 0,
    load: ServiceLoad | None = None,
) -> None:
    """Scale a breaching service up, or one whose request rate (``requests`` over the SLO
    window, :mod:`policies.indicators`; learned capacity and headroom from ``load``) wants
    more replicas, and free the GPUs that takes."""
    now, pspec = rnd.now, rnd.policy.spec
    breaching = slo.state == "breaching"
    workload = rnd.inv.service_workload.get(key)
    if breach_quiet_until(spec, slo, workload) == math.inf:
        return  # nothing to add: no need to read the percentile
    replicas_now = None if workload is None else workload.replicas
    asked = leading_ask(spec, requests, window, now, load=load, current=replicas_now)
    lead = None if asked is None else asked.replicas
    seen = rnd.verdicts(key, spec, workload.replicas, margin=0.0) if workload is not None else None
    top: Ask | None = None
    if seen is not None:
        by_rate = [Ask("request_rate", lead, 0.0, 0.0)] if lead is not None else []
        top = _top([*by_rate, *seen.asks])
        lead = None if top is None else top.replicas
        breaching = (breaching or bool(seen.breaching)) and not seen.work_bound
    if not breaching and (lead is None or workload is None or lead <= workload.replicas):
        return
    bounds = spec.replicas
    at_max = workload is not None and bounds is not None and workload.replicas >= bounds.max
    if lead is None and spec.scale is not None and at_max:
        return  # a leading indicator with too few requests for a rate: as without one
    cooldown = spec.cooldown if spec.cooldown is not None else pspec.cooldowns.service
    if not rnd.cooldowns.ready(key, now, cooldown) and not _served(rnd, key, spec, workload):
        return
    q = spec.slo.percentile / 100.0
    p = window.quantile(now, q)
    if p is None and lead is None and (seen is None or not seen.breaching):
        return
    # In a histogram's overflow bucket the percentile is only known to exceed the last bound.
    floor = window.above_bound(now, q)
    objective = spec.slo.objective_ms
    ratio = p / objective if p is not None else 0.0
    worst = spec.slo  # the objective whose ratio sizes the response
    if seen is not None:
        for o, po in seen.breaching:
            if po is not None and po / o.objective_ms > ratio:
                worst, ratio = o, po / o.objective_ms
        if worst is not spec.slo:
            floor = None  # the primary's overflow bound says nothing about this objective
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
    if seen is not None:
        _signal_inputs(seen, worst, spec, inputs, thresholds)
    alternatives: list[Alternative] = []
    current = desired = ahead = 0
    led = rate_sized = False
    if spec.scale is not None:
        if workload is None or spec.replicas is None:
            return
        tolerance = spec.scale.tolerance
        thresholds["tolerance"] = f"{tolerance:.0%}"
        current = workload.replicas
        desired = current
        sized = breaching and (floor is not None or ratio > 1.0 + tolerance)
        by_ratio = math.ceil(max(current, 1) * ratio)
        if floor is not None:
            # the ratio is a floor: at least one more replica, however close to 1 it reads
            by_ratio = max(by_ratio, current + 1)
        if sized and asked is not None and asked.learned:
            # the load at the learned capacity sizes the breach (module docstring)
            rate_sized = True
            desired = max(asked.replicas, current + 1)
            alternatives.append(
                Alternative(
                    f"scale to ceil({current} * {ratio:.2f}) = {by_ratio}",
                    "a breach under load is sized by the rate at the learned capacity: the "
                    "percentile's ratio is queueing delay, not the replicas missing",
                )
            )
            last = rnd.cooldowns.last(key)
            settled = spec.slo.window + (load.startup_s(spec) if load is not None else 0.0)
            if asked.replicas <= current and last is not None and now - last < settled:
                # the rate asks for no more; the window still holds the latency from before
                # the last action's replicas could serve: nothing to size one more by yet
                desired = current
        elif sized:
            desired = by_ratio
        if lead is not None and (asked is not None or seen is not None):
            if asked is not None:
                leading_inputs(asked, inputs, thresholds)
            led = lead > desired
            desired = max(desired, lead)
        if seen is not None and seen.work_bound and slo.state == "breaching":
            alternatives.append(
                Alternative(
                    "scale up on the latency",
                    f"latency is set by the work, not by queueing: {_evidence(rnd, key)}",
                )
            )
        if desired <= current:
            return
        bounds = spec.replicas
        thresholds.update(min_replicas=bounds.min, max_replicas=bounds.max)
        desired = min(max(bounds.min, desired), bounds.max)
        leading = spec.scale.leading
        rate_led = rate_sized or (led and (top is None or top.signal == "request_rate"))
        if rate_led and asked is not None and leading is not None and leading.tolerance > 0:
            tolerated = _tolerated(rnd, spec, asked, leading.tolerance, current, desired)
            within = max(bounds.min, tolerated)
            if within < desired:
                alternatives.append(
                    Alternative(
                        f"scale to {desired}",
                        f"{within} serve the rate within its {leading.tolerance:.0%} "
                        "tolerance; the GPUs for more would restart a DDP job (the free GPUs "
                        "and the sweep tasks above their floor are too few)",
                    )
                )
                desired = within
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
        alternatives.append(Alternative(f"scale to {desired}", quota_note(left, gpr)))
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
                claimant_waits=first,
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
    if worst is not spec.slo and not led:
        pw = next((po for o, po in seen.breaching if o is worst), None) if seen else None
        name = f"P{worst.percentile:g} {worst.metric}"
        cause_text = (
            f"{key} breaching ({name} {pw or 0:.0f}ms > objective {worst.objective_ms:g}ms)"
        )
        how = f"desired ceil({current} * {ratio:.2f}) bounded = {desired}"
    if rate_sized and asked is not None and not led:
        how = (
            f"desired max(ceil({asked.planned:.1f} / {asked.per_replica:.3g} learned), "
            f"{current} + 1) bounded = {desired}"
        )
    if led and top is not None and top.signal != "request_rate":
        rule = "signal-scale-up"
        cause_text = (
            f"{key} {top.signal} {top.value:.3g} wants {top.replicas} replicas at "
            f"{_per(top)} a replica ({p_now})"
        )
        how = f"desired = the most any signal asks, bounded = {desired}"
    elif led and asked is not None:
        rule = "leading-scale-up"
        cause_text = f"{key} request rate {asked.rate:.1f}/s wants {lead} replicas ({p_now})"
        how = f"desired ceil({asked.planned:.1f} / {asked.per_replica:.3g}) bounded = {desired}"
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


def _tolerated(
    rnd: Round, spec: ServiceSpec, asked: LeadingAsk, tolerance: float, current: int, desired: int
) -> int:
    """The replicas a scale-up to ``desired`` aims at when its last ones are within the rate's
    ``tolerance``: the fewest (at least one more) that serve the planned rate within it, where
    the GPUs free now and the sweep tasks above their floor cannot place ``desired`` (the rest
    would come from a DDP job, and resizing one restarts every worker from its checkpoint, for
    replicas the tolerance would hold once the fewer run); else ``desired``."""
    within = max(
        current + 1, math.ceil(asked.planned / (asked.per_replica * (1.0 + tolerance)) - 1e-9)
    )
    if within >= desired:
        return desired
    pool, gpr = spec.pool, spec.gpus_per_replica
    tasks = sum(
        (v.workload.replicas - v.min_replicas) * v.workload.gpus_per_replica
        for v in rnd.inv.training.values()
        if v.workload.kind in TASK_KINDS and v.protected is None and v.pool_gpus.get(pool, 0)
    )
    if rnd.free(pool) + tasks >= (desired - current) * gpr:
        return desired
    return within


def _per(ask: Ask) -> str:
    """An ask's per-replica target as the policy wrote it."""
    if ask.signal in ("kv_cache", "gpu_utilization"):
        return f"{ask.target:g}%"
    return f"{ask.target:g}"


def _evidence(rnd: Round, key: str) -> str:
    sig = rnd.signals.get(key)
    return sig.work_bound.evidence if sig is not None else ""


def _signal_inputs(
    seen: Verdicts,
    worst: SloSpec,
    spec: ServiceSpec,
    inputs: dict[str, str | int | float | bool | None],
    thresholds: dict[str, str | int | float | bool | None],
) -> None:
    """The signals' readings and targets, into an explanation."""
    for a in seen.asks:
        inputs[a.signal] = round(a.value, 3)
        inputs[f"{a.signal}_replicas"] = a.replicas
        thresholds[f"{a.signal}_per_replica"] = _per(a)
    if seen.missing:
        inputs["signals_without_readings"] = ", ".join(seen.missing)
    for o, p in seen.breaching:
        inputs[f"p{o.percentile:g}_{o.metric}_ms"] = None if p is None else round(p, 2)
        thresholds[f"{o.metric}_objective_ms"] = o.objective_ms
    if worst is not spec.slo:
        thresholds["objective_ms"] = worst.objective_ms
    inputs["work_bound"] = seen.work_bound


def leading_inputs(
    asked: LeadingAsk,
    inputs: dict[str, str | int | float | bool | None],
    thresholds: dict[str, str | int | float | bool | None],
) -> None:
    """What the leading indicator read and planned with, for an explanation."""
    inputs["request_rate"] = round(asked.rate, 2)
    inputs["leading_replicas"] = asked.replicas
    key = "learned_rate_per_replica" if asked.learned else "rate_per_replica"
    (inputs if asked.learned else thresholds)[key] = round(asked.per_replica, 3)
    if asked.lookahead_s > 0:
        inputs["planned_rate"] = round(asked.planned, 2)
        inputs["rate_growth_per_s"] = round(asked.growth, 5)
        inputs["lookahead"] = format_duration(asked.lookahead_s)
    if asked.forecast is not None:
        inputs["forecast_rate"] = round(asked.forecast, 2)
    if asked.tolerance > 0:
        thresholds["rate_tolerance"] = f"{asked.tolerance:.0%}"


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


def quota_note(left: int, gpr: int) -> str:
    """Why a namespace's GPU quota limits a step (an alternative's reason)."""
    return f"namespace GPU quota has {left} left, a replica needs {gpr}"

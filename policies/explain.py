"""``ebbtide policy explain``: what a policy will do, in plain language, setting by setting.

Design:

* Every setting of the model is described, defaults included, so two policies that differ in
  any setting read differently (tests/policies/test_policy_explain.py changes each setting of a
  fully populated policy in turn and checks the text changes, and that its list of settings is
  every field of :mod:`policies.model`: a new setting fails it until it is described here).
* The explanation is data first (:class:`Explanation`: sections of subjects, each a few
  sentences) so the CLI prints it as text or as JSON (``-o json``) from one source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policies.model import (
    DO_NOT_DISRUPT,
    MigSpec,
    Policy,
    PolicySpec,
    ScaleSpec,
    ServiceSpec,
    Step,
    TrainingSpec,
    format_duration,
)

__all__ = ["Explanation", "Item", "Section", "explain"]

_d = format_duration


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.10g}%"


@dataclass(frozen=True, slots=True)
class Item:
    """One subject (a pool, a service, "budgets") and the sentences that describe it."""

    subject: str
    lines: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    items: tuple[Item, ...]


@dataclass(frozen=True, slots=True)
class Explanation:
    """A policy explained: its identity, mode and sections."""

    policy: str
    description: str
    digest: str
    mode: str
    """``live``, ``dry-run`` or ``kill-switch``."""
    sections: tuple[Section, ...]
    spec: dict[str, Any] = field(default_factory=dict)
    """The effective spec, every default filled in (durations in seconds, percentages as
    fractions), for ``-o json``."""

    def text(self) -> str:
        """The explanation as a person reads it."""
        head = f"Policy {self.policy!r}" + (f": {self.description}" if self.description else "")
        out = [head]
        if self.mode == "kill-switch":
            out.append(
                "KILL SWITCH ON: no decisions are made (windows and SLO states keep updating)."
            )
        elif self.mode == "dry-run":
            out.append("DRY RUN: decisions are explained but never carried out.")
        else:
            out.append("Live: decisions are carried out (unless the controller runs --dry-run).")
        for section in self.sections:
            out += ["", f"{section.title}:"]
            for item in section.items:
                first, *rest = item.lines
                prefix = f"  {item.subject}: " if item.subject else "  "
                out.append(prefix + first)
                out += [f"    {line}" for line in rest]
        return "\n".join(out)

    def as_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "description": self.description,
            "digest": self.digest,
            "mode": self.mode,
            "sections": [
                {
                    "title": s.title,
                    "items": [{"subject": i.subject, "lines": list(i.lines)} for i in s.items],
                }
                for s in self.sections
            ],
            "spec": self.spec,
        }


def explain(p: Policy) -> Explanation:
    """Explain ``p``: every setting, in the order a reader needs them."""
    s = p.spec
    mode = "kill-switch" if s.kill_switch else "dry-run" if s.dry_run else "live"
    sections = (
        Section("Pools", tuple(_pools(s))),
        Section(
            "Services",
            tuple(_service(s, name, svc) for name, svc in sorted(s.services.items()))
            or (Item("", ("(none)",)),),
        ),
        Section("Training", _training(s.training, s)),
        Section("MIG", _mig(s.mig)),
        Section("Limits", _limits(s)),
    )
    return Explanation(
        policy=p.metadata.name,
        description=p.metadata.description,
        digest=p.digest(),
        mode=mode,
        sections=sections,
        spec=p.spec.model_dump(mode="json", by_alias=True),
    )


def _pools(s: PolicySpec) -> list[Item]:
    items = []
    for name, pool in sorted(s.pools.items()):
        sel = ", ".join(f"{k}={v}" for k, v in sorted(pool.node_selector.items()))
        lines = [f"{pool.kind} GPUs on nodes labelled {sel}."]
        if pool.taints:
            taints = ", ".join(f"{t.key}={t.value}:{t.effect}" for t in pool.taints)
            lines.append(
                f"A MIG flow into this pool taints the node {taints}; out of it, removes them."
            )
        items.append(Item(name, tuple(lines)))
    return items


def _step(step: Step) -> str:
    return f"{step} replica(s)" if isinstance(step, int) else f"{_pct(step)} of the replicas"


#: What each latency metric an objective can be on measures.
_METRIC = {
    "e2e": "the whole request's latency",
    "ttft": "the time to the first token",
    "tpot": "the time per output token",
}


def _service(s: PolicySpec, name: str, svc: ServiceSpec) -> Item:
    slo = svc.slo
    workload = svc.workload or name
    cooldown = svc.cooldown if svc.cooldown is not None else s.cooldowns.service
    lines = [
        f"in pool {svc.pool}, workload {workload}, {svc.gpus_per_replica} GPU(s) a replica: "
        f"P{slo.percentile:g} of {_METRIC[slo.metric]} over {_d(slo.window)} (slots of "
        f"{_d(slo.resolution)}) must stay <= {slo.objective_ms:g}ms.",
        f"Breach after {_d(slo.breach_after)} above; recover after {_d(slo.recover_after)} "
        f"below {_pct(slo.recover_below)} of the objective "
        f"({slo.objective_ms * slo.recover_below:g}ms).",
        f"Fewer than {slo.min_samples} requests in the window give no verdict; a breach with "
        f"no verdict for {_d(slo.stale_after)} goes stale and expires.",
    ]
    for o in svc.objectives:
        lines.append(
            f"Also P{o.percentile:g} of {_METRIC[o.metric]} over {_d(o.window)} must stay <= "
            f"{o.objective_ms:g}ms (breach after {_d(o.breach_after)}, recover below "
            f"{_pct(o.recover_below)} for {_d(o.recover_after)}, {o.min_samples} requests for "
            f"a verdict, stale after {_d(o.stale_after)}): breaching when any objective "
            "breaches, recovered when all have."
        )
    if svc.scale is not None and svc.replicas is not None:
        lines += _scale(svc.scale, svc, workload, cooldown)
    else:
        if svc.replicas is not None:
            lines.append(
                f"Replica bounds {svc.replicas.min}..{svc.replicas.max} (unused without scale)."
            )
        lines.append("On breach: free GPUs for its pending pods (another autoscaler scales it).")
    lines.append(f"After acting for it, wait {_d(cooldown)} before acting for it again.")
    return Item(f"{svc.namespace}/{name}", tuple(lines))


def _scale(sc: ScaleSpec, svc: ServiceSpec, workload: str, cooldown: float) -> list[str]:
    assert svc.replicas is not None
    step = f"at most {sc.max_step} replica(s) a step" if sc.max_step else "no step limit"
    lines = [
        f"On breach: scale {sc.kind} {workload} to ceil(replicas x "
        f"P/objective) (tolerance {_pct(sc.tolerance)}), within {svc.replicas.min}.."
        f"{svc.replicas.max} replicas, {step}.",
    ]
    lead = sc.leading
    if lead is not None:
        if lead.learn:
            until = (
                "the percentile alone decides"
                if lead.rate_per_replica is None
                else f"{lead.rate_per_replica:g} requests/s a replica"
            )
            at = (
                "the objective / (1 + tolerance)"
                if lead.learn_at is None
                else f"{_pct(lead.learn_at)} of the objective"
            )
            per = (
                f"the requests/s a replica serves at {at}, learned from its own percentile "
                f"against its load per replica (until that fit is confident, {until}); a "
                "breach under load is sized by it, not by the percentile's ratio"
            )
        else:
            per = f"{lead.rate_per_replica:g} requests/s a replica"
        within = (
            f" (none while the rate is within {_pct(lead.tolerance)} above what the replicas serve)"
            if lead.tolerance > 0
            else ""
        )
        lines.append(
            f"Leading indicator: {per}; whenever the request rate over the window wants more "
            f"replicas, scale up to ceil(rate / that){within}, breaching or not; never scale "
            "down below it."
        )
        if lead.headroom:
            startup = (
                f"start-up {_d(lead.startup)}"
                if lead.startup is not None
                else "start-up observed from its pods (creation to Running)"
            )
            lines.append(
                f"Headroom: plans for the rate one pod start-up ahead ({startup}, plus half a "
                "window): its recent growth (as much as the fit is sure of) scaling up, its "
                "steepest recent rise (halved every 15 min) scaling down, so only replicas "
                "that could be brought back in time go."
            )
        if lead.forecast is not None:
            lines.append(
                f"Forecast: pre-scales for the highest rate the load's shape over the last "
                f"{_d(lead.forecast.period)} periods predicts within one start-up, while its "
                f"mean error stays within {_pct(lead.forecast.max_error)}; else it reacts."
            )
    else:
        lines.append("No leading indicator: scale-up waits for the percentile to breach.")
    if sc.signals is not None:
        sg = sc.signals
        named = [
            f"{what} {value}"
            for what, value in (
                ("waiting requests", None if sg.waiting is None else f"{sg.waiting:g}"),
                ("running requests", None if sg.running is None else f"{sg.running:g}"),
                ("KV-cache usage", None if sg.kv_cache is None else _pct(sg.kv_cache)),
                (
                    "GPU utilization",
                    None if sg.gpu_utilization is None else _pct(sg.gpu_utilization),
                ),
            )
            if value is not None
        ]
        lines.append(
            f"Load signals, a replica's target: {', '.join(named)}. Scale up to the most any "
            "signal or objective asks for; scale down only when every one agrees (a signal "
            f"with no reading for {_d(sg.stale_after)} vetoes it)."
        )
    if sc.work_bound is not None:
        wb = sc.work_bound
        settle = (
            _d(wb.settle)
            if wb.settle is not None
            else f"{_d(svc.slo.window + svc.slo.breach_after)} (window + breachAfter)"
        )
        lines.append(
            f"Work-bound latency: after {wb.after_steps} scale-up(s) in a row that cut the "
            f"request rate per replica by {_pct(wb.load_drop)} or more and, read {settle} "
            "later, leave the percentile above the objective even at replicas.max, latency "
            "stops driving the service: hold, then size it by its load signals."
        )
    if sc.ready_ends_cooldown:
        lines.append(
            "A scale-up's cooldown ends early once every replica runs and breachAfter has passed."
        )
    else:
        lines.append("A scale-up's cooldown runs its full length.")
    if sc.shrink_first:
        lines.append(
            "New replicas only into GPUs free now: GPUs freed from training are taken by the "
            "next step; no pod its owner would recreate is evicted for them."
        )
    else:
        lines.append("New replicas may be placed while training is still giving GPUs back.")
    down = sc.down
    if down is None:
        lines.append("Never scaled down by Ebbtide.")
    else:
        down_cooldown = down.cooldown if down.cooldown is not None else cooldown
        lines.append(
            f"Scale down while P{svc.slo.percentile:g} < {_pct(down.below)} of the objective "
            f"({svc.slo.objective_ms * down.below:g}ms), to the highest recommendation of the "
            f"last {_d(down.stabilization)}, at most {_step(down.max_step)} a step, every "
            f"{_d(down_cooldown)} at most, never below {svc.replicas.min}."
        )
        if down.crowd is not None:
            lines.append(
                f"A level not needed in the {_d(down.crowd.memory)} before that window (a flash "
                f"crowd's) is held only {_d(down.crowd.after)} after its last recommendation, "
                "then its replicas go back at once to the level needed before."
            )
    return lines


def _training(t: TrainingSpec | None, s: PolicySpec) -> tuple[Item, ...]:
    protected = ", ".join(s.protected_namespaces) or "none"
    never = Item(
        "never touched",
        (f"namespaces {protected}, anything annotated {DO_NOT_DISRUPT}, inference pods.",),
    )
    if t is None:
        return Item("", ("none selected; nothing is ever shrunk or evicted.",)), never
    sel = ", ".join(f"{k}={v}" for k, v in sorted(t.selector.items()))
    where = ", ".join(t.pools) if t.pools else "every pool"
    e = t.elastic
    owner = (
        "Ebbtide resizes training that an HPA or KEDA ScaledObject also targets."
        if t.owner == "ebbtide"
        else "Training that an HPA or KEDA ScaledObject also targets is not resized (an Event "
        "says why)."
    )
    lines = (
        f"workloads labelled {sel}, in {where}.",
        f"To free GPUs: shrink elastic ones first (down to {e.min_replicas_annotation} and "
        f"{t.gang_minimum_annotation}), then evict pods in order {' > '.join(t.victim_order)} "
        f"(progress from {t.progress_annotation}) with {_d(t.grace_period)} grace.",
        f"Pods opted in to the checkpoint handshake get {_d(t.checkpoint.deadline)} to "
        "checkpoint before eviction (their own annotation wins).",
        _grows(t),
        *_restarts(t),
        owner,
    )
    return Item("", lines), never


def _grows(t: TrainingSpec) -> str:
    e = t.elastic
    how = (
        "once into every GPU left idle"
        if e.grow_to == "idle"
        else f"by {e.grow_step} replica(s) at a time"
    )
    return (
        f"Grows back {how}, up to {e.max_replicas_annotation}, after GPUs stay idle "
        f"{_d(e.grow_after)} with no service breaching (GPUs a service's scale-down gave back "
        "at once: its stabilization waited longer); a DDP/elastic job (any kind but Job) "
        f"Ebbtide shrank or evicted from is not grown back within {_d(e.regrow_after)}."
    )


def _restarts(t: TrainingSpec) -> tuple[str, ...]:
    r = t.restarts
    lines = [
        "A DDP/elastic job restarts every worker on any membership change: priced at "
        f"{_d(r.restart_cost)} of all its GPUs plus its work since its last checkpoint "
        f"(reported by its pods, else assumed every {_d(r.checkpoint_every)} from its last "
        "start)."
    ]
    if r.tasks_first:
        lines.append(
            "Preempts sweep tasks (a Job's pods) before resizing such a job when that loses "
            "fewer GPU-hours."
        )
    if r.payback > 0:
        lines.append(
            f"Grows such a job only when the GPUs added, kept {_d(r.payback)}, compute more "
            "than its restart loses (else a sweep may take them)."
        )
    if r.checkpoint_horizon > 0:
        lines.append(
            f"Defers its grow until just after a checkpoint its pods say is due within "
            f"{_d(r.checkpoint_horizon)}."
        )
    return tuple(lines)


def _mig(m: MigSpec | None) -> tuple[Item, ...]:
    if m is None:
        return (Item("", ("off.",)),)
    state = "on" if m.enabled else "OFF (enabled: false; the settings below are unused)"
    profiles = ", ".join(f"{k} -> {' | '.join(m.layouts_for(k))}" for k in sorted(m.profiles))
    lines = [
        f"{state}. Convert {m.from_pool} nodes to {m.to_pool} when the pool stays below "
        f"{_pct(m.convert_below)} for {_d(m.convert_after)} and the node's GPUs stay at or "
        f"below {_pct(m.node_idle_below)} that whole time ({profiles}); at most "
        f"{m.max_concurrent} at once, keeping {m.min_whole_nodes} whole node(s).",
        f"Revert {m.to_pool} nodes when pods wait {_d(m.revert_after)} for more whole GPUs "
        "than are free.",
        f"A conversion not seen in the cluster after {_d(m.stuck_after)} stops counting as in "
        "flight.",
    ]
    for name, slices in sorted(m.configs.items()):
        per_gpu = ", ".join(f"{n} x {p}" for p, n in sorted(slices.items()))
        lines.append(f"Config {name}: {per_gpu} per GPU.")
    return (Item("", tuple(lines)),)


def _limits(s: PolicySpec) -> tuple[Item, ...]:
    b = s.budgets
    return (
        Item(
            "budgets",
            (
                f"{b.evictions.max} evictions per {_d(b.evictions.per)}, {b.scale_steps.max} "
                f"scale steps per {_d(b.scale_steps.per)}, {b.mig_conversions.max} MIG changes "
                f"per {_d(b.mig_conversions.per)}.",
            ),
        ),
        Item(
            "cooldowns",
            (
                f"{_d(s.cooldowns.service)} after an action for a service (unless it sets its "
                f"own); training grows at most every {_d(s.cooldowns.training_grow)}.",
            ),
        ),
    )

"""The next step of a MIG flow, decided on what was read: no API call, no clock, no gate.

:mod:`controller.kube.migflow` documents the flow (drain, relabel, wait for the MIG manager and
the device plugin, move the node into the pool, roll back). This module decides; the flow
issues. Kueue splits preemption the same way: ``GetTargets`` picks victims on a snapshot and
``IssuePreemptions`` evicts them (kubernetes-sigs/kueue ``pkg/scheduler/preemption``). Here
:func:`next_step` reads a flow's record, the node as read (a plain JSON ``dict``), the time, the
safety switches as plain values (:class:`Switches`) and, while draining, the node's GPU pods
(:class:`GpuPods`), and answers one :class:`Step`:

- :class:`Wait` — nothing to write now; the detail says what the flow waits for (or why it is
  paused);
- :class:`Write` — one merge patch of the node that applies the step *and* records it, with the
  outcome to report (the executor adds the ``resourceVersion`` it read the node at);
- :class:`ListPods` — the decision needs the node's GPU pods (only a draining flow reads them);
- :class:`EvictPods` — evict these pods; the executor lists the pods again afterwards and, once
  none is left, re-reads the node and asks again with ``drained=True``;
- :class:`Drained` — no GPU pod is left: re-read the node and ask again with ``drained=True``.

The decision imports only pure code (``policies``, the record module, the outcome enum), which
an import-linter contract in ``pyproject.toml`` keeps true, so every phase and outcome is
tested as a table (``tests/kube/test_migstep.py``, ``test_migstart.py``) without an API
server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from controller.kube.migannotation import (
    CONFIG_LABEL,
    FLOW_ANNOTATION,
    STATE_LABEL,
    FlowRecord,
    advertised,
    gpu_resources,
    labels_of,
)
from controller.loop.port import Outcome
from policies.drain import DrainRule, plan_drain
from policies.snapshot import Pod

__all__ = [
    "Drained",
    "EvictPods",
    "GpuPods",
    "ListPods",
    "MigFlowSettings",
    "Step",
    "Switches",
    "Wait",
    "Write",
    "closing_annotations",
    "draining_detail",
    "next_step",
]

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class MigFlowSettings:
    """Deadlines of a MIG flow."""

    drain_timeout_s: float = 600.0
    """Roll back when the node's GPU pods are not gone this long after the flow started."""
    reconfigure_timeout_s: float = 900.0
    """Roll back when the MIG manager has not reported ``success`` this long after the
    label was set."""
    reboot_timeout_s: float = 1800.0
    """When the MIG manager reports ``rebooting``, the deadline moves to at least this long
    after: a node rebooting to apply a MIG mode change is not rolled back mid-reboot."""
    advertise_timeout_s: float = 300.0
    """Roll back when, this long after ``success``, the node's allocatable does not show the
    layout's resources (the device plugin restarts after the MIG manager reports success)."""


@dataclass(frozen=True, slots=True)
class Switches:
    """What the safety gate says at the moment of deciding."""

    leader: bool = True
    halted: str | None = None
    """Why nothing may be done (a kill switch), or ``None``."""
    dry_run: bool = False

    @property
    def write_refusal(self) -> str | None:
        """Why a write must not happen now (as the gate's ``check_write`` says), or ``None``."""
        if not self.leader:
            return "not the leader (leadership lost before the write)"
        return self.halted


@dataclass(frozen=True, slots=True)
class GpuPods:
    """The GPU pods on a draining node."""

    left: int
    """Those not finished, terminating ones included: the drain is done at 0."""
    live: tuple[Pod, ...] = ()
    """Those not terminating, as the drain rule reads them."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Write nothing now; report the flow in progress."""

    detail: str


@dataclass(frozen=True, slots=True)
class Write:
    """One conditional merge patch of the node, then ``outcome`` reported with ``detail``."""

    patch: Obj
    outcome: Outcome
    detail: str
    recorded: bool = False
    """Counted, logged and told as an Event by the recorder (else only returned)."""
    reason: tuple[str, str] | None = None
    """The Event's reason and type, when not the outcome's default."""
    count: bool = True
    """Counted in the action statistics (the flow's verdict is counted once)."""


@dataclass(frozen=True, slots=True)
class ListPods:
    """The decision needs the node's GPU pods."""


@dataclass(frozen=True, slots=True)
class EvictPods:
    """EvictPods these pods (``namespace/name``), then list the GPU pods again."""

    pods: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Drained:
    """No GPU pod is left: re-read the node and decide with ``drained=True``."""


Step = Wait | Write | ListPods | EvictPods | Drained


@dataclass(frozen=True, slots=True)
class _Context:
    record: FlowRecord
    node: Obj
    name: str
    now: float
    limits: MigFlowSettings
    switches: Switches
    labels: Mapping[str, str]


def next_step(
    record: FlowRecord,
    node: Obj,
    *,
    now: float,
    settings: MigFlowSettings,
    switches: Switches,
    drain_rule: DrainRule,
    pods: GpuPods | None = None,
    drained: bool = False,
) -> Step:
    """The next step of the flow ``record`` on ``node`` (read with it, or re-read after the drain
    when ``drained``). Reads its inputs only; see the module docstring for the steps."""
    ctx = _Context(record, node, node["metadata"]["name"], now, settings, switches, labels_of(node))
    if record.phase == "restoring":
        return _await_restore(ctx)
    if switches.dry_run or switches.halted is not None:
        # Also once drained: the phase is still draining until the label is written, and a
        # dry-run or kill switch turned on during the evictions starts no label change.
        why = switches.halted or "dry-run"
        if record.phase == "draining":
            return _release(ctx, f"{why} turned on mid-flow")
        return Wait(f"paused ({why})")
    if drained:
        return _after_drain(ctx)
    if record.phase == "draining":
        return _drain(ctx, pods, drain_rule)
    return _await_manager(ctx)


def draining_detail(name: str, *, left: int, waiting: list[str]) -> str:
    """What a drain still waits for: the pods left and the evictions not done."""
    more = f" ({'; '.join(waiting)})" if waiting else ""
    return f"draining {name}: {left} GPU pods left{more}"


def closing_annotations(record: FlowRecord) -> dict[str, str | None]:
    """Annotations of a flow's last patch: the record goes, the autoscaler annotations the flow
    set go back to what they were (someone else's ``"true"`` stays)."""
    return {FLOW_ANNOTATION: None, **record.held_annotations}


# --- phases --------------------------------------------------------------------------------------


def _drain(ctx: _Context, pods: GpuPods | None, rule: DrainRule) -> Step:
    record = ctx.record
    if ctx.now >= record.deadline:
        why = f"GPU pods not drained within {ctx.limits.drain_timeout_s:g}s"
        return _rollback(ctx, why)
    if pods is None:
        return ListPods()
    drain = plan_drain(rule, pods.live)
    if drain.refusal is not None:
        return _rollback(ctx, drain.refusal)
    if drain.evict:
        return EvictPods(tuple(p.key for p in drain.evict))
    if pods.left:
        return Wait(draining_detail(ctx.name, left=pods.left, waiting=[]))
    return Drained()


def _after_drain(ctx: _Context) -> Step:
    record = ctx.record
    if ctx.labels.get(CONFIG_LABEL) == record.target and ctx.labels.get(STATE_LABEL) == "success":
        return _on_success(ctx)
    if (refusal := ctx.switches.write_refusal) is not None:
        return Wait(f"paused ({refusal})")
    nxt = replace(
        record, phase="reconfiguring", deadline=ctx.now + ctx.limits.reconfigure_timeout_s
    )
    patch: Obj = {
        "metadata": {
            "labels": {CONFIG_LABEL: record.target, STATE_LABEL: None},
            "annotations": {FLOW_ANNOTATION: nxt.to_json()},
        }
    }
    detail = f"drained; set {CONFIG_LABEL}={record.target}, waiting for the MIG manager"
    return Write(
        patch,
        Outcome.IN_PROGRESS,
        detail,
        recorded=True,
        reason=("EbbtideMigReconfiguring", "Normal"),
        count=False,
    )


def _await_manager(ctx: _Context) -> Step:
    record, limits = ctx.record, ctx.limits
    config, state = ctx.labels.get(CONFIG_LABEL), ctx.labels.get(STATE_LABEL)
    if config != record.target:
        return _rollback(ctx, f"{CONFIG_LABEL} changed under us to {config!r}")
    match state:
        case "success":
            return _on_success(ctx)
        case "failed":
            return _rollback(ctx, "the MIG manager reported failed")
        case "rebooting" if not record.rebooted:
            return _extend_for_reboot(ctx)
    if ctx.now >= record.deadline:
        why = (
            f"the MIG manager did not report success within "
            f"{limits.reconfigure_timeout_s:g}s (state {state or 'unset'})"
        )
        if state == "rebooting":
            why = f"the node was still rebooting {limits.reboot_timeout_s:g}s after"
            why += " the MIG manager reported it"
        return _rollback(ctx, why)
    # pending, unset (our relabel cleared it), a reboot under way, or a state we do not know
    return Wait(f"waiting for the MIG manager (state {state or 'unset'})")


def _extend_for_reboot(ctx: _Context) -> Step:
    """``rebooting``: the manager could not reset the GPUs and reboots the node to apply the
    MIG mode. Rolling back now would relabel a node mid-reboot; move the deadline (once,
    recorded, so a restarted controller keeps it) and wait."""
    if (refusal := ctx.switches.write_refusal) is not None:
        return Wait(f"paused ({refusal})")
    deadline = max(ctx.record.deadline, ctx.now + ctx.limits.reboot_timeout_s)
    detail = (
        f"the MIG manager is rebooting {ctx.name}; waiting up to "
        f"{ctx.limits.reboot_timeout_s:g}s more"
    )
    return _record_only(replace(ctx.record, rebooted=True, deadline=deadline), detail)


def _on_success(ctx: _Context) -> Step:
    """``success`` is reported before the device plugin re-advertises the GPUs: finish only
    once the node's allocatable shows the layout's resources, within its own deadline."""
    record = ctx.record
    if advertised(ctx.node, record.expect):
        return _finish(ctx)
    want = _resources(record.expect)
    have = _resources(gpu_resources(ctx.node))
    detail = f"MIG manager reported success; waiting for the device plugin ({have} → {want})"
    if record.phase != "advertising":
        if (refusal := ctx.switches.write_refusal) is not None:
            return Wait(f"paused ({refusal})")
        deadline = ctx.now + ctx.limits.advertise_timeout_s
        return _record_only(replace(record, phase="advertising", deadline=deadline), detail)
    if ctx.now >= record.deadline:
        why = (
            f"the device plugin did not advertise {want} within "
            f"{ctx.limits.advertise_timeout_s:g}s of success (allocatable: {have})"
        )
        return _rollback(ctx, why)
    return Wait(detail)


def _finish(ctx: _Context) -> Step:
    record = ctx.record
    if (refusal := ctx.switches.write_refusal) is not None:
        return Wait(f"paused ({refusal})")
    spec: Obj = {"unschedulable": True if record.was_cordoned else None}
    if record.taints:
        spec["taints"] = _moved_taints(ctx.node, record.taints)
    patch: Obj = {
        "metadata": {"labels": dict(record.pool), "annotations": closing_annotations(record)},
        "spec": spec,
    }
    pool = ",".join(f"{k}={v}" for k, v in sorted(record.pool.items()) if v is not None)
    cordon = "left cordoned as it was before" if record.was_cordoned else "uncordoned"
    detail = f"{ctx.name} is at {record.target}, moved to pool {pool}, {cordon}"
    return Write(patch, Outcome.APPLIED, detail, recorded=True)


# --- leaving a flow ------------------------------------------------------------------------------


def _release(ctx: _Context, why: str) -> Step:
    """Stop a draining flow under the kill switch or dry-run: undo our cordon and drop the
    record, which the switches allow (it only takes the node back to where it was); the
    leader alone may write it."""
    if not ctx.switches.leader:
        return Wait(f"{why}; paused (not the leader)")
    return _write_rollback(ctx, f"released: {why}")


def _rollback(ctx: _Context, why: str) -> Step:
    if (refusal := ctx.switches.write_refusal) is not None:
        return Wait(f"{why}; paused ({refusal})")
    return _write_rollback(ctx, f"rolled back: {why}")


def _write_rollback(ctx: _Context, what: str) -> Step:
    """One patch: restore the config label if ours is on; then either uncordon (unless it
    was cordoned before) and delete the record, or, when the manager must put an old layout
    back, keep the cordon and record ``restoring``. A Warning Event and a MIG-failure count
    go with it."""
    record = ctx.record
    labels: dict[str, str | None] = {}
    restored = ""
    ours = ctx.labels.get(CONFIG_LABEL) == record.target
    if ours:
        labels = {CONFIG_LABEL: record.previous, STATE_LABEL: None}
        restored = f"; {CONFIG_LABEL} restored to {record.previous or '(none)'}"
    if ours and record.previous is not None:
        deadline = ctx.now + ctx.limits.reconfigure_timeout_s
        nxt = replace(record, phase="restoring", deadline=deadline, rebooted=False)
        patch: Obj = {
            "metadata": {"labels": labels, "annotations": {FLOW_ANNOTATION: nxt.to_json()}}
        }
        cordon = "kept cordoned until the MIG manager reports the old layout back"
    else:
        patch = {
            "metadata": {"labels": labels, "annotations": closing_annotations(record)},
            "spec": {"unschedulable": True if record.was_cordoned else None},
        }
        cordon = "left cordoned as it was before" if record.was_cordoned else "uncordoned"
    return Write(patch, Outcome.FAILED, f"{what}{restored}; {cordon}", recorded=True)


def _await_restore(ctx: _Context) -> Step:
    """A rolled-back flow waits for the MIG manager to put the old layout back, then
    uncordons; on ``failed`` or silence past the deadline it leaves the node cordoned for an
    operator. Its outcome (FAILED) was reported when the rollback started: these steps are
    Events and log lines, reported as IN_PROGRESS so the ledger's verdict stands."""
    record = ctx.record
    state = ctx.labels.get(STATE_LABEL)
    if state == "rebooting" and not record.rebooted:
        return _extend_for_reboot(ctx)
    restored = (
        ctx.labels.get(CONFIG_LABEL) == record.previous
        and state == "success"
        and advertised(ctx.node, record.previous_resources)
    )
    late = ctx.now >= record.deadline
    if not restored and state != "failed" and not late:
        detail = f"rolled back; waiting for the MIG manager to restore {record.previous}"
        return Wait(f"{detail} (state {state or 'unset'})")
    if (refusal := ctx.switches.write_refusal) is not None:
        return Wait(f"paused ({refusal})")
    if restored:
        unschedulable = True if record.was_cordoned else None
        reason = ("EbbtideMigRestored", "Normal")
        detail = f"{ctx.name} is back at {record.previous}; " + (
            "left cordoned as it was before" if record.was_cordoned else "uncordoned"
        )
    else:
        unschedulable = True
        reason = ("EbbtideMigRestoreFailed", "Warning")
        how = "reported failed" if state == "failed" else "no success before the deadline"
        detail = (
            f"the MIG manager did not restore {record.previous} ({how}); "
            f"{ctx.name} left cordoned: check its GPUs, then uncordon it"
        )
    patch: Obj = {
        "metadata": {"annotations": closing_annotations(record)},
        "spec": {"unschedulable": unschedulable},
    }
    return Write(patch, Outcome.IN_PROGRESS, detail, recorded=True, reason=reason, count=False)


# --- helpers -------------------------------------------------------------------------------------


def _record_only(record: FlowRecord, detail: str) -> Write:
    """A transition that changes nothing on the node but its record."""
    patch: Obj = {"metadata": {"annotations": {FLOW_ANNOTATION: record.to_json()}}}
    return Write(patch, Outcome.IN_PROGRESS, detail)


def _moved_taints(node: Obj, moves: Mapping[str, str | None]) -> list[Obj]:
    """The node's taints after a pool move: ones the pools do not list kept as they are (in
    order), the source pool's dropped, the destination pool's set. A merge patch replaces the
    whole list, so this is written with the node's resourceVersion like every other step."""
    kept = [
        dict(t)
        for t in (node.get("spec") or {}).get("taints") or []
        if f"{t.get('key')}:{t.get('effect')}" not in moves
    ]
    for where, value in sorted(moves.items()):
        if value is not None:
            key, effect = where.rsplit(":", 1)
            taint = {"key": key, "value": value, "effect": effect}
            kept.append(taint if value else {"key": key, "effect": effect})
    return kept


def _resources(resources: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={n or '>0'}" for k, n in sorted(resources.items())) or "none"

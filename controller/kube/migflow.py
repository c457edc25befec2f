"""MIG conversion (and revert) of a node as a resumable workflow recorded on the node itself.

The NVIDIA MIG manager repartitions a node's GPUs when its ``nvidia.com/mig.config`` label
changes and reports ``nvidia.com/mig.config.state``: ``pending`` while it works, ``rebooting``
when a GPU reset failed and it reboots the node to apply the MIG mode, then ``success`` or
``failed`` (NVIDIA/mig-parted ``deployments/gpu-operator/reconfigure-mig.sh``). It does not
drain the node. Whoever changes the label must cordon the node and move its GPU pods off first,
and must not leave it cordoned when anything goes wrong. That takes minutes, so it cannot be one
blocking call: it is a small state machine advanced by :meth:`MigFlow.advance` /
:meth:`MigFlow.resume_all` on each evaluation tick, with its whole state in one JSON annotation
on the node (``ebbtide.io/mig-flow``, :class:`~controller.kube.migrecord.FlowRecord`).

Convert (whole cards → MIG) and revert (MIG → ``all-disabled``) are the same flow:

1. **start** — one patch, conditional on the node's ``resourceVersion``: cordon, write the
   record (phase ``draining``) and set ``karpenter.sh/do-not-disrupt`` and
   ``cluster-autoscaler.kubernetes.io/scale-down-disabled`` to ``"true"``, so neither
   autoscaler removes a node that looks empty and cordoned mid-flow; the last patch of the flow
   puts their previous values back (someone else's ``"true"`` stays). The MIG budget is spent
   here, once per flow. A target config that names no known layout fails before anything.
2. **draining** — list the node's GPU pods; if any of them may not be evicted by the drain rule
   the engine plans with (:mod:`policies.drain`: protected namespace, ``do-not-disrupt``, a
   service's pod, not training) roll back before evicting anything; otherwise evict them through
   the actuator's own eviction path (Eviction API, eviction budget, Events).
   A PDB 429 or a spent budget just leaves the flow in ``draining`` for the next tick; the drain
   deadline rolls it back.
3. **reconfiguring** — one patch once no GPU pod is left: set ``nvidia.com/mig.config`` to the
   target, delete the stale ``nvidia.com/mig.config.state`` (so an old ``success`` cannot be
   mistaken for the new one) and record the phase. Then wait for the manager: ``success`` →
   advertising; ``failed``, or no ``success`` before the deadline → roll back; ``pending`` or
   unset → wait; ``rebooting`` → move the deadline to at least ``reboot_timeout_s`` from now,
   once, recorded (relabelling a node mid-reboot would only make the manager redo its work).
3b. **advertising** — the manager reports ``success`` and *then* lets the device plugin back
   (it re-enables the ``nvidia.com/gpu.deploy.*`` components after applying the layout), so
   for a while the node advertises the old resources or none. Finish only once its
   ``status.allocatable`` shows what the layout gives under the node's MIG strategy (GFD's
   ``nvidia.com/mig.strategy`` label, read at start): ``nvidia.com/mig-<profile>`` counts under
   ``mixed``, the instances as ``nvidia.com/gpu`` under ``single`` (56 on 8 A100-80GB at
   ``all-1g.10gb``), whole ``nvidia.com/gpu`` for a revert (:func:`policies.miglayout.
   expected_resources`, recorded at start); past ``advertise_timeout_s`` roll back. Physical
   GPUs come from ``nvidia.com/gpu.count``, which under ``single`` counts a MIG node's
   instances (:func:`policies.miglayout.cards_of`). A layout of several profiles on a
   ``single`` node fails at start, like an unknown config: the device plugin cannot advertise
   it. (Under ``single``, ``all-7g.80gb`` and whole cards advertise the same count: there the
   flow cannot tell the restarted plugin from the old one and finishes on ``success``.)
4. **finish** — one patch: move the node to the destination pool (its label key/values come from
   the policy's pool ``nodeSelector``; keys only the source pool uses are removed), write the
   destination pool's ``taints`` and drop the source pool's (matched by key and effect; other
   taints stay), uncordon it unless it was cordoned before, and delete the record.

**Rollback** is one patch too: restore the previous config label (when ours is still there),
uncordon unless it was cordoned before, delete the record; a Warning Event and a MIG-failure count
go with it. When the config label had already been changed and the previous one names a layout,
the MIG manager has to put that layout back first: the rollback patch restores the label, keeps
the node cordoned and records the phase ``restoring`` with its own deadline; the node is
uncordoned (and the record deleted) only once the manager reports ``success`` for the old layout,
and the resources the node advertised before are back, so no GPU pod lands on half-configured
cards (a ``rebooting`` there extends its deadline as above). If it reports ``failed`` or stays
silent past the deadline, the node is left cordoned for an operator with an
``EbbtideMigRestoreFailed`` Warning
(its record deleted, so nothing waits on it any more). The flow's outcome, FAILED, is reported
when the rollback starts; the budget unit comes back then.

Every transition is a single conditional patch that applies the step *and* records it, so a
controller that dies anywhere finds either the old phase (and redoes an idempotent
step) or the new one: it resumes or rolls back, never starts over, never forgets a cordon.
A 409 means the node moved under us: re-read and decide again.

**Kill switch or dry-run turned on mid-flow.** Neither starts anything new: no eviction, no MIG
label change, no pool move. A flow still ``draining`` (the config label untouched) is released at
once — uncordoned unless it was cordoned before, its record deleted, a Warning Event — because
undoing our own cordon is the one write that takes the cluster back to where it was, and waiting
for the switch to be lifted could leave the node cordoned indefinitely. A flow already
``reconfiguring`` or ``advertising`` is paused where it stands: the MIG manager is
repartitioning (or the device plugin is not back), and uncordoning before the layout is known
and advertised would schedule GPU pods onto it. A flow ``restoring`` goes on:
waiting for the old layout and uncordoning only take the node back to where it was. Lost
leadership pauses any flow (a follower writes nothing); the next leader resumes it from the
record.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, TypeVar

import structlog
from kubernetes_asyncio import client

from controller.cluster import ActionResult, Outcome
from controller.kube.client import Conflict, KubeError, NotFound, call
from controller.kube.migrecord import (
    AUTOSCALER_HOLD,
    CONFIG_LABEL,
    FLOW_ANNOTATION,
    STATE_LABEL,
    Direction,
    FlowRecord,
    MigDecision,
    advertised,
    annotations_of,
    gpu_count,
    gpu_resources,
    is_cordoned,
    labels_of,
    record_of,
    uses_gpus,
)
from controller.kube.recorder import ObjectRef, Recorder
from controller.kube.translate import (
    DEPLOYMENT,
    PYTORCHJOB,
    STATEFULSET,
    Priorities,
    WorkloadKind,
    pod_from,
)
from controller.safety import SafetyGate, Target, Verdict
from policies.decisions import Evict, Explanation, MigConvert
from policies.drain import DrainRule, plan_drain
from policies.miglayout import expected_resources, layout_of, strategy_of
from policies.model import PoolSpec
from policies.snapshot import MIG_DISABLED

__all__ = [
    "CONFIG_LABEL",
    "FLOW_ANNOTATION",
    "STATE_LABEL",
    "ApiLimits",
    "FlowRecord",
    "MigFlow",
    "MigFlowSettings",
]

log = structlog.get_logger(__name__)
T = TypeVar("T")

MERGE_PATCH: Final = "application/merge-patch+json"
#: A drain needs no priorities.
_NO_PRIORITIES: Final = Priorities()
_CONFLICT_RETRIES: Final = 3

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ApiLimits:
    """How hard one API call is tried (see :func:`controller.kube.client.call`)."""

    timeout_s: float = 10.0
    """Timeout of one try."""
    attempts: int = 5
    """Tries of a call failing transiently (5xx, throttled 429, timeouts)."""
    deadline_s: float = 30.0
    """Give up retrying after this long."""

    async def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await call(
            fn, attempts=self.attempts, deadline_s=self.deadline_s, timeout_s=self.timeout_s
        )

    async def get(self, api: client.ApiClient, path: str, **query: str) -> Obj:
        """GET ``path`` as plain JSON: no model classes, whose client-side validation would
        refuse partial objects, and the same ``dict`` shape for built-in and custom kinds."""
        out: Obj = await self.run(
            lambda: api.call_api(
                path,
                "GET",
                query_params=list(query.items()),
                header_params={"Accept": "application/json"},
                response_types_map={200: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
        )
        return out


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


class MigFlow:
    """Starts, advances and rolls back MIG flows on nodes; see the module docstring."""

    def __init__(
        self,
        api: client.ApiClient,
        gate: SafetyGate,
        recorder: Recorder,
        *,
        evict: Callable[[Evict], Awaitable[ActionResult]],
        nodes: Callable[[], Iterable[Obj]],
        workload_kinds: Sequence[WorkloadKind] = (DEPLOYMENT, STATEFULSET, PYTORCHJOB),
        settings: MigFlowSettings | None = None,
        limits: ApiLimits | None = None,
    ) -> None:
        self._api = api
        self._core: Any = client.CoreV1Api(api)  # untyped edge: bodies are plain dicts
        self._gate = gate
        self._recorder = recorder
        self._evict = evict
        self._nodes = nodes
        self._kinds = tuple(workload_kinds)
        """The owners a drain recognises a service's pod by: the kinds the actuator scales."""
        self.settings = settings or MigFlowSettings()
        self._limits = limits or ApiLimits()

    # --- public ----------------------------------------------------------------------------------

    async def start(self, decision: MigDecision) -> ActionResult:
        """Carry out a MIG decision: start its flow, or advance the one already running."""
        ref = ObjectRef("Node", decision.node)
        began = self._gate.now()
        with self._gate.hold(decision) as permit:
            if not permit.ok:
                return await self._verdict(decision, permit.verdict, ref)
            outcome = await self._settle(
                lambda: self._start_once(decision, permit.reserve, permit.spend)
            )
            if isinstance(outcome, ActionResult):
                return outcome
            record = await self._flow_on(decision.node)
            if record is not None and record.started >= began:  # ours, only the answer was lost
                permit.spend()
                detail = f"{outcome}; the flow was started and resumes on the next tick"
                return ActionResult(decision, Outcome.IN_PROGRESS, detail)
            return await self._done(decision, Outcome.FAILED, outcome, ref)

    async def advance(self, name: str) -> ActionResult | None:
        """Move the flow recorded on node ``name`` on by at most one phase; ``None`` when the
        node has no flow (or cannot be read now). Waiting is never recorded; transitions are."""
        record = await self._flow_on(name)
        if record is None:
            return None
        decision = record.decision(name)
        with self._gate.hold(decision) as permit:
            if not permit.ok:
                outcome = permit.verdict.outcome or Outcome.REFUSED
                return ActionResult(decision, outcome, permit.verdict.reason)
            result = await self._settle(lambda: self._advance_once(decision))
            if isinstance(result, ActionResult):
                return result
            return ActionResult(decision, Outcome.IN_PROGRESS, f"{result}; retrying next tick")

    async def resume_all(self) -> list[ActionResult]:
        """Advance every flow recorded on any node (after a restart, and on every tick). Flows
        are found in the cached nodes (the watch cache), never by listing nodes: this runs on
        every evaluation; each flow's node is then read fresh before anything is decided. Under
        the kill switch, draining flows are released instead (see the module docstring)."""
        if not self._gate.leader():
            return []
        names = sorted(
            node["metadata"]["name"]
            for node in self._nodes()
            if FLOW_ANNOTATION in annotations_of(node)
        )
        halted = self._gate.halted()
        results: list[ActionResult] = []
        for name in names:
            if halted is not None:
                result = await self._release_halted(name, halted)
            else:
                result = await self.advance(name)
            if result is not None:
                results.append(result)
        return results

    # --- steps ---------------------------------------------------------------------------------

    async def _start_once(
        self,
        decision: MigDecision,
        reserve: Callable[[], Verdict],
        spend: Callable[[], None],
    ) -> ActionResult:
        name = decision.node
        ref = ObjectRef("Node", name)
        try:
            node = await self._read_node(name)
        except NotFound:
            return await self._done(decision, Outcome.FAILED, f"node {name} not found", ref)
        ref = ref.with_uid(node["metadata"].get("uid"))
        direction: Direction = "convert" if isinstance(decision, MigConvert) else "revert"
        target = decision.profile if direction == "convert" else MIG_DISABLED
        try:
            record = record_of(node)
        except ValueError as exc:
            return await self._done(decision, Outcome.FAILED, str(exc), ref)
        if record is not None:
            if record.direction == direction and record.target == target:
                return await self._advance_once(decision)
            detail = f"another MIG flow ({record.direction} to {record.target}) is in progress"
            return ActionResult(decision, Outcome.IN_PROGRESS, detail)
        labels = labels_of(node)
        verdict = self._gate.check_target(
            decision, Target("Node", name, None, labels, annotations_of(node))
        )
        pool = self._pool_move(direction)
        configs = self._gate.policy.spec.mig.configs if self._gate.policy.spec.mig else {}
        try:
            expect = expected_resources(
                layout_of(target, configs),
                gpu_count(node, configs),
                strategy=strategy_of(labels),
            )
        except ValueError as exc:
            return await self._done(decision, Outcome.FAILED, str(exc), ref)
        if self._already_done(node, target, pool):
            return await self._done(decision, Outcome.ALREADY_DONE, f"{name} is at {target}", ref)
        if not verdict.ok or not (verdict := reserve()).ok:
            return await self._verdict(decision, verdict, ref)
        plan = f"cordon {name}, drain its GPU pods, set {CONFIG_LABEL}={target}"
        if self._gate.dry_run_for(decision):
            return await self._done(decision, Outcome.DRY_RUN, f"would {plan}", ref)
        if not (verdict := self._gate.check_write()).ok:
            return await self._verdict(decision, verdict, ref)
        now = self._gate.now()
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
            deadline=now + self.settings.drain_timeout_s,
            expect=expect,
            previous_resources=gpu_resources(node),
            taints=self._taint_move(direction),
            held_annotations={k: annotations_of(node).get(k) for k in AUTOSCALER_HOLD},
        )
        hold = dict.fromkeys(AUTOSCALER_HOLD, "true")
        patch: Obj = {
            "metadata": {"annotations": {FLOW_ANNOTATION: record.to_json(), **hold}},
            "spec": {"unschedulable": True},
        }
        await self._patch_node(node, patch)
        spend()
        await self._done(decision, Outcome.IN_PROGRESS, f"started: {plan}", ref)
        return await self._advance_once(decision)

    async def _advance_once(self, decision: MigDecision) -> ActionResult:
        name = decision.node
        node = await self._read_node(name)
        record = record_of(node)
        if record is None:
            return ActionResult(decision, Outcome.ALREADY_DONE, "the flow has finished")
        if record.phase == "restoring":
            return await self._await_restore(decision, node, record)
        if self._gate.dry_run_for(decision) or self._gate.halted() is not None:
            why = self._gate.halted() or "dry-run"
            if record.phase == "draining":
                return await self._release(decision, node, record, f"{why} turned on mid-flow")
            return ActionResult(decision, Outcome.IN_PROGRESS, f"paused ({why})")
        if record.phase == "draining":
            return await self._drain(decision, node, record)
        return await self._await_manager(decision, node, record)

    async def _drain(self, decision: MigDecision, node: Obj, record: FlowRecord) -> ActionResult:
        name = decision.node
        if self._gate.now() >= record.deadline:
            why = f"GPU pods not drained within {self.settings.drain_timeout_s:g}s"
            return await self._rollback(decision, node, record, why)
        pods = await self._gpu_pods(name)
        live = [
            pod
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and (pod := pod_from(p, priorities=_NO_PRIORITIES, kinds=self._kinds)) is not None
        ]
        drain = plan_drain(DrainRule.of(self._gate.policy), live)
        if drain.refusal is not None:
            return await self._rollback(decision, node, record, drain.refusal)
        evictions = [self._drain_eviction(decision, record, p.key) for p in drain.evict]
        waiting: list[str] = []
        for eviction in evictions:
            result = await self._evict(eviction)
            if result.outcome not in (Outcome.APPLIED, Outcome.ALREADY_DONE):
                waiting.append(f"{eviction.pod} {result.outcome.value}")
        if evictions:
            pods = await self._gpu_pods(name)
        if pods:
            more = f" ({'; '.join(waiting)})" if waiting else ""
            detail = f"draining {name}: {len(pods)} GPU pods left{more}"
            return ActionResult(decision, Outcome.IN_PROGRESS, detail)
        node = await self._read_node(name)  # the evictions took a while: write on a fresh read
        labels = labels_of(node)
        if labels.get(CONFIG_LABEL) == record.target and labels.get(STATE_LABEL) == "success":
            return await self._on_success(decision, node, record)
        if not (verdict := self._gate.check_write()).ok:
            return ActionResult(decision, Outcome.IN_PROGRESS, f"paused ({verdict.reason})")
        now = self._gate.now()
        nxt = replace(
            record, phase="reconfiguring", deadline=now + self.settings.reconfigure_timeout_s
        )
        patch: Obj = {
            "metadata": {
                "labels": {CONFIG_LABEL: record.target, STATE_LABEL: None},
                "annotations": {FLOW_ANNOTATION: nxt.to_json()},
            }
        }
        await self._patch_node(node, patch)
        detail = f"drained; set {CONFIG_LABEL}={record.target}, waiting for the MIG manager"
        await self._done(
            decision,
            Outcome.IN_PROGRESS,
            detail,
            self._ref(node),
            reason=("EbbtideMigReconfiguring", "Normal"),
            count=False,
        )
        return ActionResult(decision, Outcome.IN_PROGRESS, detail)

    async def _await_manager(
        self, decision: MigDecision, node: Obj, record: FlowRecord
    ) -> ActionResult:
        labels = labels_of(node)
        config, state = labels.get(CONFIG_LABEL), labels.get(STATE_LABEL)
        if config != record.target:
            why = f"{CONFIG_LABEL} changed under us to {config!r}"
            return await self._rollback(decision, node, record, why)
        match state:
            case "success":
                return await self._on_success(decision, node, record)
            case "failed":
                why = "the MIG manager reported failed"
                return await self._rollback(decision, node, record, why)
            case "rebooting" if not record.rebooted:
                return await self._extend_for_reboot(decision, node, record)
        if self._gate.now() >= record.deadline:
            why = (
                f"the MIG manager did not report success within "
                f"{self.settings.reconfigure_timeout_s:g}s (state {state or 'unset'})"
            )
            if state == "rebooting":
                why = f"the node was still rebooting {self.settings.reboot_timeout_s:g}s after"
                why += " the MIG manager reported it"
            return await self._rollback(decision, node, record, why)
        # pending, unset (our relabel cleared it), a reboot under way, or a state we do not know
        detail = f"waiting for the MIG manager (state {state or 'unset'})"
        return ActionResult(decision, Outcome.IN_PROGRESS, detail)

    async def _extend_for_reboot(
        self, decision: MigDecision, node: Obj, record: FlowRecord
    ) -> ActionResult:
        """``rebooting``: the manager could not reset the GPUs and reboots the node to apply the
        MIG mode. Rolling back now would relabel a node mid-reboot; move the deadline (once,
        recorded, so a restarted controller keeps it) and wait."""
        if not (verdict := self._gate.check_write()).ok:
            return ActionResult(decision, Outcome.IN_PROGRESS, f"paused ({verdict.reason})")
        deadline = max(record.deadline, self._gate.now() + self.settings.reboot_timeout_s)
        await self._patch_record(node, replace(record, rebooted=True, deadline=deadline))
        detail = (
            f"the MIG manager is rebooting {decision.node}; waiting up to "
            f"{self.settings.reboot_timeout_s:g}s more"
        )
        return ActionResult(decision, Outcome.IN_PROGRESS, detail)

    async def _on_success(
        self, decision: MigDecision, node: Obj, record: FlowRecord
    ) -> ActionResult:
        """``success`` is reported before the device plugin re-advertises the GPUs: finish only
        once the node's allocatable shows the layout's resources, within its own deadline."""
        if advertised(node, record.expect):
            return await self._finish(decision, node, record)
        want = _resources(record.expect)
        have = _resources(gpu_resources(node))
        if record.phase != "advertising":
            if not (verdict := self._gate.check_write()).ok:
                return ActionResult(decision, Outcome.IN_PROGRESS, f"paused ({verdict.reason})")
            deadline = self._gate.now() + self.settings.advertise_timeout_s
            await self._patch_record(node, replace(record, phase="advertising", deadline=deadline))
        elif self._gate.now() >= record.deadline:
            why = (
                f"the device plugin did not advertise {want} within "
                f"{self.settings.advertise_timeout_s:g}s of success (allocatable: {have})"
            )
            return await self._rollback(decision, node, record, why)
        detail = f"MIG manager reported success; waiting for the device plugin ({have} → {want})"
        return ActionResult(decision, Outcome.IN_PROGRESS, detail)

    async def _finish(self, decision: MigDecision, node: Obj, record: FlowRecord) -> ActionResult:
        if not (verdict := self._gate.check_write()).ok:
            return ActionResult(decision, Outcome.IN_PROGRESS, f"paused ({verdict.reason})")
        spec: Obj = {"unschedulable": True if record.was_cordoned else None}
        if record.taints:
            spec["taints"] = _moved_taints(node, record.taints)
        patch: Obj = {
            "metadata": {"labels": dict(record.pool), "annotations": _closing(record)},
            "spec": spec,
        }
        await self._patch_node(node, patch)
        pool = ",".join(f"{k}={v}" for k, v in sorted(record.pool.items()) if v is not None)
        cordon = "left cordoned as it was before" if record.was_cordoned else "uncordoned"
        detail = f"{decision.node} is at {record.target}, moved to pool {pool}, {cordon}"
        return await self._done(decision, Outcome.APPLIED, detail, self._ref(node))

    async def _release_halted(self, name: str, halted: str) -> ActionResult | None:
        """Under the kill switch (which the gate's permits refuse): release a draining flow's
        node, leave a reconfiguring one paused. ``None`` when the node has no flow."""
        record = await self._flow_on(name)
        if record is None:
            return None
        decision = record.decision(name)
        if record.phase in ("reconfiguring", "advertising"):
            return ActionResult(decision, Outcome.IN_PROGRESS, f"paused ({halted})")
        why = f"{halted} turned on mid-flow"
        result = await self._settle(lambda: self._read_then_release(decision, why))
        if isinstance(result, ActionResult):
            return result
        return ActionResult(decision, Outcome.IN_PROGRESS, f"{result}; retrying next tick")

    async def _read_then_release(self, decision: MigDecision, why: str) -> ActionResult:
        node = await self._read_node(decision.node)
        record = record_of(node)
        if record is None:
            return ActionResult(decision, Outcome.ALREADY_DONE, "the flow has finished")
        if record.phase == "restoring":
            return await self._await_restore(decision, node, record)
        return await self._release(decision, node, record, why)

    async def _release(
        self, decision: MigDecision, node: Obj, record: FlowRecord, why: str
    ) -> ActionResult:
        """Stop a draining flow under the kill switch or dry-run: undo our cordon and drop the
        record, which the switches allow (it only takes the node back to where it was); the
        leader alone may write it."""
        if not self._gate.leader():
            return ActionResult(decision, Outcome.IN_PROGRESS, f"{why}; paused (not the leader)")
        return await self._write_rollback(decision, node, record, f"released: {why}")

    async def _rollback(
        self, decision: MigDecision, node: Obj, record: FlowRecord, why: str
    ) -> ActionResult:
        if not (verdict := self._gate.check_write()).ok:
            return ActionResult(decision, Outcome.IN_PROGRESS, f"{why}; paused ({verdict.reason})")
        return await self._write_rollback(decision, node, record, f"rolled back: {why}")

    async def _write_rollback(
        self, decision: MigDecision, node: Obj, record: FlowRecord, what: str
    ) -> ActionResult:
        """One patch: restore the config label if ours is on; then either uncordon (unless it
        was cordoned before) and delete the record, or, when the manager must put an old layout
        back, keep the cordon and record ``restoring``. A Warning Event and a MIG-failure count
        go with it."""
        labels: dict[str, str | None] = {}
        restored = ""
        ours = labels_of(node).get(CONFIG_LABEL) == record.target
        if ours:
            labels = {CONFIG_LABEL: record.previous, STATE_LABEL: None}
            restored = f"; {CONFIG_LABEL} restored to {record.previous or '(none)'}"
        if ours and record.previous is not None:
            deadline = self._gate.now() + self.settings.reconfigure_timeout_s
            nxt = replace(record, phase="restoring", deadline=deadline, rebooted=False)
            patch: Obj = {
                "metadata": {"labels": labels, "annotations": {FLOW_ANNOTATION: nxt.to_json()}}
            }
            cordon = "kept cordoned until the MIG manager reports the old layout back"
        else:
            patch = {
                "metadata": {"labels": labels, "annotations": _closing(record)},
                "spec": {"unschedulable": True if record.was_cordoned else None},
            }
            cordon = "left cordoned as it was before" if record.was_cordoned else "uncordoned"
        await self._patch_node(node, patch)
        detail = f"{what}{restored}; {cordon}"
        return await self._done(decision, Outcome.FAILED, detail, self._ref(node))

    async def _await_restore(
        self, decision: MigDecision, node: Obj, record: FlowRecord
    ) -> ActionResult:
        """A rolled-back flow waits for the MIG manager to put the old layout back, then
        uncordons; on ``failed`` or silence past the deadline it leaves the node cordoned for an
        operator. Its outcome (FAILED) was reported when the rollback started: these steps are
        Events and log lines, reported as IN_PROGRESS so the ledger's verdict stands."""
        labels = labels_of(node)
        state = labels.get(STATE_LABEL)
        if state == "rebooting" and not record.rebooted:
            return await self._extend_for_reboot(decision, node, record)
        restored = (
            labels.get(CONFIG_LABEL) == record.previous
            and state == "success"
            and advertised(node, record.previous_resources)
        )
        late = self._gate.now() >= record.deadline
        if not restored and state != "failed" and not late:
            detail = f"rolled back; waiting for the MIG manager to restore {record.previous}"
            return ActionResult(
                decision, Outcome.IN_PROGRESS, f"{detail} (state {state or 'unset'})"
            )
        if not (verdict := self._gate.check_write()).ok:
            return ActionResult(decision, Outcome.IN_PROGRESS, f"paused ({verdict.reason})")
        if restored:
            unschedulable = True if record.was_cordoned else None
            reason = ("EbbtideMigRestored", "Normal")
            detail = f"{decision.node} is back at {record.previous}; " + (
                "left cordoned as it was before" if record.was_cordoned else "uncordoned"
            )
        else:
            unschedulable = True
            reason = ("EbbtideMigRestoreFailed", "Warning")
            how = "reported failed" if state == "failed" else "no success before the deadline"
            detail = (
                f"the MIG manager did not restore {record.previous} ({how}); "
                f"{decision.node} left cordoned: check its GPUs, then uncordon it"
            )
        patch: Obj = {
            "metadata": {"annotations": _closing(record)},
            "spec": {"unschedulable": unschedulable},
        }
        await self._patch_node(node, patch)
        await self._done(
            decision, Outcome.IN_PROGRESS, detail, self._ref(node), reason=reason, count=False
        )
        return ActionResult(decision, Outcome.IN_PROGRESS, detail)

    # --- helpers -------------------------------------------------------------------------------

    def _pools(self, direction: Direction) -> tuple[PoolSpec | None, PoolSpec | None]:
        """The source and destination pools of a flow in ``direction`` (``None``: no such
        pool in the policy)."""
        spec = self._gate.policy.spec
        if spec.mig is None:
            return None, None
        src, dst = (spec.mig.from_pool, spec.mig.to_pool)
        if direction == "revert":
            src, dst = dst, src
        return spec.pools.get(src), spec.pools.get(dst)

    def _pool_move(self, direction: Direction) -> dict[str, str | None]:
        """Labels that move a node into the destination pool and out of the source pool."""
        src, dst = self._pools(direction)
        move: dict[str, str | None] = dict(dst.node_selector) if dst is not None else {}
        for key in src.node_selector if src is not None else {}:
            move.setdefault(key, None)
        return move

    def _taint_move(self, direction: Direction) -> dict[str, str | None]:
        """Taints (``key:effect`` → value, ``None`` removes) that go with the pool move: the
        destination pool's, and the source pool's it does not also list, removed."""
        src, dst = self._pools(direction)
        move: dict[str, str | None] = {
            f"{t.key}:{t.effect}": t.value for t in (dst.taints if dst is not None else [])
        }
        for t in src.taints if src is not None else []:
            move.setdefault(f"{t.key}:{t.effect}", None)
        return move

    @staticmethod
    def _already_done(node: Obj, target: str, pool: Mapping[str, str | None]) -> bool:
        labels = labels_of(node)
        config = labels.get(CONFIG_LABEL) or MIG_DISABLED
        in_pool = all(labels.get(k) == v for k, v in pool.items())
        settled = labels.get(STATE_LABEL) == "success" or (
            target == MIG_DISABLED and STATE_LABEL not in labels
        )
        return config == target and settled and in_pool and not is_cordoned(node)

    def _drain_eviction(self, decision: MigDecision, record: FlowRecord, pod: str) -> Evict:
        training = self._gate.policy.spec.training
        grace = training.grace_period if training is not None else 30.0
        return Evict(
            self._gate.now(),
            pod,
            decision.node,
            None,
            grace,
            Explanation.of(
                "mig-drain",
                f"drain {decision.node} for MIG {record.direction} to {record.target} "
                f"([{record.rule}] {record.reason})",
                inputs={"node": decision.node, "target": record.target},
            ),
        )

    async def _gpu_pods(self, node: str) -> list[Obj]:
        pods = await self._limits.get(
            self._api, "/api/v1/pods", fieldSelector=f"spec.nodeName={node}"
        )
        return [
            p
            for p in pods.get("items") or []
            if uses_gpus(p) and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]

    async def _flow_on(self, name: str) -> FlowRecord | None:
        try:
            return record_of(await self._read_node(name))
        except KubeError as exc:
            log.warning("ebbtide.mig_flow_unread", node=name, error=str(exc))
        except ValueError as exc:
            log.error("ebbtide.mig_flow_unreadable", node=name, error=str(exc))
        return None

    @staticmethod
    async def _settle(step: Callable[[], Awaitable[ActionResult]]) -> ActionResult | str:
        """Run ``step`` (which re-reads the node), again on a 409; a string says why it gave
        up."""
        try:
            for _ in range(_CONFLICT_RETRIES):
                try:
                    return await step()
                except Conflict:
                    continue
            return f"the node kept changing ({_CONFLICT_RETRIES} conflicts)"
        except KubeError as exc:
            return f"API error: {exc}"

    async def _read_node(self, name: str) -> Obj:
        return await self._limits.get(self._api, f"/api/v1/nodes/{name}")

    async def _patch_record(self, node: Obj, record: FlowRecord) -> None:
        """Record a transition that changes nothing else on the node."""
        patch: Obj = {"metadata": {"annotations": {FLOW_ANNOTATION: record.to_json()}}}
        await self._patch_node(node, patch)

    async def _patch_node(self, node: Obj, patch: Obj) -> None:
        """Merge-patch ``node`` conditionally on the resourceVersion it was read at (409 if it
        changed since)."""
        body = dict(patch)
        body["metadata"] = {
            **(patch.get("metadata") or {}),
            "resourceVersion": node["metadata"]["resourceVersion"],
        }
        name = node["metadata"]["name"]
        await self._limits.run(lambda: self._core.patch_node(name, body, _content_type=MERGE_PATCH))

    @staticmethod
    def _ref(node: Obj) -> ObjectRef:
        return ObjectRef("Node", node["metadata"]["name"], uid=node["metadata"].get("uid"))

    async def _verdict(
        self, decision: MigDecision, verdict: Verdict, ref: ObjectRef
    ) -> ActionResult:
        outcome = verdict.outcome or Outcome.REFUSED
        if outcome is Outcome.IN_PROGRESS:  # a duplicate while in flight: nothing to tell
            return ActionResult(decision, outcome, verdict.reason)
        return await self._done(decision, outcome, verdict.reason, ref)

    async def _done(
        self,
        decision: MigDecision,
        outcome: Outcome,
        detail: str,
        ref: ObjectRef,
        *,
        reason: tuple[str, str] | None = None,
        count: bool = True,
    ) -> ActionResult:
        result = ActionResult(decision, outcome, detail)
        return await self._recorder.record(result, ref, reason=reason, count=count)


def _closing(record: FlowRecord) -> dict[str, str | None]:
    """Annotations of a flow's last patch: the record goes, the autoscaler annotations the flow
    set go back to what they were (someone else's ``"true"`` stays)."""
    return {FLOW_ANNOTATION: None, **record.held_annotations}


def _moved_taints(node: Obj, moves: Mapping[str, str | None]) -> list[Obj]:
    """The node's taints after a pool move: ones the pools do not list kept as they are (in
    order), the source pool's dropped, the destination pool's set. A merge patch replaces the
    whole list, so this is written with the node's resourceVersion like every other step."""
    kept = [
        t
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

"""MIG conversion (and revert) of a node as a resumable workflow recorded on the node itself.

The NVIDIA MIG manager repartitions a node's GPUs when its ``nvidia.com/mig.config`` label
changes and reports ``nvidia.com/mig.config.state``: ``pending`` while it works, ``rebooting``
when a GPU reset failed and it reboots the node to apply the MIG mode, then ``success`` or
``failed`` (NVIDIA/mig-parted ``deployments/gpu-operator/reconfigure-mig.sh``). It does not
drain the node. Whoever changes the label must cordon the node and move its GPU pods off first,
and must not leave it cordoned when anything goes wrong. That takes minutes, so it cannot be one
blocking call: it is a small state machine advanced by :meth:`MigFlow.advance` /
:meth:`MigFlow.resume_all` on each evaluation tick, with its whole state in one JSON annotation
on the node (``ebbtide.io/mig-flow``, :class:`~controller.kube.migannotation.FlowRecord`).

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

**Decide, then issue.** What each step is, is decided by pure functions on what was read:
:func:`controller.kube.migstart.first_step` for the start and
:func:`controller.kube.migstep.next_step` for every later phase (as Kueue's ``GetTargets``
decides on a snapshot and ``IssuePreemptions`` acts). This class is the executor: it reads the
node and, while draining, its GPU pods; asks the safety gate; makes the calls the step names
(evictions, one patch) and reports.

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

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final

import structlog
from kubernetes_asyncio import client

from controller.kube.client import ApiLimits, Conflict, KubeError, NotFound
from controller.kube.kube_events import EventRecorder, ObjectRef
from controller.kube.migannotation import (
    CONFIG_LABEL,
    FLOW_ANNOTATION,
    STATE_LABEL,
    FlowRecord,
    MigDecision,
    annotations_of,
    labels_of,
    record_of,
    uses_gpus,
)
from controller.kube.migstart import Finish, Resume, first_step
from controller.kube.migstep import (
    EvictPods,
    GpuPods,
    ListPods,
    MigFlowSettings,
    Switches,
    Wait,
    Write,
    draining_detail,
    next_step,
)
from controller.kube.translate import (
    DEPLOYMENT,
    PYTORCHJOB,
    STATEFULSET,
    Priorities,
    WorkloadKind,
    pod_from,
)
from controller.loop.gate import SafetyGate, Target, Verdict
from controller.loop.port import ActionResult, Outcome, Why
from policies.decisions import Evict, Explanation
from policies.drain import DrainRule

__all__ = [
    "CONFIG_LABEL",
    "FLOW_ANNOTATION",
    "STATE_LABEL",
    "FlowRecord",
    "MigFlow",
    "MigFlowSettings",
]

log = structlog.get_logger(__name__)

MERGE_PATCH: Final = "application/merge-patch+json"
#: A drain needs no priorities.
_NO_PRIORITIES: Final = Priorities()
_CONFLICT_RETRIES: Final = 3

Obj = dict[str, Any]


class MigFlow:
    """Starts, advances and rolls back MIG flows on nodes; see the module docstring."""

    def __init__(
        self,
        api: client.ApiClient,
        gate: SafetyGate,
        recorder: EventRecorder,
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
                v = permit.verdict
                return ActionResult(decision, v.outcome or Outcome.REFUSED, v.reason, why=v.why)
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
        step = first_step(
            decision, node, now=self._gate.now(), settings=self.settings, policy=self._gate.policy
        )
        match step:
            case Resume():
                return await self._advance_once(decision)
            case Wait(detail):
                return ActionResult(decision, Outcome.IN_PROGRESS, detail)
            case Finish(outcome, detail):
                return await self._done(decision, outcome, detail, ref)
        target = Target("Node", name, None, labels_of(node), annotations_of(node))
        verdict = self._gate.check_target(decision, target)
        if not verdict.ok or not (verdict := reserve()).ok:
            return await self._verdict(decision, verdict, ref)
        if self._gate.dry_run_for(decision):
            return await self._done(decision, Outcome.DRY_RUN, f"would {step.plan}", ref)
        if not (verdict := self._gate.check_write()).ok:
            return await self._verdict(decision, verdict, ref)
        await self._patch_node(node, step.patch)
        spend()
        await self._done(decision, Outcome.IN_PROGRESS, f"started: {step.plan}", ref)
        return await self._advance_once(decision)

    async def _advance_once(self, decision: MigDecision) -> ActionResult:
        node = await self._read_node(decision.node)
        record = record_of(node)
        if record is None:
            return ActionResult(decision, Outcome.ALREADY_DONE, "the flow has finished")
        return await self._issue(decision, node, record)

    async def _issue(self, decision: MigDecision, node: Obj, record: FlowRecord) -> ActionResult:
        """Make the calls :func:`~controller.kube.migstep.next_step` names until a step reports:
        list the GPU pods, evict, re-read the node after the drain, or write one patch."""
        name = decision.node
        now = self._gate.now()
        pods: GpuPods | None = None
        drained = False
        while True:
            step = next_step(
                record,
                node,
                now=now,
                settings=self.settings,
                switches=self._switches(decision),
                drain_rule=DrainRule.of(self._gate.policy),
                pods=pods,
                drained=drained,
            )
            match step:
                case Wait(detail):
                    return ActionResult(decision, Outcome.IN_PROGRESS, detail)
                case Write():
                    return await self._write(decision, node, step)
                case ListPods():
                    pods = await self._gpu_pods(name)
                    continue
                case EvictPods(keys):
                    waiting = await self._evict_all(decision, record, keys)
                    left = (await self._gpu_pods(name)).left
                    if left:
                        return ActionResult(
                            decision,
                            Outcome.IN_PROGRESS,
                            draining_detail(name, left=left, waiting=waiting),
                        )
            # drained: the evictions took a while, so decide and write on a fresh read
            node, now, drained = await self._read_node(name), self._gate.now(), True

    async def _evict_all(
        self, decision: MigDecision, record: FlowRecord, keys: Sequence[str]
    ) -> list[str]:
        """Evict the pods through the actuator's eviction path; the ones not gone yet, and
        why (a PDB 429 or a spent budget leaves them for the next tick)."""
        waiting: list[str] = []
        for key in keys:
            result = await self._evict(self._drain_eviction(decision, record, key))
            if result.outcome not in (Outcome.APPLIED, Outcome.ALREADY_DONE):
                waiting.append(f"{key} {result.outcome.value}")
        return waiting

    async def _write(self, decision: MigDecision, node: Obj, step: Write) -> ActionResult:
        await self._patch_node(node, step.patch)
        result = ActionResult(decision, step.outcome, step.detail)
        if not step.recorded:
            return result
        return await self._recorder.report(
            result, self._ref(node), reason=step.reason, count=step.count
        )

    def _switches(self, decision: MigDecision) -> Switches:
        gate = self._gate
        return Switches(
            leader=gate.leader(), halted=gate.halted(), dry_run=gate.dry_run_for(decision)
        )

    async def _release_halted(self, name: str, halted: str) -> ActionResult | None:
        """Under the kill switch (which the gate's permits refuse): release a draining flow's
        node, leave a reconfiguring one paused without reading it again. ``None`` when the node
        has no flow."""
        record = await self._flow_on(name)
        if record is None:
            return None
        decision = record.decision(name)
        if record.phase in ("reconfiguring", "advertising"):
            return ActionResult(decision, Outcome.IN_PROGRESS, f"paused ({halted})")
        result = await self._settle(lambda: self._advance_once(decision))
        if isinstance(result, ActionResult):
            return result
        return ActionResult(decision, Outcome.IN_PROGRESS, f"{result}; retrying next tick")

    # --- helpers -------------------------------------------------------------------------------

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

    async def _gpu_pods(self, node: str) -> GpuPods:
        """The node's GPU pods not finished; the ones not terminating as the drain reads them."""
        listed = await self._limits.get(
            self._api, "/api/v1/pods", fieldSelector=f"spec.nodeName={node}"
        )
        pods = [
            p
            for p in listed.get("items") or []
            if uses_gpus(p) and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        live = tuple(
            pod
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and (pod := pod_from(p, priorities=_NO_PRIORITIES, kinds=self._kinds)) is not None
        )
        return GpuPods(left=len(pods), live=live)

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
        return await self._done(decision, outcome, verdict.reason, ref, why=verdict.why)

    async def _done(
        self,
        decision: MigDecision,
        outcome: Outcome,
        detail: str,
        ref: ObjectRef,
        *,
        reason: tuple[str, str] | None = None,
        count: bool = True,
        why: Why | None = None,
    ) -> ActionResult:
        result = ActionResult(decision, outcome, detail, why=why)
        return await self._recorder.report(result, ref, reason=reason, count=count)

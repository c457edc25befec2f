"""The Kubernetes actuator: the ``apply`` half of the cluster port.

:class:`KubeActuator` carries out the engine's decisions one at a time, in order, and reports one
:class:`~controller.loop.port.ActionResult` per decision; a single decision's failure never raises.
Each decision passes the :class:`~controller.loop.gate.SafetyGate` (leader, kill switch, in-flight,
budget), then the live object is **re-read**, checked against the policy's selectors and
protections, and only then written — leadership is checked again just before the write.

* **Scale** goes through the workload's adapter (:mod:`controller.kube.workloads`, one per
  kind), so each kind is resized the way its owner expects: ``/scale`` for Deployments,
  StatefulSets and PyTorchJobs, the object's own fields for JobSets, RayClusters (with
  ``workersToDelete``) and Jobs, always as a JSON merge patch conditional on the read
  ``resourceVersion`` (kubernetes_asyncio would send a dict as a JSON patch, which a real
  apiserver refuses). The replicas are read first: at ``to`` already → ``ALREADY_DONE`` and no
  write; at ``from`` → write ``to``; anything else → ``REFUSED`` ("changed under us"). A 409
  re-reads and decides again. Refused before any write: a resize the owner's rules forbid (a
  PyTorchJob without ``elasticPolicy``, any Kueue-admitted workload, bounds), and a workload an
  HPA or KEDA ScaledObject scales unless the policy's ``training.owner`` is ``ebbtide``.
* **Evict** posts a ``policy/v1`` Eviction, so PodDisruptionBudgets hold: a 429 from a PDB is
  ``BLOCKED`` (the engine picks another victim or waits) — never a delete behind the PDB's back.
  The pod is re-read first (gone or terminating → ``ALREADY_DONE``) and the Eviction carries a
  ``uid`` precondition and the decision's grace period, so a retry can never evict a pod that a
  StatefulSet re-created under the same name. A pod whose owner has rules about its pods is
  handled the owner's way: a Kueue-admitted workload of any kind is preempted through its Kueue
  Workload instead (:mod:`controller.kube.workloads.kueue`), a PyTorchJob's Master and an
  elastic job's worker-0 are refused. Opted-in pods go through
  the checkpoint handshake first (:mod:`policies.checkpoint`), and every
  eviction reports the GPU-hours it wasted.
* **MIG** convert and revert are resumable flows on the node: :mod:`controller.kube.migflow`.
  Its drain evictions come back through this actuator's eviction path.

Retries: every call goes through :func:`controller.kube.client.call` (jittered exponential
backoff on 5xx, throttling 429 and timeouts). A write whose answer was lost may have happened, so
after any uncertain failure the object is re-read: a scale found at ``to``, or a pod found gone,
after we wrote counts as ours (``APPLIED``, budget spent) and is never written again. Together
with the conditional writes this makes an API fault unable to cause a duplicate action.

Every result is recorded (:mod:`controller.kube.kube_events`): a counter, a log line, and — except
``ALREADY_DONE`` — an Event on the pod, workload or node.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Final, TypeVar

import structlog
from kubernetes_asyncio import client

from controller.kube.client import (
    ApiLimits,
    Conflict,
    KubeError,
    NotFound,
    TooManyRequests,
    Transient,
)
from controller.kube.kube_events import ActionStats, EventRecorder, ObjectRef
from controller.kube.migflow import MigFlow, MigFlowSettings
from controller.kube.translate import (
    DEPLOYMENT,
    PYTORCHJOB,
    STATEFULSET,
    Obj,
    WorkloadKind,
    gpu_requests,
    pod_owner,
)
from controller.kube.workloads import ADAPTERS, Adapter, Io, Patch, kueue
from controller.kube.workloads.apps import mark_for_removal
from controller.kube.workloads.autoscalers import Owners
from controller.loop.gate import Permit, SafetyGate, Target, Verdict
from controller.loop.port import ActionResult, Notice, Outcome, Why
from policies.checkpoint import (
    ACK,
    DEFAULT_DEADLINE_S,
    FOR,
    NOTICE,
    Step,
    next_step,
    notice,
    stamp,
    wasted_gpu_hours,
)
from policies.decisions import Decision, Evict, MigConvert, MigRevert, Scale
from policies.miglayout import GPU_RESOURCE
from policies.snapshot import Pod

__all__ = [
    "DEFAULT_WORKLOAD_KINDS",
    "ApiLimits",
    "KubeActuator",
    "MigFlowSettings",
    "WorkloadKind",
]

log = structlog.get_logger(__name__)
T = TypeVar("T")

_CONFLICT_RETRIES: Final = 3


DEFAULT_WORKLOAD_KINDS: Final = (DEPLOYMENT, STATEFULSET, PYTORCHJOB)


def _wasted(pod: Obj, *, now: float) -> float:
    """GPU-hours evicting ``pod`` at ``now`` throws away (:mod:`policies.checkpoint`)."""
    meta = _meta(pod)
    status = pod.get("status") or {}
    started = status.get("startTime") or meta.get("creationTimestamp")
    return wasted_gpu_hours(
        meta.get("annotations") or {},
        gpu_requests(pod.get("spec") or {}).get(GPU_RESOURCE, 0),
        started=started,
        now=now,
    )


def _named(patch: Patch) -> str:
    return f" (removing {', '.join(patch.victims)})" if patch.victims else ""


def _split(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return (namespace, name) if name else ("default", namespace)


def _meta(obj: Obj) -> dict[str, Any]:
    return dict(obj.get("metadata") or {})


class KubeActuator:
    """Applies decisions to a cluster through the Kubernetes API; see the module docstring."""

    def __init__(
        self,
        api: client.ApiClient,
        gate: SafetyGate,
        *,
        nodes: Callable[[], Iterable[dict[str, Any]]],
        workload_kinds: Sequence[WorkloadKind] = DEFAULT_WORKLOAD_KINDS,
        limits: ApiLimits | None = None,
        mig: MigFlowSettings | None = None,
        recorder: EventRecorder | None = None,
        owners: Callable[[], Owners] = dict,
    ) -> None:
        self._api = api
        self._core: Any = client.CoreV1Api(api)  # untyped edges: bodies are plain dicts
        self.gate = gate
        self._kinds = {k.kind: k for k in workload_kinds}
        self._adapters = {k.kind: ADAPTERS.get(k.kind) or Adapter(k) for k in workload_kinds}
        self._owners = owners
        self._limits = limits or ApiLimits()
        self.recorder = recorder or EventRecorder(api, is_leader=gate.leader, clock=gate.now)
        self.migflow = MigFlow(
            api,
            gate,
            self.recorder,
            evict=self.evict,
            nodes=nodes,
            workload_kinds=workload_kinds,
            settings=mig,
            limits=self._limits,
        )

    @property
    def stats(self) -> ActionStats:
        return self.recorder.stats

    # --- the port ------------------------------------------------------------------------------

    async def apply(self, decisions: Sequence[Decision]) -> list[ActionResult]:
        """Carry out ``decisions`` in order; one result each, never raising for one failure."""
        return [await self._apply_one(d) for d in decisions]

    async def resume_all(self) -> list[ActionResult]:
        """Advance every MIG flow recorded on a node (call on each evaluation tick)."""
        return await self.migflow.resume_all()

    async def report(self, result: ActionResult) -> ActionResult:
        """An outcome decided before the actuator was asked (a refusal in the process loop):
        counted, logged and raised as an Event on its object like the actuator's own."""
        d = result.decision
        if isinstance(d, Scale):
            ref = self._workload_ref(d.kind, d.workload)
        elif isinstance(d, Evict):
            namespace, name = _split(d.pod)
            ref = ObjectRef("Pod", name, namespace)
        else:
            ref = ObjectRef("Node", d.node)
        return await self.recorder.report(result, ref)

    async def notice(self, notice: Notice) -> None:
        """A service's state change as an Event on its workload (the recorder writes it only
        when this replica leads, and never raises)."""
        await self.recorder.event(
            self._workload_ref(notice.kind, notice.workload),
            reason=notice.reason,
            message=notice.message,
            type="Warning" if notice.warning else "Normal",
        )

    def _workload_ref(self, kind_name: str, workload: str) -> ObjectRef:
        namespace, name = _split(workload)
        kind = self._kinds.get(kind_name)
        if kind is None:
            return ObjectRef(kind_name, name, namespace)
        return ObjectRef(kind.kind, name, namespace, kind.api_version)

    async def _apply_one(self, decision: Decision) -> ActionResult:
        try:
            if isinstance(decision, Scale):
                return await self.scale(decision)
            if isinstance(decision, Evict):
                return await self.evict(decision)
            if isinstance(decision, MigConvert | MigRevert):
                return await self.migflow.start(decision)
            raise TypeError(f"unknown decision {decision!r}")
        except Exception as exc:  # one decision's bug or API failure must not stop the rest
            log.exception("ebbtide.action_crashed", target=decision.target)
            return ActionResult(decision, Outcome.FAILED, f"unexpected error: {exc!r}")

    # --- scale ---------------------------------------------------------------------------------

    async def scale(self, d: Scale) -> ActionResult:
        """Resize a workload the way its owner expects (its adapter), conditionally on what was
        read; refused when the owner's rules or another autoscaler forbid it."""
        namespace, name = _split(d.workload)
        adapter = self._adapters.get(d.kind)
        if adapter is None:
            ref = ObjectRef(d.kind, name, namespace)
            known = ", ".join(sorted(self._adapters))
            why = f"kind {d.kind} is not a configured scale target ({known})"
            return await self._done(d, Outcome.REFUSED, why, ref)
        kind = adapter.kind
        ref = ObjectRef(kind.kind, name, namespace, kind.api_version)
        with self.gate.hold(d) as permit:
            if not (verdict := permit.reserve()).ok:
                return await self._verdict(d, verdict, ref)
            try:
                obj = await self._read_workload(kind, namespace, name)
            except NotFound:
                return await self._done(d, Outcome.FAILED, f"{d.workload} not found", ref)
            except KubeError as exc:
                return await self._done(d, Outcome.FAILED, f"cannot read: {exc}", ref)
            meta = _meta(obj)
            ref = ref.with_uid(meta.get("uid"))
            live = Target(
                kind.kind, name, namespace, meta.get("labels") or {}, meta.get("annotations") or {}
            )
            if not (verdict := self.gate.check_target(d, live)).ok:
                return await self._verdict(d, verdict, ref)
            if (other := self._autoscaler_refusal(d, namespace, name)) is not None:
                return await self._done(d, Outcome.REFUSED, other, ref)
            return await self._scale_loop(d, adapter, obj, permit, ref)

    def _autoscaler_refusal(self, d: Scale, namespace: str, name: str) -> str | None:
        """Another autoscaler owns the workload's size, and the policy does not give it to us."""
        other = self._owners().get((d.kind, namespace, name))
        if other is None:
            return None
        training = self.gate.policy.spec.training
        if d.role == "training" and training is not None and training.owner == "ebbtide":
            return None
        return (
            f"{other} scales {d.kind} {d.workload}: Ebbtide does not fight another autoscaler "
            "(the policy's training.owner: ebbtide would give it to Ebbtide)"
        )

    async def _scale_loop(
        self, d: Scale, adapter: Adapter, obj: Obj, permit: Permit, ref: ObjectRef
    ) -> ActionResult:
        namespace, name = _split(d.workload)
        maybe_ours = False  # a write of ours may have landed though we saw no answer
        step = f"{d.from_replicas}→{d.to_replicas}"
        io = self._io()
        writing = False
        try:
            for attempt in range(_CONFLICT_RETRIES):
                if attempt:
                    obj = await self._read_workload(adapter.kind, namespace, name)
                replicas, version = await self._replicas(adapter, obj)
                if replicas == d.to_replicas:
                    if maybe_ours:
                        permit.spend()
                        return await self._done(d, Outcome.APPLIED, f"scaled {step}", ref)
                    return await self._done(d, Outcome.ALREADY_DONE, f"already at {replicas}", ref)
                if replicas != d.from_replicas:
                    why = f"changed under us: replicas is {replicas}, decided on {step}"
                    return await self._done(d, Outcome.REFUSED, why, ref)
                if (owners_rule := adapter.refusal(obj, d.to_replicas)) is not None:
                    return await self._done(d, Outcome.REFUSED, owners_rule, ref)
                pods = await self._victim_pods(adapter, obj, d)
                if self.gate.dry_run_for(d):
                    named = _named(adapter.resize(obj, d.to_replicas, pods))
                    return await self._done(d, Outcome.DRY_RUN, f"would scale {step}{named}", ref)
                if not (verdict := self.gate.check_write()).ok:
                    return await self._verdict(d, verdict, ref)
                io.tries, writing = 0, True
                try:
                    await mark_for_removal(io, adapter, d.remove)
                    patch = await adapter.write(io, obj, d.to_replicas, pods, version)
                except Conflict:
                    writing = False
                    maybe_ours = maybe_ours or io.tries > 1  # a retry after a lost answer
                    continue  # re-read and decide again
                permit.spend()
                return await self._done(d, Outcome.APPLIED, f"scaled {step}{_named(patch)}", ref)
            detail = f"the workload kept changing under us ({_CONFLICT_RETRIES} conflicts)"
        except KubeError as exc:
            detail = f"API error: {exc}"
            if writing or maybe_ours:  # a write was tried: re-read before calling it failed
                try:
                    obj = await self._read_workload(adapter.kind, namespace, name)
                    replicas = (await self._replicas(adapter, obj))[0]
                except KubeError:
                    replicas = None
                if replicas == d.to_replicas:
                    permit.spend()
                    return await self._done(d, Outcome.APPLIED, f"scaled {step} ({exc})", ref)
            lasting = not isinstance(exc, Conflict | Transient)
            return await self._done(d, Outcome.FAILED, detail, ref, transient=not lasting)
        return await self._done(d, Outcome.FAILED, detail, ref, transient=True)

    async def _read_workload(self, kind: WorkloadKind, namespace: str, name: str) -> Any:
        return await self._limits.get(self._api, kind.path(namespace, name))

    async def _replicas(self, adapter: Adapter, obj: Obj) -> tuple[int, str]:
        """The replica count and the resourceVersion a write is conditional on: the Scale's
        for kinds written through ``/scale``, else the object's."""
        if not adapter.via_scale or adapter.stopped(obj):
            return adapter.replicas(obj), str(_meta(obj).get("resourceVersion") or "")
        scale = await self._limits.get(self._api, adapter.path(obj, "scale"))
        replicas = int((scale.get("spec") or {}).get("replicas") or 0)
        return replicas, str(_meta(scale).get("resourceVersion") or "")

    async def _victim_pods(self, adapter: Adapter, obj: Obj, d: Scale) -> list[Obj]:
        """The pods a shrink names its victims from, for owners that take names (KubeRay)."""
        selector = adapter.pod_selector(obj)
        if selector is None or d.to_replicas >= d.from_replicas:
            return []
        namespace = str(_meta(obj).get("namespace") or "default")
        listed = await self._limits.get(
            self._api, f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector
        )
        return list(listed.get("items") or [])

    def _io(self) -> Io:
        limits = self._limits
        return Io(
            self._api,
            timeout_s=limits.timeout_s,
            attempts=limits.attempts,
            deadline_s=limits.deadline_s,
        )

    # --- evict ---------------------------------------------------------------------------------

    async def evict(self, d: Evict) -> ActionResult:
        """Evict a pod through the Eviction API (PDBs hold); used by MIG drains as well."""
        namespace, name = _split(d.pod)
        ref = ObjectRef("Pod", name, namespace)
        with self.gate.hold(d) as permit:
            if not (verdict := permit.reserve()).ok:
                return await self._verdict(d, verdict, ref)
            try:
                pod = await self._read_pod(namespace, name)
            except KubeError as exc:
                return await self._done(d, Outcome.FAILED, f"cannot read: {exc}", ref)
            if pod is None:
                return await self._done(d, Outcome.ALREADY_DONE, "the pod is gone", ref)
            meta = _meta(pod)
            uid = meta.get("uid")
            ref = ref.with_uid(uid)
            if meta.get("deletionTimestamp"):
                return await self._done(d, Outcome.ALREADY_DONE, "the pod is terminating", ref)
            live = Target(
                "Pod", name, namespace, meta.get("labels") or {}, meta.get("annotations") or {}
            )
            if not (verdict := self.gate.check_target(d, live)).ok:
                return await self._verdict(d, verdict, ref)
            try:
                owner = await self._owner(pod)
            except KubeError as exc:
                return await self._done(d, Outcome.FAILED, f"cannot read its owner: {exc}", ref)
            if owner is not None:
                adapter, workload = owner
                if adapter.preemption(workload) is not None:
                    return await self._preempt(d, adapter, workload, permit)
                if (why := adapter.pod_refusal(workload, pod)) is not None:
                    return await self._done(d, Outcome.REFUSED, why, ref)
            now = self.gate.now()
            step = next_step(
                meta.get("annotations") or {}, now=now, deadline_s=self._checkpoint_deadline()
            )
            if step.action != "evict":
                return await self._handshake(d, pod, step, permit, ref)
            grace = max(0, round(d.grace_s))
            wasted = _wasted(pod, now=now)
            note = f"{step.detail}; " if step.detail else ""
            note += f"wasted {wasted:.2f} GPU-hours"
            if self.gate.dry_run_for(d):
                why = f"would evict (grace {grace}s) from node {d.node or '?'}; {note}"
                return await self._done(d, Outcome.DRY_RUN, why, ref)
            if not (verdict := self.gate.check_write()).ok:
                return await self._verdict(d, verdict, ref)
            result = await self._post_eviction(d, permit, ref, uid, grace)
            if result.outcome is not Outcome.APPLIED:
                return result
            return replace(result, detail=f"{result.detail}; {note}", wasted_gpu_hours=wasted)

    def _checkpoint_deadline(self) -> float:
        """The policy's handshake deadline (a pod's own annotation still wins)."""
        training = self.gate.policy.spec.training
        return DEFAULT_DEADLINE_S if training is None else training.checkpoint.deadline

    async def _handshake(
        self, d: Evict, pod: Obj, step: Step, permit: Permit, ref: ObjectRef
    ) -> ActionResult:
        """The checkpoint handshake before an eviction: give the notice (once: it is kept on
        the pod, so a restarted controller does not give it again) or keep waiting. A notice
        is a disruption (the workload checkpoints for it): it is ``IN_PROGRESS`` and counts
        against the eviction budget; a wait changed nothing and is ``BLOCKED``."""
        if step.action == "wait":
            return await self._done(d, Outcome.BLOCKED, step.detail, ref)
        if self.gate.dry_run_for(d):
            return await self._done(d, Outcome.DRY_RUN, f"would give a {step.detail}", ref)
        if not (verdict := self.gate.check_write()).ok:
            return await self._verdict(d, verdict, ref)
        fresh = {NOTICE: stamp(self.gate.now()), FOR: d.cause, ACK: None}  # None: removed
        try:
            await self._annotate(_meta(pod), fresh)
        except KubeError as exc:
            return await self._done(d, Outcome.FAILED, f"cannot give the notice: {exc}", ref)
        permit.spend()
        return await self._done(d, Outcome.IN_PROGRESS, step.detail, ref)

    async def _annotate(self, meta: dict[str, Any], annotations: dict[str, str | None]) -> None:
        """Merge ``annotations`` into a pod's (``None`` removes one), conditional on the
        resourceVersion read: a pod changed since is left for the next try."""
        body = {
            "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": annotations}
        }
        path = f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}"
        await self._io().request("PATCH", path, body)

    async def expire_notices(self, pods: Iterable[Pod]) -> list[str]:
        """Remove expired checkpoint notices (with their need and ack) from ``pods`` (the
        snapshot's: candidates, re-read before the write), so an abandoned preemption leaves
        nothing a later one could mistake for its own notice. Call on each tick, as the leader.
        Returns the pods cleared (in dry-run: that would be, and nothing is read or written);
        a failure is logged and retried at the next tick."""
        now = self.gate.now()
        deadline_s = self._checkpoint_deadline()
        dry = self.gate.dry_run or self.gate.policy.spec.dry_run
        cleared: list[str] = []
        for candidate in pods:
            given = notice(candidate.annotations, deadline_s=deadline_s)
            if given is None or now < given.expires:
                continue
            if not dry:
                if not self.gate.check_write().ok:
                    break
                try:
                    live = await self._read_pod(candidate.namespace, candidate.name)
                    meta = _meta(live or {})
                    given = notice(meta.get("annotations") or {}, deadline_s=deadline_s)
                    if live is None or given is None or now < given.expires:
                        continue
                    await self._annotate(meta, {NOTICE: None, FOR: None, ACK: None})
                except KubeError as exc:
                    log.warning("ebbtide.notice_not_cleared", pod=candidate.key, error=str(exc))
                    continue
                log.info("ebbtide.notice_expired", pod=candidate.key, notice=stamp(given.at))
            cleared.append(candidate.key)
        return cleared

    async def _post_eviction(
        self, d: Evict, permit: Permit, ref: ObjectRef, uid: str | None, grace: int
    ) -> ActionResult:
        namespace, name = _split(d.pod)
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"gracePeriodSeconds": grace, "preconditions": {"uid": uid}},
        }
        tries = 0

        async def post() -> Any:
            nonlocal tries
            tries += 1
            return await self._core.create_namespaced_pod_eviction(name, namespace, body)

        try:
            await self._run(post)
        except TooManyRequests as exc:
            if exc.disruption_budget:
                return await self._done(d, Outcome.BLOCKED, f"refused by a PDB: {exc}", ref)
            detail = f"API error: {exc}"
        except KubeError as exc:  # 404/409 after a lost answer, or retries exhausted
            detail = f"API error: {exc}"
            if await self._pod_gone(namespace, name, uid):
                if tries > 1 or not isinstance(exc, NotFound | Conflict):
                    permit.spend()  # an earlier try of ours may have evicted it: count it
                    return await self._done(d, Outcome.APPLIED, f"evicted ({exc})", ref)
                return await self._done(d, Outcome.ALREADY_DONE, "the pod went away", ref)
        else:
            permit.spend()
            return await self._done(d, Outcome.APPLIED, f"evicted, grace {grace}s", ref)
        return await self._done(d, Outcome.FAILED, detail, ref)

    async def _owner(self, pod: Obj) -> tuple[Adapter, Obj] | None:
        """The tracked workload owning ``pod`` (its owner may have rules about its pods, or be
        Kueue's), found as the snapshot finds it (:func:`~controller.kube.translate.pod_owner`:
        a Deployment through its ReplicaSet, a JobSet by its pod label); None when it has none
        or it is gone."""
        owner = pod_owner(pod, [a.kind for a in self._adapters.values()])
        if owner is None:
            return None
        kind, name = owner
        adapter = self._adapters[kind.kind]
        namespace = str(_meta(pod).get("namespace") or "default")
        try:
            return adapter, await self._read_workload(adapter.kind, namespace, name)
        except NotFound:
            return None

    async def _preempt(
        self, d: Evict, adapter: Adapter, workload: Obj, permit: Permit
    ) -> ActionResult:
        """Stop the pod's whole workload through Kueue instead of evicting it
        (:mod:`controller.kube.workloads.kueue`: mark, then deactivate; restart-safe)."""
        meta = _meta(workload)
        kind = adapter.kind
        ref = ObjectRef(
            kind.kind, str(meta.get("name")), meta.get("namespace"), kind.api_version
        ).with_uid(meta.get("uid"))
        io = self._io()
        try:
            plan = await kueue.planned(io, workload)
            if plan.done:
                why = f"Kueue Workload {plan.workload} already deactivated: Kueue stops it"
                return await self._done(d, Outcome.ALREADY_DONE, why, ref)
            if self.gate.dry_run_for(d):
                why = (
                    f"would deactivate Kueue Workload {plan.workload} (instead of evicting {d.pod})"
                )
                return await self._done(d, Outcome.DRY_RUN, why, ref)
            if not (verdict := self.gate.check_write()).ok:
                return await self._verdict(d, verdict, ref)
            detail = await kueue.stop(io, workload, adapter.path(workload), plan)
        except (KubeError, LookupError) as exc:
            return await self._done(d, Outcome.FAILED, f"cannot preempt through Kueue: {exc}", ref)
        permit.spend()
        return await self._done(d, Outcome.APPLIED, f"{detail} (instead of evicting {d.pod})", ref)

    async def _read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._limits.get(self._api, f"/api/v1/namespaces/{namespace}/pods/{name}")
        except NotFound:
            return None

    async def _pod_gone(self, namespace: str, name: str, uid: str | None) -> bool:
        """The pod we meant is gone, terminating or replaced by another with its name."""
        try:
            pod = await self._read_pod(namespace, name)
        except KubeError:
            return False
        if pod is None:
            return True
        meta = _meta(pod)
        return meta.get("uid") != uid or bool(meta.get("deletionTimestamp"))

    # --- plumbing ------------------------------------------------------------------------------

    async def _run(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await self._limits.run(fn)

    async def _verdict(self, d: Decision, verdict: Verdict, ref: ObjectRef) -> ActionResult:
        outcome = verdict.outcome or Outcome.REFUSED
        if outcome is Outcome.IN_PROGRESS:  # a duplicate of an action in flight
            return ActionResult(d, outcome, verdict.reason)
        return await self._done(d, outcome, verdict.reason, ref, why=verdict.why)

    async def _done(
        self,
        d: Decision,
        outcome: Outcome,
        detail: str,
        ref: ObjectRef,
        *,
        transient: bool = False,
        why: Why | None = None,
    ) -> ActionResult:
        return await self.recorder.report(
            ActionResult(d, outcome, detail, transient=transient, why=why), ref
        )

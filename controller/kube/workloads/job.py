"""``batch/v1`` Jobs, and Jobs that Kueue admits.

A plain Job is resized through ``spec.parallelism`` (bounds from Ebbtide's annotations) and its
pods are evicted like any other. A Job that Kueue manages (label ``kueue.x-k8s.io/queue-name``) is
different: Kueue holds quota for it while admitted, and changing it behind Kueue's back makes
Kueue suspend and requeue it, so Ebbtide

* never resizes it and never evicts its pods one by one;
* preempts it by deactivating its Kueue Workload (``spec.active: false``): Kueue then evicts it,
  suspends the Job and releases the quota, the way Kueue's own preemption does;
* resumes it, when the engine grows it back, by setting ``spec.active: true`` again: Kueue
  requeues and re-admits it.

The Job is marked :data:`PREEMPTED` with the Workload's name, so only a Job Ebbtide stopped is
resumed by Ebbtide, and the mark survives a controller restart. While stopped (Kueue suspends
it) it shows 0 replicas and may grow to its ``parallelism``: a grow resumes it whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from controller.kube.translate import Obj, WorkloadKind, get_path
from controller.kube.workloads.base import Adapter, Io, Patch, int_or_none, kueue_managed, meta

__all__ = ["JOB", "JOBS", "KUEUE_WORKLOADS", "PREEMPTED", "JobAdapter"]

JOB: Final = WorkloadKind(
    kind="Job",
    group="batch",
    version="v1",
    plural="jobs",
    replicas_path="spec.parallelism",
    template_path="spec.template",
)
KUEUE_WORKLOADS: Final = "/apis/kueue.x-k8s.io/v1beta1/namespaces/{namespace}/workloads"
PREEMPTED: Final = "ebbtide.io/preempted"
"""On a Job Ebbtide stopped: the Kueue Workload it deactivated."""


def _parallelism(obj: Obj) -> int:
    value = int_or_none(get_path(obj, "spec.parallelism"))
    return 1 if value is None else value


def _marked(obj: Obj) -> str | None:
    annotations: Mapping[str, str] = meta(obj).get("annotations") or {}
    return annotations.get(PREEMPTED) or None


class JobAdapter(Adapter):
    """See the module docstring."""

    checks_pods = True
    extra_rules = (("kueue.x-k8s.io", "workloads", ("list", "patch")),)

    def replicas(self, obj: Obj) -> int:
        return 0 if get_path(obj, "spec.suspend") else _parallelism(obj)

    def bounds(self, obj: Obj) -> tuple[int, int] | None:
        if get_path(obj, "spec.suspend"):  # stopped: only one Ebbtide stopped may grow back
            return 0, _parallelism(obj) if _marked(obj) else 0
        if kueue_managed(obj):
            return _parallelism(obj), _parallelism(obj)
        return None

    def refusal(self, obj: Obj, to: int) -> str | None:
        if get_path(obj, "spec.suspend"):
            if not _marked(obj):
                return "the Job was suspended by someone else: Ebbtide resumes only its own"
            return None if to > 0 else "the Job is already stopped"
        if kueue_managed(obj):
            return (
                "Kueue admitted the Job: a resize would make Kueue suspend and requeue it; it "
                "is preempted through its Kueue Workload instead"
            )
        return super().refusal(obj, to)

    async def write(self, io: Io, obj: Obj, to: int, pods: Sequence[Obj], version: str) -> Patch:
        marked = _marked(obj)
        if not (get_path(obj, "spec.suspend") and marked):
            return await super().write(io, obj, to, pods, version)
        # Kueue's: activate the Workload first, then drop the mark (a crash between the two
        # leaves a mark the next grow clears, activating an active Workload again).
        namespace = str(meta(obj).get("namespace") or "default")
        path = f"{KUEUE_WORKLOADS.format(namespace=namespace)}/{marked}"
        await io.request("PATCH", path, {"spec": {"active": True}})
        body = {"metadata": {"resourceVersion": version, "annotations": {PREEMPTED: None}}}
        await io.request("PATCH", self.path(obj), body)
        return Patch({"spec": {"active": True}})

    def preemption(self, obj: Obj) -> str | None:
        return "Kueue" if kueue_managed(obj) and not get_path(obj, "spec.suspend") else None

    def preempted(self, obj: Obj) -> str | None:
        marked = _marked(obj)
        return (
            f"Kueue Workload {marked} already deactivated: Kueue suspends the Job"
            if marked
            else None
        )

    async def preempt(self, io: Io, obj: Obj, *, dry_run: bool) -> str:
        """Deactivate the Job's Kueue Workload (found by its ownerReference to the Job's uid)
        and mark the Job; the Workload is written first so a mark always names a real one."""
        m = meta(obj)
        namespace, uid = str(m.get("namespace") or "default"), m.get("uid")
        listed = await io.request("GET", KUEUE_WORKLOADS.format(namespace=namespace))
        owned = [w for w in listed.get("items") or [] if _owned_by(w, uid)]
        if not owned:
            raise LookupError(f"no Kueue Workload owned by Job {namespace}/{m.get('name')}")
        name = str(meta(owned[0]).get("name"))
        if dry_run:
            return f"would deactivate Kueue Workload {name}"
        await io.request("PATCH", f"{KUEUE_WORKLOADS.format(namespace=namespace)}/{name}",
                         {"spec": {"active": False}})  # fmt: skip
        await io.request("PATCH", self.path(obj), {"metadata": {"annotations": {PREEMPTED: name}}})
        return f"deactivated Kueue Workload {name}: Kueue suspends the Job and releases its quota"


def _owned_by(obj: Obj, uid: Any) -> bool:
    return any(r.get("uid") == uid for r in meta(obj).get("ownerReferences") or [])


JOBS = JobAdapter(JOB)

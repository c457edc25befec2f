"""Kueue, for every kind: stop and resume a Kueue-admitted workload through its Kueue Workload.

Kueue holds quota for a workload it admitted (a Job, JobSet, RayCluster, PyTorchJob… carrying
the queue label :data:`QUEUE`, or any other ``kueue.x-k8s.io/`` label or annotation); evicting
its pods or resizing it behind Kueue's back makes Kueue suspend and requeue it with the quota
still counted. So Ebbtide

* preempts it by deactivating its Kueue Workload (``spec.active: false``): Kueue evicts it,
  suspends the job and releases the quota, as Kueue's own preemption does. The Workload's name
  is not derivable from the job's: it is the one :data:`PREBUILT` names, else the one whose
  owner reference (uid, else kind and name) is the job among the namespace's Workloads;
* resumes it, when the engine grows it back, with ``spec.active: true``: Kueue requeues and
  re-admits it.

Restart-safe order: the job is marked :data:`PREEMPTED` with the Workload's name *before* the
Workload is deactivated. A crash between the two leaves a marked job whose Workload is still
active, which the next preemption finishes (one write) instead of calling it done; a marked job
whose Workload is inactive is known as Ebbtide's, so only a job Ebbtide stopped is resumed by
Ebbtide. Resuming writes the other way round (activate, then drop the mark): a crash between
leaves a mark the next grow clears, activating an active Workload again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from controller.controller_errors import ControllerError
from controller.kube.translate import Obj, get_path

if TYPE_CHECKING:
    from controller.kube.workloads.base import Io

__all__ = [
    "PREBUILT",
    "PREEMPTED",
    "QUEUE",
    "RULE",
    "WORKLOADS",
    "NoWorkload",
    "Stop",
    "managed",
    "marked",
    "planned",
    "resume",
    "stop",
]

_PREFIX: Final = "kueue.x-k8s.io/"
QUEUE: Final = "kueue.x-k8s.io/queue-name"
"""The label (an annotation in old Kueue releases) that hands a workload to Kueue."""
PREBUILT: Final = "kueue.x-k8s.io/prebuilt-workload-name"
"""The label naming the Kueue Workload made for the job beforehand."""
PREEMPTED: Final = "ebbtide.io/preempted"
"""On a job Ebbtide stops: the Kueue Workload it deactivates."""
WORKLOADS: Final = "/apis/kueue.x-k8s.io/v1beta1/namespaces/{namespace}/workloads"
RULE: Final = ("kueue.x-k8s.io", "workloads", ("get", "list", "patch"))
"""RBAC (group, resource, verbs) the stop and resume need."""


class NoWorkload(ControllerError, LookupError):
    """Kueue made no Workload for the job (so there is nothing to deactivate)."""


def _meta(obj: Obj) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def managed(obj: Obj) -> bool:
    """Kueue admits this object: any ``kueue.x-k8s.io/`` label or annotation (the queue name,
    the annotation old Kueue releases used, a prebuilt Workload's name), or Ebbtide stopped it
    through Kueue."""
    m = _meta(obj)
    keys = (*(m.get("labels") or {}), *(m.get("annotations") or {}))
    return any(k.startswith(_PREFIX) for k in keys) or marked(obj) is not None


def marked(obj: Obj) -> str | None:
    """The Kueue Workload Ebbtide deactivates (or did) for this job, from its mark."""
    annotations: Mapping[str, str] = _meta(obj).get("annotations") or {}
    return annotations.get(PREEMPTED) or None


@dataclass(frozen=True, slots=True)
class Stop:
    """What stopping a job through Kueue takes: its Workload, and whether it is done."""

    workload: str
    done: bool
    """The job is marked and its Workload inactive: nothing left to write."""


def _workloads(obj: Obj) -> str:
    return WORKLOADS.format(namespace=str(_meta(obj).get("namespace") or "default"))


async def planned(io: Io, obj: Obj) -> Stop:
    """Find the job's Workload (its mark's or :data:`PREBUILT`'s, else the one whose owner
    reference is the job) and whether it is already stopped (an inactive Workload); raises
    :class:`NoWorkload` when Kueue made none."""
    m = _meta(obj)
    name = marked(obj) or (m.get("labels") or {}).get(PREBUILT)
    if name is not None:
        workload = await io.request("GET", f"{_workloads(obj)}/{name}")
        return Stop(name, get_path(workload, "spec.active") is False)
    listed = await io.request("GET", _workloads(obj))
    for workload in listed.get("items") or []:
        if any(_refers_to(ref, obj) for ref in _meta(workload).get("ownerReferences") or []):
            return Stop(str(_meta(workload).get("name")), False)
    kind = obj.get("kind") or "job"
    raise NoWorkload(f"no Kueue Workload owned by {kind} {m.get('namespace')}/{m.get('name')}")


def _refers_to(ref: Mapping[str, Any], obj: Obj) -> bool:
    m = _meta(obj)
    if ref.get("uid") and m.get("uid"):
        return bool(ref.get("uid") == m.get("uid"))
    return (ref.get("kind"), ref.get("name")) == (obj.get("kind"), m.get("name"))


async def stop(io: Io, obj: Obj, path: str, plan: Stop) -> str:
    """Mark the job at ``path``, then deactivate its Workload (see the module docstring)."""
    if marked(obj) != plan.workload:
        await io.request("PATCH", path, {"metadata": {"annotations": {PREEMPTED: plan.workload}}})
    await io.request("PATCH", f"{_workloads(obj)}/{plan.workload}", {"spec": {"active": False}})
    kind = obj.get("kind") or "job"
    return (
        f"deactivated Kueue Workload {plan.workload}: Kueue suspends the {kind} and releases "
        "its quota"
    )


async def resume(io: Io, obj: Obj, path: str, version: str) -> None:
    """Activate the Workload of a job Ebbtide stopped, then drop the mark (conditionally on
    ``version``, the job's read resourceVersion)."""
    name = marked(obj)
    if name is None:
        raise ValueError("only a job Ebbtide stopped is resumed")
    await io.request("PATCH", f"{_workloads(obj)}/{name}", {"spec": {"active": True}})
    body = {"metadata": {"resourceVersion": version, "annotations": {PREEMPTED: None}}}
    await io.request("PATCH", path, body)

"""The one interface every workload adapter follows, and what most of them share.

Each kind Ebbtide acts on has an owner with its own rules: the Deployment controller answers to
``/scale``, Kubeflow's training operator to ``elasticPolicy``, KubeRay to ``workersToDelete``,
Kueue to its Workload's ``active`` flag. An adapter (one file per kind, like KEDA's scalers) says
how to act on its kind *the way the owner expects*:

* **Pure parts** take the object as a dict and answer: the snapshot :class:`~policies.snapshot.
  Workload` with the owner's bounds (:meth:`WorkloadAdapter.workload`), the replica count
  (:meth:`~WorkloadAdapter.replicas`), why a resize is refused (:meth:`~WorkloadAdapter.
  refusal`), and the merge patch that resizes it (:meth:`~WorkloadAdapter.resize`). They are
  table-tested without a server.
* **Kueue** is the same for every kind (:mod:`~controller.kube.workloads.kueue`): a workload
  Kueue admitted is fixed while it runs, stopped through its Kueue Workload instead of having
  its pods evicted (:meth:`~WorkloadAdapter.preemption`), and, once Kueue suspended it at
  :attr:`~WorkloadAdapter.suspend_path`, shows 0 replicas and is resumed whole by a grow
  (:meth:`~WorkloadAdapter.write`) when Ebbtide stopped it.

The actuator keeps the parts every kind shares: the safety gate, the conditional write on the
read ``resourceVersion``, retries, dry-run and the Event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from kubernetes_asyncio import client

from controller.kube.client import call
from controller.kube.translate import Obj, Priorities, WorkloadKind, get_path, workload_from
from controller.kube.workloads import kueue
from policies.snapshot import Workload

__all__ = [
    "MERGE_PATCH",
    "SCALE_GROUP",
    "Adapter",
    "Io",
    "Patch",
    "group_index",
    "in_group",
    "int_or_none",
    "merge_patch_at",
    "meta",
]

MERGE_PATCH: Final = "application/merge-patch+json"
SCALE_GROUP: Final = "ebbtide.io/scale-group"
"""Names the RayCluster worker group Ebbtide resizes, or the JobSet replicated job it counts
(default: the first)."""


@dataclass(frozen=True, slots=True)
class Patch:
    """A JSON merge patch of the object (``sub=""``) or of one of its subresources."""

    body: Mapping[str, Any]
    sub: str = ""
    """``"scale"`` to write the ``/scale`` subresource."""
    victims: tuple[str, ...] = ()
    """Pods the owner is told to remove (RayCluster ``workersToDelete``), for the record."""


class Io:
    """The API client and call limits an adapter's requests go through. :attr:`tries` counts
    every try, so the caller can tell a retried write (whose first answer was lost) from one."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        timeout_s: float = 10.0,
        attempts: int = 5,
        deadline_s: float = 30.0,
    ) -> None:
        self.api = api
        self.timeout_s, self.attempts, self.deadline_s = timeout_s, attempts, deadline_s
        self.tries = 0

    async def request(self, method: str, path: str, body: Any = None, **query: str) -> Obj:
        """One JSON request (a merge patch for PATCH), retried on transient failures."""
        headers = {"Accept": "application/json"}
        if method == "PATCH":
            headers["Content-Type"] = MERGE_PATCH

        async def once() -> Any:
            self.tries += 1
            return await self.api.call_api(
                path,
                method,
                query_params=list(query.items()),
                header_params=headers,
                body=body,
                response_types_map={200: "object", 201: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )

        out: Obj = await call(
            once, attempts=self.attempts, deadline_s=self.deadline_s, timeout_s=self.timeout_s
        )
        return out


def meta(obj: Obj) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def int_or_none(value: Any) -> int | None:
    """An integer field, or None when absent or not an integer."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def merge_patch_at(obj: Obj, path: str, value: Any) -> dict[str, Any]:
    """A merge patch setting ``path`` (dotted, numeric parts index lists) to ``value``. A merge
    patch replaces lists whole, so a list on the way is copied from ``obj`` with one item
    changed; the conditional write (on the read ``resourceVersion``) keeps that safe."""
    head, _, rest = path.partition(".")
    if not rest:
        return {head: value}
    current = obj.get(head) if isinstance(obj, Mapping) else None
    if isinstance(current, list):
        index, _, rest = rest.partition(".")
        items = [dict(item) if isinstance(item, Mapping) else item for item in current]
        at = int(index)
        items[at] = _set(items[at], rest, value) if rest else value
        return {head: items}
    return {head: merge_patch_at(current if isinstance(current, Mapping) else {}, rest, value)}


def _set(obj: Any, path: str, value: Any) -> Any:
    """A copy of ``obj`` with ``path`` set (for an item of a list a merge patch replaces)."""
    head, _, rest = path.partition(".")
    out = dict(obj) if isinstance(obj, Mapping) else {}
    out[head] = _set(out.get(head), rest, value) if rest else value
    return out


class Adapter:
    """A kind whose replica count lives at ``kind.replicas_path`` and is written there with a
    merge patch; subclasses override what their owner does differently. Bounds come from
    Ebbtide's own annotations unless :meth:`bounds` gives the owner's."""

    via_scale: bool = False
    """Read and write the replica count through the ``/scale`` subresource."""
    fixed_size: str | None = None
    """Why its owner never lets its replica count change (None: it may). Such a kind has fixed
    bounds, so the engine plans no resize of it; it is only preempted (its pods evicted, or
    through Kueue), and its RBAC has no write for a resize."""
    suspend_path: str = "spec.suspend"
    """Where the kind is suspended (by Kueue, or whoever runs it): 0 replicas while set."""
    extra_rules: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    """RBAC (group, resource, verbs) it needs beyond reading its kind and writing its size."""

    def __init__(self, kind: WorkloadKind) -> None:
        self.kind = kind

    def located(self, obj: Obj) -> WorkloadKind:
        """Where this object's replicas and pod template are (a group's index may vary)."""
        return self.kind

    def stopped(self, obj: Obj) -> bool:
        """Suspended: none of its pods run, whatever its replica count says."""
        return bool(get_path(obj, self.suspend_path))

    def size(self, obj: Obj) -> int:
        """The replica count it asks for (what it runs unless :meth:`stopped`)."""
        value = int_or_none(get_path(obj, self.located(obj).replicas_path))
        return 1 if value is None else value

    def replicas(self, obj: Obj) -> int:
        return 0 if self.stopped(obj) else self.size(obj)

    def bounds(self, obj: Obj) -> tuple[int, int] | None:
        """(min, max) replicas the owner allows; None: Ebbtide's annotations decide."""
        return None

    def gpus_per_replica(self, obj: Obj, pod_gpus: int) -> int:
        """GPUs one replica takes, from one pod's (a JobSet replica is a Job of many pods)."""
        return pod_gpus

    def workload(self, obj: Obj, priorities: Priorities) -> Workload:
        """The snapshot workload, carrying the owner's bounds when it has them: a stopped one
        may grow back whole only when Ebbtide stopped it, one Kueue runs is fixed."""
        w = workload_from(obj, self.located(obj), priorities=priorities)
        w = replace(
            w,
            replicas=self.replicas(obj),
            gpus_per_replica=self.gpus_per_replica(obj, w.gpus_per_replica),
        )
        if self.stopped(obj):
            top = self.size(obj) if kueue.marked(obj) else 0
            return replace(w, min_replicas=0, max_replicas=top)
        fixed = kueue.managed(obj) or self.fixed_size is not None
        bounds = (w.replicas, w.replicas) if fixed else self.bounds(obj)
        if bounds is not None:
            w = replace(w, min_replicas=bounds[0], max_replicas=bounds[1])
        return w

    def refusal(self, obj: Obj, to: int) -> str | None:
        """Why resizing to ``to`` replicas is forbidden (None: allowed): a stopped workload is
        only resumed, and only when Ebbtide stopped it; Kueue's is never resized, nor a kind of
        :attr:`fixed_size`; then the owner's own rules (:meth:`owner_refusal`)."""
        kind = self.kind.kind
        if self.stopped(obj):
            if kueue.marked(obj) is None:
                return f"the {kind} was suspended by someone else: Ebbtide resumes only its own"
            return None if to > 0 else f"the {kind} is already stopped"
        if kueue.managed(obj):
            return (
                f"Kueue manages the {kind}: a resize behind Kueue's back makes it suspend and "
                "requeue it; it is preempted through its Kueue Workload instead"
            )
        if self.fixed_size is not None:
            return self.fixed_size
        return self.owner_refusal(obj, to)

    def owner_refusal(self, obj: Obj, to: int) -> str | None:
        """Why the owner's rules forbid resizing to ``to`` replicas (None: allowed)."""
        bounds = self.bounds(obj)
        if bounds is not None and not bounds[0] <= to <= bounds[1]:
            lo, hi = bounds
            return f"{to} replicas is outside the {self.kind.kind}'s bounds {lo}..{hi}"
        return None

    def pod_refusal(self, obj: Obj, pod: Obj) -> str | None:
        """Why this pod of the workload must not be evicted (None: it may be)."""
        return None

    def pod_selector(self, obj: Obj) -> str | None:
        """Label selector of the pods :meth:`resize` names victims from (None: none needed)."""
        return None

    def resize(self, obj: Obj, to: int, pods: Sequence[Obj]) -> Patch:
        """The merge patch that sets the replica count to ``to``."""
        return Patch(merge_patch_at(obj, self.located(obj).replicas_path, to))

    def path(self, obj: Obj, sub: str = "") -> str:
        """The object's URL path (``sub``: one of its subresources)."""
        m = meta(obj)
        base = self.kind.path(str(m.get("namespace") or "default"), str(m.get("name", "")))
        return f"{base}/{sub}" if sub else base

    async def write(self, io: Io, obj: Obj, to: int, pods: Sequence[Obj], version: str) -> Patch:
        """Write :meth:`resize`'s patch conditionally on ``version`` (a changed object is a 409,
        never a lost update), or resume a workload Ebbtide stopped through Kueue; returns the
        patch written."""
        if self.stopped(obj):
            await kueue.resume(io, obj, self.path(obj), version)
            return Patch({"spec": {"active": True}})
        patch = self.resize(obj, to, pods)
        body = dict(patch.body)
        body["metadata"] = {**(body.get("metadata") or {}), "resourceVersion": version}
        await io.request("PATCH", self.path(obj, patch.sub), body)
        return patch

    def preemption(self, obj: Obj) -> str | None:
        """Who must be asked to stop this workload instead of evicting its pods (``"Kueue"``),
        or None: its pods are evicted through the Eviction API."""
        return "Kueue" if kueue.managed(obj) else None


def in_group(
    kind: WorkloadKind, obj: Obj, groups_path: str, key: str, template: str
) -> WorkloadKind:
    """``kind`` located in the group :func:`group_index` picks: its ``replicas`` and, at
    ``template`` under it, its pod template."""
    at = f"{groups_path}.{group_index(obj, groups_path, key)}"
    return replace(kind, replicas_path=f"{at}.replicas", template_path=f"{at}.{template}")


def group_index(obj: Obj, groups_path: str, key: str) -> int:
    """Index of the group (``key`` names it) that :data:`SCALE_GROUP` names in the list at
    ``groups_path``; the first group when the annotation is absent or names none."""
    wanted = (meta(obj).get("annotations") or {}).get(SCALE_GROUP)
    groups = get_path(obj, groups_path) or []
    for i, group in enumerate(groups):
        if isinstance(group, Mapping) and group.get(key) == wanted:
            return i
    return 0

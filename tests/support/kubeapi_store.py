"""In-memory object store with apiserver semantics, behind the test API server.

The store is synchronous: every write runs to completion inside one event-loop step, so a watch
can snapshot history and register for live events atomically, and a fault injected in front of a
request can never leave half a write behind.

What it keeps as an apiserver does:

- one global, monotonically increasing ``resourceVersion``; each object carries the version of
  its last write, and ``uid``, ``generation`` (bumped when anything outside ``metadata`` and
  ``status`` changes), ``creationTimestamp`` and ``generateName`` are filled in on create;
- optimistic concurrency: a write whose ``metadata.resourceVersion`` is set and stale is a
  409 Conflict, as is a create of a name that exists (AlreadyExists);
- a ``status`` subresource per resource type: the main resource cannot change ``status`` and
  ``/status`` can change nothing else;
- a validating admission webhook per resource type where its owner runs one
  (``ResourceType.validate_update``, e.g. JobSet's), refusing an update before it is stored;
- finalizers: deleting an object with finalizers only sets ``deletionTimestamp``; it goes away
  when an update empties ``metadata.finalizers``;
- a bounded history of watch events. A watch from a version older than the history reaches is
  410 Expired, as after an etcd compaction; ``compact()`` forces that.

Two small pieces of cluster behaviour live here because controllers read their results: pods are
defaulted on create (``status.phase: Pending``, ``spec.priority`` from the PriorityClass) and every
PodDisruptionBudget's ``status`` is recomputed whenever a pod or budget in its namespace changes,
as the disruption controller would.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import random
import string
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from .kubeapi_objects import (
    ApiError,
    Obj,
    apply_patch,
    disruption_status,
    get_path,
    label_selector_matcher,
    labels_of,
)


@dataclass(frozen=True, kw_only=True)
class ResourceType:
    """One API resource: where it lives in the URL space and how it behaves."""

    group: str
    """API group, ``""`` for the core group."""
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    has_status: bool = True
    """Whether ``status`` is a subresource (main-resource writes keep the stored status)."""
    replicas_path: str | None = None
    """Dotted path of the replica count; set to serve ``/scale``."""
    status_replicas_path: str | None = None
    """Dotted path of the observed replica count for ``Scale.status.replicas``."""
    selector_path: str | None = None
    """Dotted path of a label selector (string or ``LabelSelector``) for ``Scale.status``."""
    validate_update: Callable[[Obj, Obj], ApiError | None] | None = None
    """The owner's validating admission webhook on update of the resource itself (not its
    subresources): the refusal of ``(old, new)``, or None to admit it."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def qualified(self) -> str:
        """``pods`` or ``leases.coordination.k8s.io``, as the apiserver names it in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _apps(plural: str, kind: str) -> ResourceType:
    return ResourceType(
        group="apps",
        version="v1",
        plural=plural,
        kind=kind,
        replicas_path="spec.replicas",
        status_replicas_path="status.replicas",
        selector_path="spec.selector",
    )


BUILTIN_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(group="", version="v1", plural="namespaces", kind="Namespace", namespaced=False),
    ResourceType(group="", version="v1", plural="nodes", kind="Node", namespaced=False),
    ResourceType(group="", version="v1", plural="pods", kind="Pod"),
    ResourceType(group="", version="v1", plural="events", kind="Event", has_status=False),
    ResourceType(
        group="events.k8s.io", version="v1", plural="events", kind="Event", has_status=False
    ),
    _apps("deployments", "Deployment"),
    _apps("statefulsets", "StatefulSet"),
    ResourceType(
        group="policy", version="v1", plural="poddisruptionbudgets", kind="PodDisruptionBudget"
    ),
    ResourceType(group="", version="v1", plural="resourcequotas", kind="ResourceQuota"),
    ResourceType(
        group="scheduling.k8s.io",
        version="v1",
        plural="priorityclasses",
        kind="PriorityClass",
        namespaced=False,
        has_status=False,
    ),
    ResourceType(
        group="coordination.k8s.io", version="v1", plural="leases", kind="Lease", has_status=False
    ),
    ResourceType(
        group="autoscaling",
        version="v2",
        plural="horizontalpodautoscalers",
        kind="HorizontalPodAutoscaler",
    ),
)

PYTORCHJOB = ResourceType(
    group="kubeflow.org",
    version="v1",
    plural="pytorchjobs",
    kind="PyTorchJob",
    replicas_path="spec.pytorchReplicaSpecs.Worker.replicas",
    status_replicas_path="status.replicaStatuses.Worker.active",
    selector_path="status.replicaStatuses.Worker.selector",
)
"""The default custom resource: Kubeflow's PyTorchJob, scaled through its Worker replicas."""

SERVICEOBJECTIVE = ResourceType(
    group="ebbtide.io", version="v1alpha1", plural="serviceobjectives", kind="ServiceObjective"
)
"""Ebbtide's own ServiceObjective (helm/ebbtide/crds/serviceobjectives.yaml), with its status
subresource as the CRD declares it (``subresources: {status: {}}``): as apiextensions-apiserver
serves a custom resource (``pkg/registry/customresource/strategy.go`` ``PrepareForUpdate``
keeps the stored status on a write to the object; ``status_strategy.go`` copies the stored
object and takes only ``status`` from a write to ``/status``), which :meth:`Store.update` does
for every resource with ``has_status``."""

_PODS = ("", "pods")
_PDBS = ("policy", "poddisruptionbudgets")
_IMMUTABLE_META = (
    "uid",
    "creationTimestamp",
    "name",
    "namespace",
    "generation",
    "deletionTimestamp",
    "resourceVersion",
)


@dataclass(frozen=True)
class WatchEvent:
    """One change: ``obj`` is the object after it (the last state for DELETED)."""

    type: str
    rv: int
    resource: ResourceType
    obj: Obj
    old: Obj | None


@dataclass(eq=False)
class Watcher:
    """A registered watch; ``None`` in the queue means the store closed."""

    resource: ResourceType
    namespace: str | None
    queue: asyncio.Queue[WatchEvent | None] = field(default_factory=asyncio.Queue)

    def wants(self, event: WatchEvent) -> bool:
        ns = event.obj.get("metadata", {}).get("namespace")
        return event.resource.key == self.resource.key and self.namespace in (None, ns)


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class Store:
    """Objects by resource, namespace and name, with watch history and subscribers."""

    def __init__(
        self,
        *,
        history_limit: int = 1000,
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
    ) -> None:
        self.resources: dict[tuple[str, str], ResourceType] = {}
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self._rv = 0
        self._history: deque[WatchEvent] = deque()
        self._history_limit = history_limit
        self._compacted_rv = 0
        self._watchers: set[Watcher] = set()
        self._clock = clock
        self._random = random.Random(seed)
        self._syncing = False
        self._dry_run = False
        for resource in BUILTIN_RESOURCES:
            self.register(resource)

    # --- registry ------------------------------------------------------------------------------

    def register(self, resource: ResourceType) -> None:
        """Serve a resource type (a custom resource, say); replaces one with the same key."""
        self.resources[resource.key] = resource
        self._objects.setdefault(resource.key, {})

    def unregister(self, resource: ResourceType) -> None:
        """Stop serving a resource type (a CRD deleted): its objects go, its watches end."""
        self.resources.pop(resource.key, None)
        self._objects.pop(resource.key, None)
        for watcher in [w for w in self._watchers if w.resource.key == resource.key]:
            watcher.queue.put_nowait(None)
            self._watchers.discard(watcher)

    def lookup(self, group: str, version: str, plural: str) -> ResourceType:
        resource = self.resources.get((group, plural))
        if resource is None or resource.version != version:
            raise ApiError(404, "the server could not find the requested resource")
        return resource

    def resolve(self, name: str) -> ResourceType:
        """A resource by kind (``Pod``), plural (``pods``) or ``plural.group``; core wins ties."""
        candidates = sorted(self.resources.values(), key=lambda r: r.group != "")
        for resource in candidates:
            if name in (resource.kind, resource.plural, resource.qualified):
                return resource
        raise KeyError(f"unknown resource {name!r}")

    def resolve_object(self, obj: Obj) -> ResourceType:
        """The resource of an object from its ``apiVersion`` and ``kind``."""
        for resource in self.resources.values():
            if (resource.api_version, resource.kind) == (obj.get("apiVersion"), obj.get("kind")):
                return resource
        raise KeyError(f"unknown apiVersion/kind {obj.get('apiVersion')}/{obj.get('kind')}")

    # --- reads ---------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        return self._rv

    def get(self, resource: ResourceType, namespace: str | None, name: str) -> Obj:
        return copy.deepcopy(self._require(resource, namespace, name))

    def list_objects(self, resource: ResourceType, namespace: str | None = None) -> list[Obj]:
        """Objects sorted by namespace and name; all namespaces when ``namespace`` is None."""
        objects = self._objects[resource.key]
        return [
            copy.deepcopy(objects[k])
            for k in sorted(objects)
            if namespace is None or k[0] == namespace
        ]

    def _require(self, resource: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self._objects[resource.key].get((namespace or "", name))
        if obj is None:
            raise ApiError(
                404,
                f'{resource.qualified} "{name}" not found',
                details={"name": name, "group": resource.group, "kind": resource.plural},
            )
        return obj

    # --- writes --------------------------------------------------------------------------------

    def create(
        self, resource: ResourceType, namespace: str | None, body: Obj, *, keep_status: bool = False
    ) -> Obj:
        """POST semantics: status is dropped where it is a subresource, unless ``keep_status``
        (tests seeding state)."""
        obj = copy.deepcopy(body)
        if resource.has_status and not keep_status:
            obj.pop("status", None)
        meta = obj.setdefault("metadata", {})
        if resource.namespaced:
            if meta.get("namespace") not in (None, namespace):
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the "
                    "namespace sent on the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "name or generateName is required")
            suffix = "".join(self._random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = meta["generateName"] + suffix
        if (namespace or "", meta["name"]) in self._objects[resource.key]:
            raise ApiError(
                409,
                f'{resource.qualified} "{meta["name"]}" already exists',
                reason="AlreadyExists",
                details={"name": meta["name"], "kind": resource.plural},
            )
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        meta.update(
            uid=str(uuid.UUID(int=self._random.getrandbits(128), version=4)),
            generation=1,
            creationTimestamp=self._now(),
        )
        for key in ("resourceVersion", "deletionTimestamp"):
            meta.pop(key, None)
        if resource.key == _PODS:
            self._default_pod(obj)
        return self._commit(resource, None, obj)

    def update(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        body: Obj,
        *,
        subresource: str | None = None,
    ) -> Obj:
        """PUT semantics: replace the object (or only its status), checking resourceVersion."""
        old = self._require(resource, namespace, name)
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise ApiError(400, "the name of the object does not match the name on the URL")
        self._check_version(resource, old, body)
        if subresource == "status":
            new = copy.deepcopy(old)
            new["status"] = copy.deepcopy(body.get("status"))
        else:
            new = copy.deepcopy(body)
            if resource.has_status:
                new["status"] = copy.deepcopy(old.get("status"))
        if new.get("status") is None:
            new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for key in _IMMUTABLE_META:
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        new["apiVersion"], new["kind"] = resource.api_version, resource.kind
        if subresource is None and resource.validate_update is not None:
            refusal = resource.validate_update(old, new)
            if refusal is not None:
                raise refusal
        if _spec_part(new) != _spec_part(old):
            meta["generation"] = old["metadata"].get("generation", 1) + 1
        return self._commit(resource, old, new)

    def patch(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        body: object,
        content_type: str,
        *,
        subresource: str | None = None,
    ) -> Obj:
        """PATCH semantics; a patch that sets a stale ``metadata.resourceVersion`` is a 409."""
        old = self._require(resource, namespace, name)
        return self.update(
            resource, namespace, name, apply_patch(old, body, content_type), subresource=subresource
        )

    def delete(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        *,
        preconditions: Obj | None = None,
    ) -> Obj | None:
        """Delete now, or mark for deletion while finalizers remain (then return the object)."""
        old = self._require(resource, namespace, name)
        preconditions = preconditions or {}
        for key in ("uid", "resourceVersion"):
            if preconditions.get(key) not in (None, old["metadata"].get(key)):
                raise ApiError(
                    409,
                    f"Precondition failed: {key} in precondition: "
                    f"{preconditions[key]}, {key} in object meta: "
                    f"{old['metadata'].get(key)}",
                )
        if old["metadata"].get("finalizers"):
            new = copy.deepcopy(old)
            new["metadata"].setdefault("deletionTimestamp", self._now())
            return copy.deepcopy(self._commit(resource, old, new))
        self._commit(resource, old, None)
        return None

    def _check_version(self, resource: ResourceType, old: Obj, body: Obj) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted not in (None, "", old["metadata"]["resourceVersion"]):
            raise ApiError(
                409,
                f"Operation cannot be fulfilled on {resource.qualified} "
                f'"{old["metadata"]["name"]}": the object has been modified; '
                f"please apply your changes to the latest version and try again",
                details={"name": old["metadata"]["name"], "kind": resource.plural},
            )

    @contextlib.contextmanager
    def dry_run(self) -> Iterator[None]:
        """Writes inside validate and answer as usual but change nothing (``?dryRun=All``)."""
        self._dry_run = True
        try:
            yield
        finally:
            self._dry_run = False

    def _commit(self, resource: ResourceType, old: Obj | None, new: Obj | None) -> Obj:
        """Store ``new`` (None deletes ``old``) under a fresh resourceVersion and notify."""
        if self._dry_run:
            return copy.deepcopy(new if new is not None else old) or {}
        self._rv += 1
        objects = self._objects[resource.key]
        if (
            new is not None
            and new["metadata"].get("deletionTimestamp")
            and not new["metadata"].get("finalizers")
        ):
            old, new = new, None  # the last finalizer went away
        if new is None:
            assert old is not None
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            del objects[(gone["metadata"].get("namespace") or "", gone["metadata"]["name"])]
            self._emit(WatchEvent("DELETED", self._rv, resource, gone, old))
            self._after_change(resource, gone)
            return gone
        new["metadata"]["resourceVersion"] = str(self._rv)
        objects[(new["metadata"].get("namespace") or "", new["metadata"]["name"])] = new
        self._emit(
            WatchEvent(
                "ADDED" if old is None else "MODIFIED", self._rv, resource, copy.deepcopy(new), old
            )
        )
        self._after_change(resource, new)
        return copy.deepcopy(new)

    def _now(self) -> str:
        return datetime.fromtimestamp(self._clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    # --- built-in cluster behaviour --------------------------------------------------------------

    def _default_pod(self, pod: Obj) -> None:
        pod.setdefault("status", {}).setdefault("phase", "Pending")
        spec = pod.setdefault("spec", {})
        class_name = spec.get("priorityClassName")
        priority_class = (
            self._objects[("scheduling.k8s.io", "priorityclasses")].get(("", class_name))
            if class_name
            else None
        )
        if priority_class is not None and spec.get("priority") is None:
            spec["priority"] = priority_class.get("value", 0)

    def _after_change(self, resource: ResourceType, obj: Obj) -> None:
        if self._syncing or (resource.key not in (_PODS, _PDBS) and not resource.replicas_path):
            return
        namespace = obj["metadata"].get("namespace")
        self._syncing = True
        try:
            pods = [p for (ns, _), p in self._objects[_PODS].items() if ns == namespace]
            pdb_resource = self.resources[_PDBS]
            for (ns, _), pdb in list(self._objects[_PDBS].items()):
                status = self._budget_status(pdb, pods) if ns == namespace else None
                if status is not None and pdb.get("status") != status:
                    new = copy.deepcopy(pdb)
                    new["status"] = status
                    self._commit(pdb_resource, pdb, new)
        finally:
            self._syncing = False

    def budget_status(self, pdb: Obj) -> Obj:
        """A PodDisruptionBudget's status computed from the pods stored now."""
        namespace = pdb["metadata"].get("namespace")
        return self._budget_status(
            pdb, [p for (ns, _), p in self._objects[_PODS].items() if ns == namespace]
        )

    def _budget_status(self, pdb: Obj, pods: list[Obj]) -> Obj:
        return disruption_status(pdb, pods, controller_scale=self._controller_scale)

    def _controller_scale(self, pod: Obj) -> tuple[str, int] | None:
        """(uid, replicas) of the pod's controller when it is stored and scalable."""
        meta = pod["metadata"]
        for ref in meta.get("ownerReferences") or []:
            if not ref.get("controller"):
                continue
            for resource in self.resources.values():
                if (resource.api_version, resource.kind) != (
                    ref.get("apiVersion"),
                    ref.get("kind"),
                ) or not resource.replicas_path:
                    continue
                owner = self._objects[resource.key].get((meta.get("namespace") or "", ref["name"]))
                if owner is not None:
                    replicas = get_path(owner, resource.replicas_path)
                    return owner["metadata"]["uid"], int(replicas or 0)
        return None

    def matching_budgets(self, pod: Obj) -> list[Obj]:
        """The PodDisruptionBudgets in the pod's namespace whose selector matches it."""
        namespace = pod["metadata"].get("namespace")
        return [
            copy.deepcopy(pdb)
            for (ns, _), pdb in sorted(self._objects[_PDBS].items())
            if ns == namespace
            and label_selector_matcher((pdb.get("spec") or {}).get("selector"))(labels_of(pod))
        ]

    # --- watch ---------------------------------------------------------------------------------

    def _emit(self, event: WatchEvent) -> None:
        if len(self._history) >= self._history_limit:
            self._compacted_rv = self._history.popleft().rv
        self._history.append(event)
        for watcher in self._watchers:
            if watcher.wants(event):
                watcher.queue.put_nowait(event)

    def watch(self, resource: ResourceType, namespace: str | None, since: int | None) -> Watcher:
        """Register a watch. ``since`` None or 0 replays current objects as ADDED first."""
        watcher = Watcher(resource, namespace)
        if not since:
            for obj in self.list_objects(resource, namespace):
                rv = int(obj["metadata"]["resourceVersion"])
                watcher.queue.put_nowait(WatchEvent("ADDED", rv, resource, obj, None))
        elif since < self._compacted_rv:
            raise ApiError(410, f"too old resource version: {since} ({self._compacted_rv + 1})")
        else:
            for event in self._history:
                if event.rv > since and watcher.wants(event):
                    watcher.queue.put_nowait(event)
        self._watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def compact(self) -> None:
        """Forget all watch history: any watch from an older version now gets 410."""
        self._history.clear()
        self._compacted_rv = self._rv

    def close(self) -> None:
        """End every open watch."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)
        self._watchers.clear()

    def watchers(self) -> Iterable[Watcher]:
        return tuple(self._watchers)

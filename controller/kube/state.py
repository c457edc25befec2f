"""The cluster as the engine sees it, kept current by informers: the Kubernetes ``Cluster`` view.

Design:

* :class:`KubeClusterState` runs one :class:`~controller.kube.informer.Informer` per kind —
  Nodes (by a node label selector), Pods (by a label selector and/or namespaces, finished pods
  excluded by a field selector), PriorityClasses, PodDisruptionBudgets, ResourceQuotas (the
  namespaces' GPU quotas, which bound training growth), and each tracked workload
  kind (Deployments, StatefulSets, custom resources with ``/scale`` such as PyTorchJob, described
  by :class:`~controller.kube.translate.WorkloadKind`; which ones is a setting). It is
  :attr:`synced` once every informer has listed. A workload kind whose API is not installed (no
  CRD: the apiserver answers 404) counts as listed and empty, is logged once and is looked for
  again every ``rediscover_s``, so a cluster without Kubeflow still syncs and acts.
* **Incremental.** Each informer's change callback only marks the object's key dirty. On
  :meth:`KubeClusterState.snapshot`, dirty objects are re-translated — skipped when their
  ``resourceVersion`` is the one already translated — and the cached translation is replaced
  only if it differs. The sorted tuples of nodes, pods and workloads are rebuilt only for a kind
  whose translations changed; objects that enter or leave are bisected into the sort order. A
  PriorityClass change that changes the resolved priorities re-translates pods and workloads
  (rare: admission already wrote ``spec.priority`` into most pods).
* **Identity.** ``snapshot()`` returns the same :class:`~policies.snapshot.Snapshot` object while
  no informer's version moved, without looking at anything else. When one moved but no
  translation changed (a pod's status conditions, a node heartbeat), it still returns the same
  object: equal content, so the engine's identity-keyed caches stay valid. Any change that the
  snapshot can show yields a new object.
* Consistency is per informer, as in any informer-based controller: the snapshot is what the
  caches hold at the moment of the call, with no cross-kind transaction.
* :meth:`KubeClusterState.pdbs` hands the cached PodDisruptionBudgets (raw dicts) to actuators,
  :meth:`KubeClusterState.owners` the workloads HPAs and KEDA ScaledObjects scale.
* Workloads are translated by their kind's adapter (:mod:`controller.kube.workloads`), which
  carries the owner's bounds (a PyTorchJob's ``elasticPolicy``) into the snapshot; a Volcano or
  coscheduling PodGroup's ``minMember`` becomes its gang minimum, and the HPA or KEDA
  ScaledObject that targets it its ``scaled_by`` (a PodGroup or autoscaler change re-translates
  the workloads), so the engine plans no resize another autoscaler would fight.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Generic, TypeVar

import structlog
from kubernetes_asyncio.client import ApiClient

from controller.kube.informer import Backoff, Change, Informer, Obj, Resource
from controller.kube.translate import (
    DEPLOYMENT,
    PYTORCHJOB,
    STATEFULSET,
    Priorities,
    WorkloadKind,
    keep_pod,
    node_from,
    pod_from,
    priorities_from,
    quota_from,
    tightest_quotas,
)
from controller.kube.workloads import ADAPTERS, Adapter
from controller.kube.workloads.autoscalers import HPAS, SCALED_OBJECTS, Owners, owners
from controller.kube.workloads.podgroups import PODGROUPS, Gangs, gang_minimum, gangs
from policies.snapshot import GpuQuota, Pod, Snapshot, Workload

__all__ = ["WORKLOAD_KINDS", "ClusterStateSettings", "KubeClusterState", "workload_kinds"]

log = structlog.get_logger(__name__)

NODES: Final = Resource(plural="nodes", namespaced=False)
PODS: Final = Resource(plural="pods")
PRIORITY_CLASSES: Final = Resource(
    group="scheduling.k8s.io", version="v1", plural="priorityclasses", namespaced=False
)
PDBS: Final = Resource(group="policy", version="v1", plural="poddisruptionbudgets")
QUOTAS: Final = Resource(plural="resourcequotas")
#: Finished pods hold no GPUs; the apiserver filters them out (and sends DELETED as they finish).
LIVE_PODS: Final = "status.phase!=Succeeded,status.phase!=Failed"

#: The workload kinds the adapter can track, by the names the ``kube.workload_kinds`` setting uses.
WORKLOAD_KINDS: Final[Mapping[str, WorkloadKind]] = {
    name: adapter.kind for name, adapter in ADAPTERS.items()
}

_T = TypeVar("_T")


def workload_kinds(names: Iterable[str]) -> tuple[WorkloadKind, ...]:
    """The kinds named (``Deployment``, ``PyTorchJob``…), in order; KeyError for an unknown one."""
    return tuple(WORKLOAD_KINDS[name] for name in names)


@dataclass(frozen=True, kw_only=True)
class ClusterStateSettings:
    """What :class:`KubeClusterState` watches."""

    node_selector: str | None = None
    """Label selector of the nodes to watch (``None``: every node; nodes without GPUs drop out)."""
    pod_selector: str | None = None
    """Label selector of the pods to watch (``None``: every pod in :attr:`namespaces`)."""
    namespaces: tuple[str, ...] = ()
    """Namespaces of pods, workloads and PDBs (empty: all namespaces)."""
    workload_selector: str | None = None
    """Label selector of the workloads to watch."""
    workload_kinds: tuple[WorkloadKind, ...] = (DEPLOYMENT, STATEFULSET, PYTORCHJOB)
    """Workload kinds to track; custom kinds say where replicas and the pod template are."""
    page_size: int = 500
    """LIST page size (``limit``)."""
    watch_timeout_s: float = 300.0
    """Server-side watch timeout; each watch takes a random value between this and twice it."""
    backoff: Backoff = field(default_factory=Backoff)
    """Backoff between failed list/watch attempts."""
    rediscover_s: float = 60.0
    """How often a workload kind whose API is not installed is looked for again."""


class _Translations(Generic[_T]):
    """Translations of one informer's objects, refreshed from the keys its changes marked."""

    def __init__(
        self,
        informer: Informer,
        translate: Callable[[Obj], _T | None],
        sort_key: Callable[[_T], Any],
    ) -> None:
        self.informer = informer
        self._translate = translate
        self._sort_key = sort_key
        self._values: dict[str, _T] = {}
        self._versions: dict[str, str] = {}
        self._dirty: set[str] = set()
        self._sorted: tuple[_T, ...] = ()
        self._order: list[str] = []
        self._order_keys: list[Any] = []
        """Sort keys of :attr:`_order`'s values, for bisecting."""

    def mark(self, change: Change) -> None:
        self._dirty.add(change.key)

    def invalidate(self) -> None:
        """Re-translate every object on the next refresh (its inputs beyond the object changed)."""
        self._dirty.update(self.informer.keys())
        self._dirty.update(self._values)
        self._versions.clear()

    def refresh(self) -> bool:
        """Bring translations up to date; True when any translation changed."""
        if not self._dirty:
            return False
        changed = False
        entered: list[str] = []
        left: list[_T] = []
        for key in self._dirty:
            obj = self.informer.get(key)
            if obj is None:
                self._versions.pop(key, None)
                gone = self._values.pop(key, None)
                if gone is not None:
                    left.append(gone)
                continue
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            if version and self._versions.get(key) == version:
                continue
            self._versions[key] = version
            new, old = self._translate(obj), self._values.get(key)
            if new is None:
                if old is not None:
                    del self._values[key]
                    left.append(old)
            elif new != old:
                self._values[key] = new
                changed = True
                if old is None:
                    entered.append(key)
        self._dirty.clear()
        if entered or left:
            changed = True
            self._reorder(entered, left)
        if changed:
            self._sorted = tuple(self._values[k] for k in self._order)
        return changed

    def _reorder(self, entered: list[str], left: list[_T]) -> None:
        """Keep :attr:`_order` sorted: bisect a few insertions and removals, re-sort many."""
        if len(entered) + len(left) > 64:
            pairs = sorted((self._sort_key(v), k) for k, v in self._values.items())
            self._order_keys = [p[0] for p in pairs]
            self._order = [p[1] for p in pairs]
            return
        for value in left:
            at = bisect.bisect_left(self._order_keys, self._sort_key(value))
            del self._order_keys[at], self._order[at]
        for key in entered:
            sort_key = self._sort_key(self._values[key])
            at = bisect.bisect_left(self._order_keys, sort_key)
            self._order_keys.insert(at, sort_key)
            self._order.insert(at, key)

    def values(self) -> tuple[_T, ...]:
        """Translations sorted by name, as of the last refresh."""
        return self._sorted


class KubeClusterState:
    """Informers for the kinds the engine needs, and a snapshot assembled from them."""

    def __init__(self, api: ApiClient, settings: ClusterStateSettings | None = None) -> None:
        self.settings = settings = settings or ClusterStateSettings()
        common: dict[str, Any] = {
            "page_size": settings.page_size,
            "watch_timeout_s": settings.watch_timeout_s,
            "backoff": settings.backoff,
        }
        scoped: dict[str, Any] = {**common, "namespaces": settings.namespaces}
        self._kinds = settings.workload_kinds
        self._priorities = Priorities()
        self._classes = Informer(api, PRIORITY_CLASSES, **common)
        self._pdbs = Informer(api, PDBS, **scoped)
        # Other autoscalers (KEDA is optional: no CRD lists 404 and counts as none).
        self._hpas = Informer(
            api, HPAS, optional=True, rediscover_s=settings.rediscover_s, **scoped
        )
        self._scaled_objects = Informer(
            api, SCALED_OBJECTS, optional=True, rediscover_s=settings.rediscover_s, **scoped
        )
        self._owners: tuple[tuple[int, int], Owners] = ((-1, -1), {})
        self._scaled: Owners = {}
        """The index the workloads were last translated with."""
        self._podgroups = tuple(
            Informer(api, r, optional=True, rediscover_s=settings.rediscover_s, **scoped)
            for r in PODGROUPS
        )
        self._podgroups_version: tuple[int, ...] = ()
        self._gangs: Gangs = {}
        self._nodes = _Translations(
            Informer(api, NODES, label_selector=settings.node_selector, **common),
            node_from,
            lambda n: n.name,
        )
        self._pods = _Translations(
            Informer(
                api,
                PODS,
                label_selector=settings.pod_selector,
                field_selector=LIVE_PODS,
                **scoped,
            ),
            self._translate_pod,
            lambda p: (p.namespace, p.name),
        )
        self._quotas = _Translations(
            Informer(api, QUOTAS, **scoped), _named_quota, lambda q: (q[1].namespace, q[0])
        )
        self._workloads: list[_Translations[Workload]] = []
        for kind in self._kinds:
            resource = Resource(group=kind.group, version=kind.version, plural=kind.plural)
            informer = Informer(
                api,
                resource,
                label_selector=settings.workload_selector,
                optional=True,
                rediscover_s=settings.rediscover_s,
                **scoped,
            )
            self._workloads.append(
                _Translations(informer, self._workload_translator(kind), _workload_order)
            )
        translated: list[_Translations[Any]] = [
            self._nodes,
            self._pods,
            self._quotas,
            *self._workloads,
        ]
        for translations in translated:
            translations.informer.on_change = translations.mark
        self._all = (
            self._classes,
            self._pdbs,
            self._hpas,
            self._scaled_objects,
            *self._podgroups,
            *(t.informer for t in translated),
        )
        self._seen_versions: tuple[int, ...] | None = None
        self._classes_version = -1
        self._snapshot = Snapshot()
        self._kept_pods: tuple[Pod, ...] = ()
        self._stopping = asyncio.Event()
        self.last_rebuild_s = 0.0
        """Seconds the last snapshot rebuild took (0 while the cached snapshot was reused)."""

    # --- the port's view ---------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once every informer has completed its first LIST."""
        return all(i.synced for i in self._all)

    async def wait_synced(self) -> None:
        """Return once :attr:`synced` is true."""
        for informer in self._all:
            await informer.wait_synced()

    def snapshot(self) -> Snapshot:
        """The current view: the same object while nothing it shows has changed."""
        versions = tuple(i.version for i in self._all)
        if versions == self._seen_versions:
            self.last_rebuild_s = 0.0
            return self._snapshot
        started = time.perf_counter()
        self._seen_versions = versions
        classes_changed = False
        if self._classes.version != self._classes_version:
            self._classes_version = self._classes.version
            priorities = priorities_from(self._classes.items())
            if priorities != self._priorities:
                self._priorities = priorities
                classes_changed = True
                self._pods.invalidate()
                for translations in self._workloads:
                    translations.invalidate()
        podgroups = tuple(i.version for i in self._podgroups)
        if podgroups != self._podgroups_version:  # gang minimums are part of the translation
            self._podgroups_version = podgroups
            gang_index = gangs(pg for i in self._podgroups for pg in i.items())
            if gang_index != self._gangs:
                self._gangs = gang_index
                for translations in self._workloads:
                    translations.invalidate()
        scaled = self.owners()
        if scaled is not self._scaled and scaled != self._scaled:  # part of the translation
            self._scaled = scaled
            for translations in self._workloads:
                translations.invalidate()
        workloads_changed = any([w.refresh() for w in self._workloads])
        nodes_changed = self._nodes.refresh()
        pods_changed = self._pods.refresh()
        quotas_changed = self._quotas.refresh()
        if pods_changed or workloads_changed:
            tracked = {w.key for t in self._workloads for w in t.values()}
            self._kept_pods = tuple(p for p in self._pods.values() if keep_pod(p, tracked))
        changed = (classes_changed, workloads_changed, nodes_changed, pods_changed, quotas_changed)
        if any(changed):
            workloads = sorted(
                (w for t in self._workloads for w in t.values()), key=_workload_order
            )
            self._snapshot = Snapshot(
                nodes=self._nodes.values(),
                pods=self._kept_pods,
                workloads=tuple(workloads),
                priority_classes=self._priorities.classes(),
                quotas=tightest_quotas(q for _, q in self._quotas.values()),
            )
        self.last_rebuild_s = time.perf_counter() - started
        return self._snapshot

    def nodes(self) -> list[Obj]:
        """The cached Nodes, raw (the cache's own dicts: do not mutate); MIG flows are found in
        their annotations."""
        return self._nodes.informer.items()

    def owners(self) -> Owners:
        """Workloads that an HPA or KEDA ScaledObject scales, and which one (re-indexed only
        when either informer moved)."""
        versions = (self._hpas.version, self._scaled_objects.version)
        if versions != self._owners[0]:
            self._owners = (versions, owners(self._hpas.items(), self._scaled_objects.items()))
        return self._owners[1]

    def pdbs(self) -> list[Obj]:
        """The cached PodDisruptionBudgets, raw (the cache's own dicts: do not mutate)."""
        return self._pdbs.items()

    @property
    def informers(self) -> Mapping[str, Informer]:
        """Every informer by resource name (``pods``, ``deployments.apps``…), for diagnostics."""
        return {str(i.resource): i for i in self._all}

    # --- running -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to stop its informers and return."""
        self._stopping.set()

    async def run(self) -> None:
        """Run every informer until :meth:`stop` is called or the task is cancelled."""
        log.info("cluster_state.starting", informers=sorted(self.informers))
        try:
            async with asyncio.TaskGroup() as group:
                for informer in self._all:
                    group.create_task(informer.run(), name=f"informer {informer.resource}")
                await self._stopping.wait()
                for informer in self._all:
                    informer.stop()
        finally:
            self._stopping.clear()  # so that it can run again

    # --- translation with the current priorities -------------------------------------------

    def _translate_pod(self, obj: Obj) -> Pod | None:
        return pod_from(obj, priorities=self._priorities, kinds=self._kinds)

    def _workload_translator(self, kind: WorkloadKind) -> Callable[[Obj], Workload | None]:
        adapter = ADAPTERS.get(kind.kind) or Adapter(kind)

        def translate(obj: Obj) -> Workload | None:
            w = adapter.workload(obj, self._priorities)
            gang = gang_minimum(self._gangs, w.kind, w.namespace, w.name)
            scaled_by = self._scaled.get((w.kind, w.namespace, w.name))
            if gang is None and scaled_by is None:
                return w
            return replace(w, gang_min=w.gang_min if gang is None else gang, scaled_by=scaled_by)

        return translate


def _named_quota(obj: Obj) -> tuple[str, GpuQuota] | None:
    """A ResourceQuota's GPU quota with the object's name (several may share a namespace)."""
    quota = quota_from(obj)
    return None if quota is None else (str((obj.get("metadata") or {}).get("name", "")), quota)


def _workload_order(w: Workload) -> tuple[str, str, str]:
    return (w.namespace, w.name, w.kind)

"""ServiceObjectives in the cluster: watched where the chart allows, their status written back.

:class:`ObjectiveSync` is the Kubernetes half of the ``ServiceObjective`` resource
(:mod:`controller.kube.objective_crd`): an :class:`~controller.kube.informer.Informer` over the
objects in the namespaces the ``kube.objective_namespaces`` setting allows (one list+watch per
namespace, or one over the cluster for ``*``; the chart's RBAC grants exactly that), the pause
annotation read off them, and the status writer. What the status says is the process's business
(:mod:`controller.process.objective_status`); how often it is written is decided here:

* **Through the status subresource only** (``PATCH …/serviceobjectives/NAME/status``, a JSON merge
  patch of ``status``): the API server ignores ``status`` on a write to the object and anything
  but ``status`` on a write to ``/status`` (apiextensions-apiserver,
  ``pkg/registry/customresource/strategy.go`` and ``status_strategy.go``,
  ``PrepareForUpdate``), so a team's ``kubectl apply`` and the controller never overwrite each
  other's half.
* **Rate-limited as the HPA is**: at most once per ``every_s`` per object (the HPA updates its
  status once per sync period), and only when the status differs from the one the object
  carries, so an unchanged service costs no write at all and a percentile that moves every
  second costs one write per period.
* A failed write is logged in one line and tried again after the period; it never stops the
  controller. An object the informer no longer holds is forgotten.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import structlog
from kubernetes_asyncio.client import ApiClient

from controller.kube.client import KubeError
from controller.kube.informer import Informer, Obj, Resource
from controller.kube.objective_crd import GROUP, PAUSED_ANNOTATION, PLURAL, VERSION
from controller.kube.workloads.base import Io

__all__ = ["OBJECTIVES", "ObjectiveSync"]

log = structlog.get_logger(__name__)

OBJECTIVES: Final = Resource(group=GROUP, version=VERSION, plural=PLURAL)
ALL: Final = "*"


class ObjectiveSync:
    """The ServiceObjectives of the allowed namespaces, and their rate-limited status writes."""

    def __init__(
        self,
        api: ApiClient,
        namespaces: Sequence[str],
        *,
        every_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        rediscover_s: float = 60.0,
    ) -> None:
        everywhere = ALL in namespaces
        self.namespaces: frozenset[str] | None = None if everywhere else frozenset(namespaces)
        """Where objectives may be defined (``None``: every namespace)."""
        self.informer = Informer(
            api,
            OBJECTIVES,
            namespaces=() if everywhere else tuple(namespaces),
            optional=True,  # the CRD not installed yet: no objective, logged once
            rediscover_s=rediscover_s,
        )
        self.every_s = every_s
        self._clock = clock
        self._io = Io(api)
        self._written: dict[str, float] = {}
        self.writes = 0
        """Status writes made (each one PATCH of ``/status``)."""

    @property
    def synced(self) -> bool:
        return self.informer.synced

    @property
    def version(self) -> int:
        """Moves whenever an object is added, changed or deleted."""
        return self.informer.version

    def objects(self) -> list[Obj]:
        """The cached objects (the cache's own dicts: do not mutate)."""
        return self.informer.items()

    def paused(self) -> dict[str, str]:
        """``namespace/name`` of each object carrying ``ebbtide.io/paused: "true"``, with the
        words its status and ``ebbtide status`` show."""
        out = {}
        for obj in self.informer.items():
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            if annotations.get(PAUSED_ANNOTATION) == "true":
                key = _key(obj)
                out[key] = f"paused: ServiceObjective {key} carries {PAUSED_ANNOTATION}=true"
        return out

    def due(self, key: str) -> bool:
        """Whether ``key``'s status may be written now (its last write is a period old)."""
        last = self._written.get(key)
        return last is None or self._clock() - last >= self.every_s

    async def write(self, statuses: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """Write each ``namespace/name``'s status where it is due and differs from the one
        the object carries; returns the keys written."""
        for gone in self._written.keys() - set(self.informer.keys()):
            del self._written[gone]
        written = []
        for key, status in sorted(statuses.items()):
            obj = self.informer.get(key)
            if obj is None or not self.due(key) or obj.get("status") == status:
                continue
            self._written[key] = self._clock()
            namespace, _, name = key.partition("/")
            path = f"{OBJECTIVES.path(namespace)}/{name}/status"
            try:
                await self._io.request("PATCH", path, {"status": dict(status)})
            except KubeError as exc:
                log.warning("objective.status_failed", object=key, error=str(exc))
                continue
            self.writes += 1
            written.append(key)
        return written

    async def run(self) -> None:
        await self.informer.run()

    def stop(self) -> None:
        self.informer.stop()


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

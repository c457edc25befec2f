"""KubeRay RayCluster (``ray.io/v1``): no ``/scale`` subresource.

KubeRay sizes a worker group by ``workerGroupSpecs[].replicas`` within the group's own
``minReplicas``/``maxReplicas``, and removes the workers listed in
``scaleStrategy.workersToDelete`` when the count goes down (otherwise it picks any). So Ebbtide
writes both together: a shrink names the newest workers of the group as the ones to go, a grow
only raises ``replicas``. One group is resized: the first, or the one
:data:`~controller.kube.workloads.base.SCALE_GROUP` names. A cluster with
``enableInTreeAutoscaling`` belongs to the Ray autoscaler and is never resized.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from controller.kube.translate import Obj, WorkloadKind, get_path
from controller.kube.workloads.base import Adapter, Patch, in_group, int_or_none, meta

__all__ = ["RAYCLUSTER", "RAYCLUSTERS", "RayClusterAdapter"]

RAYCLUSTER: Final = WorkloadKind(
    kind="RayCluster",
    group="ray.io",
    version="v1",
    plural="rayclusters",
    replicas_path="spec.workerGroupSpecs.0.replicas",
    template_path="spec.workerGroupSpecs.0.template",
    pod_label="ray.io/cluster",
)


class RayClusterAdapter(Adapter):
    """See the module docstring."""

    def located(self, obj: Obj) -> WorkloadKind:
        return in_group(self.kind, obj, "spec.workerGroupSpecs", "groupName", "template")

    def _at(self, obj: Obj) -> str:
        return self.located(obj).replicas_path.removesuffix(".replicas")

    def _group(self, obj: Obj) -> Mapping[str, Any]:
        group = get_path(obj, self._at(obj))
        return group if isinstance(group, Mapping) else {}

    def bounds(self, obj: Obj) -> tuple[int, int]:
        replicas = self.replicas(obj)
        if get_path(obj, "spec.enableInTreeAutoscaling"):
            return replicas, replicas
        group = self._group(obj)
        lo = int_or_none(group.get("minReplicas"))
        hi = int_or_none(group.get("maxReplicas"))
        lo = replicas if lo is None else lo
        return lo, max(lo, replicas if hi is None else hi)

    def owner_refusal(self, obj: Obj, to: int) -> str | None:
        if get_path(obj, "spec.enableInTreeAutoscaling"):
            return "the RayCluster has enableInTreeAutoscaling: the Ray autoscaler owns its size"
        return super().owner_refusal(obj, to)

    def pod_selector(self, obj: Obj) -> str:
        name = meta(obj).get("name", "")
        return f"ray.io/cluster={name},ray.io/group={self._group(obj).get('groupName', '')}"

    def resize(self, obj: Obj, to: int, pods: Sequence[Obj]) -> Patch:
        """``replicas`` and, on a shrink, the newest workers as ``workersToDelete``."""
        current = self.replicas(obj)
        live = [p for p in pods if not meta(p).get("deletionTimestamp")]
        newest = sorted(
            live,
            key=lambda p: (str(meta(p).get("creationTimestamp") or ""), meta(p).get("name", "")),
            reverse=True,
        )
        victims = tuple(str(meta(p).get("name")) for p in newest[: max(0, current - to)])
        group = dict(self._group(obj))
        group["replicas"] = to
        group["scaleStrategy"] = {
            **(group.get("scaleStrategy") or {}),
            "workersToDelete": list(victims),
        }
        at = self._at(obj)
        index = int(at.rpartition(".")[2])
        groups = [dict(g) for g in get_path(obj, "spec.workerGroupSpecs") or []]
        groups[index] = group
        return Patch({"spec": {"workerGroupSpecs": groups}}, victims=victims)


RAYCLUSTERS = RayClusterAdapter(RAYCLUSTER)

"""Deployments and StatefulSets: the ``apps/v1`` controllers own replicas and answer to
``/scale``, as a HorizontalPodAutoscaler does. Bounds come from Ebbtide's annotations
(``ebbtide.io/min-replicas``, ``ebbtide.io/max-replicas``): these kinds have none of their own."""

from __future__ import annotations

from collections.abc import Sequence

from controller.kube.translate import DEPLOYMENT, STATEFULSET, Obj
from controller.kube.workloads.base import Adapter, Patch

__all__ = ["DEPLOYMENTS", "STATEFULSETS", "ScaleAdapter"]


class ScaleAdapter(Adapter):
    """Replicas read and written through the ``/scale`` subresource."""

    via_scale = True

    def resize(self, obj: Obj, to: int, pods: Sequence[Obj]) -> Patch:
        return Patch({"spec": {"replicas": to}}, sub="scale")


DEPLOYMENTS = ScaleAdapter(DEPLOYMENT)
STATEFULSETS = ScaleAdapter(STATEFULSET)

"""Deployments and StatefulSets: the ``apps/v1`` controllers own replicas and answer to
``/scale``, as a HorizontalPodAutoscaler does. Bounds come from Ebbtide's annotations
(``ebbtide.io/min-replicas``, ``ebbtide.io/max-replicas``): these kinds have none of their own.

Which pods a shrink removes is the controller's choice; a Deployment's ReplicaSet can be told
(:func:`mark_for_removal`), a StatefulSet cannot (its highest ordinals go)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from controller.kube.client import KubeError
from controller.kube.translate import DEPLOYMENT, STATEFULSET, Obj
from controller.kube.workloads.base import Adapter, Io, Patch

__all__ = ["DELETION_COST", "DEPLOYMENTS", "STATEFULSETS", "ScaleAdapter", "mark_for_removal"]

DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
"""A ReplicaSet scaling down removes pods with the lowest cost first (after unscheduled and
not-ready ones); pods without it cost 0."""
_FIRST: Final = str(-(2**31))


class ScaleAdapter(Adapter):
    """Replicas read and written through the ``/scale`` subresource."""

    via_scale = True

    def resize(self, obj: Obj, to: int, pods: Sequence[Obj]) -> Patch:
        return Patch({"spec": {"replicas": to}}, sub="scale")


DEPLOYMENTS = ScaleAdapter(DEPLOYMENT)
STATEFULSETS = ScaleAdapter(STATEFULSET)


async def mark_for_removal(io: Io, adapter: Adapter, pods: Sequence[str]) -> None:
    """Give the ``pods`` a shrink names (``namespace/name``) the lowest deletion cost right
    before a Deployment's ``/scale`` write, so its ReplicaSet removes those; other kinds cannot
    be told. A pod already gone needs nothing; one that cannot be marked does not hold the
    scale-down back (only the choice of which pods go is lost)."""
    if adapter is not DEPLOYMENTS:
        return
    body = {"metadata": {"annotations": {DELETION_COST: _FIRST}}}
    for key in pods:
        namespace, _, name = key.partition("/")
        try:
            await io.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", body)
        except KubeError:
            continue

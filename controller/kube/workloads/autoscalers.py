"""Other autoscalers that own a workload's size: HorizontalPodAutoscalers (``autoscaling/v2``)
and KEDA ScaledObjects (``keda.sh/v1alpha1``, optional: a cluster without KEDA lists 404).

Two controllers writing one replica count fight: each undoes the other on every tick. So a
workload that one of them targets is not Ebbtide's to resize unless the policy says Ebbtide owns
it (``training.owner: ebbtide``); the refusal names the other autoscaler. :func:`owners` indexes
the informers' raw objects by their ``scaleTargetRef``; it is pure and cheap (a few hundred
objects per cluster).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from controller.kube.informer import Resource
from controller.kube.translate import Obj
from controller.kube.workloads.base import meta

__all__ = ["HPAS", "SCALED_OBJECTS", "Owners", "owners"]

HPAS: Final = Resource(group="autoscaling", version="v2", plural="horizontalpodautoscalers")
SCALED_OBJECTS: Final = Resource(group="keda.sh", version="v1alpha1", plural="scaledobjects")

Owners = Mapping[tuple[str, str, str], str]
"""(kind, namespace, name) of a workload → the autoscaler that owns it, in words."""


def owners(hpas: Iterable[Obj], scaled_objects: Iterable[Obj]) -> dict[tuple[str, str, str], str]:
    """Index HPAs and ScaledObjects by the workload their ``scaleTargetRef`` names (a
    ScaledObject's kind defaults to Deployment, as KEDA's does)."""
    out: dict[tuple[str, str, str], str] = {}
    for what, objects in (("HorizontalPodAutoscaler", hpas), ("KEDA ScaledObject", scaled_objects)):
        for obj in objects:
            m = meta(obj)
            ref = (obj.get("spec") or {}).get("scaleTargetRef") or {}
            namespace = str(m.get("namespace") or "default")
            key = (str(ref.get("kind") or "Deployment"), namespace, str(ref.get("name") or ""))
            out.setdefault(key, f"{what} {namespace}/{m.get('name')}")
    return out

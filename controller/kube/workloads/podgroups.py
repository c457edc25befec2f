"""Gang minimums from the gang scheduler's own objects: PodGroups of Volcano
(``scheduling.volcano.sh/v1beta1``) and of the scheduler-plugins coscheduling plugin
(``scheduling.x-k8s.io/v1alpha1``), both optional (a 404 means not installed).

Their ``spec.minMember`` is what the scheduler enforces: below it the gang is not scheduled at
all, so evicting one pod too many wastes every other pod's GPUs. A PodGroup belongs to the
workload its ownerReference names (the training operator and JobSet create them so), else to the
workload of the same name; it wins over Ebbtide's ``ebbtide.io/gang-minimum`` annotation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from controller.kube.informer import Resource
from controller.kube.translate import Obj
from controller.kube.workloads.base import int_or_none, meta

__all__ = ["PODGROUPS", "Gangs", "gang_minimum", "gangs"]

PODGROUPS: Final = (
    Resource(group="scheduling.volcano.sh", version="v1beta1", plural="podgroups"),
    Resource(group="scheduling.x-k8s.io", version="v1alpha1", plural="podgroups"),
)

Gangs = Mapping[tuple[str, str, str], int]
"""(kind or ``""`` for by-name, namespace, name) → ``minMember``."""


def gangs(podgroups: Iterable[Obj]) -> dict[tuple[str, str, str], int]:
    """Index PodGroups by the workloads they belong to: by owner kind and name, and by name."""
    out: dict[tuple[str, str, str], int] = {}
    for pg in podgroups:
        m = meta(pg)
        minimum = int_or_none((pg.get("spec") or {}).get("minMember"))
        if minimum is None:
            continue
        namespace = str(m.get("namespace") or "default")
        out[("", namespace, str(m.get("name", "")))] = minimum
        for ref in m.get("ownerReferences") or []:
            out[(str(ref.get("kind")), namespace, str(ref.get("name")))] = minimum
    return out


def gang_minimum(index: Gangs, kind: str, namespace: str, name: str) -> int | None:
    """The ``minMember`` of the workload's PodGroup, or None when it has none."""
    owned = index.get((kind, namespace, name))
    return owned if owned is not None else index.get(("", namespace, name))

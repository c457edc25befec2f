"""Values of the simulated cluster: its delays, what it did, and GPUs by use.

Frozen dataclasses a replay, a report or a test reads; the mutable state lives in
:mod:`controller.simcluster.nodeindex` and :mod:`controller.simcluster.simulator`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from policies.snapshot import FrozenMap

__all__ = [
    "DEFAULT_TRAINING_SELECTOR",
    "EPOCH",
    "UNPOOLED",
    "Effect",
    "EffectKind",
    "GpuUse",
    "PodTemplate",
    "SimDelays",
]

#: Simulated time 0 unless told otherwise (2026-01-01T00:00:00Z, as in policy case files).
EPOCH: Final = 1_767_225_600.0
#: Labels marking training workloads and pods when no policy says otherwise.
DEFAULT_TRAINING_SELECTOR: Final[Mapping[str, str]] = FrozenMap({"ebbtide.io/class": "training"})
#: Key of :meth:`SimCluster.gpus_by_use` for nodes that match no pool.
UNPOOLED: Final = "(none)"

EffectKind = Literal[
    "created",
    "scheduled",
    "running",
    "terminating",
    "deleted",
    "scaled",
    "cordoned",
    "uncordoned",
    "mig_reconfiguring",
    "mig_done",
    "mig_failed",
]
_EMPTY: Final[Mapping[str, Any]] = FrozenMap()


@dataclass(frozen=True, slots=True)
class SimDelays:
    """How long the simulated cluster takes to do things (seconds)."""

    eviction_grace_s: float = 30.0
    """Grace of terminations the cluster starts itself (scale-down, MIG drain); an Evict
    decision uses its own ``grace_s``."""
    pod_startup_s: float = 10.0
    """From binding to a node to Running."""
    mig_reconfigure_s: float = 180.0
    """From setting ``nvidia.com/mig.config`` on a drained node to success or failure."""
    mig_failure_probability: float = 0.0
    """Chance a reconfiguration fails (the node rolls back to its previous layout)."""
    scale_up_create_s: float = 2.0
    """From a replica count going up to the new pod (the Deployment controller resizes the
    ReplicaSet, whose controller then creates it)."""
    replace_create_s: float = 0.0
    """From a workload's pod starting to terminate (evicted, preempted, drained) to its
    replacement: at once, as a ReplicaSet counts a pod with a ``deletionTimestamp`` as gone
    (``FilterActivePods``, kubernetes ``pkg/controller/replicaset/replica_set.go``) and
    recreates it while the old one still holds its GPUs for its grace period."""

    def __post_init__(self) -> None:
        names = (
            "eviction_grace_s",
            "pod_startup_s",
            "mig_reconfigure_s",
            "scale_up_create_s",
            "replace_create_s",
        )
        for name in names:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if not 0.0 <= self.mig_failure_probability <= 1.0:
            raise ValueError("mig_failure_probability must be within [0, 1]")


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """What a workload's pods carry beyond the :class:`Workload` itself."""

    mig: Mapping[str, int] = _EMPTY
    """MIG instances per replica by profile (``1g.10gb``)."""
    node_selector: Mapping[str, str] = _EMPTY
    """Labels a node must carry to run the pods (the workload's pool and own selector)."""
    annotations: Mapping[str, str] = _EMPTY
    startup_s: float | None = None
    """From binding to Running for these pods (an LLM server pulls its image and loads its
    weights: minutes); ``None``: :attr:`SimDelays.pod_startup_s`."""


@dataclass(frozen=True, slots=True)
class Effect:
    """One thing the simulated cluster did, for reports and determinism checks."""

    at: float
    kind: EffectKind
    target: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class GpuUse:
    """Physical GPUs of one pool by use. ``inference + training + idle + mig + reconfiguring``
    is ``total``; a whole-card GPU held by a pod matching the training selector is training."""

    total: int = 0
    inference: int = 0
    training: int = 0
    idle: int = 0
    mig: int = 0
    """GPUs partitioned into MIG instances (their instances are counted below)."""
    reconfiguring: int = 0
    """GPUs of nodes draining or being reconfigured."""
    mig_slices_used: int = 0
    mig_slices_total: int = 0

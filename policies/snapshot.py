"""A plain, typed picture of the cluster at one moment: what the engine decides on.

Design:

* Frozen dataclasses, no Kubernetes client types: the Kubernetes adapter, the simulator, case
  files and tests all build the same values. Labels and annotations are read-only mappings.
* Only what decisions need: nodes with their GPUs (whole cards or MIG slices), MIG labels and
  taints, pods with GPU requests, phase, resolved priority, owner workload and where they may
  run (:class:`Placement`: nodeSelector, required node affinity and tolerations), workloads
  with replicas, GPUs per replica and their pod template's placement (so where the next
  replica lands is known before it exists), and each namespace's ``requests.nvidia.com/gpu``
  quota. Priority is an integer the adapter resolves from the PriorityClass; the class name is
  kept for explanations, and :class:`SnapshotBuilder` resolves names for tests.
* A snapshot is immutable, so the engine may cache indexes on its identity: hand the engine the
  same object while nothing changed and a new one when something did.
* :class:`SnapshotBuilder` is the Kueue-style builder for tests, cases and simulators:
  ``SnapshotBuilder().node("n1", gpus=8).workload("ml", "train", replicas=2, nodes=["n1"])``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar

from policies.nodeaffinity import NodeAffinity

__all__ = [
    "ANYWHERE",
    "MIG_DISABLED",
    "FrozenMap",
    "Gpu",
    "GpuQuota",
    "Node",
    "Placement",
    "Pod",
    "PodPhase",
    "PriorityClass",
    "Snapshot",
    "SnapshotBuilder",
    "Taint",
    "Toleration",
    "Workload",
    "frozen_map",
]

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]
#: The ``nvidia.com/mig.config`` value of a node whose GPUs are whole cards.
MIG_DISABLED: Final = "all-disabled"
#: MIG slices per GPU for the ``all-<profile>`` layouts Ebbtide converts to.
_SLICES_PER_GPU: Final = {"1g": 7, "2g": 3, "3g": 2, "4g": 1, "7g": 1}

_V = TypeVar("_V")


class FrozenMap(Mapping[str, _V], Generic[_V]):
    """An immutable, hashable, picklable mapping (labels, annotations, explanation inputs)."""

    __slots__ = ("_data",)

    def __init__(self, items: Mapping[str, _V] | Iterable[tuple[str, _V]] = ()) -> None:
        self._data: dict[str, _V] = dict(items)

    def __getitem__(self, key: str) -> _V:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (self._data,))


_EMPTY: Final[Mapping[str, str]] = FrozenMap()
_NO_MIG: Final[Mapping[str, int]] = FrozenMap()


def frozen_map(items: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """A read-only copy of ``items`` (labels, annotations)."""
    return FrozenMap(items) if items else _EMPTY


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint; only ``NoSchedule`` and ``NoExecute`` keep pods off a node."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration, as Kubernetes matches it: an empty ``key`` with ``Exists`` tolerates
    every taint, an empty ``effect`` every effect."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod (or a workload's next replica) may run: the labels a node must carry
    (``nodeSelector``), its required node affinity and the taints it tolerates. Matched by
    :func:`policies.placement.admits`."""

    node_selector: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    tolerations: tuple[Toleration, ...] = ()
    affinity: NodeAffinity | None = None
    """``requiredDuringSchedulingIgnoredDuringExecution`` node affinity; ``None``: none."""
    unknown: str | None = None
    """Why Ebbtide cannot tell which nodes may run it (affinity it cannot read the way the
    apiserver does, :mod:`policies.nodeaffinity`); no node admits it and nothing is preempted
    on its behalf. ``None``: known."""

    def __post_init__(self) -> None:
        # hashable whatever the caller passed: placements key caches of "where could it land"
        object.__setattr__(self, "node_selector", frozen_map(self.node_selector))
        object.__setattr__(self, "tolerations", tuple(self.tolerations))


#: No constraint: any untainted node.
ANYWHERE: Final = Placement()


@dataclass(frozen=True, slots=True)
class GpuQuota:
    """A namespace's ``requests.nvidia.com/gpu`` ResourceQuota: ``hard`` and ``used`` as the
    quota's status reports them (the tightest, when a namespace has several)."""

    namespace: str
    hard: int
    used: int

    @property
    def left(self) -> int:
        return max(0, self.hard - self.used)


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU: a whole card, or one partitioned into ``mig_slices`` MIG instances."""

    index: int
    model: str = "A100-80GB"
    mig_profile: str | None = None
    """The MIG instance profile (``1g.10gb``) when partitioned, else ``None``."""
    mig_slices: int = 0
    """MIG instances on this GPU (0 for a whole card)."""


@dataclass(frozen=True, slots=True)
class Node:
    """A GPU node. ``mig_config``/``mig_state`` mirror ``nvidia.com/mig.config`` and
    ``nvidia.com/mig.config.state``."""

    name: str
    gpus: tuple[Gpu, ...] = ()
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    cordoned: bool = False
    mig_config: str | None = None
    mig_state: str | None = None
    mig_flow: bool = False
    """A MIG conversion or revert is under way (the Kubernetes flow's ``ebbtide.io/mig-flow``
    record, the simulator's flight), whoever started it: an engine that restarted counts it
    against ``maxConcurrent`` and never plans another on this node."""
    taints: tuple[Taint, ...] = ()

    @property
    def gpu_model(self) -> str:
        """Model of the node's GPUs (nodes are homogeneous), ``""`` without GPUs."""
        return self.gpus[0].model if self.gpus else ""

    @property
    def is_mig(self) -> bool:
        """True when the node is (being) partitioned into MIG instances."""
        return self.mig_config not in (None, MIG_DISABLED)

    @property
    def whole_gpus(self) -> int:
        """GPUs handed out as whole cards."""
        return 0 if self.is_mig else sum(1 for g in self.gpus if g.mig_profile is None)

    def mig_capacity(self) -> dict[str, int]:
        """MIG instances by profile."""
        out: dict[str, int] = {}
        for gpu in self.gpus:
            if gpu.mig_profile is not None:
                out[gpu.mig_profile] = out.get(gpu.mig_profile, 0) + gpu.mig_slices
        return out


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod, with its whole-GPU and MIG requests and resolved priority."""

    namespace: str
    name: str
    node: str | None = None
    phase: PodPhase = "Running"
    gpus: int = 0
    mig: Mapping[str, int] = field(default_factory=lambda: _NO_MIG)
    priority: int = 0
    priority_class: str | None = None
    workload: str | None = None
    """``namespace/name`` of the owning workload, if any."""
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    created: float = 0.0
    """Creation time, epoch seconds."""
    gated: bool = False
    """Held by a scheduling gate (``spec.schedulingGates``, e.g. Kueue's admission gate): the
    scheduler will not place it until the gate is lifted, so it is nobody's demand yet."""
    placement: Placement = ANYWHERE

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def waiting(self) -> bool:
        """Pending, unbound and free to be scheduled: demand for GPUs."""
        return self.node is None and self.phase == "Pending" and not self.gated

    @property
    def holds_gpus(self) -> bool:
        """Bound to a node and not finished: its GPUs are taken."""
        return self.node is not None and self.phase in ("Pending", "Running", "Unknown")


@dataclass(frozen=True, slots=True)
class Workload:
    """A scalable workload (Deployment, StatefulSet, PyTorchJob, …) with its replica count."""

    namespace: str
    name: str
    kind: str = "Deployment"
    replicas: int = 1
    gpus_per_replica: int = 1
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    priority: int = 0
    priority_class: str | None = None
    created: float = 0.0
    min_replicas: int | None = None
    """Fewest replicas its owner allows (a PyTorchJob's ``elasticPolicy``); None: the policy's
    elastic annotation decides."""
    max_replicas: int | None = None
    """Most replicas its owner allows; None: the policy's elastic annotation decides."""
    gang_min: int | None = None
    """Fewest pods its gang scheduler runs it with (a PodGroup's ``minMember``); None: the
    policy's gang annotation decides."""
    placement: Placement = ANYWHERE
    """Its pod template's placement: where another replica could land."""
    scaled_by: str | None = None
    """Another autoscaler that sizes it (``HorizontalPodAutoscaler ml/train``, ``KEDA
    ScaledObject ml/train``): the engine plans no resize of it unless the policy's
    ``training.owner`` is ``ebbtide``, so the actuator is never asked for a refused one."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster as the engine sees it. Immutable: build a new one when anything changes."""

    nodes: tuple[Node, ...] = ()
    pods: tuple[Pod, ...] = ()
    workloads: tuple[Workload, ...] = ()
    priority_classes: tuple[PriorityClass, ...] = ()
    quotas: tuple[GpuQuota, ...] = ()


class SnapshotBuilder:
    """Fluent builder of :class:`Snapshot` values for tests, case files and simulators."""

    def __init__(self) -> None:
        self._nodes: list[Node] = []
        self._pods: list[Pod] = []
        self._workloads: list[Workload] = []
        self._classes: dict[str, int] = {}
        self._quotas: dict[str, GpuQuota] = {}

    def quota(self, namespace: str, *, hard: int, used: int = 0) -> SnapshotBuilder:
        """A ``requests.nvidia.com/gpu`` quota on ``namespace``."""
        self._quotas[namespace] = GpuQuota(namespace, hard, used)
        return self

    def priority_class(self, name: str, value: int) -> SnapshotBuilder:
        self._classes[name] = value
        return self

    def _priority(self, priority: int | None, priority_class: str | None) -> int:
        if priority is not None:
            return priority
        if priority_class is None:
            return 0
        if priority_class not in self._classes:
            raise ValueError(f"unknown priority class {priority_class!r}")
        return self._classes[priority_class]

    def node(
        self,
        name: str,
        *,
        gpus: int = 8,
        model: str = "A100-80GB",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        cordoned: bool = False,
        mig_config: str | None = None,
        mig_state: str | None = None,
        mig_flow: bool = False,
        taints: Sequence[Taint] = (),
    ) -> SnapshotBuilder:
        """A node with ``gpus`` GPUs; with ``mig_config="all-1g.10gb"`` they are partitioned."""
        cards: tuple[Gpu, ...]
        if mig_config is not None and mig_config != MIG_DISABLED:
            profile = mig_config.removeprefix("all-")
            slices = _SLICES_PER_GPU.get(profile.split(".", 1)[0], 1)
            cards = tuple(Gpu(i, model, profile, slices) for i in range(gpus))
        else:
            cards = tuple(Gpu(i, model) for i in range(gpus))
        self._nodes.append(
            Node(
                name,
                cards,
                frozen_map(labels),
                frozen_map(annotations),
                cordoned,
                mig_config,
                mig_state if mig_state is not None or mig_config is None else "success",
                mig_flow,
                tuple(taints),
            )
        )
        return self

    def pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str | None = None,
        phase: PodPhase | None = None,
        gpus: int = 0,
        mig: Mapping[str, int] | None = None,
        priority: int | None = None,
        priority_class: str | None = None,
        workload: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        created: float = 0.0,
        gated: bool = False,
        placement: Placement = ANYWHERE,
    ) -> SnapshotBuilder:
        """A pod; ``phase`` defaults to Running on a node and Pending without one."""
        self._pods.append(
            Pod(
                namespace,
                name,
                node,
                phase or ("Running" if node else "Pending"),
                gpus,
                FrozenMap(mig or {}),
                self._priority(priority, priority_class),
                priority_class,
                workload,
                frozen_map(labels),
                frozen_map(annotations),
                created,
                gated,
                placement,
            )
        )
        return self

    def workload(
        self,
        namespace: str,
        name: str,
        *,
        kind: str = "Deployment",
        replicas: int = 1,
        gpus_per_replica: int = 1,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        priority: int | None = None,
        priority_class: str | None = None,
        created: float = 0.0,
        nodes: Sequence[str | None] = (),
        pod_annotations: Mapping[str, str] | None = None,
        placement: Placement = ANYWHERE,
    ) -> SnapshotBuilder:
        """A workload and, when ``nodes`` is given, its pods ``name-0…``: one per replica placed
        round-robin on ``nodes`` (``None`` leaves a pod pending). Pods inherit labels,
        priority and creation time."""
        value = self._priority(priority, priority_class)
        self._workloads.append(
            Workload(
                namespace,
                name,
                kind,
                replicas,
                gpus_per_replica,
                frozen_map(labels),
                frozen_map(annotations),
                value,
                priority_class,
                created,
                placement=placement,
            )
        )
        if nodes:
            for i in range(replicas):
                self.pod(
                    namespace,
                    f"{name}-{i}",
                    node=nodes[i % len(nodes)],
                    gpus=gpus_per_replica,
                    priority=value,
                    priority_class=priority_class,
                    workload=f"{namespace}/{name}",
                    labels=labels,
                    annotations=pod_annotations,
                    created=created,
                    placement=placement,
                )
        return self

    def build(self) -> Snapshot:
        """The snapshot, with everything sorted by name so equal inputs give equal values."""
        return Snapshot(
            nodes=tuple(sorted(self._nodes, key=lambda n: n.name)),
            pods=tuple(sorted(self._pods, key=lambda p: (p.namespace, p.name))),
            workloads=tuple(sorted(self._workloads, key=lambda w: (w.namespace, w.name))),
            priority_classes=tuple(PriorityClass(n, v) for n, v in sorted(self._classes.items())),
            quotas=tuple(self._quotas[ns] for ns in sorted(self._quotas)),
        )

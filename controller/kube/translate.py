"""Pure translation of raw Kubernetes objects (JSON dicts) into :mod:`policies.snapshot` values.

Design:

* No I/O and no client types: every function takes the dicts an informer caches and returns
  frozen snapshot values, so each is table-tested on its own and :class:`~controller.kube.state.
  KubeClusterState` can cache the result per object and ``resourceVersion``.
* **Nodes.** GPUs come from ``status.allocatable`` (``status.capacity`` when allocatable has no
  GPU resources): ``nvidia.com/gpu`` counts whole cards and ``nvidia.com/mig-<profile>`` counts
  MIG instances. Physical MIG-partitioned GPUs are derived from the ``nvidia.com/gpu.count``
  label (GPU feature discovery) minus the whole cards, else from the instances per GPU of the
  profile. Under the ``single`` MIG strategy (``nvidia.com/mig.strategy=single``) the instances
  are advertised as ``nvidia.com/gpu``, the product label ends in ``-MIG-<profile>`` and
  ``nvidia.com/gpu.count`` counts instances (:func:`policies.miglayout.cards_of`): the node's
  GPUs are MIG slices all the same, never whole cards. While the device
  plugin restarts during a MIG reconfiguration a node can advertise no GPU resource at all: its
  GPUs are then taken from ``nvidia.com/gpu.count`` and the ``nvidia.com/mig.config`` layout.
  The model comes from ``nvidia.com/gpu.product`` (``NVIDIA-A100-SXM4-80GB`` → ``A100-80GB``);
  unknown products pass through unchanged. A node carrying a MIG flow record
  (``ebbtide.io/mig-flow``) has ``mig_flow`` set, so a restarted engine counts that flow. Nodes
  without any GPU sign are dropped. ``spec.taints`` are kept for the fit rules.
* **Pods.** Whole-GPU and MIG requests follow the scheduler's rules: per container the request,
  else the limit (extended resources are integers); per pod the larger of the app containers'
  sum and the largest init container, with restartable (sidecar) init containers added to both,
  as Kubernetes ≥1.29 computes it. Priority is ``spec.priority`` (set by admission), else the
  value of ``spec.priorityClassName``, else the ``globalDefault`` class. The owner workload is a
  Deployment (via its ReplicaSet, whose name is ``<deployment>-<pod-template-hash>``), a
  StatefulSet, or a configured custom kind, directly or by a pod label such as
  ``training.kubeflow.org/job-name`` (a label wins: a JobSet's pods are owned by its Jobs).
  Succeeded and Failed pods are dropped (:func:`pod_from` returns None); :func:`keep_pod` keeps
  GPU pods and pods of tracked workloads. A ``nvidia.com/gpu`` request whose placement pins
  a ``single``-strategy MIG product (``nvidia.com/gpu.product: …-MIG-1g.10gb`` in the
  ``nodeSelector``, or ``In`` such products in every required affinity term) asks for MIG
  instances of that profile, and is one (pods and workload templates alike). A pod that asks
  for ``nvidia.com/gpu`` without such a selector and lands on a ``single`` MIG node anyway is
  read as a whole-GPU pod: nothing on the pod says which it got.
* **Placement** (pods and workload templates, :func:`placement_from`): ``nodeSelector``, the
  required node affinity as kube-scheduler matches it (:mod:`policies.nodeaffinity`: every
  operator, several terms, ``matchFields`` on the node name) and tolerations as written.
  Affinity the apiserver would not accept leaves the placement *unknown*, with the reason:
  nothing is preempted for it. Preferred affinity is a score, not a filter, and is not read.
* **Workloads.** Deployments, StatefulSets and custom kinds described by :class:`WorkloadKind`
  (where the replica count and the pod template live), with GPUs per replica from the template.
* **Quotas** (:func:`quota_from`): a ResourceQuota's ``requests.nvidia.com/gpu`` hard limit and
  use from its status (``spec.hard`` before the quota controller has filled the status);
  :func:`tightest_quotas` keeps the one with the least left per namespace.
* :func:`snapshot_from` translates whole lists at once: the reference the incremental state is
  tested against, and handy for one-off tools.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, cast

from controller.kube.migannotation import FLOW_ANNOTATION
from policies.miglayout import (
    CONFIG_LABEL,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    PRODUCT_LABEL,
    cards_of,
    product_mig_profile,
    single_mig_profile,
    slices_per_gpu,
)
from policies.nodeaffinity import NodeAffinity, UnknownAffinity
from policies.snapshot import (
    ANYWHERE,
    MIG_DISABLED,
    FrozenMap,
    Gpu,
    GpuQuota,
    Node,
    Placement,
    Pod,
    PodPhase,
    PriorityClass,
    Snapshot,
    Taint,
    Toleration,
    Workload,
    frozen_map,
)

__all__ = [
    "DEPLOYMENT",
    "PYTORCHJOB",
    "STATEFULSET",
    "Obj",
    "Priorities",
    "WorkloadKind",
    "get_path",
    "gpu_model",
    "gpu_requests",
    "keep_pod",
    "mig_slices_per_gpu",
    "node_from",
    "placement_from",
    "pod_from",
    "pod_owner",
    "pod_workload",
    "priorities_from",
    "quota_from",
    "snapshot_from",
    "tightest_quotas",
    "workload_from",
]

Obj = Mapping[str, Any]

#: The ResourceQuota key that caps a namespace's GPU requests.
GPU_QUOTA: Final = "requests.nvidia.com/gpu"
_MIG_STATE_LABEL: Final = "nvidia.com/mig.config.state"
_TEMPLATE_HASH_LABEL: Final = "pod-template-hash"
_PHASES: Final = frozenset({"Pending", "Running", "Succeeded", "Failed", "Unknown"})

#: GPU families whose model is ``<family>-<memory>GB``, with the memory when the label omits it.
_FAMILIES: Final = re.compile(r"(GH200|H200|H100|H20|A100|A30|B200)(?![0-9A-Za-z])")
_DEFAULT_MEMORY: Final = {"H200": "141GB", "GH200": "96GB", "A30": "24GB"}

#: PriorityClasses every apiserver has, in case they are not listed (RBAC, a test server).
_SYSTEM_CLASSES: Final = {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}


@dataclass(frozen=True, kw_only=True)
class WorkloadKind:
    """A scalable workload kind Ebbtide tracks: where it is served and where its fields are."""

    kind: str
    """``Deployment``, ``PyTorchJob``: the ownerReference kind and :attr:`Workload.kind`."""
    group: str
    version: str
    plural: str
    replicas_path: str = "spec.replicas"
    """Dotted path of the replica count (what the ``/scale`` subresource changes)."""
    template_path: str = "spec.template"
    """Dotted path of the pod template (GPUs per replica, priority class)."""
    pod_label: str | None = None
    """A pod label whose value names the owning workload, when pods have no ownerReference."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str, name: str) -> str:
        """The object's URL path on the API server."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{base}/namespaces/{namespace}/{self.plural}/{name}"


DEPLOYMENT: Final = WorkloadKind(
    kind="Deployment", group="apps", version="v1", plural="deployments"
)
STATEFULSET: Final = WorkloadKind(
    kind="StatefulSet", group="apps", version="v1", plural="statefulsets"
)
PYTORCHJOB: Final = WorkloadKind(
    kind="PyTorchJob",
    group="kubeflow.org",
    version="v1",
    plural="pytorchjobs",
    replicas_path="spec.pytorchReplicaSpecs.Worker.replicas",
    template_path="spec.pytorchReplicaSpecs.Worker.template",
    pod_label="training.kubeflow.org/job-name",
)


@dataclass(frozen=True)
class Priorities:
    """PriorityClass values by name, and the ``globalDefault`` class (if any)."""

    values: Mapping[str, int] = field(default_factory=dict)
    default: str | None = None

    def resolve(self, pod_spec: Obj) -> tuple[int, str | None]:
        """(priority, class name) of a pod spec, as the Priority admission plugin sets them."""
        name = pod_spec.get("priorityClassName") or None
        explicit = pod_spec.get("priority")
        if isinstance(explicit, int) and not isinstance(explicit, bool):
            return explicit, name
        if name is not None:
            return self.values.get(name, 0), name
        if self.default is not None:
            return self.values[self.default], self.default
        return 0, None

    def classes(self) -> tuple[PriorityClass, ...]:
        """The snapshot's priority classes, sorted by name."""
        return tuple(PriorityClass(n, v) for n, v in sorted(self.values.items()))


def priorities_from(objects: Iterable[Obj]) -> Priorities:
    """Index PriorityClass objects (``value``, ``globalDefault``); system classes are implied."""
    values = dict(_SYSTEM_CLASSES)
    defaults: list[tuple[int, str]] = []
    for obj in objects:
        name = str(_meta(obj).get("name", ""))
        value = _int(obj.get("value"))
        values[name] = value
        if obj.get("globalDefault"):
            defaults.append((value, name))
    # The apiserver allows one globalDefault; if there are more, take the highest, stably.
    default = max(defaults)[1] if defaults else None
    return Priorities(values, default)


# --- nodes -------------------------------------------------------------------------------------


def gpu_model(product: str | None) -> str:
    """A short model name (``A100-80GB``) from ``nvidia.com/gpu.product``; unknown pass through."""
    if not product:
        return ""
    name = product.removeprefix("NVIDIA-")
    name = re.sub(r"-SHARED$", "", name)
    name = re.sub(r"-MIG-.*$", "", name)
    family = _FAMILIES.match(name)
    if family is None:
        return product
    memory = re.search(r"(?<![0-9])(\d+)GB", name)
    size = f"{memory.group(1)}GB" if memory else _DEFAULT_MEMORY.get(family.group(1))
    return f"{family.group(1)}-{size}" if size else product


def mig_slices_per_gpu(profile: str) -> int:
    """MIG instances of ``profile`` (``1g.10gb``) one GPU holds (the table lives in
    :mod:`policies.miglayout`, shared with the MIG flow and the simulator)."""
    return slices_per_gpu(profile)


def node_from(obj: Obj) -> Node | None:
    """The snapshot node of a Node object; None when it shows no sign of GPUs."""
    meta, status = _meta(obj), obj.get("status") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    allocatable, capacity = status.get("allocatable") or {}, status.get("capacity") or {}
    resources = allocatable if _has_gpu_resources(allocatable) else capacity
    whole = _int(resources.get(GPU_RESOURCE))
    mig = {
        k.removeprefix(MIG_RESOURCE_PREFIX): n
        for k, v in resources.items()
        if k.startswith(MIG_RESOURCE_PREFIX) and (n := _int(v)) > 0
    }
    product = labels.get(PRODUCT_LABEL)
    if (single := single_mig_profile(labels)) is not None and whole:
        mig, whole = {single: whole}, 0
    physical = cards_of(labels)
    mig_config = labels.get(CONFIG_LABEL) or None
    if not whole and not mig and physical:
        # Between layouts (device plugin restarting): what the configured layout will give.
        profile = (mig_config or MIG_DISABLED).removeprefix("all-")
        if mig_config in (None, MIG_DISABLED) or "." not in profile:
            whole = physical
        else:
            mig = {profile: physical * mig_slices_per_gpu(profile)}
    if not whole and not mig and mig_config is None and product is None:
        return None
    model = gpu_model(product)
    gpus = [Gpu(i, model) for i in range(whole)]
    mig_gpus = max(0, physical - whole) if len(mig) == 1 else 0
    for profile, instances in sorted(mig.items()):
        count = mig_gpus or math.ceil(instances / mig_slices_per_gpu(profile))
        for j in range(count):
            share = instances // count + (1 if j < instances % count else 0)
            gpus.append(Gpu(len(gpus), model, profile, share))
    return Node(
        name=str(meta.get("name", "")),
        gpus=tuple(gpus),
        labels=frozen_map(labels),
        annotations=frozen_map(annotations),
        cordoned=bool((obj.get("spec") or {}).get("unschedulable")),
        mig_config=mig_config,
        mig_state=labels.get(_MIG_STATE_LABEL) or None,
        mig_flow=FLOW_ANNOTATION in annotations,
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
            for t in (obj.get("spec") or {}).get("taints") or []
        ),
    )


def _has_gpu_resources(resources: Mapping[str, Any]) -> bool:
    return any(k == GPU_RESOURCE or k.startswith(MIG_RESOURCE_PREFIX) for k in resources)


# --- placement ---------------------------------------------------------------------------------


_REQUIRED_AFFINITY: Final = "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def placement_from(pod_spec: Obj) -> Placement:
    """Where a pod spec may run: its nodeSelector, required node affinity and tolerations
    (module docstring)."""
    selector: dict[str, str] = {
        str(k): str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items()
    }
    affinity: NodeAffinity | None = None
    unknown: str | None = None
    required = get_path(pod_spec, _REQUIRED_AFFINITY)
    if required is not None:
        try:
            affinity = NodeAffinity.parse(required, where=_REQUIRED_AFFINITY)
        except UnknownAffinity as exc:
            unknown = str(exc)
    tolerations = tuple(
        Toleration(
            str(t.get("key") or ""),
            "Exists" if t.get("operator") == "Exists" else "Equal",
            str(t.get("value") or ""),
            str(t.get("effect") or ""),
        )
        for t in pod_spec.get("tolerations") or []
    )
    if not selector and not tolerations and required is None:
        return ANYWHERE
    return Placement(frozen_map(selector), tolerations, affinity, unknown)


# --- quotas -------------------------------------------------------------------------------------


def quota_from(obj: Obj) -> GpuQuota | None:
    """A namespace's GPU quota from a ResourceQuota; None when it does not cap GPUs."""
    status = obj.get("status") or {}
    hard = (status.get("hard") or {}).get(GPU_QUOTA)
    if hard is None:
        hard = ((obj.get("spec") or {}).get("hard") or {}).get(GPU_QUOTA)
    if hard is None:
        return None
    used = _int((status.get("used") or {}).get(GPU_QUOTA))
    return GpuQuota(str(_meta(obj).get("namespace") or ""), _int(hard), used)


def tightest_quotas(quotas: Iterable[GpuQuota]) -> tuple[GpuQuota, ...]:
    """One quota per namespace, the one with the fewest GPUs left, sorted by namespace: every
    quota must admit a pod, so the tightest decides."""
    best: dict[str, GpuQuota] = {}
    for q in quotas:
        if q.namespace not in best or q.left < best[q.namespace].left:
            best[q.namespace] = q
    return tuple(best[ns] for ns in sorted(best))


# --- pods --------------------------------------------------------------------------------------


def gpu_requests(pod_spec: Obj) -> dict[str, int]:
    """Effective GPU requests of a pod spec: ``nvidia.com/gpu`` and ``nvidia.com/mig-*`` counts,
    following the scheduler's init-container and sidecar rules. Zero counts are left out."""
    app: dict[str, int] = {}
    for container in pod_spec.get("containers") or []:
        _add(app, _container_gpus(container))
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for container in pod_spec.get("initContainers") or []:
        own = _container_gpus(container)
        if container.get("restartPolicy") == "Always":
            _add(sidecars, own)
            during = dict(sidecars)
        else:
            during = dict(sidecars)
            _add(during, own)
        for name, count in during.items():
            peak[name] = max(peak.get(name, 0), count)
    _add(app, sidecars)
    total = {name: max(app.get(name, 0), peak.get(name, 0)) for name in app.keys() | peak.keys()}
    return {name: count for name, count in sorted(total.items()) if count > 0}


def _container_gpus(container: Obj) -> dict[str, int]:
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    out: dict[str, int] = {}
    for name in requests.keys() | limits.keys():
        if name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX):
            out[name] = _int(requests[name] if name in requests else limits[name])
    return out


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for name, count in more.items():
        into[name] = into.get(name, 0) + count


def pod_owner(obj: Obj, kinds: Sequence[WorkloadKind]) -> tuple[WorkloadKind, str] | None:
    """The tracked kind and name of the workload owning a pod, if any: a pod label naming the
    top workload first (a JobSet's pod is owned by its Job), then the controlling owner
    reference (a Deployment's through its ReplicaSet, by the pod-template-hash)."""
    meta = _meta(obj)
    labels: Mapping[str, str] = meta.get("labels") or {}
    for tracked in kinds:
        if tracked.pod_label and labels.get(tracked.pod_label):
            return tracked, labels[tracked.pod_label]
    refs = meta.get("ownerReferences") or []
    controllers = [r for r in refs if r.get("controller")] or refs
    for ref in controllers:
        kind, group = ref.get("kind"), str(ref.get("apiVersion", "")).rpartition("/")[0]
        name = str(ref.get("name", ""))
        if kind == "ReplicaSet" and group == "apps" and DEPLOYMENT in kinds:
            template_hash = labels.get(_TEMPLATE_HASH_LABEL)
            if template_hash and name.endswith(f"-{template_hash}"):
                return DEPLOYMENT, name.removesuffix(f"-{template_hash}")
            continue
        for tracked in kinds:
            if (tracked.kind, tracked.group) == (kind, group):
                return tracked, name
    return None


def pod_workload(obj: Obj, kinds: Sequence[WorkloadKind]) -> str | None:
    """``namespace/name`` of the tracked workload owning a pod, if any (:func:`pod_owner`)."""
    owner = pod_owner(obj, kinds)
    return None if owner is None else f"{_meta(obj).get('namespace') or ''}/{owner[1]}"


def pod_from(obj: Obj, *, priorities: Priorities, kinds: Sequence[WorkloadKind]) -> Pod | None:
    """The snapshot pod of a Pod object; None when it has finished (Succeeded or Failed)."""
    meta, spec = _meta(obj), obj.get("spec") or {}
    phase = str((obj.get("status") or {}).get("phase") or "Pending")
    if phase in ("Succeeded", "Failed"):
        return None
    placement = placement_from(spec)
    gpus, mig = _gpus_and_mig(gpu_requests(spec), placement)
    priority, class_name = priorities.resolve(spec)
    return Pod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name", "")),
        node=spec.get("nodeName") or None,
        phase=cast(PodPhase, phase if phase in _PHASES else "Unknown"),
        gpus=gpus,
        mig=FrozenMap(mig),
        priority=priority,
        priority_class=class_name,
        workload=pod_workload(obj, kinds),
        labels=frozen_map(meta.get("labels")),
        annotations=frozen_map(meta.get("annotations")),
        created=_epoch(meta.get("creationTimestamp")),
        gated=bool(spec.get("schedulingGates")),
        placement=placement,
    )


def _pinned_mig_profile(placement: Placement) -> str | None:
    """The MIG profile of the ``single``-strategy product a placement pins: its
    ``nodeSelector``'s ``nvidia.com/gpu.product``, else one profile that every required
    affinity term's ``In`` on that label names (``[A100-…-MIG-1g.10gb, H100-…-MIG-1g.10gb]``
    pins ``1g.10gb``); ``None`` when it pins none or several."""
    if (product := placement.node_selector.get(PRODUCT_LABEL)) is not None:
        return product_mig_profile(product)
    if placement.affinity is None or not placement.affinity.terms:
        return None
    profiles: set[str | None] = set()
    for term in placement.affinity.terms:
        pins = [
            {product_mig_profile(v) for v in r.values}
            for r in term
            if not r.field and r.key == PRODUCT_LABEL and r.operator == "In"
        ]
        if not pins:
            return None
        profiles |= set.intersection(*pins) if len(pins) > 1 else pins[0]
    return profiles.pop() if len(profiles) == 1 else None


def _gpus_and_mig(requests: Mapping[str, int], placement: Placement) -> tuple[int, dict[str, int]]:
    """Whole GPUs and MIG instances by profile of GPU ``requests``. Under the ``single`` MIG
    strategy a pod asks for instances as ``nvidia.com/gpu`` and picks the profile by selecting
    the product GFD writes on such nodes (``nvidia.com/gpu.product: …-MIG-1g.10gb``, NVIDIA's
    MIG guide): those are instances, never whole cards, so MIG demand finds them and whole-card
    demand and training do not count them."""
    gpus = requests.get(GPU_RESOURCE, 0)
    mig = {
        k.removeprefix(MIG_RESOURCE_PREFIX): n
        for k, n in requests.items()
        if k.startswith(MIG_RESOURCE_PREFIX)
    }
    profile = _pinned_mig_profile(placement)
    if gpus and profile is not None:
        mig[profile] = mig.get(profile, 0) + gpus
        gpus = 0
    return gpus, mig


def keep_pod(pod: Pod, tracked: Container[str]) -> bool:
    """Whether the snapshot shows a pod: it asks for GPUs or belongs to a tracked workload."""
    return bool(pod.gpus or pod.mig) or (pod.workload is not None and pod.workload in tracked)


# --- workloads ---------------------------------------------------------------------------------


def workload_from(obj: Obj, kind: WorkloadKind, *, priorities: Priorities) -> Workload:
    """The snapshot workload of a Deployment, StatefulSet or custom object of ``kind``."""
    meta = _meta(obj)
    replicas = get_path(obj, kind.replicas_path)
    template = get_path(obj, kind.template_path) or {}
    template_spec = (template.get("spec") or {}) if isinstance(template, Mapping) else {}
    priority, class_name = priorities.resolve(template_spec)
    placement = placement_from(template_spec)
    return Workload(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name", "")),
        kind=kind.kind,
        replicas=1 if replicas is None else _int(replicas),
        gpus_per_replica=_gpus_and_mig(gpu_requests(template_spec), placement)[0],
        labels=frozen_map(meta.get("labels")),
        annotations=frozen_map(meta.get("annotations")),
        priority=priority,
        priority_class=class_name,
        created=_epoch(meta.get("creationTimestamp")),
        placement=placement,
    )


# --- whole lists ---------------------------------------------------------------------------------


def snapshot_from(
    *,
    nodes: Iterable[Obj] = (),
    pods: Iterable[Obj] = (),
    workloads: Iterable[tuple[WorkloadKind, Obj]] = (),
    priority_classes: Iterable[Obj] = (),
    quotas: Iterable[Obj] = (),
    kinds: Sequence[WorkloadKind] = (DEPLOYMENT, STATEFULSET, PYTORCHJOB),
    workload: Callable[[Obj, WorkloadKind, Priorities], Workload] | None = None,
) -> Snapshot:
    """Translate whole lists into a snapshot, sorted as :class:`SnapshotBuilder` sorts;
    ``workload`` translates a workload (its kind's adapter), :func:`workload_from` by default."""
    priorities = priorities_from(priority_classes)
    if workload is None:
        translated = [workload_from(o, k, priorities=priorities) for k, o in workloads]
    else:
        translated = [workload(o, k, priorities) for k, o in workloads]
    tracked = {w.key for w in translated}
    kept = (pod_from(o, priorities=priorities, kinds=kinds) for o in pods)
    return Snapshot(
        nodes=tuple(sorted((n for n in map(node_from, nodes) if n), key=lambda n: n.name)),
        pods=tuple(
            sorted(
                (p for p in kept if p is not None and keep_pod(p, tracked)),
                key=lambda p: (p.namespace, p.name),
            )
        ),
        workloads=tuple(sorted(translated, key=lambda w: (w.namespace, w.name, w.kind))),
        priority_classes=priorities.classes(),
        quotas=tightest_quotas(q for q in map(quota_from, quotas) if q),
    )


# --- helpers -----------------------------------------------------------------------------------


def get_path(obj: Obj, path: str) -> Any:
    """The value at a dotted path (``spec.pytorchReplicaSpecs.Worker.replicas``), or None; a
    numeric part indexes a list (``spec.workerGroupSpecs.0.replicas``)."""
    node: Any = obj
    for part in path.split("."):
        if isinstance(node, list) and part.isdigit():
            node = node[int(part)] if int(part) < len(node) else None
        elif isinstance(node, Mapping):
            node = node.get(part)
        else:
            return None
    return node


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _int(value: Any) -> int:
    """An integer count (extended resources are integers); anything unreadable counts 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        try:
            return int(float(str(value).strip()))
        except (ValueError, OverflowError):
            return 0


def _epoch(timestamp: Any) -> float:
    """Epoch seconds of an RFC 3339 timestamp; 0.0 when missing or unreadable."""
    if not isinstance(timestamp, str) or not timestamp:
        return 0.0
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0

"""Translation of raw Kubernetes objects into snapshot values: tables with readable ids."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from controller.kube.translate import (
    DEPLOYMENT,
    PYTORCHJOB,
    STATEFULSET,
    Priorities,
    gpu_model,
    gpu_requests,
    keep_pod,
    node_from,
    placement_from,
    pod_from,
    priorities_from,
    quota_from,
    snapshot_from,
    tightest_quotas,
    workload_from,
)
from policies.snapshot import Gpu, GpuQuota, Pod, SnapshotBuilder, Taint, Toleration

Obj = dict[str, Any]
KINDS = (DEPLOYMENT, STATEFULSET, PYTORCHJOB)
T0 = "2024-05-01T12:00:00Z"
T0_EPOCH = 1714564800.0

# --- builders ----------------------------------------------------------------------------------


@dataclass
class NodeObj:
    """A raw Node: ``NodeObj("n1").gpus(8).product("NVIDIA-A100-SXM4-80GB").obj()``."""

    name: str
    capacity: dict[str, str] = field(default_factory=lambda: {"cpu": "64"})
    allocatable: dict[str, str] | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False

    def gpus(self, n: int, *, allocatable: int | None = None) -> NodeObj:
        self.capacity["nvidia.com/gpu"] = str(n)
        if allocatable is not None:
            self.allocatable = {**self.capacity, "nvidia.com/gpu": str(allocatable)}
        return self

    def mig(self, profile: str, instances: int) -> NodeObj:
        self.capacity[f"nvidia.com/mig-{profile}"] = str(instances)
        return self

    def count(self, n: int) -> NodeObj:
        return self.label("nvidia.com/gpu.count", str(n))

    def product(self, product: str) -> NodeObj:
        return self.label("nvidia.com/gpu.product", product)

    def mig_config(self, config: str, state: str | None = "success") -> NodeObj:
        self.label("nvidia.com/mig.config", config)
        return self.label("nvidia.com/mig.config.state", state) if state else self

    def label(self, key: str, value: str) -> NodeObj:
        self.labels[key] = value
        return self

    def cordon(self) -> NodeObj:
        self.unschedulable = True
        return self

    def obj(self) -> Obj:
        status: Obj = {"capacity": dict(self.capacity)}
        status["allocatable"] = dict(self.allocatable or self.capacity)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": dict(self.labels),
                "annotations": dict(self.annotations),
                "resourceVersion": "1",
            },
            "spec": {"unschedulable": True} if self.unschedulable else {},
            "status": status,
        }


def resources(gpus: int = 0, *, mig: dict[str, int] | None = None, where: str = "limits") -> Obj:
    amounts = {"cpu": "1"}
    if gpus:
        amounts["nvidia.com/gpu"] = str(gpus)
    for profile, n in (mig or {}).items():
        amounts[f"nvidia.com/mig-{profile}"] = str(n)
    return {where: amounts}


@dataclass
class PodObj:
    """A raw Pod: ``PodObj("ml", "p").container(gpus=2).on("n1").obj()``."""

    namespace: str
    name: str
    spec: Obj = field(default_factory=lambda: {"containers": []})
    phase: str = "Running"
    labels: dict[str, str] = field(default_factory=dict)
    owners: list[Obj] = field(default_factory=list)

    def container(
        self, gpus: int = 0, *, mig: dict[str, int] | None = None, where: str = "limits"
    ) -> PodObj:
        self.spec["containers"].append(
            {
                "name": f"c{len(self.spec['containers'])}",
                "resources": resources(gpus, mig=mig, where=where),
            }
        )
        return self

    def init(self, gpus: int = 0, *, sidecar: bool = False) -> PodObj:
        container: Obj = {"name": "init", "resources": resources(gpus)}
        if sidecar:
            container["restartPolicy"] = "Always"
        self.spec.setdefault("initContainers", []).append(container)
        return self

    def on(self, node: str) -> PodObj:
        self.spec["nodeName"] = node
        return self

    def in_phase(self, phase: str) -> PodObj:
        self.phase = phase
        return self

    def priority(self, value: int | None = None, *, class_name: str | None = None) -> PodObj:
        if value is not None:
            self.spec["priority"] = value
        if class_name is not None:
            self.spec["priorityClassName"] = class_name
        return self

    def label(self, key: str, value: str) -> PodObj:
        self.labels[key] = value
        return self

    def owned_by(self, kind: str, name: str, api_version: str = "apps/v1") -> PodObj:
        self.owners.append(
            {"apiVersion": api_version, "kind": kind, "name": name, "controller": True, "uid": "u"}
        )
        return self

    def obj(self) -> Obj:
        meta: Obj = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": dict(self.labels),
            "creationTimestamp": T0,
            "resourceVersion": "1",
        }
        if self.owners:
            meta["ownerReferences"] = list(self.owners)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": copy.deepcopy(self.spec),
            "status": {"phase": self.phase},
        }


def priority_class(name: str, value: int, *, default: bool = False) -> Obj:
    body: Obj = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }
    if default:
        body["globalDefault"] = True
    return body


def workload_obj(
    kind: str, name: str, *, replicas: int | None, gpus: int, pc: str | None = None
) -> Obj:
    template: Obj = {
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": [{"name": "main", "resources": resources(gpus)}]},
    }
    if pc:
        template["spec"]["priorityClassName"] = pc
    spec: Obj
    if kind == "PyTorchJob":
        worker: Obj = {"template": template}
        if replicas is not None:
            worker["replicas"] = replicas
        spec = {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": worker}}
        api_version = "kubeflow.org/v1"
    else:
        spec = {"template": template, "selector": {"matchLabels": {"app": name}}}
        if replicas is not None:
            spec["replicas"] = replicas
        api_version = "apps/v1"
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {"team": "ml"},
            "creationTimestamp": T0,
        },
        "spec": spec,
    }


# --- GPU models ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("product", "model"),
    [
        pytest.param("NVIDIA-A100-SXM4-80GB", "A100-80GB", id="a100-sxm4-80"),
        pytest.param("NVIDIA-A100-PCIE-40GB", "A100-40GB", id="a100-pcie-40"),
        pytest.param("NVIDIA-A100-80GB-PCIe", "A100-80GB", id="a100-80-pcie"),
        pytest.param("NVIDIA-H100-80GB-HBM3", "H100-80GB", id="h100-hbm3"),
        pytest.param("NVIDIA-H100-SXM5-80GB", "H100-80GB", id="h100-sxm5"),
        pytest.param("NVIDIA-H200", "H200-141GB", id="h200-no-memory"),
        pytest.param("NVIDIA-H200-141GB-HBM3e", "H200-141GB", id="h200-with-memory"),
        pytest.param("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "A100-80GB", id="mig-single-strategy"),
        pytest.param("NVIDIA-A100-SXM4-80GB-SHARED", "A100-80GB", id="time-sliced"),
        pytest.param("Tesla-T4", "Tesla-T4", id="unknown-passes-through"),
        pytest.param("NVIDIA-H100-NVL", "NVIDIA-H100-NVL", id="no-memory-passes-through"),
        pytest.param(None, "", id="no-label"),
    ],
)
def test_gpu_model(product: str | None, model: str) -> None:
    """GPU feature discovery product labels map to short model names; unknown ones pass."""
    assert gpu_model(product) == model


# --- nodes -------------------------------------------------------------------------------------


def whole(n: int, model: str = "A100-80GB") -> tuple[Gpu, ...]:
    return tuple(Gpu(i, model) for i in range(n))


def sliced(n: int, profile: str, slices: int, *, start: int = 0) -> tuple[Gpu, ...]:
    return tuple(Gpu(start + i, "A100-80GB", profile, slices) for i in range(n))


A100 = "NVIDIA-A100-SXM4-80GB"


@pytest.mark.parametrize(
    ("node", "gpus", "mig_config", "mig_state", "cordoned"),
    [
        pytest.param(
            NodeObj("n").gpus(8).count(8).product(A100),
            whole(8),
            None,
            None,
            False,
            id="whole-cards",
        ),
        pytest.param(
            NodeObj("n").gpus(8, allocatable=7).product(A100),
            whole(7),
            None,
            None,
            False,
            id="allocatable-wins",
        ),
        pytest.param(
            NodeObj("n").gpus(8).product(A100).mig_config("all-disabled"),
            whole(8),
            "all-disabled",
            "success",
            False,
            id="mig-disabled",
        ),
        pytest.param(
            NodeObj("n")
            .gpus(0)
            .mig("1g.10gb", 56)
            .count(8)
            .product(A100)
            .mig_config("all-1g.10gb"),
            sliced(8, "1g.10gb", 7),
            "all-1g.10gb",
            "success",
            False,
            id="mig-all-1g",
        ),
        pytest.param(
            NodeObj("n").mig("1g.20gb", 32).count(8).product(A100).mig_config("all-1g.20gb"),
            sliced(8, "1g.20gb", 4),
            "all-1g.20gb",
            "success",
            False,
            id="mig-all-1g.20gb-four-per-gpu",
        ),
        pytest.param(
            NodeObj("n").mig("2g.20gb", 9).product(A100).mig_config("all-2g.20gb"),
            sliced(3, "2g.20gb", 3),
            "all-2g.20gb",
            "success",
            False,
            id="mig-without-count-label",
        ),
        pytest.param(
            NodeObj("n").mig("3g.40gb", 7).count(4).product(A100).mig_config("all-3g.40gb"),
            (*sliced(3, "3g.40gb", 2), Gpu(3, "A100-80GB", "3g.40gb", 1)),
            "all-3g.40gb",
            "success",
            False,
            id="mig-one-instance-unhealthy",
        ),
        pytest.param(
            NodeObj("n").gpus(4).mig("3g.40gb", 8).count(8).product(A100),
            (*whole(4), *sliced(4, "3g.40gb", 2, start=4)),
            None,
            None,
            False,
            id="mixed-whole-and-mig",
        ),
        pytest.param(
            NodeObj("n").count(8).product(A100).mig_config("all-1g.10gb", "pending").cordon(),
            sliced(8, "1g.10gb", 7),
            "all-1g.10gb",
            "pending",
            True,
            id="reconfiguring-no-resources",
        ),
        pytest.param(
            NodeObj("n").gpus(8).product(A100).cordon(), whole(8), None, None, True, id="cordoned"
        ),
    ],
)
def test_node_from(
    node: NodeObj,
    gpus: tuple[Gpu, ...],
    mig_config: str | None,
    mig_state: str | None,
    cordoned: bool,
) -> None:
    """Nodes get one Gpu per physical card, MIG slices per card, MIG labels and cordon state."""
    raw = node.obj()
    before = copy.deepcopy(raw)
    got = node_from(raw)
    assert raw == before, "the raw object was mutated"
    assert got is not None
    assert (got.gpus, got.mig_config, got.mig_state, got.cordoned) == (
        gpus,
        mig_config,
        mig_state,
        cordoned,
    )
    assert got.labels == raw["metadata"]["labels"]


@pytest.mark.parametrize(
    ("annotations", "mig_flow"),
    [
        pytest.param({}, False, id="no-flow"),
        pytest.param({"ebbtide.io/mig-flow": '{"phase": "draining"}'}, True, id="flow-record"),
        pytest.param({"ebbtide.io/mig-flow": "not json"}, True, id="unreadable-record-counts"),
    ],
)
def test_node_from_sees_a_mig_flow_under_way(annotations: dict[str, str], mig_flow: bool) -> None:
    """A node carrying a MIG flow record is a flow under way, read or not, so a restarted
    engine counts it against maxConcurrent."""
    node = NodeObj("n", annotations=annotations).gpus(8).product(A100).cordon()
    got = node_from(node.obj())
    assert got is not None
    assert got.mig_flow is mig_flow


def test_node_without_gpus_is_dropped() -> None:
    """A node with no GPU resource and no GPU label is not part of the snapshot."""
    assert node_from(NodeObj("cpu").obj()) is None


# --- pods --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "gpus", "mig"),
    [
        pytest.param(PodObj("ml", "p").container(2), 2, {}, id="limits-only"),
        pytest.param(PodObj("ml", "p").container(2, where="requests"), 2, {}, id="requests"),
        pytest.param(PodObj("ml", "p").container(1).container(3), 4, {}, id="containers-sum"),
        pytest.param(PodObj("ml", "p").container(1).init(4), 4, {}, id="init-larger-than-app"),
        pytest.param(
            PodObj("ml", "p").container(3).init(1).init(2), 3, {}, id="app-larger-than-init"
        ),
        pytest.param(
            PodObj("ml", "p").container(2).init(1, sidecar=True).init(2), 3, {}, id="sidecar-adds"
        ),
        pytest.param(
            PodObj("ml", "p")
            .container(mig={"1g.10gb": 2})
            .container(mig={"1g.10gb": 1, "3g.40gb": 1}),
            0,
            {"1g.10gb": 3, "3g.40gb": 1},
            id="mig-by-profile",
        ),
        pytest.param(PodObj("ml", "p").container(0), 0, {}, id="no-gpus"),
    ],
)
def test_pod_gpu_requests(pod: PodObj, gpus: int, mig: dict[str, int]) -> None:
    """GPU and MIG requests follow the scheduler's container, init and sidecar rules."""
    raw = pod.obj()
    before = copy.deepcopy(raw)
    got = pod_from(raw, priorities=Priorities(), kinds=KINDS)
    assert raw == before, "the raw object was mutated"
    assert got is not None
    assert (got.gpus, dict(got.mig)) == (gpus, mig)


def test_gpu_requests_reads_integer_and_string_quantities() -> None:
    """Extended-resource quantities may be JSON numbers or strings."""
    spec = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 2}}}]}
    assert gpu_requests(spec) == {"nvidia.com/gpu": 2}


CLASSES = [priority_class("high", 1000), priority_class("batch", 10, default=True)]


@pytest.mark.parametrize(
    ("pod", "priority", "class_name"),
    [
        pytest.param(
            PodObj("ml", "p").priority(7, class_name="high"), 7, "high", id="spec-priority-wins"
        ),
        pytest.param(PodObj("ml", "p").priority(class_name="high"), 1000, "high", id="from-class"),
        pytest.param(PodObj("ml", "p"), 10, "batch", id="global-default"),
        pytest.param(PodObj("ml", "p").priority(class_name="gone"), 0, "gone", id="unknown-class"),
        pytest.param(
            PodObj("ml", "p").priority(class_name="system-node-critical"),
            2000001000,
            "system-node-critical",
            id="system-class",
        ),
    ],
)
def test_pod_priority(pod: PodObj, priority: int, class_name: str | None) -> None:
    """Priority is spec.priority, else the class's value, else the globalDefault class's."""
    got = pod_from(pod.obj(), priorities=priorities_from(CLASSES), kinds=KINDS)
    assert got is not None
    assert (got.priority, got.priority_class) == (priority, class_name)


def test_no_global_default_means_priority_zero() -> None:
    """Without spec.priority, a class name or a globalDefault class, priority is 0."""
    got = pod_from(PodObj("ml", "p").obj(), priorities=priorities_from([]), kinds=KINDS)
    assert got is not None
    assert (got.priority, got.priority_class) == (0, None)


@pytest.mark.parametrize(
    ("pod", "kinds", "workload"),
    [
        pytest.param(
            PodObj("ml", "p")
            .owned_by("ReplicaSet", "web-7d9f8c")
            .label("pod-template-hash", "7d9f8c"),
            KINDS,
            "ml/web",
            id="deployment-via-replicaset",
        ),
        pytest.param(
            PodObj("ml", "p")
            .owned_by("ReplicaSet", "my-app-v2-5b6c")
            .label("pod-template-hash", "5b6c"),
            KINDS,
            "ml/my-app-v2",
            id="deployment-name-with-dashes",
        ),
        pytest.param(
            PodObj("ml", "p").owned_by("ReplicaSet", "bare"), KINDS, None, id="bare-replicaset"
        ),
        pytest.param(
            PodObj("ml", "p")
            .owned_by("ReplicaSet", "web-7d9f8c")
            .label("pod-template-hash", "7d9f8c"),
            (STATEFULSET,),
            None,
            id="deployments-not-tracked",
        ),
        pytest.param(
            PodObj("ml", "p").owned_by("StatefulSet", "db"), KINDS, "ml/db", id="statefulset"
        ),
        pytest.param(
            PodObj("ml", "p").owned_by("PyTorchJob", "bert", "kubeflow.org/v1"),
            KINDS,
            "ml/bert",
            id="pytorchjob-owner",
        ),
        pytest.param(
            PodObj("ml", "p").label("training.kubeflow.org/job-name", "bert"),
            KINDS,
            "ml/bert",
            id="pytorchjob-label-fallback",
        ),
        pytest.param(
            PodObj("ml", "p").owned_by("Job", "etl", "batch/v1"), KINDS, None, id="untracked-kind"
        ),
        pytest.param(PodObj("ml", "p"), KINDS, None, id="no-owner"),
    ],
)
def test_pod_workload(pod: PodObj, kinds: tuple[Any, ...], workload: str | None) -> None:
    """The owner workload is found through ReplicaSets, directly, or by a configured label."""
    got = pod_from(pod.obj(), priorities=Priorities(), kinds=kinds)
    assert got is not None
    assert got.workload == workload


@pytest.mark.parametrize(
    ("phase", "kept"),
    [
        pytest.param("Pending", "Pending", id="pending"),
        pytest.param("Running", "Running", id="running"),
        pytest.param("Unknown", "Unknown", id="unknown"),
        pytest.param("Weird", "Unknown", id="unrecognised-is-unknown"),
        pytest.param("Succeeded", None, id="succeeded-dropped"),
        pytest.param("Failed", None, id="failed-dropped"),
    ],
)
def test_pod_phase(phase: str, kept: str | None) -> None:
    """Live phases are kept; terminal pods are dropped."""
    got = pod_from(
        PodObj("ml", "p").container(1).in_phase(phase).obj(), priorities=Priorities(), kinds=KINDS
    )
    assert (got.phase if got else None) == kept


def test_pod_fields() -> None:
    """Node, labels, creation time and identity come through."""
    got = pod_from(
        PodObj("ml", "p").container(1).on("n1").label("app", "x").obj(),
        priorities=Priorities(),
        kinds=KINDS,
    )
    assert got == Pod("ml", "p", "n1", "Running", 1, labels={"app": "x"}, created=T0_EPOCH)


@pytest.mark.parametrize(
    ("gates", "gated"), [([], False), ([{"name": "kueue.x-k8s.io/admission"}], True)]
)
def test_a_scheduling_gate_is_seen(gates: list[dict[str, str]], gated: bool) -> None:
    """A pod held by spec.schedulingGates (Kueue's admission gate) is marked gated."""
    obj = PodObj("ml", "p").container(1).obj()
    obj["spec"]["schedulingGates"] = gates
    got = pod_from(obj, priorities=Priorities(), kinds=KINDS)
    assert got is not None
    assert got.gated is gated


@pytest.mark.parametrize(
    ("pod", "kept"),
    [
        pytest.param(Pod("ml", "p", gpus=1), True, id="whole-gpus"),
        pytest.param(Pod("ml", "p", mig={"1g.10gb": 1}), True, id="mig"),
        pytest.param(Pod("ml", "p", workload="ml/web"), True, id="tracked-workload"),
        pytest.param(Pod("ml", "p", workload="ml/other"), False, id="untracked-workload"),
        pytest.param(Pod("ml", "p"), False, id="cpu-only"),
    ],
)
def test_keep_pod(pod: Pod, kept: bool) -> None:
    """Only GPU pods and pods of tracked workloads are kept."""
    assert keep_pod(pod, {"ml/web"}) is kept


# --- workloads ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "kind", "replicas", "gpus", "priority", "class_name"),
    [
        pytest.param(
            workload_obj("Deployment", "web", replicas=3, gpus=1),
            DEPLOYMENT,
            3,
            1,
            10,
            "batch",
            id="deployment",
        ),
        pytest.param(
            workload_obj("Deployment", "web", replicas=None, gpus=0),
            DEPLOYMENT,
            1,
            0,
            10,
            "batch",
            id="default-replicas",
        ),
        pytest.param(
            workload_obj("StatefulSet", "db", replicas=2, gpus=2, pc="high"),
            STATEFULSET,
            2,
            2,
            1000,
            "high",
            id="statefulset",
        ),
        pytest.param(
            workload_obj("PyTorchJob", "bert", replicas=4, gpus=8, pc="high"),
            PYTORCHJOB,
            4,
            8,
            1000,
            "high",
            id="pytorchjob",
        ),
    ],
)
def test_workload_from(
    raw: Obj, kind: Any, replicas: int, gpus: int, priority: int, class_name: str
) -> None:
    """Replicas and GPUs per replica come from the configured paths, priority from the template."""
    before = copy.deepcopy(raw)
    got = workload_from(raw, kind, priorities=priorities_from(CLASSES))
    assert raw == before, "the raw object was mutated"
    assert (got.kind, got.replicas, got.gpus_per_replica, got.priority, got.priority_class) == (
        kind.kind,
        replicas,
        gpus,
        priority,
        class_name,
    )
    assert (got.key, dict(got.labels), got.created) == (
        f"ml/{raw['metadata']['name']}",
        {"team": "ml"},
        T0_EPOCH,
    )


# --- whole snapshot ----------------------------------------------------------------------------


def test_snapshot_from_matches_the_builder() -> None:
    """A small raw cluster translates to the snapshot the test builder describes."""
    raw_pods = [
        PodObj("ml", "bert-worker-0")
        .container(8)
        .on("n1")
        .owned_by("PyTorchJob", "bert", "kubeflow.org/v1")
        .priority(class_name="high")
        .obj(),
        PodObj("ml", "web-abc-1")
        .container(0)
        .in_phase("Pending")
        .owned_by("ReplicaSet", "web-abc")
        .label("pod-template-hash", "abc")
        .obj(),
        PodObj("ml", "cpu-only").container(0).on("n1").obj(),
        PodObj("ml", "done").container(1).on("n1").in_phase("Succeeded").obj(),
    ]
    got = snapshot_from(
        nodes=[NodeObj("n1").gpus(8).product(A100).obj(), NodeObj("cpu").obj()],
        pods=raw_pods,
        workloads=[
            (PYTORCHJOB, workload_obj("PyTorchJob", "bert", replicas=1, gpus=8, pc="high")),
            (DEPLOYMENT, workload_obj("Deployment", "web", replicas=1, gpus=0)),
        ],
        priority_classes=CLASSES,
    )
    labels = {"team": "ml"}
    want = (
        SnapshotBuilder()
        .priority_class("high", 1000)
        .priority_class("batch", 10)
        .priority_class("system-cluster-critical", 2000000000)
        .priority_class("system-node-critical", 2000001000)
        .node("n1", gpus=8)
        .workload(
            "ml",
            "bert",
            kind="PyTorchJob",
            gpus_per_replica=8,
            priority_class="high",
            labels=labels,
            created=T0_EPOCH,
        )
        .workload(
            "ml", "web", gpus_per_replica=0, priority_class="batch", labels=labels, created=T0_EPOCH
        )
        .pod(
            "ml",
            "bert-worker-0",
            node="n1",
            gpus=8,
            priority_class="high",
            workload="ml/bert",
            created=T0_EPOCH,
        )
        .pod(
            "ml",
            "web-abc-1",
            priority_class="batch",
            workload="ml/web",
            labels={"pod-template-hash": "abc"},
            created=T0_EPOCH,
        )
        .build()
    )
    assert got.nodes == tuple(
        n.__class__(n.name, n.gpus, {"nvidia.com/gpu.product": A100}) for n in want.nodes
    )
    assert (got.pods, got.workloads, got.priority_classes) == (
        want.pods,
        want.workloads,
        want.priority_classes,
    )


# --- placement and quotas ----------------------------------------------------------------------

TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
PIN_H100 = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}
                    ]
                }
            ]
        }
    }
}


@pytest.mark.parametrize(
    ("spec", "selector", "affinity", "tolerations"),
    [
        pytest.param({}, {}, None, (), id="none"),
        pytest.param({"nodeSelector": {"pool": "a"}}, {"pool": "a"}, None, (), id="node-selector"),
        pytest.param(
            {"affinity": PIN_H100},
            {},
            "(nvidia.com/gpu.product In [H100])",
            (),
            id="one-value-affinity",
        ),
        pytest.param(
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "m", "operator": "In", "values": ["a", "b"]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            {},
            "(m In [a, b])",
            (),
            id="multi-value-affinity",
        ),
        pytest.param(
            {"tolerations": [TOLERATE_GPU, {"key": "x", "value": "y"}]},
            {},
            None,
            (
                Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),
                Toleration("x", "Equal", "y", ""),
            ),
            id="tolerations",
        ),
    ],
)
def test_placement_from(
    spec: Obj, selector: dict[str, str], affinity: str | None, tolerations: tuple[Toleration, ...]
) -> None:
    """A pod spec's nodeSelector, required node affinity and tolerations become its placement,
    each as written (more in tests/kube/test_translate_affinity.py)."""
    got = placement_from(spec)
    assert dict(got.node_selector) == selector
    assert (None if got.affinity is None else str(got.affinity)) == affinity
    assert got.tolerations == tolerations
    assert got.unknown is None


def test_node_taints_pod_and_template_placement_are_translated() -> None:
    """Node taints, a pod's placement and a workload template's placement reach the snapshot."""
    node = node_from(
        {
            "metadata": {"name": "n", "labels": {"nvidia.com/gpu.count": "8"}},
            "spec": {
                "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
            },
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        }
    )
    assert node is not None
    assert node.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    spec = {"containers": [], "tolerations": [TOLERATE_GPU], "affinity": PIN_H100}
    pod = pod_from(
        {"metadata": {"name": "p", "namespace": "ml"}, "spec": spec},
        priorities=Priorities(),
        kinds=(),
    )
    assert pod is not None
    assert pod.placement == placement_from(spec)
    wl = workload_from(
        {"metadata": {"name": "w", "namespace": "ml"}, "spec": {"template": {"spec": spec}}},
        DEPLOYMENT,
        priorities=Priorities(),
    )
    assert wl.placement == pod.placement


def quota(name: str, *, hard: str | None, used: str | None = None, spec_only: bool = False) -> Obj:
    hard_map = {} if hard is None else {"requests.nvidia.com/gpu": hard, "pods": "10"}
    status = (
        {} if spec_only else {"hard": hard_map, "used": {"requests.nvidia.com/gpu": used or "0"}}
    )
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"hard": hard_map},
        "status": status,
    }


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        pytest.param(quota("q", hard="8", used="6"), GpuQuota("ml", 8, 6), id="status"),
        pytest.param(quota("q", hard="4", spec_only=True), GpuQuota("ml", 4, 0), id="spec-only"),
        pytest.param(quota("q", hard=None), None, id="no-gpu-key"),
    ],
)
def test_quota_from(obj: Obj, want: GpuQuota | None) -> None:
    """A ResourceQuota's requests.nvidia.com/gpu: hard and used from status, spec before the
    quota controller fills it in, nothing when it does not cap GPUs."""
    assert quota_from(obj) == want


def test_the_tightest_quota_of_a_namespace_decides() -> None:
    """With several quotas in a namespace, the one with the fewest GPUs left is kept."""
    got = tightest_quotas([GpuQuota("ml", 16, 4), GpuQuota("ml", 8, 6), GpuQuota("a", 2, 0)])
    assert got == (GpuQuota("a", 2, 0), GpuQuota("ml", 8, 6))

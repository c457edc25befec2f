"""KubeClusterState: informers in, snapshots out, against the test server and on its own."""

from __future__ import annotations

import asyncio
import copy
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration
from structlog.testing import capture_logs

from controller.kube.informer import Backoff, Informer
from controller.kube.kube_runtime import KubeRuntime
from controller.kube.state import WORKLOAD_KINDS, ClusterStateSettings, KubeClusterState
from controller.kube.translate import DEPLOYMENT, PYTORCHJOB, STATEFULSET, snapshot_from
from controller.kube.workloads import ADAPTERS
from controller.process.settings import Settings, WorkloadKindName
from policies.model import Policy
from policies.snapshot import Snapshot
from support.kubeapi import KubeAPIServer, LoggedRequest
from support.kubeapi_objects import make_node, make_pod
from support.kubeapi_rbac import chart_authorizer
from support.kubeapi_store import PYTORCHJOB as PYTORCHJOB_CRD
from support.workload_kinds import synced_state

Obj = dict[str, Any]
FAST = Backoff(base_s=0.02, max_s=0.2)
T0 = "2024-05-01T12:00:00Z"


# --- builders ----------------------------------------------------------------------------------


def owned(pod: Obj, kind: str, name: str, *, api_version: str = "apps/v1") -> Obj:
    """``pod`` with a controller ownerReference (and the template hash of a ReplicaSet)."""
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": api_version, "kind": kind, "name": name, "controller": True, "uid": "u"}
    ]
    if kind == "ReplicaSet":
        pod["metadata"]["labels"]["pod-template-hash"] = name.rsplit("-", 1)[1]
    return pod


def deployment(name: str, *, replicas: int, gpus: int = 0, namespace: str = "ml") -> Obj:
    container: Obj = {"name": "main", "image": "busybox"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container]},
            },
        },
    }


def pytorchjob(name: str, *, workers: int, gpus: int, namespace: str = "ml") -> Obj:
    template = {
        "spec": {
            "containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
        }
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers, "template": template}}},
    }


def priority_class(name: str, value: int, *, default: bool = False) -> Obj:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "globalDefault": default,
    }


def pdb(name: str, *, app: str, namespace: str = "ml") -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
    }


async def eventually(check: Callable[[], bool], *, within: float = 5.0) -> None:
    """Poll ``check`` until it is true, failing after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def pod_keys(snapshot: Snapshot) -> list[str]:
    return [p.key for p in snapshot.pods]


def reference(state: KubeClusterState) -> Snapshot:
    """The snapshot a full, non-incremental translation of the caches gives."""
    informers = state.informers
    kinds = {"deployments.apps": DEPLOYMENT, "statefulsets.apps": STATEFULSET}
    kinds["pytorchjobs.kubeflow.org"] = PYTORCHJOB
    return snapshot_from(
        nodes=informers["nodes"].items(),
        pods=informers["pods"].items(),
        workloads=[(k, o) for name, k in kinds.items() for o in informers[name].items()],
        priority_classes=informers["priorityclasses.scheduling.k8s.io"].items(),
        workload=lambda obj, kind, priorities: ADAPTERS[kind.kind].workload(obj, priorities),
        quotas=informers["resourcequotas"].items(),
    )


# --- against the test server -------------------------------------------------------------------


async def test_snapshot_shows_gpu_nodes_pods_and_workloads(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A synced state's snapshot holds GPU nodes, GPU pods, tracked workloads and their pods,
    with priorities resolved, and leaves out CPU nodes and unrelated CPU pods."""
    await kubeapi.create(priority_class("high", 1000))
    await kubeapi.create(priority_class("batch", 10, default=True))
    await kubeapi.create(make_node("gpu-1", gpus=8, labels={"pool": "a100"}))
    await kubeapi.create(make_node("cpu-1"))
    await kubeapi.create(deployment("web", replicas=1))
    await kubeapi.create(pytorchjob("bert", workers=2, gpus=8))
    await kubeapi.create(owned(make_pod("web-5f7-x", namespace="ml"), "ReplicaSet", "web-5f7"))
    for i in range(2):
        await kubeapi.create(
            owned(
                make_pod(
                    f"bert-worker-{i}", namespace="ml", node="gpu-1", gpus=8, priority_class="high"
                ),
                "PyTorchJob",
                "bert",
                api_version="kubeflow.org/v1",
            )
        )
    await kubeapi.create(make_pod("lonely-cpu", namespace="ml"))
    async with synced_state(kube_client) as state:
        snapshot = state.snapshot()
    assert [n.name for n in snapshot.nodes] == ["gpu-1"]
    assert snapshot.nodes[0].labels["pool"] == "a100"
    assert pod_keys(snapshot) == ["ml/bert-worker-0", "ml/bert-worker-1", "ml/web-5f7-x"]
    assert [(p.gpus, p.priority, p.workload) for p in snapshot.pods] == [
        (8, 1000, "ml/bert"),
        (8, 1000, "ml/bert"),
        (0, 10, "ml/web"),
    ]
    assert [(w.key, w.kind, w.replicas, w.gpus_per_replica) for w in snapshot.workloads] == [
        ("ml/bert", "PyTorchJob", 2, 8),
        ("ml/web", "Deployment", 1, 0),
    ]
    assert snapshot == reference(state)


async def test_snapshot_identity_is_stable_until_something_shown_changes(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """The same snapshot object comes back while nothing changed, and also after a change the
    snapshot cannot show (a status condition); a visible change gives a new object."""
    await kubeapi.create(make_node("n1", gpus=8))
    await kubeapi.create(make_pod("p", namespace="ml", node="n1", gpus=1))
    async with synced_state(kube_client) as state:
        first = state.snapshot()
        assert state.snapshot() is first
        pods = state.informers["pods"]
        version = pods.version
        await kubeapi.patch(
            "pods",
            "ml",
            "p",
            {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
            subresource="status",
        )
        await eventually(lambda: pods.version > version)
        assert state.snapshot() is first
        await kubeapi.patch("nodes", None, "n1", {"spec": {"unschedulable": True}})
        await eventually(lambda: state.snapshot() is not first)
        second = state.snapshot()
        assert second.nodes[0].cordoned
        assert second.pods is first.pods, "unchanged kinds keep their tuples"
        assert state.snapshot() is second


async def test_selectors_and_namespaces_limit_what_is_watched(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """The node selector, pod selector and namespaces decide what the snapshot can contain."""
    await kubeapi.create(make_node("a100-1", gpus=8, labels={"pool": "gpu"}))
    await kubeapi.create(make_node("other", gpus=8))
    await kubeapi.create(make_pod("in", namespace="ml", gpus=1, labels={"ebbtide": "yes"}))
    await kubeapi.create(make_pod("unlabelled", namespace="ml", gpus=1))
    await kubeapi.create(make_pod("elsewhere", namespace="web", gpus=1, labels={"ebbtide": "yes"}))
    await kubeapi.create(deployment("elsewhere", replicas=1, namespace="web"))
    settings = ClusterStateSettings(
        node_selector="pool=gpu", pod_selector="ebbtide=yes", namespaces=("ml",), backoff=FAST
    )
    async with synced_state(kube_client, settings) as state:
        snapshot = state.snapshot()
        await kubeapi.patch("nodes", None, "other", {"metadata": {"labels": {"pool": "gpu"}}})
        await eventually(lambda: len(state.snapshot().nodes) == 2)
    assert [n.name for n in snapshot.nodes] == ["a100-1"]
    assert pod_keys(snapshot) == ["ml/in"]
    assert snapshot.workloads == ()


async def test_priority_class_change_reresolves_priorities(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A PriorityClass created after a pod that names it changes the pod's resolved priority."""
    await kubeapi.create(make_pod("p", namespace="ml", gpus=1, priority_class="late"))
    async with synced_state(kube_client) as state:
        assert [p.priority for p in state.snapshot().pods] == [0]
        await kubeapi.create(priority_class("late", 500))
        await eventually(lambda: [p.priority for p in state.snapshot().pods] == [500])
        assert state.snapshot() == reference(state)


async def test_finished_pods_and_deleted_workloads_leave_the_snapshot(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A pod that finishes drops out; so do the CPU pods of a workload that is deleted."""
    await kubeapi.create(make_pod("gpu", namespace="ml", node="n1", gpus=1))
    await kubeapi.create(deployment("web", replicas=1))
    await kubeapi.create(owned(make_pod("web-abc-1", namespace="ml"), "ReplicaSet", "web-abc"))
    async with synced_state(kube_client) as state:
        assert pod_keys(state.snapshot()) == ["ml/gpu", "ml/web-abc-1"]
        await kubeapi.patch(
            "pods", "ml", "gpu", {"status": {"phase": "Succeeded"}}, subresource="status"
        )
        await eventually(lambda: pod_keys(state.snapshot()) == ["ml/web-abc-1"])
        await kubeapi.delete("deployments", "ml", "web")
        await eventually(lambda: pod_keys(state.snapshot()) == [])
        assert state.snapshot().workloads == ()


async def test_a_kind_whose_crd_is_not_installed_is_skipped_then_rediscovered() -> None:
    """Without the Kubeflow CRD (its LIST answers 404) the state still syncs, says so once, and
    tracks PyTorchJobs as soon as the CRD is installed."""
    server = KubeAPIServer(resources=(), authorizer=chart_authorizer())
    async with server, ApiClient(Configuration(server.url)) as api:
        settings = ClusterStateSettings(backoff=FAST, rediscover_s=0.05)

        def jobs() -> list[LoggedRequest]:
            return server.requests_matching(path_regex=r"^/apis/kubeflow\.org/v1/pytorchjobs$")

        with capture_logs() as logs:
            async with synced_state(api, settings) as state:
                assert state.snapshot().workloads == ()
                assert not state.informers["pytorchjobs.kubeflow.org"].installed
                await server.until(lambda: len(jobs()) >= 3)  # looked for again and again
                server.add_resource(PYTORCHJOB_CRD)
                await server.create(pytorchjob("bert", workers=2, gpus=8))
                await server.until(lambda: any(r.query.get("watch") for r in jobs()))
                assert [w.key for w in state.snapshot().workloads] == ["ml/bert"]
        kubeflow = [e for e in logs if e.get("resource") == "pytorchjobs.kubeflow.org"]
        assert [e["event"] for e in kubeflow if e["log_level"] == "warning"] == [
            "informer.api_absent"
        ]
        assert [e["event"] for e in kubeflow if e["event"].startswith("informer.api_")] == [
            "informer.api_absent",
            "informer.api_installed",
        ]
    assert server.forbidden == []


def test_the_workload_kinds_setting_chooses_what_is_watched_and_scaled(
    kube_client: ApiClient,
) -> None:
    """kube.workload_kinds names exactly the registry's kinds, and the runtime watches and
    scales only the ones it lists."""
    assert set(get_args(WorkloadKindName)) == set(WORKLOAD_KINDS)
    settings = Settings(policies=[Path("p.yaml")], kube={"workload_kinds": ["StatefulSet"]})
    policy = Policy.model_validate(
        {
            "apiVersion": "ebbtide.io/v1alpha1",
            "kind": "Policy",
            "metadata": {"name": "t"},
            "spec": {"pools": {}},
        }
    )
    runtime = KubeRuntime(kube_client, settings.kube, policy, dry_run=settings.dry_run_for(policy))
    watched = set(runtime.state.informers)
    assert {"statefulsets.apps", "nodes"} <= watched
    assert not watched & {"deployments.apps", "pytorchjobs.kubeflow.org"}
    assert runtime.state.settings.workload_kinds == (STATEFULSET,)


async def test_quotas_taints_and_template_placement_reach_the_snapshot(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """ResourceQuotas capping GPUs are watched (the tightest per namespace), node taints and a
    workload template's tolerations reach the snapshot, and a quota change makes a new one."""
    node = make_node("gpu-1", gpus=8)
    node["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    await kubeapi.create(node)
    web = deployment("web", replicas=1, gpus=2)
    web["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "nvidia.com/gpu", "operator": "Exists"}
    ]
    await kubeapi.create(web)
    for name, hard in (("wide", "16"), ("tight", "4")):
        await kubeapi.create(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": name, "namespace": "ml"},
                "spec": {"hard": {"requests.nvidia.com/gpu": hard}},
            }
        )
    async with synced_state(kube_client) as state:
        snapshot = state.snapshot()
        assert [(q.namespace, q.hard) for q in snapshot.quotas] == [("ml", 4)]
        assert [t.key for t in snapshot.nodes[0].taints] == ["nvidia.com/gpu"]
        assert [t.operator for t in snapshot.workloads[0].placement.tolerations] == ["Exists"]
        assert snapshot == reference(state)
        await kubeapi.delete("ResourceQuota", "ml", "tight")
        await eventually(lambda: [q.hard for q in state.snapshot().quotas] == [16])


async def test_pdbs_are_exposed_raw(kubeapi: KubeAPIServer, kube_client: ApiClient) -> None:
    """PodDisruptionBudgets are cached as raw objects, status included, for the actuators."""
    await kubeapi.create(pdb("web", app="web"))
    await kubeapi.create(make_pod("w", namespace="ml", labels={"app": "web"}))
    async with synced_state(kube_client) as state:
        await eventually(lambda: [p["status"]["currentHealthy"] for p in state.pdbs()] == [1])
    assert [p["metadata"]["name"] for p in state.pdbs()] == ["web"]


async def test_relist_after_gone_keeps_the_snapshot_consistent(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Changes missed while watches are down and history is compacted arrive by re-list, and the
    incremental snapshot equals a full translation afterwards."""
    await kubeapi.create(make_node("n1", gpus=8))
    await kubeapi.create(make_pod("stays", namespace="ml", node="n1", gpus=1))
    await kubeapi.create(make_pod("goes", namespace="ml", node="n1", gpus=1))
    async with synced_state(kube_client) as state:
        before = state.snapshot()
        kubeapi.faults.add(method="GET", path_regex="^/api", status=503, times=3)
        kubeapi.store.close()
        await kubeapi.delete("pods", "ml", "goes")
        await kubeapi.create(make_pod("new", namespace="ml", node="n1", gpus=2))
        await kubeapi.patch("nodes", None, "n1", {"spec": {"unschedulable": True}})
        kubeapi.compact()
        await eventually(lambda: pod_keys(state.snapshot()) == ["ml/new", "ml/stays"])
        await eventually(lambda: state.snapshot().nodes[0].cordoned)
        assert state.snapshot() == reference(state)
        assert state.snapshot() is not before


# --- without a server: incremental against full translation ------------------------------------


def gen_node(i: int, *, gpus: int = 8) -> Obj:
    node = make_node(f"node-{i:05d}", gpus=gpus, labels={"pool": "a100" if i % 5 else "mig"})
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-80GB"
    node["metadata"]["resourceVersion"] = "1"
    return node


def gen_pod(i: int, *, nodes: int, rv: int = 1) -> Obj:
    deploy = i // 8
    pod = make_pod(
        f"train-{deploy:05d}-h{deploy:x}-{i % 8}",
        namespace=f"team-{deploy % 20}",
        node=f"node-{i % nodes:05d}" if i % 6 else None,
        phase="Running" if i % 6 else "Pending",
        gpus=1 + i % 2,
        priority_class="batch" if i % 3 else "high",
    )
    owned(pod, "ReplicaSet", f"train-{deploy:05d}-h{deploy:x}")
    pod["metadata"].update(resourceVersion=str(rv), creationTimestamp=T0)
    return pod


def gen_deployment(d: int) -> Obj:
    body = deployment(f"train-{d:05d}", replicas=8, gpus=1, namespace=f"team-{d % 20}")
    body["metadata"]["resourceVersion"] = "1"
    return body


def informer(state: KubeClusterState, name: str) -> Informer:
    return state.informers[name]


def seed(state: KubeClusterState, *, nodes: int, pods: int) -> None:
    informer(state, "priorityclasses.scheduling.k8s.io").replace(
        [priority_class("high", 1000), priority_class("batch", 10, default=True)]
    )
    informer(state, "nodes").replace(gen_node(i) for i in range(nodes))
    informer(state, "deployments.apps").replace(gen_deployment(d) for d in range(pods // 8))
    informer(state, "pods").replace(gen_pod(i, nodes=nodes) for i in range(pods))


async def test_incremental_snapshot_matches_full_translation_under_random_changes() -> None:
    """After random adds, changes and deletes of every kind, the incrementally maintained
    snapshot equals a full translation of the same objects."""
    rng = random.Random(7)
    async with ApiClient() as api:
        state = KubeClusterState(api)
        seed(state, nodes=20, pods=160)
        assert state.snapshot() == reference(state)
        pods, nodes = informer(state, "pods"), informer(state, "nodes")
        for step in range(200):
            roll = rng.random()
            if roll < 0.4:
                victim = copy.deepcopy(rng.choice(pods.items()))
                victim["metadata"]["resourceVersion"] = f"{step + 10}"
                victim["status"]["phase"] = rng.choice(["Running", "Pending", "Succeeded"])
                victim["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(
                    rng.randint(0, 2)
                )
                pods.apply("MODIFIED", victim)
            elif roll < 0.6:
                pods.apply("ADDED", gen_pod(1000 + step, nodes=20, rv=step + 10))
            elif roll < 0.75 and len(pods):
                pods.apply("DELETED", rng.choice(pods.items()))
            elif roll < 0.85:
                node = copy.deepcopy(rng.choice(nodes.items()))
                node["metadata"]["resourceVersion"] = f"{step + 10}"
                node["spec"]["unschedulable"] = not node["spec"].get("unschedulable")
                nodes.apply("MODIFIED", node)
            elif roll < 0.95:
                deployments = informer(state, "deployments.apps")
                if rng.random() < 0.5 and len(deployments):
                    deployments.apply("DELETED", rng.choice(deployments.items()))
                else:
                    deployments.apply("ADDED", gen_deployment(rng.randint(0, 40)))
            else:
                informer(state, "priorityclasses.scheduling.k8s.io").apply(
                    "MODIFIED",
                    priority_class("batch", step, default=True)
                    | {"metadata": {"name": "batch", "resourceVersion": str(step + 10)}},
                )
            if step % 10 == 0:
                assert state.snapshot() == reference(state), f"diverged at step {step}"
        assert state.snapshot() == reference(state)


@pytest.mark.slow
async def test_snapshot_rebuild_time_at_scale() -> None:
    """Prints snapshot() rebuild times for 1,250 nodes x 8 GPUs and 12,000 GPU pods (a
    measurement, not an assertion on speed); run with ``-s`` to see it."""
    async with ApiClient() as api:
        state = KubeClusterState(api)
        started = time.perf_counter()
        seed(state, nodes=1250, pods=12_000)
        seeded = time.perf_counter() - started
        rows: list[tuple[str, float]] = []

        def measure(label: str) -> Snapshot:
            t = time.perf_counter()
            snapshot = state.snapshot()
            rows.append((label, time.perf_counter() - t))
            return snapshot

        first = measure("first build (translate everything)")
        assert (len(first.nodes), len(first.pods)) == (1250, 12_000)
        assert sum(len(n.gpus) for n in first.nodes) == 10_000
        measure("no change (cached object)")
        pods = informer(state, "pods")
        changed = copy.deepcopy(pods.items()[0])
        changed["metadata"]["resourceVersion"] = "2"
        changed["metadata"]["labels"]["touched"] = "yes"
        pods.apply("MODIFIED", changed)
        measure("1 pod modified")
        pods.apply("ADDED", gen_pod(99_999, nodes=1250, rv=3))
        measure("1 pod added")
        for i, obj in enumerate(copy.deepcopy(pods.items()[:100])):
            obj["metadata"]["resourceVersion"] = str(10 + i)
            obj["metadata"]["labels"]["touched"] = "again"
            pods.apply("MODIFIED", obj)
        measure("100 pods modified")
        node = copy.deepcopy(informer(state, "nodes").items()[0])
        node["metadata"]["resourceVersion"] = "2"
        node["spec"]["unschedulable"] = True
        informer(state, "nodes").apply("MODIFIED", node)
        measure("1 node cordoned")
        informer(state, "priorityclasses.scheduling.k8s.io").apply(
            "MODIFIED",
            {
                "metadata": {"name": "batch", "resourceVersion": "5"},
                "value": 11,
                "globalDefault": True,
            },
        )
        measure("priority class changed (re-translate pods)")
        assert state.snapshot() == reference(state)
    print(f"\nseeding the informer stores: {seeded * 1000:.0f} ms")
    for label, seconds in rows:
        print(f"snapshot() {label:<45} {seconds * 1000:9.2f} ms")

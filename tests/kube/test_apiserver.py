"""The Kubernetes API test server, driven the way the controller drives a cluster.

Every request goes through ``kubernetes_asyncio`` over HTTP; the server's direct helpers
(``create``, ``get``, ``patch``) only seed state and inspect results. If a test here fails, the
controller's integration tests would test against a server that is not Kubernetes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client import ApiClient, ApiException, Configuration
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_node, make_pod
from support.kubeapi_store import PYTORCHJOB, ResourceType
from support.mig_manager import CONFIG_LABEL, STATE_LABEL, MigManager

MERGE = "application/merge-patch+json"
Obj = dict[str, Any]

#: These tests drive the server as a cluster admin would; its authorizer is tested on its own.
pytestmark = pytest.mark.kube_rbac(None)


# --- builders ----------------------------------------------------------------------------------


def statefulset(name: str, *, replicas: int, namespace: str = "default") -> Obj:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    }


def deployment(name: str, *, replicas: int, namespace: str = "default") -> Obj:
    body = statefulset(name, replicas=replicas, namespace=namespace)
    body["kind"] = "Deployment"
    del body["spec"]["serviceName"]
    return body


def pytorchjob(name: str, *, workers: int, namespace: str = "default") -> Obj:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers, "template": {}}}},
    }


async def eventually(check: Callable[[], Awaitable[bool]], *, within: float = 5.0) -> None:
    """Poll ``check`` until it is true, failing after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def collect(w: watch.Watch, func: Any, count: int, **kwargs: Any) -> list[tuple[str, str]]:
    """(type, name) of the first ``count`` watch events."""
    seen: list[tuple[str, str]] = []
    async for event in w.stream(func, **kwargs):
        seen.append((event["type"], event["raw_object"]["metadata"]["name"]))
        if len(seen) == count:
            break
    return seen


# --- lists and selectors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["a", "b"]),
        ("app==web", ["a", "b"]),
        ("app!=web", ["c", "d"]),
        ("tier in (front,back)", ["a", "b"]),
        ("tier notin (front)", ["b", "c", "d"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c", "d"]),
        ("app=web,tier!=back", ["a"]),
        ("app in (web,db),!tier", ["c"]),
        ("", ["a", "b", "c", "d"]),
    ],
)
async def test_label_selectors(
    kubeapi: KubeAPIServer, kube_client: ApiClient, selector: str, expected: list[str]
) -> None:
    """Lists honour every label-selector operator."""
    for name, labels in [
        ("a", {"app": "web", "tier": "front"}),
        ("b", {"app": "web", "tier": "back"}),
        ("c", {"app": "db"}),
        ("d", {}),
    ]:
        await kubeapi.create(make_pod(name, labels=labels))
    pods = await client.CoreV1Api(kube_client).list_namespaced_pod(
        "default", label_selector=selector
    )
    assert [p.metadata.name for p in pods.items] == expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=n1", ["a", "c"]),
        ("spec.nodeName=", ["b"]),
        ("status.phase=Running", ["a"]),
        ("status.phase!=Running", ["b", "c"]),
        ("metadata.name=b", ["b"]),
        ("metadata.namespace=ns2", ["c"]),
        ("spec.nodeName=n1,status.phase!=Succeeded", ["a"]),
    ],
)
async def test_field_selectors(
    kubeapi: KubeAPIServer, kube_client: ApiClient, selector: str, expected: list[str]
) -> None:
    """Lists across namespaces honour field selectors on name, namespace, node and phase."""
    await kubeapi.create(make_pod("a", namespace="ns1", node="n1"))
    await kubeapi.create(make_pod("b", namespace="ns1", phase="Pending"))
    await kubeapi.create(make_pod("c", namespace="ns2", node="n1", phase="Succeeded"))
    pods = await client.CoreV1Api(kube_client).list_pod_for_all_namespaces(field_selector=selector)
    assert [p.metadata.name for p in pods.items] == expected


async def test_list_pages_with_limit_and_continue(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """``limit`` pages a list and ``continue`` resumes it."""
    for i in range(5):
        await kubeapi.create(make_node(f"node-{i}"))
    core = client.CoreV1Api(kube_client)
    first = await core.list_node(limit=2)
    second = await core.list_node(limit=10, _continue=first.metadata._continue)
    assert [n.metadata.name for n in first.items] == ["node-0", "node-1"]
    assert first.metadata.remaining_item_count == 3
    assert [n.metadata.name for n in second.items] == ["node-2", "node-3", "node-4"]


# --- metadata and writes -----------------------------------------------------------------------


async def test_create_fills_metadata_and_generation_tracks_spec(kube_client: ApiClient) -> None:
    """Create sets uid, resourceVersion, creationTimestamp, generateName; spec edits bump
    generation and label edits do not."""
    apps = client.AppsV1Api(kube_client)
    body = deployment("ignored", replicas=1)
    body["metadata"] = {"generateName": "web-"}
    created = await apps.create_namespaced_deployment("default", body)
    name, meta = created.metadata.name, created.metadata
    assert name.startswith("web-")
    assert len(name) == len("web-") + 5
    assert meta.uid
    assert meta.creation_timestamp is not None
    assert meta.generation == 1
    relabelled = await apps.patch_namespaced_deployment(
        name, "default", {"metadata": {"labels": {"team": "a"}}}
    )
    assert relabelled.metadata.generation == 1
    assert int(relabelled.metadata.resource_version) > int(meta.resource_version)
    rescaled = await apps.patch_namespaced_deployment(name, "default", {"spec": {"replicas": 3}})
    assert rescaled.metadata.generation == 2
    assert rescaled.metadata.uid == meta.uid
    with pytest.raises(ApiException) as exc:
        await apps.create_namespaced_deployment("default", deployment(name, replicas=1))
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["reason"] == "AlreadyExists"


async def test_stale_resource_version_is_conflict(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """PUT or PATCH carrying a stale resourceVersion gets 409 Conflict and changes nothing."""
    core = client.CoreV1Api(kube_client)
    await kubeapi.create(make_pod("p"))
    mine, theirs = (
        await core.read_namespaced_pod("p", "default"),
        await core.read_namespaced_pod("p", "default"),
    )
    mine.metadata.labels = {"owner": "me"}
    await core.replace_namespaced_pod("p", "default", mine)
    theirs.metadata.labels = {"owner": "them"}
    with pytest.raises(ApiException) as put:
        await core.replace_namespaced_pod("p", "default", theirs)
    stale = {
        "metadata": {
            "resourceVersion": theirs.metadata.resource_version,
            "labels": {"owner": "them"},
        }
    }
    with pytest.raises(ApiException) as patch:
        await core.patch_namespaced_pod("p", "default", stale)
    for error in (put.value, patch.value):
        status = json.loads(error.body)
        assert (error.status, status["kind"], status["reason"]) == (409, "Status", "Conflict")
        assert "the object has been modified" in status["message"]
    assert (await core.read_namespaced_pod("p", "default")).metadata.labels == {"owner": "me"}


async def test_patch_content_types(kubeapi: KubeAPIServer, kube_client: ApiClient) -> None:
    """Strategic-merge, merge and JSON patches apply; a dict sent as JSON patch is rejected."""
    core = client.CoreV1Api(kube_client)
    await kubeapi.create(make_pod("p", labels={"a": "1", "b": "2"}))
    await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": None}}})
    await core.patch_namespaced_pod(
        "p", "default", {"metadata": {"labels": {"c": "3"}}}, _content_type=MERGE
    )
    await core.patch_namespaced_pod(
        "p",
        "default",
        [
            {"op": "test", "path": "/metadata/labels/b", "value": "2"},
            {"op": "replace", "path": "/metadata/labels/b", "value": "two"},
            {"op": "add", "path": "/metadata/annotations", "value": {"x/y": "z"}},
        ],
    )
    pod = await core.read_namespaced_pod("p", "default")
    assert pod.metadata.labels == {"b": "two", "c": "3"}
    assert pod.metadata.annotations == {"x/y": "z"}
    custom = client.CustomObjectsApi(kube_client)
    await kubeapi.create(pytorchjob("job", workers=1))
    with pytest.raises(ApiException) as exc:
        await custom.patch_namespaced_custom_object(
            "kubeflow.org", "v1", "default", "pytorchjobs", "job", {"metadata": {}}
        )
    assert exc.value.status == 400
    await custom.patch_namespaced_custom_object(
        "kubeflow.org",
        "v1",
        "default",
        "pytorchjobs",
        "job",
        {"metadata": {"labels": {"queue": "q"}}},
        _content_type=MERGE,
    )
    assert kubeapi.get("PyTorchJob", "default", "job")["metadata"]["labels"] == {"queue": "q"}


async def test_status_subresource_only_changes_status(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """/status writes change only status; main-resource writes cannot change status."""
    core = client.CoreV1Api(kube_client)
    await kubeapi.create(make_pod("p", phase="Pending"))
    await core.patch_namespaced_pod_status(
        "p", "default", {"status": {"phase": "Running"}, "spec": {"nodeName": "sneaky"}}
    )
    await core.patch_namespaced_pod(
        "p", "default", {"status": {"phase": "Failed"}, "spec": {"nodeName": "n1"}}
    )
    pod = kubeapi.get("pods", "default", "p")
    assert pod is not None
    assert (pod["status"]["phase"], pod["spec"]["nodeName"]) == ("Running", "n1")


async def test_cluster_scoped_kinds_and_pod_priority(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """PriorityClasses and Nodes are cluster-scoped; a pod gets its PriorityClass's value."""
    await client.SchedulingV1Api(kube_client).create_priority_class(
        {"metadata": {"name": "high"}, "value": 1000}
    )
    await client.CoreV1Api(kube_client).create_node(make_node("gpu-1", gpus=8))
    pod = await client.CoreV1Api(kube_client).create_namespaced_pod(
        "default", make_pod("p", priority_class="high")
    )
    assert pod.spec.priority == 1000
    assert pod.status.phase == "Pending"  # status sent on create is dropped, then defaulted
    assert kubeapi.get("Node", None, "gpu-1") is not None
    assert [p["metadata"]["name"] for p in kubeapi.objects("priorityclasses")] == ["high"]


async def test_dry_run_changes_nothing(kubeapi: KubeAPIServer, kube_client: ApiClient) -> None:
    """``dryRun=All`` writes and evictions answer as usual but change nothing."""
    core = client.CoreV1Api(kube_client)
    before = await kubeapi.create(make_pod("p"))
    patched = await core.patch_namespaced_pod(
        "p", "default", {"metadata": {"labels": {"x": "y"}}}, dry_run="All"
    )
    assert patched.metadata.labels == {"x": "y"}
    await core.create_namespaced_pod_eviction(
        "p", "default", {"metadata": {"name": "p"}}, dry_run="All"
    )
    assert kubeapi.get("pods", "default", "p") == before


async def test_finalizers_delay_deletion(kubeapi: KubeAPIServer, kube_client: ApiClient) -> None:
    """Deleting an object with finalizers marks it; removing the last finalizer deletes it."""
    core = client.CoreV1Api(kube_client)
    pod = make_pod("p")
    pod["metadata"]["finalizers"] = ["ebbtide.io/hold"]
    await kubeapi.create(pod)
    await core.delete_namespaced_pod("p", "default")
    marked = await core.read_namespaced_pod("p", "default")
    assert marked.metadata.deletion_timestamp is not None
    await core.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": None}})
    assert kubeapi.get("pods", "default", "p") is None


# --- watch -------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["true", "True", "1"])
async def test_watch_parameter_spellings(
    kubeapi: KubeAPIServer, kube_client: ApiClient, spelling: str
) -> None:
    """``watch=true``, ``watch=True`` and ``watch=1`` all start a watch stream."""
    await kubeapi.create(make_pod("p"))
    response = await kube_client.request(
        "GET",
        f"{kubeapi.url}/api/v1/namespaces/default/pods",
        query_params=[("watch", spelling), ("timeoutSeconds", "1")],
        _preload_content=False,
    )
    line = json.loads(await response.content.readline())
    response.release()
    assert (line["type"], line["object"]["metadata"]["name"]) == ("ADDED", "p")


async def test_watch_replays_from_resource_version_then_streams(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A watch from a list's resourceVersion gets every later change, then live ones."""
    core = client.CoreV1Api(kube_client)
    await kubeapi.create(make_pod("before"))
    listed = await core.list_namespaced_pod("default")
    await kubeapi.create(make_pod("a"))
    await kubeapi.patch("pods", "default", "a", {"metadata": {"labels": {"x": "y"}}})
    await kubeapi.delete("pods", "default", "a")

    async def later() -> None:
        await asyncio.sleep(0.1)
        await kubeapi.create(make_pod("live"))

    task = asyncio.create_task(later())
    async with watch.Watch() as w:
        seen = await collect(
            w,
            core.list_namespaced_pod,
            4,
            namespace="default",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=5,
        )
    await task
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a"), ("ADDED", "live")]


async def test_watch_with_selector_sees_objects_enter_and_leave(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A selector-filtered watch turns a relabel into DELETED or ADDED, as the apiserver does."""
    core = client.CoreV1Api(kube_client)
    await kubeapi.create(make_pod("p", labels={"app": "web"}))
    rv = (await core.list_namespaced_pod("default")).metadata.resource_version
    await kubeapi.patch("pods", "default", "p", {"metadata": {"labels": {"app": "db"}}})
    await kubeapi.create(make_pod("other", labels={"app": "db"}))
    await kubeapi.patch("pods", "default", "p", {"metadata": {"labels": {"app": "web"}}})
    async with watch.Watch() as w:
        seen = await collect(
            w,
            core.list_namespaced_pod,
            2,
            namespace="default",
            label_selector="app=web",
            resource_version=rv,
            timeout_seconds=5,
        )
    assert seen == [("DELETED", "p"), ("ADDED", "p")]


async def test_watch_too_old_resource_version_is_410_then_relist(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """After compaction an old resourceVersion gets 410 Gone; a fresh list's version works."""
    core = client.CoreV1Api(kube_client)
    await kubeapi.create(make_pod("first"))
    old_rv = (await core.list_namespaced_pod("default")).metadata.resource_version
    await kubeapi.create(make_pod("a"))
    kubeapi.compact()
    async with watch.Watch() as w:
        with pytest.raises(ApiException) as exc:
            await collect(
                w,
                core.list_namespaced_pod,
                1,
                namespace="default",
                resource_version=old_rv,
                timeout_seconds=2,
            )
    assert exc.value.status == 410
    relisted = await core.list_namespaced_pod("default")
    await kubeapi.create(make_pod("b"))
    async with watch.Watch() as w:
        seen = await collect(
            w,
            core.list_namespaced_pod,
            1,
            namespace="default",
            resource_version=relisted.metadata.resource_version,
            timeout_seconds=2,
        )
    assert seen == [("ADDED", "b")]


async def test_watch_history_is_bounded() -> None:
    """Events beyond ``history_limit`` are forgotten, so an old watch gets 410."""
    async with (
        KubeAPIServer(history_limit=2) as server,
        ApiClient(Configuration(host=server.url)) as api,
    ):
        for i in range(4):
            await server.create(make_pod(f"p{i}"))
        core = client.CoreV1Api(api)
        async with watch.Watch() as w:
            with pytest.raises(ApiException) as exc:
                await collect(
                    w,
                    core.list_namespaced_pod,
                    1,
                    namespace="default",
                    resource_version="1",
                    timeout_seconds=1,
                )
            seen = await collect(
                w,
                core.list_namespaced_pod,
                1,
                namespace="default",
                resource_version="2",
                timeout_seconds=1,
            )
    assert exc.value.status == 410
    assert seen == [("ADDED", "p2")]


async def test_watch_timeout_ends_stream_with_bookmark(kube_client: ApiClient) -> None:
    """``timeoutSeconds`` ends an idle watch, after a BOOKMARK when bookmarks are allowed."""
    core = client.CoreV1Api(kube_client)
    started = time.monotonic()
    async with watch.Watch() as w:
        events = [
            e
            async for e in w.stream(
                core.list_namespaced_pod,
                namespace="default",
                timeout_seconds=1,
                allow_watch_bookmarks=True,
            )
        ]
    assert 0.9 < time.monotonic() - started < 3
    assert [e["type"] for e in events] == ["BOOKMARK"]


async def test_close_ends_open_watches() -> None:
    """Closing the server ends open watches promptly instead of hanging teardown."""
    server = KubeAPIServer()
    await server.start()
    async with ApiClient(Configuration(host=server.url)) as api:
        core = client.CoreV1Api(api)

        async def watch_forever() -> list[Any]:
            async with watch.Watch() as w:
                return [
                    e
                    async for e in w.stream(
                        core.list_namespaced_pod, namespace="default", timeout_seconds=60
                    )
                ]

        task = asyncio.create_task(watch_forever())
        await eventually(lambda: _true(any(True for _ in server.store.watchers())))
        started = time.monotonic()
        await server.close()
        assert await asyncio.wait_for(task, 3) == []
        assert time.monotonic() - started < 2


async def _true(value: bool) -> bool:
    return value


# --- eviction ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "budget",
    [
        {"minAvailable": 2},
        {"minAvailable": "60%"},
        {"maxUnavailable": 1},
        {"maxUnavailable": "33%"},
    ],
    ids=["minAvailable=2", "minAvailable=60%", "maxUnavailable=1", "maxUnavailable=33%"],
)
async def test_eviction_respects_disruption_budget(
    kubeapi: KubeAPIServer, kube_client: ApiClient, budget: Obj
) -> None:
    """Eviction is 201 (pod deleted) while the PDB allows it and 429 once it would violate it."""
    sts = await kubeapi.create(statefulset("web", replicas=3))
    owner = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "web",
        "uid": sts["metadata"]["uid"],
        "controller": True,
    }
    for i in range(3):
        pod = make_pod(f"web-{i}", labels={"app": "web"})
        pod["metadata"]["ownerReferences"] = [owner]
        await kubeapi.create(pod)
    policy, core = client.PolicyV1Api(kube_client), client.CoreV1Api(kube_client)
    await policy.create_namespaced_pod_disruption_budget(
        "default",
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, **budget},
        },
    )
    pdb = await policy.read_namespaced_pod_disruption_budget("web", "default")
    assert (pdb.status.disruptions_allowed, pdb.status.current_healthy) == (1, 3)

    def eviction(name: str) -> Obj:
        return {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": "default"},
        }

    await core.create_namespaced_pod_eviction("web-0", "default", eviction("web-0"))
    assert kubeapi.get("pods", "default", "web-0") is None
    with pytest.raises(ApiException) as exc:
        await core.create_namespaced_pod_eviction("web-1", "default", eviction("web-1"))
    status = json.loads(exc.value.body)
    assert (exc.value.status, status["reason"]) == (429, "TooManyRequests")
    assert status["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert kubeapi.get("pods", "default", "web-1") is not None
    pdb = await policy.read_namespaced_pod_disruption_budget("web", "default")
    assert (pdb.status.disruptions_allowed, pdb.status.current_healthy) == (0, 2)
    with pytest.raises(ApiException) as missing:
        await core.create_namespaced_pod_eviction("nope", "default", eviction("nope"))
    assert missing.value.status == 404
    assert [r.status for r in kubeapi.requests_matching(method="POST", path_regex="eviction$")] == [
        201,
        429,
        404,
    ]


async def test_eviction_without_budget_and_of_unready_pod(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """With no PDB eviction always works; an unready pod may go while the budget is met."""
    core = client.CoreV1Api(kube_client)
    await kubeapi.create(make_pod("lonely"))
    for name, ready in [("a", True), ("b", True), ("sick", False)]:
        await kubeapi.create(make_pod(name, labels={"app": "x"}, ready=ready))
    await kubeapi.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "x", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "x"}}, "minAvailable": 2},
        }
    )
    for name in ("lonely", "sick"):
        await core.create_namespaced_pod_eviction(name, "default", {"metadata": {"name": name}})
    assert [p["metadata"]["name"] for p in kubeapi.objects("pods")] == ["a", "b"]


# --- scale -------------------------------------------------------------------------------------


async def test_deployment_scale_subresource(kubeapi: KubeAPIServer, kube_client: ApiClient) -> None:
    """Deployment /scale reads, patches and replaces an autoscaling/v1 Scale, checking its
    resourceVersion."""
    apps = client.AppsV1Api(kube_client)
    await kubeapi.create(deployment("web", replicas=2))
    scale = await apps.read_namespaced_deployment_scale("web", "default")
    assert (scale.kind, scale.spec.replicas, scale.status.selector) == ("Scale", 2, "app=web")
    patched = await apps.patch_namespaced_deployment_scale(
        "web", "default", {"spec": {"replicas": 5}}
    )
    assert patched.spec.replicas == 5
    stored = kubeapi.get("Deployment", "default", "web")
    assert stored is not None
    assert (stored["spec"]["replicas"], stored["metadata"]["generation"]) == (5, 2)
    scale.spec.replicas = 1
    with pytest.raises(ApiException) as exc:
        await apps.replace_namespaced_deployment_scale("web", "default", scale)
    assert exc.value.status == 409
    patched.spec.replicas = 0
    replaced = await apps.replace_namespaced_deployment_scale("web", "default", patched)
    assert replaced.spec.replicas == 0
    sts = await kubeapi.create(statefulset("db", replicas=1))
    assert sts["spec"]["replicas"] == 1
    scaled = await apps.patch_namespaced_stateful_set_scale(
        "db", "default", {"spec": {"replicas": 3}}
    )
    assert scaled.spec.replicas == 3


@pytest.mark.parametrize(
    ("resource", "obj", "path"),
    [
        (None, pytorchjob("job", workers=2), ("spec", "pytorchReplicaSpecs", "Worker", "replicas")),
        (
            ResourceType(
                group="example.com",
                version="v1alpha1",
                plural="gpujobs",
                kind="GpuJob",
                replicas_path="spec.workers",
            ),
            {
                "apiVersion": "example.com/v1alpha1",
                "kind": "GpuJob",
                "metadata": {"name": "job", "namespace": "default"},
                "spec": {"workers": 2},
            },
            ("spec", "workers"),
        ),
    ],
    ids=["pytorchjob", "configured-path"],
)
async def test_custom_resource_scale_subresource(
    kubeapi: KubeAPIServer,
    kube_client: ApiClient,
    resource: ResourceType | None,
    obj: Obj,
    path: tuple[str, ...],
) -> None:
    """A custom resource's /scale maps Scale.spec.replicas onto its configured spec path."""
    if resource is not None:
        kubeapi.add_resource(resource)
    group, version = obj["apiVersion"].split("/")
    plural = resource.plural if resource else "pytorchjobs"
    custom = client.CustomObjectsApi(kube_client)
    await custom.create_namespaced_custom_object(group, version, "default", plural, obj)
    scale = await custom.get_namespaced_custom_object_scale(
        group, version, "default", plural, "job"
    )
    assert (scale["kind"], scale["spec"]["replicas"]) == ("Scale", 2)
    await custom.patch_namespaced_custom_object_scale(
        group, version, "default", plural, "job", {"spec": {"replicas": 4}}, _content_type=MERGE
    )
    scale["spec"]["replicas"] = 6
    with pytest.raises(ApiException) as exc:
        await custom.replace_namespaced_custom_object_scale(
            group, version, "default", plural, "job", scale
        )
    assert exc.value.status == 409
    stored: Any = await custom.get_namespaced_custom_object(
        group, version, "default", plural, "job"
    )
    for key in path:
        stored = stored[key]
    assert stored == 4


async def test_an_uninstalled_custom_resource_is_404_until_installed() -> None:
    """Without its CRD, list and watch of a kind answer 404 as a real apiserver does: a plain
    "404 page not found" for a group it does not serve, a NotFound Status for an unknown
    resource of a served group; installing the CRD serves it."""
    async with KubeAPIServer(resources=()) as server, ApiClient(Configuration(server.url)) as api:
        custom = client.CustomObjectsApi(api)
        for watching in (False, True):
            with pytest.raises(ApiException) as exc:
                await custom.list_cluster_custom_object(
                    "kubeflow.org", "v1", "pytorchjobs", watch=watching
                )
            assert (exc.value.status, exc.value.body) == (404, "404 page not found\n")
        with pytest.raises(ApiException) as exc:
            await custom.list_cluster_custom_object("apps", "v1", "rollouts")
        assert exc.value.status == 404
        assert json.loads(exc.value.body)["reason"] == "NotFound"
        server.add_resource(PYTORCHJOB)
        listed = await custom.list_cluster_custom_object("kubeflow.org", "v1", "pytorchjobs")
        assert listed["items"] == []


# --- leases and leader election ----------------------------------------------------------------


async def test_lease_create_renew_and_takeover(kube_client: ApiClient) -> None:
    """Lease PUTs renew with the current resourceVersion; a holder with a stale copy gets 409."""
    leases = client.CoordinationV1Api(kube_client)
    await leases.create_namespaced_lease(
        "default",
        {
            "metadata": {"name": "ebbtide"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 1},
        },
    )
    a_copy = await leases.read_namespaced_lease("ebbtide", "default")
    a_copy.spec.renew_time = "2026-12-02T16:00:01.000000Z"
    a_copy = await leases.replace_namespaced_lease("ebbtide", "default", a_copy)
    b_copy = await leases.read_namespaced_lease("ebbtide", "default")
    b_copy.spec.holder_identity = "b"
    await leases.replace_namespaced_lease("ebbtide", "default", b_copy)
    with pytest.raises(ApiException) as exc:
        await leases.replace_namespaced_lease("ebbtide", "default", a_copy)
    assert exc.value.status == 409
    lease = await leases.read_namespaced_lease("ebbtide", "default")
    assert lease.spec.holder_identity == "b"


async def test_leader_election_one_leader_then_takeover(kubeapi: KubeAPIServer) -> None:
    """kubernetes_asyncio's LeaderElection elects one leader; another takes over on expiry."""
    leaders: list[str] = []

    def candidate(identity: str, api: ApiClient) -> leaderelection.LeaderElection:
        async def lead() -> None:
            leaders.append(identity)

        async def stop() -> None:
            return None

        lock = LeaseLock("ebbtide", "default", identity, api)
        return leaderelection.LeaderElection(
            electionconfig.Config(
                lock,
                lease_duration=2,
                renew_deadline=1.5,
                retry_period=1,
                onstarted_leading=lead,
                onstopped_leading=stop,
            )
        )

    async with (
        ApiClient(Configuration(host=kubeapi.url)) as api_a,
        ApiClient(Configuration(host=kubeapi.url)) as api_b,
    ):
        api_b.user_agent = "b"  # to tell b's requests apart in the server's log

        def sent_by_b() -> list[str]:
            return [
                r.method for r in kubeapi.requests if r.user_agent == "b" and "/leases" in r.path
            ]

        task_a = asyncio.create_task(candidate("a", api_a).run())
        await eventually(lambda: _true(leaders == ["a"]))
        task_b = asyncio.create_task(candidate("b", api_b).run())
        # b's third request shows two of its attempts over: both found the lease held and wrote
        # nothing, and b does not lead.
        await kubeapi.until(lambda: len(sent_by_b()) >= 3)
        assert sent_by_b() == ["GET"] * 3
        assert leaders == ["a"]
        task_a.cancel()  # "a" crashes without releasing the lease
        await eventually(lambda: _true(leaders == ["a", "b"]), within=6)
        task_b.cancel()
        await asyncio.gather(task_a, task_b, return_exceptions=True)
    lease = kubeapi.get("Lease", "default", "ebbtide")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "b"


# --- events ------------------------------------------------------------------------------------


async def test_events_core_and_events_v1(kubeapi: KubeAPIServer, kube_client: ApiClient) -> None:
    """Events can be created through core/v1 and events.k8s.io/v1 and found by field."""
    involved = {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "default"}
    await client.CoreV1Api(kube_client).create_namespaced_event(
        "default",
        {
            "metadata": {"generateName": "p."},
            "involvedObject": involved,
            "reason": "Preempted",
            "message": "by ebbtide",
            "type": "Normal",
        },
    )
    await client.EventsV1Api(kube_client).create_namespaced_event(
        "default",
        {
            "metadata": {"generateName": "p."},
            "regarding": involved,
            "eventTime": "2026-12-02T16:00:00.000000Z",
            "reportingController": "ebbtide",
            "reportingInstance": "ebbtide-0",
            "action": "Preempt",
            "reason": "Preempted",
            "note": "by ebbtide",
            "type": "Normal",
        },
    )
    core_events = await client.CoreV1Api(kube_client).list_namespaced_event(
        "default", field_selector="involvedObject.name=p,reason=Preempted"
    )
    assert [e.message for e in core_events.items] == ["by ebbtide"]
    v1_events = kubeapi.objects("events.events.k8s.io")
    assert [e["note"] for e in v1_events] == ["by ebbtide"]


# --- faults and the request log ----------------------------------------------------------------


@pytest.mark.parametrize("code", [500, 429, 409])
async def test_faults_fail_requests_without_changing_state(
    kubeapi: KubeAPIServer, kube_client: ApiClient, code: int
) -> None:
    """A scripted fault answers its status, leaves the object untouched, then runs out."""
    core = client.CoreV1Api(kube_client)
    before = await kubeapi.create(make_pod("p"))
    fault = kubeapi.faults.add(method="PATCH", path_regex=r"/pods/p$", status=code, times=1)
    patch = {"metadata": {"labels": {"x": "y"}}}
    with pytest.raises(ApiException) as exc:
        await core.patch_namespaced_pod("p", "default", patch)
    assert exc.value.status == code
    assert kubeapi.get("pods", "default", "p") == before
    await core.patch_namespaced_pod("p", "default", patch)
    logged = kubeapi.requests_matching(method="PATCH")
    assert [(r.status, r.body) for r in logged] == [(code, patch), (200, patch)]
    assert fault.hits == 1


@pytest.mark.parametrize("commit", [False, True], ids=["abandoned", "committed"])
async def test_fault_delay_times_out_the_client(
    kubeapi: KubeAPIServer, kube_client: ApiClient, commit: bool
) -> None:
    """A delay past the client's timeout is a client timeout; the write is abandoned, or made
    anyway with ``commit=True``."""
    core = client.CoreV1Api(kube_client)
    await kubeapi.create(make_pod("p"))
    kubeapi.faults.add(method="PATCH", status=None, delay=0.5, commit=commit)
    with pytest.raises(asyncio.TimeoutError):
        await core.patch_namespaced_pod(
            "p", "default", {"metadata": {"labels": {"x": "y"}}}, _request_timeout=0.2
        )
    await asyncio.sleep(0.6)  # past the delay: an uncancelled handler would have written by now
    pod = kubeapi.get("pods", "default", "p")
    assert pod is not None
    assert (pod["metadata"]["labels"] == {"x": "y"}) is commit


# --- kubeconfig --------------------------------------------------------------------------------


async def test_kubeconfig_connects_a_client(kubeapi: KubeAPIServer, tmp_path: Path) -> None:
    """A client loading ``write_kubeconfig``'s file reaches the server."""
    path = kubeapi.write_kubeconfig(tmp_path / "kubeconfig")
    configuration = Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    await kubeapi.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    async with ApiClient(configuration) as api:
        namespaces = await client.CoreV1Api(api).list_namespace()
    assert [n.metadata.name for n in namespaces.items] == ["ml"]


# --- MIG manager -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "state", "resources"),
    [
        ("success", "success", {"nvidia.com/mig-1g.10gb": "56"}),
        ("failed", "failed", {"nvidia.com/gpu": "8"}),
        ("never", "pending", {"nvidia.com/gpu": "8"}),
    ],
)
async def test_mig_manager_reconfigures_on_label_change(
    kubeapi: KubeAPIServer,
    kube_client: ApiClient,
    mig_manager: MigManager,
    outcome: Any,
    state: str,
    resources: dict[str, str],
) -> None:
    """Relabelling ``nvidia.com/mig.config`` goes pending, then success, failed or nowhere."""
    mig_manager.script("gpu-1", outcome)
    await kubeapi.create(make_node("gpu-1", gpus=8))
    core = client.CoreV1Api(kube_client)
    rv = (await core.list_node()).metadata.resource_version
    await core.patch_node("gpu-1", {"metadata": {"labels": {CONFIG_LABEL: "all-1g.10gb"}}})
    states: list[str] = []
    async with watch.Watch() as w:
        async for event in w.stream(core.list_node, resource_version=rv, timeout_seconds=1):
            label = event["object"].metadata.labels.get(STATE_LABEL)
            if label and label not in states:
                states.append(label)
            if label == state and state != "pending":
                break
    assert states == (["pending"] if state == "pending" else ["pending", state])
    node = await core.read_node("gpu-1")
    gpu_resources = {k: v for k, v in node.status.allocatable.items() if "nvidia" in k}
    assert gpu_resources == resources
    assert {k: v for k, v in node.status.capacity.items() if "nvidia" in k} == resources


async def test_mig_manager_disables_mig_again(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """``all-disabled`` brings back whole GPUs; an unknown profile fails."""
    node = make_node("gpu-1", gpus=2, labels={CONFIG_LABEL: "all-3g.40gb"})
    await kubeapi.create(node)
    core = client.CoreV1Api(kube_client)

    async def state_is(wanted: str) -> bool:
        labels = (await core.read_node("gpu-1")).metadata.labels
        return bool(labels.get(STATE_LABEL) == wanted)

    await eventually(lambda: state_is("success"))
    assert kubeapi.objects("nodes")[0]["status"]["capacity"]["nvidia.com/mig-3g.40gb"] == "4"
    await core.patch_node("gpu-1", {"metadata": {"labels": {CONFIG_LABEL: "all-disabled"}}})
    await eventually(lambda: state_is("pending"))
    await eventually(lambda: state_is("success"))
    capacity = (await core.read_node("gpu-1")).status.capacity
    assert {k: v for k, v in capacity.items() if "nvidia" in k} == {"nvidia.com/gpu": "2"}
    await core.patch_node("gpu-1", {"metadata": {"labels": {CONFIG_LABEL: "no-such"}}})
    await eventually(lambda: state_is("failed"))
    assert [a[1:] for a in mig_manager.applied] == [
        ("all-3g.40gb", "success"),
        ("all-disabled", "success"),
        ("no-such", "failed"),
    ]

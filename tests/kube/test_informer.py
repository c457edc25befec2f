"""The list+watch informer against the Kubernetes API test server, through the real client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration
from structlog.testing import capture_logs

from controller.kube.informer import Backoff, Change, Informer, Resource
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_node, make_pod
from support.kubeapi_rbac import chart_authorizer

PODS = Resource(plural="pods")
NODES = Resource(plural="nodes", namespaced=False)
PYTORCHJOBS = Resource(group="kubeflow.org", version="v1", plural="pytorchjobs")
FAST = Backoff(base_s=0.02, max_s=0.2)


def names(informer: Informer) -> list[str]:
    return sorted(informer.keys())


async def eventually(check: Callable[[], bool], *, within: float = 5.0) -> None:
    """Poll ``check`` until it is true, failing after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@asynccontextmanager
async def running(informer: Informer, *, sync: bool = True) -> AsyncIterator[Informer]:
    """Run ``informer`` in a task (waiting for its first list), then stop it."""
    task = asyncio.create_task(informer.run(), name="test informer")
    try:
        if sync:
            await asyncio.wait_for(informer.wait_synced(), 5)
        yield informer
    finally:
        informer.stop()
        await asyncio.wait_for(task, 5)


def watches(server: KubeAPIServer, path: str) -> list[Any]:
    return [r for r in server.requests_matching(path_regex=path) if r.query.get("watch")]


def lists(server: KubeAPIServer, path: str) -> list[Any]:
    return [r for r in server.requests_matching(path_regex=path) if not r.query.get("watch")]


async def break_watches(server: KubeAPIServer, *, fail: int | None = None) -> None:
    """End every open watch; with ``fail``, the next ``fail`` watch requests get a 500."""
    if fail is not None:
        server.faults.add(method="GET", path_regex=r"^/api", status=500, times=fail)
    server.store.close()
    await asyncio.sleep(0)


async def test_list_then_watch_follows_create_modify_delete(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """The first LIST fills the store; later creates, patches and deletes arrive by watch."""
    await kubeapi.create(make_pod("before", namespace="ml"))
    seen: list[tuple[str, str]] = []
    informer = Informer(kube_client, PODS, on_change=lambda c: seen.append((c.type, c.key)))
    async with running(informer):
        assert informer.synced
        assert names(informer) == ["ml/before"]
        version = informer.version
        await kubeapi.create(make_pod("a", namespace="ml"))
        await eventually(lambda: "ml/a" in names(informer))
        assert informer.version > version
        await kubeapi.patch("pods", "ml", "a", {"metadata": {"labels": {"x": "y"}}})
        await eventually(lambda: (informer.get("ml/a") or {})["metadata"]["labels"] == {"x": "y"})
        await kubeapi.delete("pods", "ml", "before")
        await eventually(lambda: names(informer) == ["ml/a"])
    assert seen == [
        ("ADDED", "ml/before"),
        ("ADDED", "ml/a"),
        ("MODIFIED", "ml/a"),
        ("DELETED", "ml/before"),
    ]
    watch = watches(kubeapi, "/pods")[0]
    assert watch.query["allowWatchBookmarks"] == "true"
    assert watch.query["resourceVersion"] == "1"
    assert items_have_kind(informer.items(), "Pod")


def items_have_kind(items: list[dict[str, Any]], kind: str) -> bool:
    return all(o["kind"] == kind and o["apiVersion"] for o in items)


async def test_label_and_field_selectors_filter_list_and_watch(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Only matching objects are cached; a relabel moves an object in or out of the store."""
    await kubeapi.create(make_pod("gpu", labels={"team": "ml"}, node="n1"))
    await kubeapi.create(make_pod("web", labels={"team": "web"}, node="n1"))
    await kubeapi.create(make_pod("done", labels={"team": "ml"}, phase="Succeeded"))
    informer = Informer(
        kube_client, PODS, label_selector="team=ml", field_selector="status.phase!=Succeeded"
    )
    async with running(informer):
        assert names(informer) == ["default/gpu"]
        await kubeapi.patch("pods", "default", "web", {"metadata": {"labels": {"team": "ml"}}})
        await eventually(lambda: names(informer) == ["default/gpu", "default/web"])
        await kubeapi.patch("pods", "default", "gpu", {"metadata": {"labels": {"team": "x"}}})
        await kubeapi.patch(
            "pods", "default", "web", {"status": {"phase": "Succeeded"}}, subresource="status"
        )
        await eventually(lambda: names(informer) == [])
    for request in kubeapi.requests_matching(path_regex="/pods"):
        assert request.query["labelSelector"] == "team=ml"
        assert request.query["fieldSelector"] == "status.phase!=Succeeded"


async def test_cluster_scoped_and_custom_resources_in_pages(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Nodes (cluster-scoped) and PyTorchJobs (a group resource) list in pages of ``limit``."""
    for i in range(5):
        await kubeapi.create(make_node(f"node-{i}", gpus=8))
        await kubeapi.create(
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "metadata": {"name": f"job-{i}", "namespace": "ml"},
                "spec": {},
            }
        )
    nodes = Informer(kube_client, NODES, page_size=2)
    jobs = Informer(kube_client, PYTORCHJOBS, page_size=2)
    async with running(nodes), running(jobs):
        assert names(nodes) == [f"node-{i}" for i in range(5)]
        assert names(jobs) == [f"ml/job-{i}" for i in range(5)]
    node_lists = lists(kubeapi, "^/api/v1/nodes$")
    assert [r.query.get("limit") for r in node_lists] == ["2", "2", "2"]
    assert [bool(r.query.get("continue")) for r in node_lists] == [False, True, True]
    assert len(lists(kubeapi, "^/apis/kubeflow.org/v1/pytorchjobs$")) == 3
    assert items_have_kind(jobs.items(), "PyTorchJob")


async def test_namespaces_each_listed_and_watched(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """With namespaces, only those are listed and watched, and the informer syncs when all did."""
    for namespace in ("a", "b", "c"):
        await kubeapi.create(make_pod("p", namespace=namespace))
    informer = Informer(kube_client, PODS, namespaces=("a", "b"))
    async with running(informer):
        assert names(informer) == ["a/p", "b/p"]
        await kubeapi.create(make_pod("q", namespace="b"))
        await kubeapi.create(make_pod("q", namespace="c"))
        await eventually(lambda: names(informer) == ["a/p", "b/p", "b/q"])
    assert {r.path for r in watches(kubeapi, "/pods")} == {
        "/api/v1/namespaces/a/pods",
        "/api/v1/namespaces/b/pods",
    }


@pytest.mark.parametrize("how", ["error-event", "http-410"])
async def test_gone_relists_and_emits_the_missed_changes(
    kubeapi: KubeAPIServer, kube_client: ApiClient, how: str
) -> None:
    """After 410 Gone the informer re-lists, and its store and change stream match the server."""
    for name in ("keep", "change", "drop"):
        await kubeapi.create(make_pod(name))
    replayed: dict[str, dict[str, Any]] = {}

    def follow(change: Change) -> None:
        if change.type == "DELETED":
            replayed.pop(change.key)
        else:
            replayed[change.key] = change.obj

    informer = Informer(kube_client, PODS, on_change=follow, backoff=FAST)
    async with running(informer):
        if how == "http-410":
            kubeapi.faults.add(method="GET", path_regex="/pods", status=410, times=1)
        await break_watches(kubeapi, fail=2 if how == "error-event" else None)
        # Changes the informer cannot see while its watch fails, then the history is gone.
        await kubeapi.patch("pods", "default", "change", {"metadata": {"labels": {"v": "2"}}})
        await kubeapi.delete("pods", "default", "drop")
        await kubeapi.create(make_pod("new"))
        kubeapi.compact()
        await eventually(
            lambda: names(informer) == ["default/change", "default/keep", "default/new"]
        )
        assert (informer.get("default/change") or {})["metadata"]["labels"] == {"v": "2"}
        assert replayed == {key: informer.get(key) for key in names(informer)}
    assert len(lists(kubeapi, "/pods")) == 2


async def test_watch_failures_back_off_and_resume_without_relisting(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Failing watches are retried with growing jittered delays, then resume from the last
    version: the changes made meanwhile arrive without a second LIST."""
    await kubeapi.create(make_pod("a"))
    informer = Informer(kube_client, PODS, backoff=Backoff(base_s=0.02, max_s=1.0))
    with capture_logs() as logs:
        async with running(informer):
            await kubeapi.create(make_pod("seen"))
            await eventually(lambda: "default/seen" in names(informer))
            await break_watches(kubeapi, fail=4)
            await kubeapi.create(make_pod("b"))
            await kubeapi.delete("pods", "default", "a")
            await eventually(lambda: names(informer) == ["default/b", "default/seen"])
    retries = [e for e in logs if e["event"] == "informer.retry"]
    assert [e["failures"] for e in retries] == [1, 2, 3, 4]
    bounds = [0.02 * 2**i for i in range(4)]
    assert all(b / 10 <= e["delay_s"] <= b + 0.001 for e, b in zip(retries, bounds, strict=True))
    assert "500" in retries[0]["error"]
    assert len(lists(kubeapi, "/pods")) == 1
    resumed = watches(kubeapi, "/pods")[-1]
    assert resumed.query["resourceVersion"] == "2"


async def test_watch_that_ends_at_once_counts_as_a_failure(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A watch closed at once without any event is retried after a backoff, not immediately."""
    informer = Informer(kube_client, PODS, backoff=FAST)
    with capture_logs() as logs:
        async with running(informer):
            await eventually(lambda: bool(kubeapi.store.watchers()))
            await break_watches(kubeapi)
            await eventually(lambda: any(e["event"] == "informer.retry" for e in logs))
            await kubeapi.create(make_pod("later"))
            await eventually(lambda: names(informer) == ["default/later"])
    retry = next(e for e in logs if e["event"] == "informer.retry")
    assert "ended at once" in retry["error"]


async def test_list_faults_are_retried_until_synced(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Failing LISTs (500, then a 403) are retried; the informer syncs when the server recovers."""
    await kubeapi.create(make_node("n1", gpus=8))
    kubeapi.faults.add(method="GET", path_regex="/nodes", status=500, times=2)
    kubeapi.faults.add(method="GET", path_regex="/nodes", status=403, times=1)
    informer = Informer(kube_client, NODES, backoff=FAST)
    async with running(informer):
        assert names(informer) == ["n1"]
    assert [r.status for r in lists(kubeapi, "/nodes")] == [500, 500, 403, 200]


async def test_crd_deleted_while_watched_empties_an_optional_informer(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """An optional informer whose CRD is deleted drops its objects (DELETED) when the watch
    answers 404, stays synced, and waits to rediscover the kind."""
    await kubeapi.create(
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j"}}
    )
    seen: list[tuple[str, str]] = []
    gone = asyncio.Event()

    def on_change(change: Change) -> None:
        seen.append((change.type, change.key))
        if change.type == "DELETED":
            gone.set()

    informer = Informer(
        kube_client, PYTORCHJOBS, optional=True, rediscover_s=30.0, on_change=on_change
    )
    async with running(informer):
        assert informer.installed
        kubeapi.remove_resource("pytorchjobs")
        await asyncio.wait_for(gone.wait(), 5)
        assert (names(informer), informer.synced, informer.installed) == ([], True, False)
    assert seen == [("ADDED", "default/j"), ("DELETED", "default/j")]
    assert [r.status for r in watches(kubeapi, "pytorchjobs")][-1] == 404
    assert len(lists(kubeapi, "pytorchjobs")) == 1


async def test_server_down_then_back_catches_up() -> None:
    """While the server is down the informer keeps retrying; when it returns on the same
    address it catches up with what changed meanwhile."""
    first = KubeAPIServer(authorizer=chart_authorizer())
    await first.start()
    port = int(first.url.rsplit(":", 1)[1])
    await first.create(make_pod("a"))
    async with ApiClient(Configuration(host=first.url)) as api:
        informer = Informer(api, PODS, backoff=FAST)
        with capture_logs() as logs:
            async with running(informer):
                await first.close()
                store = first.store
                await eventually(lambda: any(e["event"] == "informer.retry" for e in logs))
                store.create(store.resolve("pods"), "default", make_pod("b"), keep_status=True)
                authorizer = chart_authorizer()
                async with KubeAPIServer(port=port, store=store, authorizer=authorizer) as back:
                    await eventually(lambda: names(informer) == ["default/a", "default/b"])
    assert "transport" in next(e for e in logs if e["event"] == "informer.retry")["error"]
    assert first.forbidden == back.forbidden == []


async def test_cancel_and_stop_leave_no_tasks(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Cancelling ``run()`` mid-watch ends every loop it started; ``stop()`` ends it normally."""
    informer = Informer(kube_client, PODS, namespaces=("a", "b"))
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(informer.wait_synced(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with running(informer):
        assert informer.synced


async def test_store_operations_report_changes_and_move_the_version() -> None:
    """``apply`` and ``replace`` change the store, report the changes and bump ``version`` once
    per batch; re-applying the same resourceVersion is no change."""

    def pod(name: str, rv: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}

    async with ApiClient() as api:
        informer = Informer(api, PODS)
        assert informer.apply("ADDED", pod("a", "1")) is not None
        assert informer.apply("MODIFIED", pod("a", "1")) is None
        assert informer.version == 1
        changes = informer.replace([pod("a", "2"), pod("b", "3")])
        assert [(c.type, c.key) for c in changes] == [("MODIFIED", "ns/a"), ("ADDED", "ns/b")]
        assert informer.version == 2
        assert informer.replace([pod("a", "2"), pod("b", "3")]) == []
        assert informer.version == 2
        assert [(c.type, c.key) for c in informer.replace([])] == [
            ("DELETED", "ns/a"),
            ("DELETED", "ns/b"),
        ]
        assert informer.apply("DELETED", pod("a", "4")) is None
        assert informer.version == 3

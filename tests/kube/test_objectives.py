"""ServiceObjectives over real HTTP: watched only where allowed, status written through the status
subresource at most once a period and only when it changed, the pause annotation read; and the
test API server's status subresource as apiextensions-apiserver serves it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient

from controller.kube.objectives import ObjectiveSync
from support.kubeapi import KubeAPIServer
from support.kubeapi_store import SERVICEOBJECTIVE

STATUS_PATH = r"/serviceobjectives/[^/]+/status$"


def objective(namespace: str, name: str, *, paused: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if paused:
        meta["annotations"] = {"ebbtide.io/paused": "true"}
    return {
        "apiVersion": "ebbtide.io/v1alpha1",
        "kind": "ServiceObjective",
        "metadata": meta,
        "spec": {"pool": "whole", "slo": {"percentile": 99, "objectiveMs": 300}},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _running(sync: ObjectiveSync) -> asyncio.Task[None]:
    task = asyncio.create_task(sync.run())
    async with asyncio.timeout(5):
        await sync.informer.wait_synced()
    return task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.kube_rbac(objectives=["team-a"])
async def test_only_the_allowed_namespaces_are_watched(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """objectives in team-a and team-b, team-a allowed: only team-a's is seen, no request goes
    to team-b (the chart grants nothing there: the fixture fails on any 403), and the paused
    one is reported with the words the status shows."""
    kubeapi.add_resource(SERVICEOBJECTIVE)
    await kubeapi.create(objective("team-a", "search", paused=True))
    await kubeapi.create(objective("team-b", "embed"))
    sync = ObjectiveSync(kube_client, ["team-a"])
    task = await _running(sync)
    try:
        assert [o["metadata"]["name"] for o in sync.objects()] == ["search"]
        assert sync.paused() == {
            "team-a/search": "paused: ServiceObjective team-a/search carries ebbtide.io/paused=true"
        }
        assert not kubeapi.requests_matching(path_regex="/namespaces/team-b/")
    finally:
        await _stop(task)


@pytest.mark.kube_rbac(objectives=["team-a"])
async def test_status_is_written_once_a_period_and_only_when_changed(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """One write for a new status; none for another within the period; one after it; none for
    a status equal to the one the object carries, however long after."""
    kubeapi.add_resource(SERVICEOBJECTIVE)
    await kubeapi.create(objective("team-a", "search"))
    clock = Clock()
    sync = ObjectiveSync(kube_client, ["team-a"], every_s=15, clock=clock)
    task = await _running(sync)

    def writes() -> int:
        return len(kubeapi.requests_matching(method="PATCH", path_regex=STATUS_PATH))

    try:
        first = {"state": "ok", "current": "120ms"}
        assert await sync.write({"team-a/search": first}) == ["team-a/search"]
        stored = kubeapi.get("ServiceObjective", "team-a", "search")
        assert stored is not None
        assert stored["status"] == first
        clock.now += 14.9
        assert await sync.write({"team-a/search": {"state": "ok", "current": "130ms"}}) == []
        clock.now += 0.1
        second = {"state": "breaching", "current": "900ms"}
        cached = asyncio.Event()  # the watch brings the written status into the cache
        sync.informer.on_change = lambda c: cached.set() if c.obj.get("status") == second else None
        assert await sync.write({"team-a/search": second}) == ["team-a/search"]
        async with asyncio.timeout(5):
            await cached.wait()
        clock.now += 100
        assert await sync.write({"team-a/search": dict(second)}) == []
        assert writes() == sync.writes == 2
    finally:
        await _stop(task)


@pytest.mark.kube_rbac(None)
async def test_the_status_subresource_keeps_spec_and_status_apart(kubeapi: KubeAPIServer) -> None:
    """As apiextensions-apiserver serves a CRD with a status subresource: a patch of the object
    leaves .status as stored, a patch of /status leaves everything else (spec, annotations) as
    stored; only a spec change moves metadata.generation."""
    kubeapi.add_resource(SERVICEOBJECTIVE)
    await kubeapi.create(objective("team-a", "search"))
    base = f"{kubeapi.url}/apis/ebbtide.io/v1alpha1/namespaces/team-a/serviceobjectives/search"
    headers = {"Content-Type": "application/merge-patch+json"}
    async with aiohttp.ClientSession() as http:
        body = {"spec": {"slo": {"objectiveMs": 250}}, "status": {"state": "forged"}}
        async with http.patch(base, json=body, headers=headers) as r:
            assert r.status == 200
        after = kubeapi.get("ServiceObjective", "team-a", "search")
        assert after is not None
        assert after["spec"]["slo"]["objectiveMs"] == 250
        assert "status" not in after
        assert after["metadata"]["generation"] == 2
        body = {
            "spec": {"slo": {"objectiveMs": 1}},
            "metadata": {"annotations": {"ebbtide.io/paused": "true"}},
            "status": {"state": "ok"},
        }
        async with http.patch(f"{base}/status", json=body, headers=headers) as r:
            assert r.status == 200
        after = kubeapi.get("ServiceObjective", "team-a", "search")
        assert after is not None
        assert after["status"] == {"state": "ok"}
        assert after["spec"]["slo"]["objectiveMs"] == 250
        assert "annotations" not in after["metadata"]
        assert after["metadata"]["generation"] == 2

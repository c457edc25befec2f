"""ServiceObjectives end to end: `ebbtide run` against the Kubernetes-API test server (authorizing
with the chart's RBAC for ``serviceObjectives.namespaces: [team-a]``), objects in an allowed
namespace and in one that is not, status conditions written through /status and rate-limited,
the pause annotation honoured, and `ebbtide status` showing what the controller did."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest

from support.e2e import World, deployment, eventually, ready, workload_pod
from support.kubeapi_store import SERVICEOBJECTIVE

pytestmark = [pytest.mark.slow, pytest.mark.kube_rbac(objectives=["team-a"])]

EVERY_S = 2.0
"""The status period: a writer without the limit writes about every evaluation here."""
STATUS = r"/serviceobjectives/[^/]+/status$"
SEARCH = {
    "pool": "whole",
    "gpusPerReplica": 1,
    "replicas": {"min": 1, "max": 3},
    "slo": {"percentile": 99, "objectiveMs": 300, "window": "8s", "resolution": "1s",
            "breachAfter": "2s", "recoverAfter": "2s", "minSamples": 10},
    "scale": {"maxStep": 1},
}  # fmt: skip


def service_objective(namespace: str, name: str, spec: dict[str, Any], *,
                      paused: bool = False) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if paused:
        meta["annotations"] = {"ebbtide.io/paused": "true"}
    return {"apiVersion": "ebbtide.io/v1alpha1", "kind": "ServiceObjective", "metadata": meta,
            "spec": spec}  # fmt: skip


_CALLS = itertools.count()


def slow_search(world: World) -> None:
    """Slow requests for team-a/search, 10 % slower on each call: the percentile, and so the
    status a writer without a rate limit would write, moves on every call."""
    latency_ms = 500.0 * 1.1 ** next(_CALLS)
    events = [
        {"type": "inference.latency", "ts": time.time(), "service": "search",
         "namespace": "team-a", "samples_ms": [latency_ms] * 20}
        for _ in range(20)
    ]  # fmt: skip
    world.produce("ebbtide.inference.latency", events, "team-a/search")


def service(data: dict[str, Any], key: str) -> dict[str, Any]:
    (found,) = [s for s in data["services"] if s["service"] == key]
    return found


def conditions(world: World, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    obj = world.kubeapi.get("ServiceObjective", namespace, name)
    assert obj is not None
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or ()}


async def test_objectives_join_the_policy_report_their_status_and_pause(world: World) -> None:
    kubeapi = world.kubeapi
    kubeapi.add_resource(SERVICEOBJECTIVE)
    await kubeapi.create(deployment("team-a", "search", 1, labels={"app": "search"}))
    await kubeapi.create(workload_pod("team-a", "search", 0, "gpu-2", {"app": "search"}))
    await kubeapi.create(service_objective("team-a", "search", SEARCH, paused=True))
    await kubeapi.create(service_objective("team-a", "chat", SEARCH))  # the policy's name
    await kubeapi.create(service_objective("team-b", "embed", SEARCH))  # namespace not allowed
    controller = world.start(
        env={
            "EBBTIDE_KUBE__OBJECTIVE_NAMESPACES": '["team-a"]',
            "EBBTIDE_KUBE__OBJECTIVE_STATUS_EVERY_S": str(EVERY_S),
        }
    )
    started = time.monotonic()
    await ready(controller)
    (start,) = [
        json.loads(line) for line in controller.log.read_text().splitlines()
        if '"controller.started"' in line
    ]  # fmt: skip
    assert start["rewind_s"] == 8 + 30  # search's window (the files' is 4s) + the margin

    # Paused: breaching, decided, refused as paused; nothing changes in the cluster.
    def paused_and_breaching() -> bool:
        search = service(controller.status(), "team-a/search")
        return search["state"] == "breaching" and search["lastDecision"] is not None

    await eventually(paused_and_breaching, 30, lambda: slow_search(world))
    search = service(controller.status(), "team-a/search")
    pause = "paused: ServiceObjective team-a/search carries ebbtide.io/paused=true"
    assert search["paused"] is True
    assert search["blockedBy"][0] == pause
    assert search["source"] == "ServiceObjective team-a/search"
    assert search["lastDecision"]["outcome"] == "refused"
    assert world.replicas("team-a", "search") == 1

    await eventually(
        lambda: (
            conditions(world, "team-a", "search").get("AbleToScale", {}).get("reason") == "Paused"
        ),
        10,
        lambda: slow_search(world),
    )
    obj = kubeapi.get("ServiceObjective", "team-a", "search")
    assert obj is not None
    assert obj["status"]["paused"] is True
    assert obj["status"]["objective"] == "P99 <= 300ms"
    assert obj["spec"] == SEARCH  # the controller never writes a team's spec
    ready_ = conditions(world, "team-a", "search")["Ready"]
    assert (ready_["status"], ready_["reason"]) == ("True", "Accepted")
    taken = conditions(world, "team-a", "chat")["Ready"]
    assert (taken["status"], taken["reason"]) == ("False", "NameTaken")
    assert "already defined by the policy file (namespace serving), which wins" in taken["message"]

    shown = controller.status_cli()  # what a user sees matches what the controller did
    assert service(shown, "team-a/search")["blockedBy"][0] == pause
    assert service(shown, "serving/chat")["source"] == "policy file"
    verdicts = {o["object"]: (o["accepted"], o["reason"]) for o in shown["objectives"]}
    assert verdicts == {"team-a/chat": (False, "NameTaken"), "team-a/search": (True, "Accepted")}

    # Unpaused: the breach scales search up, and its status says so.
    await kubeapi.patch(
        "ServiceObjective", "team-a", "search",
        {"metadata": {"annotations": {"ebbtide.io/paused": "false"}}},
    )  # fmt: skip
    await eventually(lambda: world.replicas("team-a", "search") > 1, 30, lambda: slow_search(world))

    def status_shows_the_scale() -> bool:
        st = (kubeapi.get("ServiceObjective", "team-a", "search") or {}).get("status") or {}
        return st.get("paused") is False and st.get("lastDecision", "").startswith(
            "scale team-a/search "
        )

    await eventually(status_shows_the_scale, 15, lambda: slow_search(world))
    search = service(controller.status_cli("team-a/search"), "team-a/search")
    assert search["paused"] is False
    last = search["lastDecision"]
    assert (last["action"], last["target"]) == ("scale", "team-a/search")
    assert last["to"] > 1
    assert controller.metric("ebbtide_service_objectives", reason="NameTaken") == 1
    assert controller.metric("ebbtide_service_objectives", reason="Accepted") == 1
    counted = controller.metric("ebbtide_objective_status_writes_total")
    assert 2 <= counted <= len(kubeapi.requests_matching(method="PATCH", path_regex=STATUS))
    elapsed = time.monotonic() - started
    assert controller.stop() == 0

    # Rate-limited: at most one write per object per period, each one a change.
    for name in ("search", "chat"):
        writes = kubeapi.requests_matching(
            method="PATCH", path_regex=f"/namespaces/team-a/serviceobjectives/{name}/status$"
        )
        assert 1 <= len(writes) <= elapsed / EVERY_S + 1, (name, len(writes), elapsed)
        bodies = [json.dumps(w.body, sort_keys=True) for w in writes]
        assert all(a != b for a, b in itertools.pairwise(bodies)), name
    # Never watched, never written: the namespace the chart does not allow.
    assert not kubeapi.requests_matching(path_regex="/namespaces/team-b/")
    embed = kubeapi.get("ServiceObjective", "team-b", "embed")
    assert embed is not None
    assert "status" not in embed
    assert not kubeapi.requests_matching(method="PATCH", path_regex=r"/serviceobjectives/[^/]+$")

"""The controller merges the ServiceObjectives it watches with the policy files: an object joins
as a service, an edit re-specs it, a deleted one leaves, a refused one stays out (its verdict
logged once), and a reload of the files keeps the objects merged."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from controller.kube.kube_runtime import KubeRuntime
from controller.process.app import Controller, load_policy_files
from controller.process.settings import load_settings
from support.e2e import HERE
from support.kubeapi import KubeAPIServer
from support.kubeapi_store import SERVICEOBJECTIVE

pytestmark = pytest.mark.kube_rbac(objectives=["team-a"])

SPEC = {"pool": "whole", "replicas": {"max": 3}, "slo": {"percentile": 99, "objectiveMs": 300}}


def objective(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "ebbtide.io/v1alpha1", "kind": "ServiceObjective",
            "metadata": {"name": name, "namespace": "team-a"}, "spec": spec}  # fmt: skip


@pytest.fixture
async def controller(kubeapi: KubeAPIServer, tmp_path: Path) -> AsyncIterator[Controller]:
    """A controller over a synced KubeRuntime watching team-a's ServiceObjectives."""
    kubeapi.add_resource(SERVICEOBJECTIVE)
    policy = tmp_path / "policy.yaml"
    policy.write_text((HERE / "policy.yaml").read_text())
    settings = load_settings(
        policies=[policy],
        kube={"kubeconfig": kubeapi.write_kubeconfig(tmp_path / "kubeconfig"),
              "lease_namespace": "ebbtide-system", "objective_namespaces": ["team-a"]},
        http={"address": "127.0.0.1:0"},
        dry_run=False,
    )  # fmt: skip
    loaded = load_policy_files(settings)
    runtime = await KubeRuntime.connect(settings.kube, loaded, dry_run=False)
    task = asyncio.create_task(runtime.run())
    try:
        deadline = time.monotonic() + 10
        while not runtime.cluster.synced:
            assert time.monotonic() < deadline, "the runtime did not sync in time"
            await asyncio.sleep(0.02)
        yield Controller(settings, runtime, loaded, objectives=runtime.objectives)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await runtime.close()


async def _moved(controller: Controller, version: int) -> None:
    """Wait until the objectives' cache moved past ``version`` (a watch event arrived)."""
    objectives = controller.objectives
    assert objectives is not None
    deadline = time.monotonic() + 5
    while objectives.version == version:
        assert time.monotonic() < deadline, "the watch did not deliver the change"
        await asyncio.sleep(0.02)


async def test_objects_join_change_and_leave_the_policy(
    kubeapi: KubeAPIServer, controller: Controller, tmp_path: Path
) -> None:
    objectives = controller.objectives
    assert objectives is not None
    assert sorted(controller.policy.spec.services) == ["chat"]

    version = objectives.version
    await kubeapi.create(objective("search", SPEC))
    await kubeapi.create(objective("chat", SPEC))
    await kubeapi.create(objective("embed", {**SPEC, "pool": "gpu"}))
    await _moved(controller, version)
    with structlog.testing.capture_logs() as logs:
        assert controller.merge_objectives()
        assert not controller.merge_objectives()  # nothing moved: nothing to do
    services = controller.policy.spec.services
    assert sorted(services) == ["chat", "search"]
    assert services["chat"].namespace == "serving"  # the policy file's chat wins
    assert services["search"].namespace == "team-a"
    assert controller.engine.policy is controller.policy
    refused = {e["object"]: e["reason"] for e in logs if e["event"] == "objective.refused"}
    assert refused == {"team-a/chat": "NameTaken", "team-a/embed": "InvalidSpec"}
    assert [e["object"] for e in logs if e["event"] == "objective.accepted"] == ["team-a/search"]

    version = objectives.version
    await kubeapi.patch("ServiceObjective", "team-a", "search",
                        {"spec": {"slo": {"objectiveMs": 250}}})  # fmt: skip
    await _moved(controller, version)
    with structlog.testing.capture_logs() as logs:
        assert controller.merge_objectives()
    assert controller.policy.spec.services["search"].slo.objective_ms == 250
    assert [e["event"] for e in logs] == []  # verdicts unchanged: nothing to say

    policy = controller.settings.policies[0]
    policy.write_text(policy.read_text().replace("objectiveMs: 300", "objectiveMs: 350"))
    assert controller.reload()
    services = controller.policy.spec.services
    assert (services["chat"].slo.objective_ms, services["search"].slo.objective_ms) == (350, 250)

    version = objectives.version
    await kubeapi.delete("ServiceObjective", "team-a", "search")
    await _moved(controller, version)
    with structlog.testing.capture_logs() as logs:
        assert controller.merge_objectives()
    assert sorted(controller.policy.spec.services) == ["chat"]
    assert [(e["event"], e["object"]) for e in logs] == [("objective.removed", "team-a/search")]


async def test_only_the_leader_writes_status(
    kubeapi: KubeAPIServer, controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every replica merges; a follower writes no status, the leader writes each object's (the
    refused one's too: its Ready condition says why)."""
    objectives = controller.objectives
    assert objectives is not None
    version = objectives.version
    await kubeapi.create(objective("search", SPEC))
    await kubeapi.create(objective("chat", SPEC))
    await _moved(controller, version)
    assert controller.merge_objectives()
    monkeypatch.setattr(controller.runtime, "is_leader", lambda: False)
    assert await controller.write_objective_status() == []
    assert not kubeapi.requests_matching(method="PATCH", path_regex="/status$")
    monkeypatch.setattr(controller.runtime, "is_leader", lambda: True)
    assert await controller.write_objective_status() == ["team-a/chat", "team-a/search"]
    chat = kubeapi.get("ServiceObjective", "team-a", "chat")
    assert chat is not None
    (ready,) = [c for c in chat["status"]["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "NameTaken")
    search = kubeapi.get("ServiceObjective", "team-a", "search")
    assert search is not None
    assert search["status"]["objective"] == "P99 <= 300ms"
    assert search["status"]["observedGeneration"] == 1

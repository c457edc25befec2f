"""MIG conversion flows over real HTTP with the fake MIG manager: happy path, manager failure,
manager silence, drain problems, and a controller restarted mid-way that resumes from the node's
annotation without repeating evictions or relabels."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from controller.kube.actuator import ApiLimits, KubeActuator, MigFlowSettings
from controller.kube.kube_runtime import KubeRuntime
from controller.kube.migflow import CONFIG_LABEL, FLOW_ANNOTATION, STATE_LABEL
from controller.loop.gate import SafetyGate
from controller.loop.port import ActionResult, Outcome
from controller.process.settings import Settings
from policies.decisions import Explanation, MigConvert, MigRevert
from policies.model import Policy
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_node, make_pod
from support.mig_manager import MigManager

Obj = dict[str, Any]
TRAINING = {"ebbtide.io/class": "training"}
WHOLE = {"ebbtide.io/pool": "whole"}
MIG = {"ebbtide.io/pool": "mig"}
TARGET = "all-1g.10gb"
WHY = Explanation.of(
    "mig-convert-idle",
    "whole pool at 3% < 20% for 30m; convert gpu-1",
    inputs={"pool_util_pct": 3.0},
    thresholds={"convert_below": "20%"},
)


def policy(**spec: Any) -> Policy:
    body: dict[str, Any] = {
        "pools": {
            "whole": {"nodeSelector": dict(WHOLE)},
            "mig": {"nodeSelector": dict(MIG), "kind": "mig"},
        },
        "training": {"selector": dict(TRAINING), "gracePeriod": "5s"},
        "mig": {
            "fromPool": "whole",
            "toPool": "mig",
            "convertBelow": "20%",
            "convertAfter": "10m",
            "profiles": {"A100-80GB": TARGET},
            "revertAfter": "2m",
        },
        **spec,
    }
    meta = {"name": "test"}
    return Policy.model_validate(
        {"apiVersion": "ebbtide.io/v1alpha1", "kind": "Policy", "metadata": meta, "spec": body}
    )


def actuator(
    api: ApiClient,
    server: KubeAPIServer,
    *,
    dry_run: bool = False,
    drain_s: float = 30.0,
    reconfigure_s: float = 30.0,
    pol: Policy | None = None,
) -> KubeActuator:
    """A fresh actuator, as after a controller restart: its own gate, ledger and recorder. Its
    node cache is the server's store (the runtime hands it the node informer's)."""
    return KubeActuator(
        api,
        SafetyGate(pol or policy(), dry_run=dry_run),
        nodes=lambda: server.objects("nodes"),
        limits=ApiLimits(timeout_s=1.0, attempts=4, deadline_s=5.0),
        mig=MigFlowSettings(drain_timeout_s=drain_s, reconfigure_timeout_s=reconfigure_s),
    )


def convert(node: str = "gpu-1") -> MigConvert:
    return MigConvert(1.0, node, TARGET, "A100-80GB", WHY)


async def gpu_node(
    server: KubeAPIServer, *, labels: Obj | None = None, cordoned: bool = False
) -> None:
    mig = {CONFIG_LABEL: "all-disabled", STATE_LABEL: "success"}
    node = make_node("gpu-1", gpus=8, labels={**WHOLE, **mig, **(labels or {})})
    if cordoned:
        node["spec"]["unschedulable"] = True
    await server.create(node)


async def gpu_pod(server: KubeAPIServer, name: str, *, ns: str = "ml", **labels: str) -> None:
    pod = make_pod(name, namespace=ns, labels={**TRAINING, **labels}, node="gpu-1", gpus=1)
    await server.create(pod)


async def block_with_pdb(server: KubeAPIServer) -> None:
    await server.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "train"}}, "minAvailable": 1},
        }
    )


async def drive(act: KubeActuator, *, within: float = 5.0) -> ActionResult:
    """Tick ``resume_all`` until a flow finishes (APPLIED) or rolls back (FAILED)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for result in await act.resume_all():
            if result.outcome in (Outcome.APPLIED, Outcome.FAILED):
                return result
        await asyncio.sleep(0.02)
    raise AssertionError("the MIG flow did not finish in time")


def node_of(server: KubeAPIServer) -> Obj:
    node = server.get("nodes", None, "gpu-1")
    assert node is not None
    return node


def reasons(server: KubeAPIServer) -> list[str]:
    return sorted(e["reason"] for e in server.objects("events"))


def config_writes(server: KubeAPIServer, value: str) -> int:
    """Node patches that set ``nvidia.com/mig.config`` to ``value``."""
    return sum(
        1
        for r in server.requests
        if r.method == "PATCH"
        and r.path == "/api/v1/nodes/gpu-1"
        and r.status == 200
        and ((r.body or {}).get("metadata") or {}).get("labels", {}).get(CONFIG_LABEL) == value
    )


def evictions(server: KubeAPIServer) -> list[int | None]:
    return [r.status for r in server.requests if r.path.endswith("/eviction")]


def assert_released(node: Obj) -> None:
    """Uncordoned and without a flow record."""
    assert not node["spec"].get("unschedulable")
    assert FLOW_ANNOTATION not in (node["metadata"].get("annotations") or {})


async def test_conversion_happy_path(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """Cordon, evict the GPU pod, relabel, success: the node is MIG, in the MIG pool, open."""
    await gpu_node(kubeapi)
    await gpu_pod(kubeapi, "train-0")
    await kubeapi.create(make_pod("agent", namespace="kube-system", node="gpu-1"))
    act = actuator(kube_client, kubeapi)
    [started] = await act.apply([convert()])
    assert started.outcome is Outcome.IN_PROGRESS
    done = await drive(act)
    assert done.outcome is Outcome.APPLIED
    node = node_of(kubeapi)
    labels = node["metadata"]["labels"]
    assert (labels[CONFIG_LABEL], labels[STATE_LABEL], labels["ebbtide.io/pool"]) == (
        TARGET,
        "success",
        "mig",
    )
    assert node["status"]["capacity"]["nvidia.com/mig-1g.10gb"] == "56"
    assert_released(node)
    assert kubeapi.get("pods", "ml", "train-0") is None
    assert kubeapi.get("pods", "kube-system", "agent") is not None  # not a GPU pod: stays
    assert reasons(kubeapi) == [
        "EbbtideEvicted",
        "EbbtideMigConverted",
        "EbbtideMigConverting",
        "EbbtideMigReconfiguring",
    ]
    now = act.gate.now()
    assert act.gate.budgets.mig_conversions.used(now) == 1
    assert act.gate.budgets.evictions.used(now) == 1
    assert act.stats.total(action="mig_convert", outcome=Outcome.APPLIED) == 1


async def test_revert_happy_path(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """A MIG node goes back to all-disabled and the whole-card pool."""
    await gpu_node(kubeapi, labels={**MIG, CONFIG_LABEL: TARGET})
    act = actuator(kube_client, kubeapi)
    [started] = await act.apply([MigRevert(1.0, "gpu-1", TARGET, WHY)])
    assert started.outcome is Outcome.IN_PROGRESS
    assert (await drive(act)).outcome is Outcome.APPLIED
    node = node_of(kubeapi)
    labels = node["metadata"]["labels"]
    assert (labels[CONFIG_LABEL], labels["ebbtide.io/pool"]) == ("all-disabled", "whole")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert_released(node)


async def settled(manager: MigManager, *, within: float = 5.0) -> None:
    """The manager has applied the layout a new node came with (it reacts to the creation)."""
    deadline = time.monotonic() + within
    while not manager.applied:
        assert time.monotonic() < deadline, "the MIG manager never saw the node"
        await asyncio.sleep(0.02)


async def reconfigured(manager: MigManager, node: str, config: str, *, within: float = 5.0) -> None:
    """The manager has reconfigured ``node`` to ``config`` and reported success."""
    deadline = time.monotonic() + within
    while (node, config, "success") not in manager.applied:
        assert time.monotonic() < deadline, f"the MIG manager never applied {config} to {node}"
        await asyncio.sleep(0.02)


async def settle_restore(act: KubeActuator, server: KubeAPIServer, *, within: float = 5.0) -> None:
    """Tick ``resume_all`` until the rolled-back flow's record is gone."""
    deadline = time.monotonic() + within
    while FLOW_ANNOTATION in (node_of(server)["metadata"].get("annotations") or {}):
        assert time.monotonic() < deadline, "the rolled-back flow never settled"
        await act.resume_all()
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    ("outcome", "settings", "why"),
    [
        ("failed", {}, "reported failed"),
        ("never", {"reconfigure_s": 1.0}, "did not report success within 1s"),
    ],
    ids=["manager-failed", "manager-never-answers"],
)
async def test_manager_failure_or_silence_rolls_back_and_waits_for_the_old_layout(
    kubeapi: KubeAPIServer,
    kube_client: ApiClient,
    mig_manager: MigManager,
    outcome: Any,
    settings: Obj,
    why: str,
) -> None:
    """Manager failed or silent past the deadline: the flow fails (Warning), its config label
    is restored, and the node stays cordoned until the manager reports the old layout back;
    only then is it uncordoned."""
    await gpu_node(kubeapi)
    await settled(mig_manager)
    mig_manager.script("gpu-1", outcome, then="success")
    act = actuator(kube_client, kubeapi, **settings)
    await act.apply([convert()])
    done = await drive(act)
    assert done.outcome is Outcome.FAILED
    assert why in done.detail
    node = node_of(kubeapi)
    assert node["metadata"]["labels"][CONFIG_LABEL] == "all-disabled"
    assert node["spec"].get("unschedulable") is True, "uncordoned before the old layout is back"
    assert json.loads(node["metadata"]["annotations"][FLOW_ANNOTATION])["phase"] == "restoring"
    await settle_restore(act, kubeapi)
    node = node_of(kubeapi)
    assert node["metadata"]["labels"][STATE_LABEL] == "success"
    assert node["metadata"]["labels"]["ebbtide.io/pool"] == "whole"
    assert_released(node)
    assert mig_manager.applied[-1] == ("gpu-1", "all-disabled", "success")
    [warning] = [e for e in kubeapi.objects("events") if e["type"] == "Warning"]
    assert warning["reason"] == "EbbtideMigFailed"
    assert "[mig-convert-idle]" in warning["message"]
    assert "EbbtideMigRestored" in reasons(kubeapi)
    assert act.stats.mig_failures == 1


@pytest.mark.parametrize("restore", ["failed", "never"])
async def test_an_old_layout_not_restored_leaves_the_node_cordoned_for_an_operator(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager, restore: Any
) -> None:
    """When the manager cannot put the old layout back either, the node is not uncordoned
    onto cards in an unknown state: it stays cordoned, the record goes, a Warning says why."""
    await gpu_node(kubeapi)
    await settled(mig_manager)
    mig_manager.script("gpu-1", "failed", then=restore)
    act = actuator(kube_client, kubeapi, reconfigure_s=0.5)
    await act.apply([convert()])
    assert (await drive(act)).outcome is Outcome.FAILED
    await settle_restore(act, kubeapi)
    node = node_of(kubeapi)
    assert node["spec"].get("unschedulable") is True
    assert node["metadata"]["labels"][CONFIG_LABEL] == "all-disabled"
    [gave_up] = [e for e in kubeapi.objects("events") if e["reason"] == "EbbtideMigRestoreFailed"]
    assert gave_up["type"] == "Warning"
    assert "check its GPUs, then uncordon it" in gave_up["message"]


async def test_previously_cordoned_node_stays_cordoned(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """A node an operator had cordoned is converted and left cordoned, as it was."""
    await gpu_node(kubeapi, cordoned=True)
    act = actuator(kube_client, kubeapi)
    await act.apply([convert()])
    assert (await drive(act)).outcome is Outcome.APPLIED
    node = node_of(kubeapi)
    assert node["spec"]["unschedulable"] is True
    assert FLOW_ANNOTATION not in node["metadata"].get("annotations", {})


async def test_protected_gpu_pod_rolls_back_before_any_eviction(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """A GPU pod that may not be disrupted aborts the drain: no eviction, node released."""
    await gpu_node(kubeapi)
    await gpu_pod(kubeapi, "train-0")
    await gpu_pod(kubeapi, "keep", ns="kube-system")
    [result] = await actuator(kube_client, kubeapi).apply([convert()])
    assert result.outcome is Outcome.FAILED
    assert "kube-system/keep may not be disrupted" in result.detail
    assert evictions(kubeapi) == []
    assert_released(node_of(kubeapi))
    assert node_of(kubeapi)["metadata"]["labels"][CONFIG_LABEL] == "all-disabled"


async def test_inference_gpu_pod_rolls_back_before_any_eviction(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """A pod of an inference service's Deployment blocks the drain even when it carries the
    training label: the drain follows the rule the engine plans with (policies.drain)."""
    await gpu_node(kubeapi)
    await gpu_pod(kubeapi, "train-0")
    chat = make_pod(
        "chat-7d9f-x1",
        namespace="serving",
        labels={**TRAINING, "pod-template-hash": "7d9f"},
        node="gpu-1",
        gpus=1,
    )
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "chat-7d9f", "controller": True}
    chat["metadata"]["ownerReferences"] = [owner]
    await kubeapi.create(chat)
    service = {
        "namespace": "serving",
        "pool": "whole",
        "slo": {"percentile": 99, "objectiveMs": 100},
    }
    act = actuator(kube_client, kubeapi, pol=policy(services={"chat": service}))
    [result] = await act.apply([convert()])
    assert result.outcome is Outcome.FAILED
    assert "serving/chat-7d9f-x1 may not be disrupted: pod of inference service" in result.detail
    assert evictions(kubeapi) == []
    assert_released(node_of(kubeapi))


async def test_pdb_blocked_drain_waits_then_times_out(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """A PDB keeps the flow draining, never deleted around, until the deadline rolls it back."""
    await gpu_node(kubeapi)
    await gpu_pod(kubeapi, "train-0", app="train")
    await block_with_pdb(kubeapi)
    act = actuator(kube_client, kubeapi, drain_s=0.3)
    [started] = await act.apply([convert()])
    assert started.outcome is Outcome.IN_PROGRESS
    assert "1 GPU pods left" in started.detail
    done = await drive(act)
    assert done.outcome is Outcome.FAILED
    assert "not drained within" in done.detail
    assert kubeapi.get("pods", "ml", "train-0") is not None
    assert set(evictions(kubeapi)) == {429}
    assert config_writes(kubeapi, TARGET) == 0
    assert_released(node_of(kubeapi))


@pytest.mark.parametrize("switch", ["kill_switch", "dry_run"])
async def test_kill_switch_or_dry_run_mid_drain_releases_the_node(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager, switch: str
) -> None:
    """Turned on while a drain waits on a PDB, the kill switch or dry-run stops the flow: no
    further eviction, no MIG label change, and the node is uncordoned with its record gone
    rather than left cordoned until someone notices."""
    await gpu_node(kubeapi)
    await gpu_pod(kubeapi, "train-0", app="train")
    await block_with_pdb(kubeapi)
    act = actuator(kube_client, kubeapi)
    [started] = await act.apply([convert()])
    assert started.outcome is Outcome.IN_PROGRESS
    setattr(act.gate, switch, True)
    [released] = await act.resume_all()
    assert released.outcome is Outcome.FAILED
    assert "released" in released.detail
    assert_released(node_of(kubeapi))
    assert evictions(kubeapi) == [429]
    assert config_writes(kubeapi, TARGET) == 0
    assert await act.resume_all() == []


async def test_restart_while_reconfiguring_resumes_without_repeating(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """A new actuator finishes the flow from the annotation: one eviction, one relabel."""
    mig_manager.script("gpu-1", "success", delay=0.4)
    await gpu_node(kubeapi)
    await settled(mig_manager)  # its reaction to the new node is not the flow's
    mig_manager.applied.clear()
    await gpu_pod(kubeapi, "train-0")
    first = actuator(kube_client, kubeapi)
    [started] = await first.apply([convert()])
    assert "waiting for the MIG manager" in started.detail
    record = json.loads(node_of(kubeapi)["metadata"]["annotations"][FLOW_ANNOTATION])
    assert (record["phase"], record["target"], record["previous"]) == (
        "reconfiguring",
        TARGET,
        "all-disabled",
    )
    assert record["was_cordoned"] is False
    assert record["previous_pool"] == {"ebbtide.io/pool": "whole"}
    second = actuator(kube_client, kubeapi)  # the restarted controller
    done = await drive(second)
    assert done.outcome is Outcome.APPLIED
    assert done.decision.explanation.rule == "mig-convert-idle"  # rebuilt from the annotation
    assert_released(node_of(kubeapi))
    assert config_writes(kubeapi, TARGET) == 1
    assert evictions(kubeapi) == [201]
    assert mig_manager.applied == [("gpu-1", TARGET, "success")]
    assert second.gate.budgets.mig_conversions.used(second.gate.now()) == 0


async def test_restart_while_draining_resumes_the_drain(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """Restarted while a PDB held the drain, the new actuator evicts once the PDB allows it."""
    await gpu_node(kubeapi)
    await gpu_pod(kubeapi, "train-0", app="train")
    await block_with_pdb(kubeapi)
    [started] = await actuator(kube_client, kubeapi).apply([convert()])
    assert started.outcome is Outcome.IN_PROGRESS
    await kubeapi.delete("PodDisruptionBudget", "ml", "train")
    second = actuator(kube_client, kubeapi)
    assert (await drive(second)).outcome is Outcome.APPLIED
    assert evictions(kubeapi) == [429, 201]
    assert config_writes(kubeapi, TARGET) == 1
    assert_released(node_of(kubeapi))


async def test_dry_run_and_already_done_write_nothing_to_the_node(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """Dry-run reports "would" on the node; a node already converted is ALREADY_DONE."""
    await gpu_node(kubeapi)
    [would] = await actuator(kube_client, kubeapi, dry_run=True).apply([convert()])
    assert would.outcome is Outcome.DRY_RUN
    assert "would cordon gpu-1" in would.detail
    assert reasons(kubeapi) == ["EbbtideWouldConvertMig"]
    await kubeapi.patch(
        "nodes", None, "gpu-1", {"metadata": {"labels": {**MIG, CONFIG_LABEL: TARGET}}}
    )
    await reconfigured(mig_manager, "gpu-1", TARGET)
    [done] = await actuator(kube_client, kubeapi).apply([convert()])
    assert done.outcome is Outcome.ALREADY_DONE
    assert [r for r in kubeapi.requests if r.method == "PATCH"] == []


@contextlib.asynccontextmanager
async def held_drain(
    kubeapi: KubeAPIServer, kube_client: ApiClient, tmp_path: Path
) -> AsyncIterator[KubeRuntime]:
    """A leading runtime (settings from the environment) whose conversion of gpu-1 has started
    and is held in its drain by a PDB on its one GPU pod; stopped on exit."""
    await gpu_node(kubeapi)
    await gpu_pod(kubeapi, "train-0", app="train")
    await block_with_pdb(kubeapi)
    # The production lease timings: nothing competes for the lease, and a 2 s one is lost on a
    # loaded machine.
    settings = Settings(
        policies=[tmp_path / "p.yaml"], kube={"lease_namespace": "ebbtide-system"}, dry_run=False
    )
    runtime = KubeRuntime(
        kube_client, settings.kube, policy(), dry_run=settings.dry_run_for(policy())
    )
    task = asyncio.create_task(runtime.run(), name="runtime")
    try:
        await kubeapi.until(lambda: runtime.is_leader() and runtime.state.synced)
        [started] = await runtime.cluster.apply([convert()])
        assert started.outcome is Outcome.IN_PROGRESS
        yield runtime
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        runtime.state.stop()


async def test_ticks_find_flows_in_the_watch_cache_and_list_no_nodes(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager, tmp_path: Path
) -> None:
    """The runtime's ticks find flows in the node informer's cache: while a PDB holds a drain,
    every tick advances the flow (one eviction try) and none LISTs nodes."""
    async with held_drain(kubeapi, kube_client, tmp_path) as runtime:
        listed = len(node_lists(kubeapi))
        for _ in range(5):
            [tick] = await runtime.tick(0.0)
            assert "1 GPU pods left" in tick.detail
    assert evictions(kubeapi) == [429] * 6
    assert len(node_lists(kubeapi)) == listed == 1


def node_lists(server: KubeAPIServer) -> list[Any]:
    """Node LISTs (not watches, not GETs of one node)."""
    return [
        r
        for r in server.requests_matching(method="GET", path_regex=r"^/api/v1/nodes$")
        if not r.query.get("watch")
    ]


async def test_the_flow_deadlines_come_from_the_settings(
    kubeapi: KubeAPIServer,
    kube_client: ApiClient,
    mig_manager: MigManager,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """EBBTIDE_KUBE__MIG_DRAIN_TIMEOUT_S reaches the runtime's MIG flow: a drain a PDB holds is
    rolled back once 0.5 s (not the default 10 minutes) have passed."""
    monkeypatch.setenv("EBBTIDE_KUBE__MIG_DRAIN_TIMEOUT_S", "0.5")
    async with held_drain(kubeapi, kube_client, tmp_path) as runtime:
        await asyncio.sleep(0.6)
        [late] = await runtime.tick(0.0)
    assert "not drained within 0.5s" in late.detail, late.detail

"""The MIG flow under the MIG manager's own semantics, over real HTTP with the fake manager:
``rebooting`` extends the deadline (and survives a restart), ``success`` waits for the device
plugin to advertise the layout, mixed layouts, pool taints, and the autoscaler annotations held
while the flow runs."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from test_migflow import (
    MIG,
    TARGET,
    WHOLE,
    WHY,
    assert_released,
    convert,
    drive,
    gpu_node,
    node_of,
    policy,
    settle_restore,
    settled,
)

from controller.kube.actuator import ApiLimits, KubeActuator, MigFlowSettings
from controller.kube.migannotation import AUTOSCALER_HOLD
from controller.kube.migflow import CONFIG_LABEL, FLOW_ANNOTATION, STATE_LABEL
from controller.loop.gate import SafetyGate
from controller.loop.port import Outcome
from policies.decisions import MigConvert
from policies.model import Policy
from support.kubeapi import KubeAPIServer
from support.mig_manager import MigManager

Obj = dict[str, Any]
KARPENTER, AUTOSCALER = AUTOSCALER_HOLD


def actuator(
    api: ApiClient, server: KubeAPIServer, *, pol: Policy | None = None, **settings: float
) -> KubeActuator:
    """A fresh actuator (as after a restart) with short deadlines unless given."""
    mig = {"drain_timeout_s": 5.0, "reconfigure_timeout_s": 5.0, **settings}
    return KubeActuator(
        api,
        SafetyGate(pol or policy(), dry_run=False),
        nodes=lambda: server.objects("nodes"),
        limits=ApiLimits(timeout_s=1.0, attempts=4, deadline_s=5.0),
        mig=MigFlowSettings(**mig),
    )


def record_of(server: KubeAPIServer) -> Obj | None:
    text = (node_of(server)["metadata"].get("annotations") or {}).get(FLOW_ANNOTATION)
    return None if text is None else dict(json.loads(text))


async def tick_until(
    act: KubeActuator, server: KubeAPIServer, what: Any, within: float = 5.0
) -> None:
    """Tick ``resume_all`` until ``what(record)`` holds."""
    deadline = time.monotonic() + within
    while not what(record_of(server)):
        assert time.monotonic() < deadline, f"never reached; record {record_of(server)}"
        await act.resume_all()
        await asyncio.sleep(0.02)


async def test_rebooting_extends_the_deadline_instead_of_rolling_back(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """The manager reboots the node for longer than the reconfigure deadline: the flow waits
    (the extension recorded on the node) and finishes instead of relabelling mid-reboot."""
    mig_manager.script("gpu-1", "success", reboot=0.8)
    await gpu_node(kubeapi)
    act = actuator(kube_client, kubeapi, reconfigure_timeout_s=0.3, reboot_timeout_s=5.0)
    await act.apply([convert()])
    await tick_until(act, kubeapi, lambda r: r is not None and r["rebooted"])
    assert node_of(kubeapi)["metadata"]["labels"][STATE_LABEL] == "rebooting"
    done = await drive(act)
    assert done.outcome is Outcome.APPLIED, done.detail
    assert node_of(kubeapi)["metadata"]["labels"][CONFIG_LABEL] == TARGET
    assert_released(node_of(kubeapi))


async def test_a_reboot_longer_than_the_extension_rolls_back(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """The extension has a maximum: a node still rebooting past it is rolled back."""
    mig_manager.script("gpu-1", "success", reboot=3.0, then="success")
    await gpu_node(kubeapi)
    act = actuator(kube_client, kubeapi, reconfigure_timeout_s=0.2, reboot_timeout_s=0.4)
    await act.apply([convert()])
    done = await drive(act)
    assert done.outcome is Outcome.FAILED
    assert "still rebooting 0.4s after" in done.detail


async def test_restart_while_rebooting_keeps_the_extended_deadline(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """A controller restarted mid-reboot reads the extension from the record and waits for the
    reboot, even with a reconfigure deadline long past."""
    mig_manager.script("gpu-1", "success", reboot=1.0)
    await gpu_node(kubeapi)
    first = actuator(kube_client, kubeapi, reconfigure_timeout_s=0.2, reboot_timeout_s=5.0)
    await first.apply([convert()])
    await tick_until(first, kubeapi, lambda r: r is not None and r["rebooted"])
    second = actuator(kube_client, kubeapi, reconfigure_timeout_s=0.2, reboot_timeout_s=0.2)
    done = await drive(second)
    assert done.outcome is Outcome.APPLIED, done.detail
    assert_released(node_of(kubeapi))


async def test_success_waits_for_the_device_plugin_to_advertise(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """After ``success`` the node stays cordoned (phase advertising) until its allocatable shows
    the layout's MIG resources; then it is uncordoned."""
    mig_manager.script("gpu-1", "success", advertise=0.6)
    await gpu_node(kubeapi)
    act = actuator(kube_client, kubeapi, advertise_timeout_s=5.0)
    await act.apply([convert()])
    await tick_until(act, kubeapi, lambda r: r is not None and r["phase"] == "advertising")
    node = node_of(kubeapi)
    assert node["metadata"]["labels"][STATE_LABEL] == "success"
    assert "nvidia.com/mig-1g.10gb" not in node["status"]["allocatable"]
    assert node["spec"]["unschedulable"] is True
    done = await drive(act)
    assert done.outcome is Outcome.APPLIED
    node = node_of(kubeapi)
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "56"
    assert_released(node)


async def test_a_device_plugin_that_never_advertises_rolls_back(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """No MIG resources within the advertise deadline: the flow fails with the resources it
    wanted and saw, restores the old layout and uncordons once the whole GPUs are back."""
    mig_manager.script("gpu-1", "success", advertise=None)
    await gpu_node(kubeapi)
    act = actuator(kube_client, kubeapi, advertise_timeout_s=0.3)
    await act.apply([convert()])
    done = await drive(act)
    assert done.outcome is Outcome.FAILED
    assert "did not advertise nvidia.com/mig-1g.10gb=56 within 0.3s" in done.detail
    assert "allocatable: nvidia.com/gpu=8" in done.detail
    await settle_restore(act, kubeapi)
    node = node_of(kubeapi)
    assert node["metadata"]["labels"][CONFIG_LABEL] == "all-disabled"
    assert_released(node)
    assert not set(AUTOSCALER_HOLD) & set(node["metadata"].get("annotations") or {})


async def test_restart_while_waiting_for_the_device_plugin_resumes(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """A controller restarted in phase advertising keeps waiting on the recorded deadline and
    finishes once the resources show, without relabelling again."""
    await gpu_node(kubeapi)
    await settled(mig_manager)  # its reaction to the new node is not the flow's
    mig_manager.applied.clear()
    mig_manager.script("gpu-1", "success", advertise=0.8)
    first = actuator(kube_client, kubeapi, advertise_timeout_s=5.0)
    await first.apply([convert()])
    await tick_until(first, kubeapi, lambda r: r is not None and r["phase"] == "advertising")
    second = actuator(kube_client, kubeapi, advertise_timeout_s=5.0)
    done = await drive(second)
    assert done.outcome is Outcome.APPLIED
    assert mig_manager.applied == [("gpu-1", TARGET, "success")]
    assert_released(node_of(kubeapi))


async def test_mixed_layout_waits_for_each_profile(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """A named mixed config (the policy's configs) converts and is checked per profile."""
    balanced = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    pol = policy(
        mig={
            "fromPool": "whole",
            "toPool": "mig",
            "convertBelow": "20%",
            "convertAfter": "10m",
            "profiles": {"A100-80GB": [TARGET, "all-balanced"]},
            "configs": {"all-balanced": balanced},
            "revertAfter": "2m",
        }
    )
    await gpu_node(kubeapi)
    act = actuator(kube_client, kubeapi, pol=pol)
    await act.apply([MigConvert(1.0, "gpu-1", "all-balanced", "A100-80GB", WHY)])
    record = record_of(kubeapi)
    assert record is not None
    assert record["expect"] == {
        "nvidia.com/mig-1g.10gb": 16,
        "nvidia.com/mig-2g.20gb": 8,
        "nvidia.com/mig-3g.40gb": 8,
    }
    assert (await drive(act)).outcome is Outcome.APPLIED
    assert node_of(kubeapi)["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "8"


async def test_an_unknown_config_fails_before_touching_the_node(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """A target no layout is known for (not all-<profile>, not in configs) is refused before
    the cordon: the MIG manager would fail it with the node drained."""
    await gpu_node(kubeapi)
    act = actuator(kube_client, kubeapi)
    [result] = await act.apply([MigConvert(1.0, "gpu-1", "all-custom", "A100-80GB", WHY)])
    assert result.outcome is Outcome.FAILED
    assert "unknown MIG config 'all-custom'" in result.detail
    assert [r for r in kubeapi.requests if r.method == "PATCH"] == []


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param({}, {}, id="unset-removed"),
        # someone else's "true" on Karpenter's key protects the node: no flow starts at all
        # (tests/test_safety.py); values that protect nothing are put back as they were
        pytest.param(
            {KARPENTER: "false", AUTOSCALER: "false"},
            {KARPENTER: "false", AUTOSCALER: "false"},
            id="someone-elses-restored",
        ),
    ],
)
async def test_autoscaler_annotations_held_while_the_flow_runs(
    kubeapi: KubeAPIServer,
    kube_client: ApiClient,
    mig_manager: MigManager,
    before: dict[str, str],
    after: dict[str, str],
) -> None:
    """Karpenter's do-not-disrupt and the cluster-autoscaler's scale-down-disabled are "true"
    from the first patch of the flow to its last, then back to what they were."""
    mig_manager.script("gpu-1", "success", delay=0.3)
    await gpu_node(kubeapi)
    if before:
        await kubeapi.patch("nodes", None, "gpu-1", {"metadata": {"annotations": before}})
    act = actuator(kube_client, kubeapi)
    await act.apply([convert()])
    held = node_of(kubeapi)["metadata"]["annotations"]
    assert (held[KARPENTER], held[AUTOSCALER]) == ("true", "true")
    assert (await drive(act)).outcome is Outcome.APPLIED
    annotations = node_of(kubeapi)["metadata"].get("annotations") or {}
    assert {k: v for k, v in annotations.items() if k in AUTOSCALER_HOLD} == after


async def test_taints_move_with_the_pool(
    kubeapi: KubeAPIServer, kube_client: ApiClient, mig_manager: MigManager
) -> None:
    """Converted, the node takes the MIG pool's taint and loses the whole pool's; a taint
    neither pool lists stays."""
    pol = policy(
        pools={
            "whole": {
                "nodeSelector": dict(WHOLE),
                "taints": [{"key": "ebbtide.io/whole", "effect": "NoSchedule"}],
            },
            "mig": {
                "nodeSelector": dict(MIG),
                "kind": "mig",
                "taints": [{"key": "nvidia.com/mig", "value": "true", "effect": "NoSchedule"}],
            },
        }
    )
    await gpu_node(kubeapi)
    other = {"key": "team", "value": "a", "effect": "NoExecute"}
    whole = {"key": "ebbtide.io/whole", "effect": "NoSchedule"}
    await kubeapi.patch("nodes", None, "gpu-1", {"spec": {"taints": [other, whole]}})
    act = actuator(kube_client, kubeapi, pol=pol)
    await act.apply([convert()])
    assert (await drive(act)).outcome is Outcome.APPLIED
    assert node_of(kubeapi)["spec"]["taints"] == [
        other,
        {"key": "nvidia.com/mig", "value": "true", "effect": "NoSchedule"},
    ]

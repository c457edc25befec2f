"""The MIG flow on a cluster installed with ``mig.strategy=single`` (the GPU operator's MIG guide),
over real HTTP with the fake MIG manager playing that strategy's device plugin and GPU feature
discovery (NVIDIA/k8s-device-plugin ``internal/lm/mig-strategy.go``): the instances come back as
``nvidia.com/gpu`` (56 on 8 A100-80GB at ``all-1g.10gb``) and ``nvidia.com/gpu.count`` counts
them, so a flow waiting for ``nvidia.com/mig-1g.10gb`` or taking 56 for the cards rolls back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from test_migflow import (
    MIG,
    TARGET,
    WHY,
    assert_released,
    convert,
    drive,
    node_of,
    policy,
    settle_restore,
    settled,
)

from controller.kube.actuator import ApiLimits, KubeActuator, MigFlowSettings
from controller.kube.migflow import CONFIG_LABEL, FLOW_ANNOTATION, STATE_LABEL
from controller.loop.gate import SafetyGate
from controller.loop.port import Outcome
from policies.decisions import MigConvert, MigRevert
from policies.model import Policy
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_node
from support.mig_manager import A100_80GB_PROFILES, MigManager

Obj = dict[str, Any]
PRODUCT = "NVIDIA-A100-SXM4-80GB"
SINGLE = {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": PRODUCT}


@pytest.fixture
async def single_manager(kubeapi: KubeAPIServer) -> AsyncIterator[MigManager]:
    """A fake MIG manager whose device plugin and GFD run ``mig.strategy=single``."""
    async with MigManager(
        kubeapi, profiles=A100_80GB_PROFILES, delay=0.05, strategy="single"
    ) as manager:
        yield manager


def actuator(api: ApiClient, server: KubeAPIServer, *, pol: Policy | None = None) -> KubeActuator:
    """Short deadlines: a flow waiting for resources the plugin never advertises rolls back
    within the test instead of hanging it."""
    return KubeActuator(
        api,
        SafetyGate(pol or policy(), dry_run=False),
        nodes=lambda: server.objects("nodes"),
        limits=ApiLimits(timeout_s=1.0, attempts=4, deadline_s=5.0),
        mig=MigFlowSettings(
            drain_timeout_s=5.0, reconfigure_timeout_s=5.0, advertise_timeout_s=1.0
        ),
    )


def whole_node() -> Obj:
    """8 whole A100s under ``single``, as GFD labels them."""
    labels = {"ebbtide.io/pool": "whole", **SINGLE, CONFIG_LABEL: "all-disabled"}
    node = make_node("gpu-1", gpus=8, labels={**labels, STATE_LABEL: "success"})
    return node


def sliced_node() -> Obj:
    """The same node at ``all-1g.10gb`` under ``single``: 56 instances as ``nvidia.com/gpu``,
    GFD's count 56 and product ``…-MIG-1g.10gb``."""
    labels = {
        **MIG,
        **SINGLE,
        "nvidia.com/gpu.product": f"{PRODUCT}-MIG-1g.10gb",
        CONFIG_LABEL: TARGET,
        STATE_LABEL: "success",
    }
    node = make_node("gpu-1", gpus=56, labels=labels)
    return node


def gpu_state(node: Obj) -> tuple[dict[str, str], str, str]:
    """The GPU resources allocatable, GFD's count and product."""
    alloc = node["status"]["allocatable"]
    gpu = {k: v for k, v in alloc.items() if k.startswith("nvidia.com/")}
    labels = node["metadata"]["labels"]
    return gpu, labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.product"]


async def test_conversion_under_single_strategy_finishes(
    kubeapi: KubeAPIServer, kube_client: ApiClient, single_manager: MigManager
) -> None:
    """Under single the converted node advertises 56 nvidia.com/gpu: the flow finishes there."""
    await kubeapi.create(whole_node())
    act = actuator(kube_client, kubeapi)
    [started] = await act.apply([convert()])
    assert started.outcome is Outcome.IN_PROGRESS
    done = await drive(act)
    assert done.outcome is Outcome.APPLIED, done.detail
    node = node_of(kubeapi)
    assert gpu_state(node) == ({"nvidia.com/gpu": "56"}, "56", f"{PRODUCT}-MIG-1g.10gb")
    assert node["metadata"]["labels"]["ebbtide.io/pool"] == "mig"
    assert_released(node)
    assert act.stats.total(action="mig_convert", outcome=Outcome.FAILED) == 0


async def test_revert_under_single_strategy_expects_the_cards_not_the_instances(
    kubeapi: KubeAPIServer, kube_client: ApiClient, single_manager: MigManager
) -> None:
    """Reverting a single-strategy MIG node (count label 56) waits for 8 whole cards, not 56."""
    await kubeapi.create(sliced_node())
    act = actuator(kube_client, kubeapi)
    [started] = await act.apply([MigRevert(1.0, "gpu-1", TARGET, WHY)])
    assert started.outcome is Outcome.IN_PROGRESS
    done = await drive(act)
    assert done.outcome is Outcome.APPLIED, done.detail
    node = node_of(kubeapi)
    assert gpu_state(node) == ({"nvidia.com/gpu": "8"}, "8", PRODUCT)
    labels = node["metadata"]["labels"]
    assert (labels[CONFIG_LABEL], labels["ebbtide.io/pool"]) == ("all-disabled", "whole")
    assert_released(node)


async def test_convert_then_revert_under_single_round_trips(
    kubeapi: KubeAPIServer, kube_client: ApiClient, single_manager: MigManager
) -> None:
    """Whole → all-1g.10gb → whole under single leaves the node as GFD first labelled it."""
    await kubeapi.create(whole_node())
    before = gpu_state(node_of(kubeapi))
    act = actuator(kube_client, kubeapi)
    await act.apply([convert()])
    assert (await drive(act)).outcome is Outcome.APPLIED
    await act.apply([MigRevert(2.0, "gpu-1", TARGET, WHY)])
    assert (await drive(act)).outcome is Outcome.APPLIED
    assert gpu_state(node_of(kubeapi)) == before == ({"nvidia.com/gpu": "8"}, "8", PRODUCT)


async def test_a_mixed_layout_on_a_single_strategy_node_fails_before_touching_it(
    kubeapi: KubeAPIServer, kube_client: ApiClient, single_manager: MigManager
) -> None:
    """all-balanced cannot be advertised under single (GFD: …-MIG-INVALID): FAILED at start,
    the node never cordoned, labelled or annotated, no budget spent."""
    pol = policy(
        mig={
            "fromPool": "whole",
            "toPool": "mig",
            "convertBelow": "20%",
            "convertAfter": "10m",
            "profiles": {"A100-80GB": [TARGET, "all-balanced"]},
            "configs": {"all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
            "revertAfter": "2m",
        }
    )
    await kubeapi.create(whole_node())
    act = actuator(kube_client, kubeapi, pol=pol)
    decision = MigConvert(1.0, "gpu-1", "all-balanced", "A100-80GB", WHY)
    [result] = await act.apply([decision])
    assert result.outcome is Outcome.FAILED
    assert "mig.strategy=single" in result.detail
    assert [r for r in kubeapi.requests if r.method == "PATCH"] == []
    node = node_of(kubeapi)
    assert FLOW_ANNOTATION not in (node["metadata"].get("annotations") or {})
    assert act.gate.budgets.mig_conversions.used(act.gate.now()) == 0


async def test_a_failed_conversion_under_single_waits_for_the_whole_cards_back(
    kubeapi: KubeAPIServer, kube_client: ApiClient, single_manager: MigManager
) -> None:
    """The manager fails the conversion: the rollback keeps the node cordoned until the whole
    cards are advertised again (nvidia.com/gpu 8, the card's product), then uncordons it."""
    await kubeapi.create(whole_node())
    await settled(single_manager)
    single_manager.script("gpu-1", "failed", then="success")
    act = actuator(kube_client, kubeapi)
    await act.apply([convert()])
    assert (await drive(act)).outcome is Outcome.FAILED
    await settle_restore(act, kubeapi)
    node = node_of(kubeapi)
    assert gpu_state(node) == ({"nvidia.com/gpu": "8"}, "8", PRODUCT)
    assert node["metadata"]["labels"][CONFIG_LABEL] == "all-disabled"
    assert_released(node)

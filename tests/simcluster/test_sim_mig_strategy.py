"""The simulator and the Kubernetes side agree under both MIG strategies: a node the simulated
cluster converts (or reverts) shows the same GPUs and GPU feature discovery labels as the same
node after the fake MIG manager, playing that strategy's device plugin and GFD, reconfigured it
and :func:`controller.kube.translate.node_from` read it. Both sides also refuse a layout of
several profiles on a ``single`` node; scenarios say the strategy (``spec.migStrategy``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sim_builders import DELAYS, POOLS, T0, WHOLE, apply, convert, revert

from controller.kube.migannotation import CONFIG_LABEL, STATE_LABEL
from controller.kube.translate import node_from
from controller.loop.port import Outcome
from controller.simcluster import SimCluster
from controller.simcluster.scenario import Scenario, build_cluster
from policies.miglayout import MigStrategy
from policies.snapshot import Node, SnapshotBuilder
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_node
from support.mig_manager import A100_80GB_PROFILES, MigManager

Obj = dict[str, Any]
PRODUCT = "NVIDIA-A100-SXM4-80GB"
GFD = ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/mig.strategy")
BALANCED = {"all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}


def gfd(strategy: MigStrategy) -> dict[str, str]:
    """The labels GFD writes on 8 whole A100-80GB cards."""
    return {"nvidia.com/mig.strategy": strategy, "nvidia.com/gpu.product": PRODUCT}


async def real_node(strategy: MigStrategy, configs: list[str]) -> Node:
    """The node, 8 whole cards, taken through ``configs`` by the fake MIG manager, as
    :func:`node_from` reads it."""
    async with KubeAPIServer() as server:
        labels = {**gfd(strategy), CONFIG_LABEL: "all-disabled", STATE_LABEL: "success"}
        await server.create(make_node("gpu-1", gpus=8, labels=labels))
        async with MigManager(
            server, profiles=A100_80GB_PROFILES, delay=0.0, strategy=strategy
        ) as manager:
            for config in configs:
                patch = {"metadata": {"labels": {CONFIG_LABEL: config}}}
                await server.patch("nodes", None, "gpu-1", patch)
                deadline = time.monotonic() + 10.0
                while ("gpu-1", config, "success") not in manager.applied:
                    assert time.monotonic() < deadline, f"the MIG manager never applied {config}"
                    await asyncio.sleep(0.01)
                manager.applied.clear()
            obj = server.get("nodes", None, "gpu-1")
    assert obj is not None
    node = node_from(obj)
    assert node is not None
    return node


async def sim_node(strategy: MigStrategy, configs: list[str]) -> Node:
    """The same node taken through ``configs`` by the simulated cluster."""
    labels = {**WHOLE, **gfd(strategy), "nvidia.com/gpu.count": "8"}
    b = SnapshotBuilder().node("gpu-1", gpus=8, labels=labels, mig_config="all-disabled")
    c = SimCluster(b.build(), delays=DELAYS, start=T0, pools=POOLS)
    at = T0
    for config in configs:
        step = (
            revert("gpu-1", at=at) if config == "all-disabled" else convert("gpu-1", config, at=at)
        )
        [started] = await apply(c, step)
        assert started.outcome is Outcome.IN_PROGRESS, started.detail
        at += 1000
        c.advance(at)
    [node] = c.snapshot().nodes
    assert node.mig_state == "success"
    return node


@pytest.mark.parametrize("strategy", ["single", "mixed"])
@pytest.mark.parametrize(
    "configs",
    [
        pytest.param(["all-1g.10gb"], id="convert-1g"),
        pytest.param(["all-3g.40gb"], id="convert-3g"),
        pytest.param(["all-1g.10gb", "all-disabled"], id="convert-then-revert"),
    ],
)
async def test_simulator_and_kubernetes_agree(strategy: MigStrategy, configs: list[str]) -> None:
    """Same GPUs (cards, profiles, instances per card) and same GFD labels on both sides."""
    real = await real_node(strategy, configs)
    sim = await sim_node(strategy, configs)
    assert sim.gpus == real.gpus
    assert (sim.mig_capacity(), sim.whole_gpus) == (real.mig_capacity(), real.whole_gpus)
    assert {k: sim.labels.get(k) for k in GFD} == {k: real.labels.get(k) for k in GFD}


@pytest.mark.parametrize(
    ("strategy", "want"), [("single", Outcome.FAILED), ("mixed", Outcome.IN_PROGRESS)]
)
async def test_the_simulator_refuses_a_mixed_layout_on_a_single_node(
    strategy: MigStrategy, want: Outcome
) -> None:
    """all-balanced on a single node FAILS at once and leaves the node open, as the flow fails
    it at start; a mixed node starts converting (cordoned)."""
    labels = {**WHOLE, "nvidia.com/mig.strategy": strategy}
    b = SnapshotBuilder().node("w0", gpus=2, labels=labels)
    c = SimCluster(b.build(), delays=DELAYS, start=T0, pools=POOLS, mig_configs=BALANCED)
    [result] = await apply(c, convert("w0", "all-balanced"))
    assert result.outcome is want, result.detail
    [node] = c.snapshot().nodes
    assert node.cordoned is (want is Outcome.IN_PROGRESS)
    if want is Outcome.FAILED:
        assert "mig.strategy=single" in result.detail


def scenario(body: Obj) -> Scenario:
    return Scenario.model_validate(
        {
            "apiVersion": "ebbtide.io/v1alpha1",
            "kind": "Scenario",
            "metadata": {"name": "s"},
            "spec": body,
        }
    )


@pytest.mark.parametrize(
    ("body", "want"),
    [
        pytest.param({}, ["mixed", "mixed"], id="default-mixed"),
        pytest.param({"migStrategy": "single"}, ["single", "single"], id="single"),
        pytest.param(
            {
                "migStrategy": "single",
                "nodes": [
                    {"name": "a"},
                    {"name": "b", "labels": {"nvidia.com/mig.strategy": "mixed"}},
                ],
            },
            ["single", "mixed"],
            id="a-node-label-wins",
        ),
    ],
)
def test_scenario_strategy_labels_every_node(body: Obj, want: list[str]) -> None:
    """spec.migStrategy is written on every node as GFD does; a node's own label wins."""
    body = {"nodes": [{"name": "a"}, {"name": "b"}], **body}
    c = build_cluster(scenario(body))
    assert [n.labels["nvidia.com/mig.strategy"] for n in c.snapshot().nodes] == want

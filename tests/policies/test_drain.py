"""Drain eligibility: one rule for which pods leave a node, and MIG planning that obeys it."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
from policy_fixtures import T0, TRAINING, cluster, make_policy

from policies.drain import DrainRule, plan_drain
from policies.inventory import Inventory
from policies.mig import MigFlights, plan_reverts
from policies.snapshot import Pod, SnapshotBuilder

POLICY = make_policy()
RULE = DrainRule.of(POLICY)
SLICE = {"1g.10gb": 1}

# -- builders: one pod on a node, by what it is ------------------------------------------------

PodOn = Callable[[SnapshotBuilder, str, str], object]


def trainer(b: SnapshotBuilder, node: str, name: str) -> object:
    return b.pod("ml", name, node=node, mig=SLICE, labels=TRAINING)


def whole_trainer(b: SnapshotBuilder, node: str, name: str) -> object:
    return b.pod("ml", name, node=node, gpus=2, labels=TRAINING)


def inference(b: SnapshotBuilder, node: str, name: str) -> object:
    """A pod of the chat service's workload, even carrying the training label."""
    return b.pod("serving", name, node=node, mig=SLICE, workload="serving/chat", labels=TRAINING)


def system_gpu(b: SnapshotBuilder, node: str, name: str) -> object:
    return b.pod("kube-system", name, node=node, mig=SLICE, labels=TRAINING)


def pinned(b: SnapshotBuilder, node: str, name: str) -> object:
    annotations = {"ebbtide.io/do-not-disrupt": "true"}
    return b.pod("ml", name, node=node, mig=SLICE, labels=TRAINING, annotations=annotations)


def unlabelled(b: SnapshotBuilder, node: str, name: str) -> object:
    return b.pod("ml", name, node=node, mig=SLICE)


def agent(b: SnapshotBuilder, node: str, name: str) -> object:
    """A DaemonSet-like pod: no GPU request."""
    return b.pod("kube-system", name, node=node)


def finished(b: SnapshotBuilder, node: str, name: str) -> object:
    return b.pod("serving", name, node=node, mig=SLICE, phase="Succeeded")


def pods(*makers: PodOn) -> tuple[Pod, ...]:
    b = SnapshotBuilder().node("m0", gpus=1)
    for i, make in enumerate(makers):
        make(b, "m0", f"p{i}")
    return b.build().pods


@pytest.mark.parametrize(
    ("makers", "evict", "blocked"),
    [
        pytest.param([trainer, whole_trainer], ["ml/p0", "ml/p1"], {}, id="training-pods-go"),
        pytest.param([agent], [], {}, id="pods-without-gpus-neither-block-nor-go"),
        pytest.param([finished], [], {}, id="finished-pods-are-ignored"),
        pytest.param(
            [inference],
            [],
            {"serving/p0": "pod of inference service workload serving/chat"},
            id="inference-pod-blocks",
        ),
        pytest.param(
            [system_gpu],
            [],
            {"kube-system/p0": "namespace kube-system is protected"},
            id="protected-namespace-blocks",
        ),
        pytest.param(
            [pinned],
            [],
            {"ml/p0": "pod is annotated ebbtide.io/do-not-disrupt"},
            id="do-not-disrupt-blocks",
        ),
        pytest.param(
            [unlabelled],
            [],
            {"ml/p0": "not training (does not match ebbtide.io/class=training)"},
            id="non-training-pod-blocks",
        ),
        pytest.param(
            [agent, trainer, inference],
            ["ml/p1"],
            {"serving/p2": "pod of inference service workload serving/chat"},
            id="mixed-node",
        ),
    ],
)
def test_plan_drain(makers: list[PodOn], evict: list[str], blocked: dict[str, str]) -> None:
    """Which pods a drain evicts and which block it, with the reason."""
    given = pods(*makers)
    before = copy.deepcopy(given)
    got = plan_drain(RULE, given)
    assert given == before
    assert [p.key for p in got.evict] == evict
    assert {p.key: why for p, why in got.blocked} == blocked
    assert (got.refusal is None) == (not blocked)


def test_no_training_selector_means_no_gpu_pod_may_go() -> None:
    """A policy without training evicts nothing to drain a node."""
    rule = DrainRule.of(make_policy(training=None))
    got = plan_drain(rule, pods(trainer))
    assert [why for _, why in got.blocked] == ["the policy selects no training workloads"]


# -- plan_reverts picks only nodes a drain can empty --------------------------------------------


@pytest.mark.parametrize(
    ("m0", "m1", "want"),
    [
        pytest.param([inference], [trainer], ["m1"], id="inference-pod-keeps-its-node"),
        pytest.param([system_gpu], [trainer], ["m1"], id="protected-pod-keeps-its-node"),
        pytest.param([pinned], [trainer, trainer], ["m1"], id="do-not-disrupt-keeps-its-node"),
        pytest.param([agent, agent], [trainer], ["m0"], id="pods-without-gpus-do-not-count"),
        pytest.param([inference], [system_gpu], [], id="no-node-can-be-drained"),
    ],
)
def test_plan_reverts_skips_nodes_it_cannot_drain(
    m0: list[PodOn], m1: list[PodOn], want: list[str]
) -> None:
    """Sustained whole-card demand reverts the emptiest MIG node whose GPU pods may all be
    evicted; a node a real drain would refuse is never picked (it would roll back each tick)."""
    b = cluster(whole_nodes=1, gpus=8, mig_nodes=2)  # chat holds one of w0's 8 GPUs
    b.pod("ml", "waiting", gpus=8, labels=TRAINING)  # 1 whole GPU short
    for node, makers in (("m0", m0), ("m1", m1)):
        for i, make in enumerate(makers):
            make(b, node, f"{node}-p{i}")
    assert POLICY.spec.mig is not None
    got, unmet = plan_reverts(
        now=T0 + 600,
        spec=POLICY.spec.mig,
        inv=Inventory(b.build(), POLICY),
        demand_since=T0,
        slots=2,
        flights=MigFlights(),
    )
    assert ([c.node.name for c in got], unmet) == (want, 1)

"""Translation under both MIG strategies (NVIDIA/k8s-device-plugin ``internal/lm/mig-strategy.go``):
a ``single``-strategy MIG node advertises its instances as ``nvidia.com/gpu`` and GFD's
``nvidia.com/gpu.count`` counts them, and a pod asks for them as ``nvidia.com/gpu`` selecting the
``…-MIG-<profile>`` product. The snapshot shows the same MIG slices and MIG requests for both
strategies, so whole-card demand and training never count instances and MIG demand finds them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_translate import A100, NodeObj, PodObj, sliced, whole, workload_obj

from controller.kube.translate import (
    DEPLOYMENT,
    node_from,
    pod_from,
    priorities_from,
    snapshot_from,
    workload_from,
)
from policies.inventory import Inventory
from policies.model import Policy
from policies.snapshot import Gpu

Obj = dict[str, Any]
SLICE = f"{A100}-MIG-1g.10gb"
NO_PRIORITIES = priorities_from([])


def single(node: NodeObj) -> NodeObj:
    return node.label("nvidia.com/mig.strategy", "single")


def mixed(node: NodeObj) -> NodeObj:
    return node.label("nvidia.com/mig.strategy", "mixed")


@pytest.mark.parametrize(
    ("node", "gpus"),
    [
        pytest.param(
            single(NodeObj("n").gpus(56).count(56).product(SLICE).mig_config("all-1g.10gb")),
            sliced(8, "1g.10gb", 7),
            id="single-mig-count-is-instances",
        ),
        pytest.param(
            single(NodeObj("n").gpus(16).count(16).product(f"{A100}-MIG-3g.40gb")).mig_config(
                "all-3g.40gb"
            ),
            sliced(8, "3g.40gb", 2),
            id="single-mig-3g",
        ),
        pytest.param(
            single(NodeObj("n").gpus(8).count(8).product(A100).mig_config("all-disabled")),
            whole(8),
            id="single-whole-cards",
        ),
        pytest.param(
            mixed(NodeObj("n").mig("1g.10gb", 56).count(8).product(A100)).mig_config("all-1g.10gb"),
            sliced(8, "1g.10gb", 7),
            id="mixed-mig",
        ),
        pytest.param(
            single(NodeObj("n").count(56).product(SLICE).mig_config("all-disabled", "pending")),
            whole(8),
            id="single-reverting-plugin-down-stale-labels",
        ),
        pytest.param(
            single(NodeObj("n").count(8).product(A100).mig_config("all-1g.10gb", "pending")),
            sliced(8, "1g.10gb", 7),
            id="single-converting-plugin-down-stale-labels",
        ),
    ],
)
def test_node_gpus_under_both_strategies(node: NodeObj, gpus: tuple[Gpu, ...]) -> None:
    """One Gpu per physical card, MIG slices per card, whichever strategy advertises them."""
    raw = node.obj()
    before = copy.deepcopy(raw)
    got = node_from(raw)
    assert raw == before, "the raw object was mutated"
    assert got is not None
    assert got.gpus == gpus
    assert got.whole_gpus == sum(1 for g in gpus if g.mig_profile is None)


def selecting(pod: PodObj, product: str) -> PodObj:
    pod.spec["nodeSelector"] = {"nvidia.com/gpu.product": product}
    return pod


def by_affinity(pod: PodObj, *products: str) -> PodObj:
    term = {
        "matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": list(products)}
        ]
    }
    pod.spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    return pod


@pytest.mark.parametrize(
    ("pod", "gpus", "mig"),
    [
        pytest.param(
            selecting(PodObj("ml", "p").container(1), SLICE),
            0,
            {"1g.10gb": 1},
            id="single-selector",
        ),
        pytest.param(
            by_affinity(PodObj("ml", "p").container(2), SLICE),
            0,
            {"1g.10gb": 2},
            id="single-affinity",
        ),
        pytest.param(
            PodObj("ml", "p").container(mig={"1g.10gb": 1}), 0, {"1g.10gb": 1}, id="mixed"
        ),
        pytest.param(
            selecting(PodObj("ml", "p").container(1), A100), 1, {}, id="whole-card-product"
        ),
        pytest.param(
            selecting(PodObj("ml", "p").container(1), f"{A100}-MIG-INVALID"), 1, {}, id="invalid"
        ),
        pytest.param(PodObj("ml", "p").container(1), 1, {}, id="no-selector"),
        pytest.param(
            by_affinity(PodObj("ml", "p").container(1), SLICE, "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"),
            0,
            {"1g.10gb": 1},
            id="affinity-two-cards-one-profile",
        ),
        pytest.param(
            by_affinity(PodObj("ml", "p").container(1), SLICE, A100),
            1,
            {},
            id="affinity-mig-or-whole",
        ),
    ],
)
def test_pod_requests_under_both_strategies(pod: PodObj, gpus: int, mig: dict[str, int]) -> None:
    """nvidia.com/gpu selecting a …-MIG-<profile> product is MIG instances, like mig-<profile>."""
    got = pod_from(pod.in_phase("Pending").obj(), priorities=NO_PRIORITIES, kinds=[DEPLOYMENT])
    assert got is not None
    assert (got.gpus, dict(got.mig)) == (gpus, mig)


def test_a_single_strategy_mig_template_needs_no_whole_gpus() -> None:
    """A Deployment whose template selects a …-MIG- product takes no whole GPUs per replica."""
    raw = workload_obj("Deployment", "embed", replicas=3, gpus=1)
    raw["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": SLICE}
    got = workload_from(raw, DEPLOYMENT, priorities=NO_PRIORITIES)
    assert (got.replicas, got.gpus_per_replica) == (3, 0)


def policy() -> Policy:
    spec = {
        "pools": {
            "whole": {"nodeSelector": {"ebbtide.io/pool": "whole"}},
            "mig": {"nodeSelector": {"ebbtide.io/pool": "mig"}, "kind": "mig"},
        },
        "training": {"selector": {"ebbtide.io/class": "training"}},
    }
    meta = {"name": "t"}
    return Policy.model_validate(
        {"apiVersion": "ebbtide.io/v1alpha1", "kind": "Policy", "metadata": meta, "spec": spec}
    )


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_inventory_sees_the_same_cluster_under_both_strategies(strategy: str) -> None:
    """The same cluster, advertised either way: a MIG node with a training pod on a slice, a
    pending MIG pod and no whole cards; the inventory counts no whole GPU, no training on whole
    GPUs, and 1 pending 1g.10gb instance."""
    if strategy == "single":
        node = single(NodeObj("m").gpus(56).count(56).product(SLICE))
        running = selecting(PodObj("ml", "t").container(1), SLICE)
        pending = selecting(PodObj("ml", "e").container(1), SLICE)
    else:
        node = mixed(NodeObj("m").mig("1g.10gb", 56).count(8).product(A100))
        running = PodObj("ml", "t").container(mig={"1g.10gb": 1})
        pending = PodObj("ml", "e").container(mig={"1g.10gb": 1})
    node = node.mig_config("all-1g.10gb").label("ebbtide.io/pool", "mig")
    running = running.on("m").label("ebbtide.io/class", "training")
    snap = snapshot_from(
        nodes=[node.obj()], pods=[running.obj(), pending.in_phase("Pending").obj()]
    )
    inv = Inventory(snap, policy())
    assert (inv.capacity, inv.free, inv.pending_whole_gpus) == (
        {"mig": 0, "whole": 0},
        {"mig": 0, "whole": 0},
        0,
    )
    assert inv.pending_mig == {"1g.10gb": 1}
    assert inv.loose_training_pods == []
    assert [len(n.gpus) for n in snap.nodes] == [8]

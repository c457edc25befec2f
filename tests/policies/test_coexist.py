"""Coexistence in the engine: a training workload another autoscaler sizes (``scaled_by``) is
left out of resize plans unless ``training.owner: ebbtide`` — its pods may still be evicted —
and the plan says why it did not shrink it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from policy_fixtures import WHOLE, make_policy, policy_dict, training

from policies.inventory import Inventory
from policies.preemption import Plan, plan_capacity
from policies.snapshot import Snapshot, SnapshotBuilder

HPA = "HorizontalPodAutoscaler ml/elastic"


def snapshot(scaled_by: str | None) -> Snapshot:
    """Two 8-GPU nodes full: ``elastic`` (6 replicas, may shrink to 2, may grow to 8) on w0,
    ``fixed`` (8 replicas) on w1; ``elastic`` is sized by ``scaled_by``."""
    b = SnapshotBuilder()
    for i in range(2):
        b.node(f"w{i}", gpus=8, labels=WHOLE)
    training(b, "elastic", replicas=6, nodes=["w0"], min_replicas=2, max_replicas=8, priority=10)
    training(b, "fixed", replicas=8, nodes=["w1"], priority=100)
    snap = b.build()
    workloads = tuple(
        replace(w, scaled_by=scaled_by) if w.name == "elastic" else w for w in snap.workloads
    )
    return replace(snap, workloads=workloads)


def plan(snap: Snapshot, owner: str) -> tuple[Inventory, Plan]:
    spec = policy_dict()["spec"]
    policy = make_policy(training={**spec["training"], "owner": owner})
    inv = Inventory(snap, policy)
    out = plan_capacity(
        needed=2,
        pool="whole",
        training=list(inv.training.values()),
        loose_pods=inv.loose_training_pods,
        pod_pool=inv.node_pool,
        victim_order=["priority", "newest"],
        protected_namespaces=frozenset(),
        scale_budget=10,
        eviction_budget=10,
    )
    return inv, out


@pytest.mark.parametrize(
    ("scaled_by", "owner", "bounds", "shrinks", "evictions", "why"),
    [
        pytest.param(None, "others", (2, 8), [("ml/elastic", 6, 4)], 0, None, id="own"),
        pytest.param(HPA, "others", (6, 6), [], 2, HPA, id="hpa-owned"),
        pytest.param(HPA, "ebbtide", (2, 8), [("ml/elastic", 6, 4)], 0, None, id="given"),
        pytest.param(
            "KEDA ScaledObject ml/q", "others", (6, 6), [], 2, "KEDA ScaledObject", id="keda"
        ),
    ],
)
def test_another_autoscalers_workload_is_not_resized(
    scaled_by: str | None,
    owner: str,
    bounds: tuple[int, int],
    shrinks: list[tuple[str, int, int]],
    evictions: int,
    why: str | None,
) -> None:
    """Needing 2 GPUs: the elastic workload shrinks 6→4 when it is Ebbtide's; when an HPA or a
    ScaledObject sizes it (owner: others) its bounds are its replicas (no shrink, no grow), two
    of its pods are evicted instead (the lowest priority), and the rejected shrink names the
    autoscaler."""
    inv, out = plan(snapshot(scaled_by), owner)
    view = inv.training["ml/elastic"]
    assert (view.min_replicas, view.max_replicas) == bounds
    assert [(s.workload, s.from_replicas, s.to_replicas) for s in out.shrinks] == shrinks
    assert len(out.evictions) == evictions
    assert all(v.pod.workload == "ml/elastic" for v in out.evictions)
    rejected = {a.option: a.why_not for a in out.rejected}
    if why is None:
        assert "shrink ml/elastic" not in rejected
    else:
        assert why in rejected["shrink ml/elastic"]

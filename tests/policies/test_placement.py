"""Per-node placement: fit rules, plans that free room on ONE node, quota-bounded growth,
replacement pods that are no demand, and idle held GPUs reported as reclaimable."""

from __future__ import annotations

import copy
import json

import pytest
from policy_fixtures import (
    BASE,
    MIG,
    SERVING_PRIORITY,
    T0,
    TRAINING,
    WHOLE,
    make_policy,
    run,
    training,
    util,
)
from prometheus_client import generate_latest

from controller.process.metrics import Metrics, StateSources
from policies.budgets import LogRecord
from policies.decisions import Decision, Evict, MigRevert, Scale, decision_to_dict
from policies.engine import Engine
from policies.inventory import Inventory
from policies.placement import admits, could_land, node_order, place, slots
from policies.snapshot import (
    Node,
    Placement,
    Snapshot,
    SnapshotBuilder,
    Taint,
    Toleration,
)

POLICY = make_policy()
INTENT = {"outcome": "intent"}
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")
H100 = {"nvidia.com/gpu.product": "H100"}


def node(*, labels: dict[str, str] | None = None, taints: tuple[Taint, ...] = ()) -> Node:
    return SnapshotBuilder().node("n", labels=labels, taints=taints).build().nodes[0]


@pytest.mark.parametrize(
    ("n", "selector", "tolerations", "want"),
    [
        pytest.param(node(), {}, (), True, id="untainted-no-selector"),
        pytest.param(node(labels=H100), H100, (), True, id="model-selector-matches"),
        pytest.param(node(), H100, (), False, id="model-selector-misses"),
        pytest.param(node(taints=(GPU_TAINT,)), {}, (), False, id="taint-not-tolerated"),
        pytest.param(
            node(taints=(GPU_TAINT,)),
            {},
            (Toleration("nvidia.com/gpu", "Exists"),),
            True,
            id="exists-toleration",
        ),
        pytest.param(
            node(taints=(GPU_TAINT,)),
            {},
            (Toleration("nvidia.com/gpu", "Equal", "absent"),),
            False,
            id="equal-toleration-wrong-value",
        ),
        pytest.param(
            node(taints=(GPU_TAINT,)),
            {},
            (Toleration("nvidia.com/gpu", "Exists", effect="NoExecute"),),
            False,
            id="toleration-other-effect",
        ),
        pytest.param(
            node(taints=(GPU_TAINT,)), {}, (Toleration(operator="Exists"),), True, id="wildcard"
        ),
        pytest.param(
            node(taints=(Taint("soft", effect="PreferNoSchedule"),)),
            {},
            (),
            True,
            id="prefer-no-schedule-admits",
        ),
    ],
)
def test_admits(
    n: Node, selector: dict[str, str], tolerations: tuple[Toleration, ...], want: bool
) -> None:
    """A node admits a pod when it carries the selector's labels and every hard taint is
    tolerated, as kube-scheduler's NodeAffinity and TaintToleration filters decide."""
    assert admits(n, Placement(selector, tolerations)) is want


def test_slots_and_place_count_replicas_per_node() -> None:
    """Scattered free GPUs hold no multi-GPU replica; placing fills the fullest node first."""
    assert slots({"a": 1, "b": 1, "c": 1, "d": 1}, 2) == 0
    assert slots({"a": 3, "b": 2}, 2) == 2
    assert place({"a": 3, "b": 2}, 2, 1) == {"b": 2}
    assert place({"a": 1}, 2, 3) == {}


def test_node_order_prefers_the_nvlink_domain_with_the_most_free() -> None:
    """All else equal, the hole goes where its NVLink domain already has free GPUs, so free
    capacity gathers in whole domains instead of scattering over all of them."""
    key = (0.0,)
    victims = {"a1": [(key, 1)], "b1": [(key, 1)]}
    free = {"a1": 1, "a2": 8, "b1": 1, "b2": 0}
    total = dict.fromkeys(free, 8)
    domains = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    assert node_order(free, victims, total, gpus=2, domains=domains) == ["a1", "b1"]
    assert node_order(free, victims, total, gpus=2) == ["a1", "b1"]  # by name without domains
    flipped = {"a1": "B", "a2": "B", "b1": "A", "b2": "A"}
    assert node_order(free, victims, total, gpus=2, domains=flipped) == ["a1", "b1"]
    swapped = {"a1": "A", "a2": "B", "b1": "B", "b2": "A"}
    assert node_order(free, victims, total, gpus=2, domains=swapped) == ["b1", "a1"]


def test_node_order_follows_victim_order_then_fewest_evicted_then_emptied() -> None:
    """The node whose victims are least important wins; on a tie, fewer GPUs evicted, then a
    node left empty beats one left with holes."""
    low, high = (0.0,), (100.0,)
    victims = {"a": [(high, 1)], "b": [(low, 1)], "c": [(low, 1)], "d": [(low, 1)]}
    free = {"a": 1, "b": 1, "c": 1, "d": 0}
    total = {"a": 2, "b": 8, "c": 2, "d": 8}
    # d needs 2 GPUs but has 1 evictable: impossible; c is left empty, b is not
    assert node_order(free, victims, total, gpus=2) == ["c", "b", "a"]


@pytest.mark.parametrize(
    ("scale", "evicts", "scales"),
    [
        pytest.param(True, ["ml/small-0", "ml/small-1"], [3], id="scale-target"),
        pytest.param(False, ["ml/small-0"], [], id="pending-pods-only"),
    ],
)
def test_breach_frees_room_on_one_node(scale: bool, evicts: list[str], scales: list[int]) -> None:
    """End to end: chat (2 GPUs a replica, on tainted H100 nodes only) breaches while its pool
    has 12 free GPUs: 8 on a node chat may not use and 1 on each H100 node. The pool count says
    'enough', so nothing used to be freed; now a 1-GPU pod is evicted per replica, on the nodes
    with the least important victims, making 2-GPU holes: two for the scale to ceil(1 x 2.5)
    = 3, or one for the pending pod of a service without a scale target."""
    b = SnapshotBuilder()
    for i in range(4):
        b.node(f"w{i}", gpus=8, labels={**WHOLE, **H100}, taints=(GPU_TAINT,))
        b.pod("ml", f"big-{i}", node=f"w{i}", gpus=6, labels=TRAINING, priority=50)
        b.pod("ml", f"small-{i}", node=f"w{i}", gpus=1, labels=TRAINING, priority=10 + i)
    b.node("x0", gpus=8, labels=WHOLE)  # free, but no H100
    b.node("s0", gpus=2, labels=H100)  # outside the pools: chat's first replica
    b.workload(
        "serving",
        "chat",
        replicas=1 if scale else 2,
        gpus_per_replica=2,
        nodes=["s0"] if scale else ["s0", None],
        placement=Placement(H100, (Toleration("nvidia.com/gpu", "Exists"),)),
    )
    snap = b.build()
    chat = copy.deepcopy(BASE["spec"]["services"]["chat"])
    chat["gpusPerReplica"] = 2
    if not scale:
        del chat["scale"], chat["replicas"]
    engine = Engine(make_policy(services={"chat": chat}))
    for _, ds in run(engine, snap, T0, T0 + 12, 250.0):
        if ds:
            break
    assert [d.pod for d in ds if isinstance(d, Evict)] == evicts
    assert [d.to_replicas for d in ds if isinstance(d, Scale)] == scales


def test_grow_stays_within_namespace_quota_and_says_why() -> None:
    """A grow the namespace's GPU quota would refuse is not made; the workload next in line
    grows and its explanation names the quota."""
    b = SnapshotBuilder()
    b.node("w0", gpus=8, labels=WHOLE).node("w1", gpus=8, labels=WHOLE)
    b.workload("serving", "chat", replicas=1, nodes=["w0"])
    # first in line to grow back: the older one (victim order priority, newest)
    training(b, "first", replicas=2, nodes=["w1"], max_replicas=4, namespace="capped")
    training(b, "second", replicas=2, nodes=["w1"], max_replicas=4, namespace="ml", created=10)
    b.quota("capped", hard=2, used=2)
    snap = b.build()
    engine = Engine(make_policy(mig=None))
    decisions = [d for t in range(0, 130, 5) for d in engine.evaluate(T0 + t, snap)]
    grows = [d for d in decisions if isinstance(d, Scale)]
    assert grows
    assert {(d.workload, d.to_replicas) for d in grows} == {("ml/second", 3)}
    why = {a.option: a.why_not for a in grows[0].explanation.alternatives}
    assert "quota" in why["grow capped/first"]


def test_replacement_of_an_evicted_pod_reverts_no_mig_node() -> None:
    evicted_and_replaced()


def evicted_and_replaced() -> tuple[list[Decision], float, Snapshot]:
    """Regression: a breach evicts a training pod; its Job recreates it, pending; that pod is
    Ebbtide's own doing, not demand, so the MIG node is not reverted minutes later (which would
    undo the eviction)."""
    b = SnapshotBuilder()
    b.node("w0", gpus=8, labels=WHOLE)
    b.node("m0", gpus=8, labels=MIG, mig_config="all-1g.10gb")
    b.workload("serving", "chat", replicas=2, nodes=["w0"], priority=SERVING_PRIORITY)
    b.workload("ml", "batch", kind="Job", replicas=6, labels=TRAINING, nodes=["w0"])
    engine = Engine(make_policy())
    for t, ds in run(engine, b.build(), T0, T0 + 15, 300.0):  # noqa: B007 (t: the breach)
        if ds:
            break
    evicted = [d.pod for d in ds if isinstance(d, Evict)]
    assert evicted
    assert all(p.startswith("ml/batch-") for p in evicted)
    after = SnapshotBuilder()
    after.node("w0", gpus=8, labels=WHOLE)
    after.node("m0", gpus=8, labels=MIG, mig_config="all-1g.10gb")
    after.workload("serving", "chat", replicas=2 + len(evicted), nodes=["w0"])
    after.workload("ml", "batch", kind="Job", replicas=6, labels=TRAINING)
    for i in range(6):
        gone = f"ml/batch-{i}" in evicted
        after.pod(
            "ml",
            f"batch-{i + 6 if gone else i}",
            node=None if gone else "w0",
            gpus=1,
            labels=TRAINING,
            workload="ml/batch",
            created=t + 3 if gone else 0.0,
        )
    snap = after.build()
    assert Inventory(snap, make_policy()).pending_whole_gpus == len(evicted)  # counted before
    later = [d for s in range(30, 900, 30) for d in engine.evaluate(t + s, snap)]
    assert not [d for d in later if isinstance(d, MigRevert)]
    return ds, t, snap


def reverts_after_restart(ds: list[Decision], t: float, snap: Snapshot, *, log: bool) -> bool:
    """A replica restarted between the evictions and the replacements' creation: it reads the
    decisions log's intent records back (``log``) or starts from nothing."""
    engine = Engine(make_policy())
    for d in ds if log else ():
        engine.record(LogRecord.of(json.loads(json.dumps(decision_to_dict(d) | INTENT))))
    later = [d for s in range(30, 900, 30) for d in engine.evaluate(t + s, snap)]
    return any(isinstance(d, MigRevert) for d in later)


def test_after_a_restart_replacements_still_revert_no_mig_node() -> None:
    """Regression: the evicted workloads were known only in engine memory, so after a restart
    the replacement pods counted as demand again and the MIG node was reverted. The intent
    record names the workload (``disrupts``) and start-up reads it back."""
    ds, t, snap = evicted_and_replaced()
    assert {decision_to_dict(d).get("disrupts") for d in ds if isinstance(d, Evict)} == {"ml/batch"}
    assert reverts_after_restart(ds, t, snap, log=False)  # what the test is about
    assert not reverts_after_restart(ds, t, snap, log=True)


def test_pod_pending_for_other_reasons_is_still_demand() -> None:
    """A pending pod created long after the eviction is real demand: the filter is no blanket."""
    b = SnapshotBuilder().node("w0", gpus=8, labels=WHOLE)
    b.workload("ml", "batch", kind="Job", replicas=1, labels=TRAINING)
    b.pod("ml", "batch-9", gpus=2, labels=TRAINING, workload="ml/batch", created=T0 + 3600)
    inv = Inventory(b.build(), POLICY, disrupted={"ml/batch": (T0,)})
    assert inv.pending_whole_gpus == 2
    assert inv.replacements == []


def test_idle_held_gpus_are_reported_reclaimable() -> None:
    """GPUs held by pods but idle for the whole utilization window show as reclaimable, in pool
    status and as a Prometheus gauge; busy ones and free ones do not."""
    b = SnapshotBuilder()
    b.node("w0", gpus=4, labels=WHOLE).node("w1", gpus=4, labels=WHOLE)
    b.workload("serving", "chat", replicas=3, nodes=["w0"])  # 3 held on w0, 1 free
    b.workload("serving", "busy", replicas=4, nodes=["w1"])
    snap = b.build()
    engine = Engine(make_policy())
    for s in range(0, 660, 30):
        for n in ("w0", "w1"):
            for g in range(4):
                engine.observe(util(T0 + s, n, g, 1.0 if n == "w0" else 80.0))
        engine.evaluate(T0 + s, snap)
    status = {p.name: p for p in engine.pool_status(T0 + 630)}
    assert status["whole"].reclaimable_gpus == 3
    assert status["mig"].reclaimable_gpus == 0
    sources = StateSources(
        engine=lambda: engine, consumer=lambda: None, is_leader=lambda: True, clock=lambda: T0 + 630
    )
    text = generate_latest(Metrics(sources).registry).decode()
    assert 'ebbtide_reclaimable_gpus{pool="whole"} 3.0' in text


def test_idle_free_gpus_beside_busy_held_ones_are_not_reclaimable() -> None:
    """Regression: which GPU a pod holds is not known, so idle GPUs on a node were counted
    against its held ones: two busy replicas beside two free (idle) GPUs showed 2 reclaimable.
    Only idle GPUs beyond the free ones must be held: none here, one with three idle."""
    b = SnapshotBuilder().node("w0", gpus=4, labels=WHOLE)
    b.workload("serving", "chat", replicas=2, nodes=["w0"])  # 2 held, 2 free
    snap = b.build()
    engine = Engine(make_policy())
    for busy, want in (((0, 1), 0), ((0,), 1)):
        for s in range(0, 660, 30):
            for g in range(4):
                engine.observe(util(T0 + s, "w0", g, 80.0 if g in busy else 1.0))
            engine.evaluate(T0 + s, snap)
        status = {p.name: p for p in engine.pool_status(T0 + 630)}
        assert status["whole"].reclaimable_gpus == want
        engine = Engine(make_policy())


@pytest.mark.parametrize(
    ("where", "gpus", "demand"),
    [
        pytest.param(Placement(), 4, True, id="fits-a-whole-node"),
        pytest.param(Placement(WHOLE), 4, True, id="selects-the-whole-pool"),
        pytest.param(Placement(H100), 4, False, id="model-no-node-has"),
        pytest.param(Placement(), 16, False, id="larger-than-any-node"),
    ],
)
def test_only_pods_some_node_could_take_are_demand_and_revert_mig(
    where: Placement, gpus: int, demand: bool
) -> None:
    """A pending pod is demand only if some node, once in a pool, could take it (the MIG node
    counts: a revert relabels it into the whole pool). A pod asking for a model or a size no
    node has waits for nothing Ebbtide can give, so it reverts no MIG node."""
    b = SnapshotBuilder().node("w0", gpus=8, labels=WHOLE)
    b.node("m0", gpus=8, labels=MIG, mig_config="all-1g.10gb")
    b.workload("serving", "chat", replicas=8, nodes=["w0"])
    b.pod("ml", "waiting", gpus=gpus, placement=where)
    snap = b.build()
    inv = Inventory(snap, POLICY)
    assert [p.name for p in inv.pending_whole] == (["waiting"] if demand else [])
    engine = Engine(make_policy())
    reverts = [
        d.target
        for s in range(0, 300, 10)
        for d in engine.evaluate(T0 + s, snap)
        if isinstance(d, MigRevert)
    ]
    assert reverts == (["m0"] if demand else [])


def test_a_breach_scales_only_as_far_as_the_namespace_quota_allows() -> None:
    """Replicas the quota would refuse would only wait, so no training is evicted for them: chat
    wants 5 replicas, its namespace has room for one more, so one pod is evicted and chat
    scales 1→2, naming the quota."""
    b = SnapshotBuilder().node("w0", gpus=8, labels=WHOLE)
    b.workload("serving", "chat", replicas=1, nodes=["w0"], priority=SERVING_PRIORITY)
    training(b, "batch", replicas=7, nodes=["w0"])
    b.quota("serving", hard=2, used=1)
    engine = Engine(make_policy())
    for _, ds in run(engine, b.build(), T0, T0 + 12, 500.0):
        if ds:
            break
    assert len([d for d in ds if isinstance(d, Evict)]) == 1
    scale = next(d for d in ds if isinstance(d, Scale))
    assert (scale.from_replicas, scale.to_replicas) == (1, 2)
    assert any("quota" in a.why_not for a in scale.explanation.alternatives)


MIG_TAINT = Taint("nvidia.com/mig", "true", "NoSchedule")


@pytest.mark.parametrize(
    ("taints", "where", "lands"),
    [
        pytest.param((MIG_TAINT,), Placement(WHOLE), True, id="pool-taint-goes-with-a-revert"),
        pytest.param((GPU_TAINT,), Placement(WHOLE), False, id="own-taint-stays"),
        pytest.param(
            (GPU_TAINT,),
            Placement(WHOLE, (Toleration("nvidia.com/gpu", "Exists"),)),
            True,
            id="own-taint-tolerated",
        ),
    ],
)
def test_could_land_moves_pool_labels_and_taints(
    taints: tuple[Taint, ...], where: Placement, lands: bool
) -> None:
    """A MIG node (the only node) could serve a whole-GPU pod once reverted into the whole
    pool: it takes that pool's labels and loses the mig pool's taints, but keeps its own."""
    m0 = SnapshotBuilder().node("m0", labels=MIG, mig_config="all-1g.10gb", taints=taints)
    pools = [(WHOLE, ()), (MIG, (MIG_TAINT,))]
    assert could_land(m0.build().nodes, pools, where, 4) is lands

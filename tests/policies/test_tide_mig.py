"""The MIG half of the day's tide: elastic training below its maximum is whole-card demand
that brings a MIG node back, and a node brought back is idle only from then on."""

from __future__ import annotations

from policy_fixtures import MIG, T0, WHOLE, cluster, make_policy, training, util

from policies.decisions import Decision, MigConvert, MigRevert
from policies.engine import Engine
from policies.snapshot import Snapshot, SnapshotBuilder


def test_training_below_its_maximum_reverts_an_empty_mig_node() -> None:
    """w0 full: training at 7 of its 9 replicas, no pod pending. After revertAfter (2m) of
    training wanting 2 GPUs that the whole pool lacks, the empty MIG node m0 comes back; at its
    maximum, training wants nothing and nothing is reverted."""
    for replicas, want in ((7, [120]), (9, [])):
        engine = Engine(make_policy())
        b = cluster(whole_nodes=1, gpus=10, mig_nodes=1)
        training(b, "elastic", replicas=replicas, nodes=["w0"], min_replicas=2, max_replicas=9)
        if replicas < 9:
            b.pod("ml", "filler", gpus=9 - replicas, node="w0")  # keep w0 full
        snap = b.build()
        reverts = [
            s
            for s in range(0, 200, 10)
            for d in engine.evaluate(T0 + s, snap)
            if isinstance(d, MigRevert)
        ]
        assert reverts == want, replicas


def readings(engine: Engine, snap: Snapshot, now: float) -> None:
    for node in snap.nodes:
        for gpu in range(8):
            engine.observe(util(now, node.name, gpu, 1.0))


def test_a_reverted_node_is_idle_only_from_its_revert() -> None:
    """m0, a MIG node idle since 0s, is reverted at 120s for a pending 4-GPU pod. Once whole
    (the pod placed elsewhere), it is converted again only after convertAfter (10m) of idleness
    as a whole node, not at once for the idleness it showed as a MIG node."""
    engine = Engine(make_policy())
    before = cluster(whole_nodes=1, gpus=8, mig_nodes=1)
    training(before, "rigid", replicas=7, nodes=["w0"])
    before.pod("ml", "waiting", gpus=4, labels={"ebbtide.io/class": "training"})
    after = SnapshotBuilder()
    after.node("w0", gpus=8, labels=WHOLE)
    after.node("m0", gpus=8, labels=WHOLE)
    after.node("w1", gpus=8, labels=WHOLE)
    after.node("m1", gpus=8, labels=MIG, mig_config="all-1g.10gb")
    after.workload("serving", "chat", replicas=1, nodes=["w0"])
    training(after, "rigid", replicas=7, nodes=["w0"])
    training(after, "moved", replicas=4, nodes=["w1"])
    got: list[tuple[int, Decision]] = []
    for s in range(0, 1500, 30):
        snap = before.build() if s < 150 else after.build()
        readings(engine, snap, T0 + s)
        got += [(s, d) for d in engine.evaluate(T0 + s, snap)]
    reverted = [s for s, d in got if isinstance(d, MigRevert)]
    converted = [s for s, d in got if isinstance(d, MigConvert) and d.target == "m0"]
    assert reverted == [120]
    assert converted
    # first reading as a whole node at 150s, plus convertAfter, less the one missed reading
    # (60s) an idle period may have; the MIG-era history would allow 600s
    assert converted[0] >= 150 + 600 - 60

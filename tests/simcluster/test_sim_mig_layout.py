"""The simulated cluster applies mixed MIG layouts (the policy's named configs) as the real MIG
manager does, through the same layout table as the Kubernetes flow."""

from __future__ import annotations

from sim_builders import DELAYS, MIG, POOLS, T0, WHOLE, apply, convert, pods, revert

from controller.loop.port import Outcome
from controller.simcluster import SimCluster
from policies.snapshot import SnapshotBuilder

BALANCED = {"all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}


async def test_mixed_layout_converts_and_reverts_to_the_same_cards() -> None:
    """all-balanced on 2 GPUs gives four 1g, two 2g and two 3g instances; reverting gives back
    2 whole cards, not one per profile entry."""
    b = SnapshotBuilder().node("w0", gpus=2, labels=WHOLE)
    c = SimCluster(b.build(), delays=DELAYS, start=T0, pools=POOLS, mig_configs=BALANCED)
    [started] = await apply(c, convert("w0", "all-balanced"))
    assert started.outcome is Outcome.IN_PROGRESS
    c.advance(T0 + 1000)
    node = c.snapshot().nodes[0]
    assert (node.mig_config, node.mig_state, dict(node.labels)) == ("all-balanced", "success", MIG)
    assert node.mig_capacity() == {"1g.10gb": 4, "2g.20gb": 2, "3g.40gb": 2}
    await apply(c, revert("w0", "all-balanced", at=T0 + 1000))
    c.advance(T0 + 2000)
    node = c.snapshot().nodes[0]
    assert (node.mig_config, node.whole_gpus, len(node.gpus)) == ("all-disabled", 2, 2)
    assert pods(c) == {}

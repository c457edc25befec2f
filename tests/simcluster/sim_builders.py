"""Builders for the simulator tests: small clusters, decisions, and a step-by-step driver."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.loop.port import ActionResult
from controller.simcluster import EPOCH, PodTemplate, SimCluster, SimDelays
from policies.decisions import Decision, Evict, Explanation, MigConvert, MigRevert, Scale
from policies.model import PoolSpec
from policies.snapshot import Pod, SnapshotBuilder

T0 = EPOCH
WHOLE = {"ebbtide.io/pool": "whole"}
MIG = {"ebbtide.io/pool": "mig"}
TRAINING = {"ebbtide.io/class": "training"}
POOLS = {
    "whole": PoolSpec(node_selector=WHOLE, kind="whole"),
    "mig": PoolSpec(node_selector=MIG, kind="mig"),
}
WHY = Explanation.of("test", "a test decided it")
DELAYS = SimDelays(
    eviction_grace_s=30,
    pod_startup_s=10,
    mig_reconfigure_s=120,
    mig_failure_probability=0.0,
    scale_up_create_s=2,
)


def cluster(
    b: SnapshotBuilder,
    *,
    delays: SimDelays = DELAYS,
    seed: int = 0,
    templates: Mapping[str, PodTemplate] | None = None,
    pod_selectors: Mapping[str, Mapping[str, str]] | None = None,
) -> SimCluster:
    """A SimCluster at T0 over the builder's snapshot, with the whole/mig pools."""
    return SimCluster(
        b.build(),
        delays=delays,
        seed=seed,
        start=T0,
        pools=POOLS,
        templates=templates,
        pod_selectors=pod_selectors,
    )


def two_whole_nodes(gpus: int = 4) -> SnapshotBuilder:
    """Nodes w0, w1 (``gpus`` whole A100s each, pool whole), no pods."""
    return (
        SnapshotBuilder()
        .priority_class("low", 10)
        .priority_class("high", 1000)
        .node("w0", gpus=gpus, labels=WHOLE)
        .node("w1", gpus=gpus, labels=WHOLE)
    )


def evict(pod: str, *, grace: float = 5.0, at: float = T0, dry_run: bool = False) -> Evict:
    return Evict(at, pod, None, None, grace, WHY, dry_run=dry_run)


def scale(workload: str, to: int, *, frm: int = 0, at: float = T0, dry_run: bool = False) -> Scale:
    role: Any = "training"
    return Scale(at, workload, "Deployment", frm, to, role, WHY, dry_run=dry_run)


def convert(node: str, profile: str = "all-1g.10gb", *, at: float = T0) -> MigConvert:
    return MigConvert(at, node, profile, "A100-80GB", WHY)


def revert(node: str, profile: str = "all-1g.10gb", *, at: float = T0) -> MigRevert:
    return MigRevert(at, node, profile, WHY)


async def apply(c: SimCluster, *decisions: Decision) -> list[ActionResult]:
    return await c.apply(list(decisions))


def pods(c: SimCluster) -> dict[str, Pod]:
    """The snapshot's pods by key."""
    return {p.key: p for p in c.snapshot().pods}


def where(c: SimCluster) -> dict[str, tuple[str | None, str]]:
    """Each pod's node and phase."""
    return {k: (p.node, p.phase) for k, p in pods(c).items()}


def kinds(c: SimCluster, target: str) -> list[tuple[float, str]]:
    """(offset from T0, kind) of the effects on ``target``."""
    return [(e.at - T0, e.kind) for e in c.effects if e.target == target]

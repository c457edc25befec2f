"""The simulated cluster as a process runtime: ``ebbtide run --cluster sim:SCENARIO``.

The simulator's clock follows the wall clock (``tick`` advances it to now), it is always the
leader (there is no one to share it with), and every decision passes the same
:class:`~controller.loop.gate.SafetyGate` the Kubernetes actuator uses — dry-run, kill switch,
in-flight, budgets, selectors, protected namespaces and ``do-not-disrupt`` — with the target's
labels read from the simulator's current snapshot, as the Kubernetes actuator re-reads the live
object. Live runs and replays therefore refuse exactly what a real cluster would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from controller.loop.gate import SafetyGate, Target, Verdict
from controller.loop.port import ActionResult, Cluster, Notice, Outcome
from controller.simcluster.scenario import load_scenario
from controller.simcluster.simulator import SimCluster
from policies.budgets import Ledger
from policies.decisions import Decision, Evict, MigConvert, MigRevert, Scale
from policies.drain import DrainRule
from policies.model import Policy
from policies.snapshot import Snapshot

__all__ = ["GatedSimCluster", "SimRuntime", "target_of"]


def target_of(snapshot: Snapshot, decision: Decision) -> Target | None:
    """The object ``decision`` would change, as the snapshot shows it (``None``: gone)."""
    if isinstance(decision, Evict):
        namespace, _, name = decision.pod.partition("/")
        pod = next((p for p in snapshot.pods if p.key == decision.pod), None)
        return None if pod is None else Target("Pod", name, namespace, pod.labels, pod.annotations)
    if isinstance(decision, Scale):
        namespace, _, name = decision.workload.partition("/")
        wl = next((w for w in snapshot.workloads if w.key == decision.workload), None)
        return None if wl is None else Target(wl.kind, name, namespace, wl.labels, wl.annotations)
    node = next((n for n in snapshot.nodes if n.name == decision.node), None)
    return None if node is None else Target("Node", node.name, None, node.labels, node.annotations)


class GatedSimCluster:
    """The cluster port over a :class:`SimCluster`, every decision through a gate."""

    def __init__(self, sim: SimCluster, gate: SafetyGate) -> None:
        self.sim = sim
        self.gate = gate

    @property
    def synced(self) -> bool:
        return self.sim.synced

    def snapshot(self) -> Snapshot:
        return self.sim.snapshot()

    async def apply(self, decisions: Sequence[Decision]) -> list[ActionResult]:
        return [await self._apply_one(d) for d in decisions]

    async def report(self, result: ActionResult) -> None:
        await self.sim.report(result)

    async def notice(self, notice: Notice) -> None:
        await self.sim.notice(notice)

    async def _apply_one(self, d: Decision) -> ActionResult:
        with self.gate.hold(d) as permit:
            if not permit.ok:
                return _result(d, permit.verdict)
            target = target_of(self.sim.snapshot(), d)
            if target is None:
                return ActionResult(d, Outcome.ALREADY_DONE, f"{d.target} is gone")
            verdict = self.gate.check_target(d, target)
            if not verdict.ok:
                return _result(d, verdict)
            if isinstance(d, MigConvert | MigRevert):
                self.sim.drain = DrainRule.of(self.gate.policy)  # reloads included
            if self.gate.dry_run_for(d):
                return ActionResult(d, Outcome.DRY_RUN, f"would {d.action} {d.target}")
            verdict = permit.reserve()
            if not verdict.ok:
                return _result(d, verdict)
            (result,) = await self.sim.apply([d])
            if result.outcome is Outcome.APPLIED:
                permit.spend()
            return result


def _result(d: Decision, verdict: Verdict) -> ActionResult:
    return ActionResult(d, verdict.outcome or Outcome.REFUSED, verdict.reason, why=verdict.why)


class SimRuntime:
    """A simulated cluster driven by the wall clock."""

    def __init__(self, sim: SimCluster, gate: SafetyGate) -> None:
        self.gate = gate
        self._cluster = GatedSimCluster(sim, gate)

    @classmethod
    def from_file(cls, scenario: Path, policy: Policy, *, dry_run: bool) -> SimRuntime:
        """The scenario's cluster from now on, gated under ``policy`` (``dry_run``: the
        process's flag, as :meth:`controller.process.settings.Settings.dry_run_for` settles it)."""
        sim = SimCluster.from_scenario(load_scenario(scenario), start=time.time(), policy=policy)
        return cls(sim, SafetyGate(policy, dry_run=dry_run))

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    @property
    def ledger(self) -> Ledger:
        return self.gate.ledger

    def is_leader(self) -> bool:
        return True

    def reconfigure(self, policy: Policy) -> None:
        self.gate.reconfigure(policy)

    async def run(self) -> None:
        """Nothing runs in the background: :meth:`tick` moves the simulation."""
        await asyncio.Event().wait()

    async def tick(self, now: float) -> list[ActionResult]:
        self._cluster.sim.advance(now)
        return []

    async def close(self) -> None:
        return None

"""The engine's deciding: running the rules for one round, and taking feedback on what they decided.

Design:

* A round runs the rules in a fixed order, each in its own module: for each breaching service
  (or one with a leading indicator) the breach response (:func:`~policies.rules.
  respond_to_breach`: the HPA-style ``desired = ceil(replicas * p / objective)``, and the GPUs
  that needs freed by :func:`~policies.preemption.plan_capacity`: shrink, then evict); giving
  replicas back when a service is comfortably within its objective (:mod:`policies.scaledown`:
  HPA-style, stabilized, step-limited; its recommendations are recorded every tick, even while
  nothing may be decided); growing elastic training back into idle GPUs and MIG revert and
  conversion (:mod:`policies.pool_rules`). Which services a round rules, and whether the pool
  rules run at all, is the schedule's (:mod:`policies.scheduling`).
* Budgets and cooldowns (:mod:`policies.budgets`) are checked before each decision and spent
  right after, inside the round, so no caller can exceed them. The budgets live in a
  :class:`~policies.budgets.Ledger` that the caller may share with its safety gate; outcomes
  come back through :meth:`Decider.not_done` and the decisions log through
  :meth:`Decider.record`, so the engine, the gate and every replica count one verdict per
  decision.
* What the rules remember between rounds lives here: cooldowns, MIG flights and holds, when a
  pool's GPUs went free, pods and workloads held off after a refusal, and the workloads
  Ebbtide disrupted (their replacement pods are no demand).
"""

from __future__ import annotations

import math

from policies.budgets import Budgets, Cooldowns, Ledger, LogRecord
from policies.decisions import Decision, Evict, MigConvert, MigRevert, Scale
from policies.indicators import request_rate
from policies.intake import Intake
from policies.inventory import Inventory, note_disrupted
from policies.loadsignals import tick_round
from policies.mig import MigFlights
from policies.model import Policy
from policies.pool_rules import (
    gave_back_key,
    grow_quiet_until,
    grow_training,
    mig_quiet_until,
    run_mig,
)
from policies.rules import Round, breach_wait_until, respond_to_breach, responds
from policies.scaledown import scale_down
from policies.servicetrack import ServiceTrack, observe_load

__all__ = ["Decider"]


class Decider:
    """Runs the rules and takes their feedback. See the module docstring."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.budgets: Budgets = ledger.budgets
        self.cooldowns = Cooldowns()
        self._flights = MigFlights()
        self._free_since: dict[str, float] = {}
        self._held: dict[str, tuple[float, str]] = {}
        #: training workload -> (until, why): its shrink failed, so it is not shrunk again
        #: before then (another try would fail the same way); its pods may still be evicted
        self._resize_held: dict[str, tuple[float, str]] = {}
        #: workload -> when Ebbtide last evicted from or shrank it (its replacements are no demand)
        self.disrupted: dict[str, tuple[float, ...]] = {}
        self._demand_since: list[float | None] = [None]
        #: The latest hold on a MIG node after a failed flow.
        self._mig_held_until = -math.inf

    def configure(self, policy: Policy, keep: set[str]) -> None:
        """Adopt a policy: its budgets; the cooldowns of services and pools it still has."""
        self.ledger.reconfigure(policy.spec.budgets)
        self.cooldowns.forget(keep)

    def round(
        self, now: float, policy: Policy, inv: Inventory, intake: Intake | None = None
    ) -> Round:
        """A new round at ``now``; pods and workloads whose hold ran out are free again. The
        intake's signals (further objectives, load gauges, pod GPU readings) come with it."""
        self._held = {pod: hold for pod, hold in self._held.items() if hold[0] > now}
        self._resize_held = {w: hold for w, hold in self._resize_held.items() if hold[0] > now}
        return Round(
            now=now,
            policy=policy,
            inv=inv,
            budgets=self.budgets,
            cooldowns=self.cooldowns,
            held={pod: why for pod, (_, why) in self._held.items()},
            resize_held={w: why for w, (_, why) in self._resize_held.items()},
            disrupted=self.disrupted,
            signals={} if intake is None else intake.signals,
            pod_util={} if intake is None else intake.pod_util,
        )

    def rule_services(
        self, rnd: Round, ruled: list[ServiceTrack], last_round: float | None
    ) -> list[tuple[ServiceTrack, float]]:
        """Run the service rules for ``ruled`` (breach responses first, then scale-downs);
        returns each with until when, with the same SLO state and snapshot, its rules would
        only hold (``math.inf``: settled; ``-math.inf``: they may act at any tick)."""
        for svc in ruled:
            observe_load(svc, rnd.now, rnd.inv)
            sig = rnd.signals.get(svc.key)
            if sig is not None:  # its further objectives and work-bound check, every round
                wb = svc.spec.scale is not None and svc.spec.scale.work_bound is not None
                wb = wb and svc.samples >= svc.min_samples  # too few requests: no verdict
                workload = rnd.inv.service_workload.get(svc.key)
                tick_round(
                    sig,
                    svc.spec,
                    rnd.now,
                    p_ms=svc.latency.quantile(rnd.now, svc.q) if wb else None,
                    rate=request_rate(svc.spec, svc.samples, svc.latency, rnd.now) if wb else None,
                    replicas=None if workload is None else workload.replicas,
                )
            if responds(svc.spec, svc.slo):
                respond_to_breach(
                    rnd,
                    svc.key,
                    svc.spec,
                    svc.slo,
                    svc.latency,
                    requests=svc.samples,
                    load=svc.load,
                )
        out = []
        now, inv = rnd.now, rnd.inv
        for svc in ruled:
            down = svc.down
            settled = True
            if down is not None:
                if (
                    svc.ruled_at is not None
                    and last_round is not None
                    and svc.ruled_at < last_round
                ):
                    spec_down = svc.spec.scale.down if svc.spec.scale is not None else None
                    if spec_down is not None:  # the rounds that skipped it, each a hold
                        down.hold(
                            last_round,
                            window_s=spec_down.stabilization,
                            crowd=spec_down.crowd,
                        )
                settled = scale_down(
                    rnd,
                    svc.key,
                    svc.spec,
                    svc.slo,
                    svc.latency,
                    down,
                    samples=svc.samples,
                    load=svc.load,
                )
            svc.ruled_at = now
            workload = inv.service_workload.get(svc.key)
            until = breach_wait_until(rnd, svc.key, svc.spec, svc.slo, workload)
            out.append((svc, until if settled else -math.inf))
        return out

    def rule_pools(self, rnd: Round, intake: Intake, busy_pools: set[str]) -> tuple[float, bool]:
        """Run the pool rules (training growth, then MIG); returns until when, with the same
        snapshot and busy pools, they would decide nothing, and whether whole-card demand is
        unmet (each rule's own answer, :mod:`policies.pool_rules`)."""
        spec = rnd.policy.spec
        now = rnd.now
        held = grow_training(rnd, busy_pools=busy_pools, free_since=self._free_since)
        until, unmet = math.inf, False
        mig = spec.mig
        if mig is not None and mig.enabled:
            pool_window = intake.pool_windows[mig.from_pool]
            run_mig(
                rnd,
                mig=mig,
                pool_window=pool_window,
                idle=intake.idle,
                flights=self._flights,
                demand_since=self._demand_since,
                stale_s=intake.stale_s,
                breaching=bool(busy_pools),
            )
            until, unmet = mig_quiet_until(
                now,
                mig=mig,
                inv=rnd.inv,
                flights=self._flights,
                demand_since=self._demand_since,
                pool_window=pool_window,
                breaching=bool(busy_pools),
                held_until=self._mig_held_until,
            )
        grow = grow_quiet_until(
            now,
            rnd.policy,
            budgets=self.budgets,
            cooldowns=self.cooldowns,
            free_since=self._free_since,
            held_until=held,
        )
        return min(until, grow), unmet

    # -- feedback ------------------------------------------------------------------------------

    def record(self, rec: LogRecord, policy: Policy, services: dict[str, ServiceTrack]) -> None:
        """See :meth:`policies.engine.Engine.record`."""
        if not self.ledger.record(rec):
            return
        done = self.ledger.verdict(rec.id) != "not_done"
        if rec.disrupts is not None and done:
            note_disrupted(self.disrupted, rec.disrupts, rec.at)  # replacements: no demand
        for key, _ in self._cooldowns_of(policy, services, rec.cause, rec.pool):
            if done:
                self.cooldowns.mark(key, rec.at)
            else:
                self.cooldowns.retry(key, rec.at, not_before=rec.at)

    def not_done(
        self,
        decision: Decision,
        policy: Policy,
        services: dict[str, ServiceTrack],
        *,
        reason: str,
        retry_at: float | None,
        hold_until: float | None,
    ) -> None:
        """See :meth:`policies.engine.Engine.not_done`."""
        self.ledger.settle(decision.id, action=decision.action, done=False, at=decision.at)
        retry = decision.at if retry_at is None else retry_at
        pool = decision.pool if isinstance(decision, Scale) else None
        for key, quiet in self._cooldowns_of(policy, services, decision.cause, pool):
            not_before = min(retry, decision.at + quiet)
            self.cooldowns.retry(key, decision.at, not_before=not_before)
        svc = None if decision.cause is None else services.get(decision.cause)
        if (
            svc is not None
            and isinstance(decision, Scale)
            and decision.role == "inference"
            and decision.to_replicas < decision.from_replicas
        ):  # gave nothing back: training waits growAfter for what else goes free
            self.cooldowns.retry(gave_back_key(svc.spec.pool), decision.at, not_before=decision.at)
        if isinstance(decision, MigConvert | MigRevert):
            self._flights.drop(decision.node, hold_until=hold_until)
            if hold_until is not None:
                self._mig_held_until = max(self._mig_held_until, hold_until)
        if hold_until is not None and isinstance(decision, Evict):
            self._held[decision.pod] = (hold_until, reason)
        if (
            hold_until is not None
            and isinstance(decision, Scale)
            and decision.role == "training"
            and decision.to_replicas < decision.from_replicas
        ):
            self._resize_held[decision.workload] = (hold_until, reason)

    @staticmethod
    def _cooldowns_of(
        policy: Policy, services: dict[str, ServiceTrack], cause: str | None, pool: str | None
    ) -> list[tuple[str, float]]:
        """The cooldowns an action started, with their length: a service's response starts
        the service's and its pool's (:func:`~policies.rules.respond_to_breach`), a training
        grow its pool's."""
        spec = policy.spec
        keys = []
        svc = None if cause is None else services.get(cause)
        if svc is not None:
            quiet = svc.spec.cooldown
            keys.append((svc.key, spec.cooldowns.service if quiet is None else quiet))
            pool = svc.spec.pool
        if pool is not None:
            keys.append((f"pool:{pool}", spec.cooldowns.training_grow))
        return keys

"""The last gate before any write: defence in depth behind the engine.

The engine already respects budgets, selectors and protections when it decides. Between its
decision and the write, though, the cluster moves on, the policy may be reloaded, leadership may
be lost, and a second evaluation may decide the same thing again. Every actuator (the Kubernetes
one and the simulated cluster's) therefore passes each decision through a :class:`SafetyGate`
right before it writes, and the gate answers from its *own* state, never from the engine's.

Design:

* **Checks in the order they are cheapest and most absolute.** :meth:`SafetyGate.hold` checks
  leadership, the kill switch (the policy's ``killSwitch`` or the process-level flag) and the
  per-target in-flight set, and claims the target for the duration of the ``with`` block, so an
  action on one object is never issued twice, even by overlapping ``apply`` calls. The returned
  :class:`Permit` then checks the budget (:meth:`Permit.reserve`) and, when the actuator
  reports the action applied, settles it as done (:meth:`Permit.spend`). The budgets are a
  :class:`policies.budgets.Ledger` the gate shares with the engine (``ledger=``), and both
  read the decisions log into it the same way: a decision the engine took already counts, and
  the gate checks that it is still within its budget right before the write (a reload may have
  lowered it, a peer's record may have used it); an action the engine did not decide (a MIG
  flow's drain eviction) is entered when reserved and given back if it is not carried out.
  A refused, blocked or failed action costs nothing.
* **Target checks are pure** (:func:`target_refusal`): the actuator re-reads the live object and
  hands its kind, namespace, labels and annotations over as a :class:`Target`. Scale and evict
  act only on workloads and pods matching the training selector (or, for a scale of inference, a
  workload the policy names as a scaled service); MIG conversion only on nodes of the
  ``mig.fromPool`` pool and revert only on nodes of ``mig.toPool``; nothing in a protected
  namespace; nothing carrying ``ebbtide.io/do-not-disrupt`` (any value but ``"false"``),
  Karpenter's ``karpenter.sh/do-not-disrupt: "true"`` or the cluster autoscaler's
  ``safe-to-evict: "false"``.
* **Dry-run** (the policy's ``dryRun``, the decision's ``dry_run`` or the process flag): the
  actuator reads, checks, and reports what it *would* do; it writes nothing but Events.
* **Leadership is checked again immediately before each write** (:meth:`SafetyGate.check_write`),
  because an ``await`` on a read may have outlasted the lease.

Time comes from an injected clock, so tests and the simulator drive budgets with fake time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

from controller.loop.port import NOT_LEADER, Outcome, Why
from policies.budgets import Budgets, BudgetState, Ledger, SlidingBudget
from policies.decisions import Decision, Evict, MigConvert, Scale
from policies.drain import disrupt_annotation, disrupt_forbidden
from policies.model import Policy
from policies.snapshot import FrozenMap

__all__ = [
    "GO",
    "Permit",
    "SafetyGate",
    "Target",
    "Verdict",
    "disrupt_forbidden",
    "flight_key",
    "target_refusal",
]

_NONE: Final[Mapping[str, str]] = FrozenMap()


@dataclass(frozen=True, slots=True)
class Target:
    """The live object a decision would change, as re-read right before the write."""

    kind: str
    """``Pod``, ``Node``, ``Deployment``, ``PyTorchJob``, …"""
    name: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: _NONE)
    annotations: Mapping[str, str] = field(default_factory=lambda: _NONE)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The gate's answer: ``outcome`` is ``None`` to go on, else how the decision ends."""

    outcome: Outcome | None = None
    reason: str = ""
    why: Why | None = None
    """For a refusal whose reason decides what happens next (a follower's)."""

    @property
    def ok(self) -> bool:
        return self.outcome is None


GO: Final = Verdict()


def _refuse(reason: str, why: Why | None = None) -> Verdict:
    return Verdict(Outcome.REFUSED, reason, why)


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _show(selector: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def flight_key(decision: Decision) -> str:
    """The in-flight key of the object a decision changes (a pod, a workload, a node)."""
    if isinstance(decision, Scale):
        return f"workload:{decision.kind}:{decision.workload}"
    if isinstance(decision, Evict):
        return f"pod:{decision.pod}"
    return f"node:{decision.node}"


def _inference_workloads(policy: Policy) -> set[str]:
    """``namespace/name`` of every workload the policy scales as an inference service."""
    return {
        f"{svc.namespace}/{svc.workload or name}"
        for name, svc in policy.spec.services.items()
        if svc.scale is not None
    }


def target_refusal(policy: Policy, decision: Decision, target: Target) -> str | None:
    """Why ``decision`` must not touch ``target`` under ``policy``, or ``None``. Pure."""
    spec = policy.spec
    if target.namespace is not None and target.namespace in spec.protected_namespaces:
        return f"namespace {target.namespace} is protected"
    if (annotation := disrupt_annotation(target.annotations)) is not None:
        return f"{target.kind} {target.name} is annotated {annotation}"
    if isinstance(decision, Scale):
        key = f"{target.namespace}/{target.name}"
        if decision.role == "inference":
            if key not in _inference_workloads(policy):
                return f"{key} is not a workload the policy scales as an inference service"
            return None
        return _training_refusal(policy, target)
    if isinstance(decision, Evict):
        return _training_refusal(policy, target)
    mig = spec.mig
    if mig is None or not mig.enabled:
        return "MIG conversion is not enabled by the policy"
    pool = mig.from_pool if isinstance(decision, MigConvert) else mig.to_pool
    selector = spec.pools[pool].node_selector if pool in spec.pools else None
    if selector is None:
        return f"pool {pool} is not defined"
    if not _matches(selector, target.labels):
        return f"node {target.name} is not in pool {pool} ({_show(selector)})"
    return None


def _training_refusal(policy: Policy, target: Target) -> str | None:
    training = policy.spec.training
    if training is None:
        return "the policy selects no training workloads"
    if not _matches(training.selector, target.labels):
        selector = _show(training.selector)
        return f"{target.kind} {target.name} does not match the training selector {selector}"
    return None


class Permit:
    """A claim on one target for one decision; see :meth:`SafetyGate.hold`."""

    __slots__ = ("_entered", "_gate", "_reserved", "decision", "spent", "verdict")

    def __init__(self, gate: SafetyGate, decision: Decision, verdict: Verdict) -> None:
        self._gate = gate
        self.decision = decision
        self.verdict = verdict
        self._reserved = False
        self._entered = False
        self.spent = False

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    def reserve(self) -> Verdict:
        """Check the decision against its budget right before the write, or say why not."""
        if not self.verdict.ok:
            return self.verdict
        if self._reserved or self.spent:
            return GO
        verdict, self._entered = self._gate._reserve(self.decision)
        self._reserved = verdict.ok
        return verdict

    def spend(self) -> None:
        """The action was applied: it counts in the ledger (reserved or not)."""
        if self.spent:
            return
        self._gate._settle(self.decision, done=True)
        self._reserved = self._entered = False
        self.spent = True

    def release(self) -> None:
        """The block ends: a unit the gate entered for an action not carried out goes back."""
        if self._entered:
            self._gate._settle(self.decision, done=False)
        self._reserved = self._entered = False


class SafetyGate:
    """Leadership, kill switch, dry-run, in-flight, budgets and target checks for actuators."""

    def __init__(
        self,
        policy: Policy,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        dry_run: bool = False,
        kill_switch: bool = False,
        clock: Callable[[], float] = time.time,
        ledger: Ledger | None = None,
    ) -> None:
        self._policy = policy
        self._is_leader = is_leader
        self.dry_run = dry_run
        """Process-level dry-run: decide and report, write nothing but Events."""
        self.kill_switch = kill_switch
        """Process-level kill switch: refuse every action."""
        self._clock = clock
        self.ledger = ledger if ledger is not None else Ledger(policy.spec.budgets)
        self._in_flight: set[str] = set()

    # --- configuration -------------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self._policy

    def reconfigure(self, policy: Policy) -> None:
        """A reloaded policy: new selectors and limits; what was spent still counts."""
        self._policy = policy
        self.ledger.reconfigure(policy.spec.budgets)

    def now(self) -> float:
        return self._clock()

    # --- checks --------------------------------------------------------------------------------

    def leader(self) -> bool:
        return bool(self._is_leader())

    def halted(self) -> str | None:
        """Why nothing may be done at all (kill switch), or ``None``."""
        if self.kill_switch:
            return "the process kill switch is on"
        if self._policy.spec.kill_switch:
            return f"policy {self._policy.metadata.name} has killSwitch on"
        return None

    def dry_run_for(self, decision: Decision) -> bool:
        """True when ``decision`` must only be reported (process, policy or decision dry-run)."""
        return self.dry_run or self._policy.spec.dry_run or decision.dry_run

    def screen(self, decision: Decision) -> Verdict:
        """Leader, kill switch and in-flight checks for ``decision`` (claims nothing)."""
        if not self.leader():
            return _refuse(NOT_LEADER, Why.NOT_LEADER)
        if (why := self.halted()) is not None:
            return _refuse(why)
        if flight_key(decision) in self._in_flight:
            return Verdict(Outcome.IN_PROGRESS, f"an action on {decision.target} is in flight")
        return GO

    @contextmanager
    def hold(self, decision: Decision) -> Iterator[Permit]:
        """Screen ``decision`` and, when it passes, claim its target until the block ends."""
        verdict = self.screen(decision)
        permit = Permit(self, decision, verdict)
        key = flight_key(decision)
        if verdict.ok:
            self._in_flight.add(key)
        try:
            yield permit
        finally:
            permit.release()
            if verdict.ok:
                self._in_flight.discard(key)

    def check_target(self, decision: Decision, target: Target) -> Verdict:
        """Selectors, protected namespaces and do-not-disrupt on the re-read live object."""
        why = target_refusal(self._policy, decision, target)
        return GO if why is None else _refuse(why)

    def check_write(self) -> Verdict:
        """Immediately before a write: still the leader, and not halted meanwhile."""
        if not self.leader():
            return _refuse(f"{NOT_LEADER} (leadership lost before the write)", Why.NOT_LEADER)
        if (why := self.halted()) is not None:
            return _refuse(why)
        return GO

    def in_flight(self) -> frozenset[str]:
        return frozenset(self._in_flight)

    # --- budgets -------------------------------------------------------------------------------

    @property
    def budgets(self) -> Budgets:
        return self.ledger.budgets

    def budget_for(self, decision: Decision) -> SlidingBudget:
        return self.budgets.for_action(decision.action)

    def budget_states(self) -> list[BudgetState]:
        return self.budgets.states(self.now())

    def _reserve(self, decision: Decision) -> tuple[Verdict, bool]:
        """Check ``decision`` against its budget; ``(verdict, entered)``: whether the gate
        entered it in the ledger (it was not there yet) and must give it back if unused."""
        if self.ledger.verdict(decision.id) == "done":
            return Verdict(Outcome.ALREADY_DONE, f"{decision.id} was carried out already"), False
        budget = self.budget_for(decision)
        now = self.now()
        known = budget.holds(decision.id)
        used = budget.used(now, excluding=decision.id)
        if used >= budget.max:
            return _refuse(
                f"{budget.name} budget spent: {budget.max} per {budget.per_s:g}s ({used} used)"
            ), False
        if known:
            return GO, False
        self.ledger.reserve(decision.id, action=decision.action, now=now)
        return GO, True

    def _settle(self, decision: Decision, *, done: bool) -> None:
        self.ledger.settle(decision.id, action=decision.action, done=done, at=self.now())

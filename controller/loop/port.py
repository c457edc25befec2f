"""The cluster port: what the controller needs from a cluster, whichever cluster it is.

Two adapters implement it: :mod:`controller.kube` (a real cluster through the Kubernetes API) and
the simulated cluster used by replays. The engine never sees either; the process loop asks the
port for a :class:`~policies.snapshot.Snapshot`, gives it to the engine, and hands the engine's
decisions back to the port, which reports one :class:`ActionResult` per decision.

:func:`feed_back` is the one way outcomes go back to the engine, in the live process, replay
and simulate alike: an action that did not happen gives its budget unit and cooldown back, and
a pod a PodDisruptionBudget protected is skipped as a victim for a while.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Protocol

from policies.budgets import Ledger
from policies.decisions import Decision, Scale
from policies.engine import Engine
from policies.model import Policy
from policies.snapshot import Snapshot

__all__ = [
    "MIG_FAILED_HOLD_OFF_S",
    "NOT_FREED",
    "NOT_LEADER",
    "RESIZE_FAILED_HOLD_OFF_S",
    "RETRY_HOLD_OFF_S",
    "ActionResult",
    "Cluster",
    "ClusterRuntime",
    "Outcome",
    "feed_back",
]

#: How long a pod whose eviction a PodDisruptionBudget refused is skipped as a victim, and how
#: long a service waits to try again after part of its response was not carried out.
RETRY_HOLD_OFF_S: Final = 60.0
#: How long a node whose MIG reconfiguration failed is left out of MIG planning.
MIG_FAILED_HOLD_OFF_S: Final = 3600.0
#: How long a training workload whose shrink failed is not shrunk again (other workloads are
#: shrunk, or pods evicted, meanwhile). A failed resize is usually the owner's rule (a webhook's
#: 422) and fails the same way at once: retried after every hold-off it would hold the breach
#: on one victim. Ten minutes: long enough for the breach to be met by other victims, short
#: enough that a transient API failure does not take the workload off the plan for long.
RESIZE_FAILED_HOLD_OFF_S: Final = 600.0
#: The start of the detail of a follower's refusal (a follower decides but never acts).
NOT_LEADER: Final = "not the leader"
#: The start of the detail of a scale-up refused because freeing its GPUs was not carried out.
NOT_FREED: Final = "the GPUs it needs were not freed"


class Outcome(StrEnum):
    """How a decision ended. Metrics label actions with these values."""

    APPLIED = "applied"
    """The cluster was changed as decided."""
    ALREADY_DONE = "already_done"
    """The cluster was already in the decided state (idempotent re-apply, a restart)."""
    DRY_RUN = "dry_run"
    """Nothing was written; the decision was reported as what would have been done."""
    IN_PROGRESS = "in_progress"
    """A multi-step action (MIG conversion) has started or moved on and is not finished."""
    REFUSED = "refused"
    """A safety rule forbade it (budget, selector, protected, do-not-disrupt, not leader)."""
    BLOCKED = "blocked"
    """The cluster said not now (a PodDisruptionBudget answered 429): try another or wait."""
    FAILED = "failed"
    """It was tried and did not work after retries, or a multi-step action rolled back."""


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What became of one decision, with a human-readable ``detail``."""

    decision: Decision
    outcome: Outcome
    detail: str = ""
    wasted_gpu_hours: float = 0.0
    """GPU-hours of work a preemption threw away (since the pod's last checkpoint)."""
    transient: bool = False
    """A failure the next try may not meet again (a conflict, throttling, a server error or a
    timeout), as opposed to one that repeats itself (a webhook's or a validation's refusal)."""


class Cluster(Protocol):
    """A cluster the controller can observe and act on."""

    @property
    def synced(self) -> bool:
        """True once the first full view of the cluster is in (readiness waits for it)."""
        ...

    def snapshot(self) -> Snapshot:
        """The current view; the same object while nothing changed (the engine caches on it)."""
        ...

    async def apply(self, decisions: Sequence[Decision]) -> list[ActionResult]:
        """Carry out ``decisions`` in order; never raises for a single decision's failure."""
        ...

    async def report(self, result: ActionResult) -> None:
        """Record an outcome decided before the cluster was asked (the GPUs a scale-up needed
        were not freed, the intent could not be written) as the adapter records its own: a
        Kubernetes Event for every action and refusal."""
        ...


class ClusterRuntime(Protocol):
    """A cluster adapter as the process runs it: the port plus its lifecycle and leadership."""

    @property
    def cluster(self) -> Cluster: ...

    def is_leader(self) -> bool:
        """True while this replica may write to the cluster (checked before every action)."""
        ...

    @property
    def ledger(self) -> Ledger:
        """The safety gate's ledger, which the engine shares (one verdict per decision)."""
        ...

    def reconfigure(self, policy: Policy) -> None:
        """A reloaded policy: the actuation-time safety checks follow it."""
        ...

    async def run(self) -> None:
        """Background work (watches, leader election) until cancelled."""
        ...

    async def tick(self, now: float) -> list[ActionResult]:
        """Time-driven upkeep before each evaluation (a simulated clock, MIG workflows moving
        on); returns what that upkeep did to the cluster."""
        ...

    async def close(self) -> None:
        """Release clients; called once, after :meth:`run` was cancelled."""
        ...


_NOT_DONE: Final = frozenset({Outcome.REFUSED, Outcome.BLOCKED, Outcome.FAILED})


def _shrinks_training(decision: Decision) -> bool:
    return (
        isinstance(decision, Scale)
        and decision.role == "training"
        and decision.to_replicas < decision.from_replicas
    )


def feed_back(engine: Engine, results: Iterable[ActionResult], *, now: float) -> None:
    """Tell the engine which of its decisions did not happen: their budget units and cooldowns
    come back. A PodDisruptionBudget's "not now" holds its pod off for
    :data:`RETRY_HOLD_OFF_S` and lets the service try again at once with the next victim (as
    does a follower's "not the leader"); any other refusal or failure would repeat itself, so
    the service waits :data:`RETRY_HOLD_OFF_S` before the next try. A node whose MIG flow
    failed is left out of MIG planning for :data:`MIG_FAILED_HOLD_OFF_S`: its budget unit
    comes back, but another try would likely fail again after draining its training. A
    training workload whose shrink failed in a way that repeats itself is not shrunk again for
    :data:`RESIZE_FAILED_HOLD_OFF_S`: the next try plans other victims instead (a transient
    failure is retried after the hold-off, as any other)."""
    for r in results:
        if r.outcome not in _NOT_DONE:
            continue
        blocked = r.outcome is Outcome.BLOCKED
        at_once = blocked or r.detail.startswith((NOT_LEADER, NOT_FREED))
        hold = None
        if blocked and not isinstance(r.decision, Scale):  # a pod (a PDB) or a MIG node
            hold = now + RETRY_HOLD_OFF_S
        elif r.outcome is Outcome.FAILED and r.decision.action in ("mig_convert", "mig_revert"):
            hold = now + MIG_FAILED_HOLD_OFF_S
        elif r.outcome is Outcome.FAILED and not r.transient and _shrinks_training(r.decision):
            hold = now + RESIZE_FAILED_HOLD_OFF_S
        engine.not_done(
            r.decision,
            reason=r.detail,
            retry_at=now if at_once else now + RETRY_HOLD_OFF_S,
            hold_until=hold,
        )

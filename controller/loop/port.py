"""The cluster port: what the controller needs from a cluster, whichever cluster it is.

Two adapters implement it: :mod:`controller.kube` (a real cluster through the Kubernetes API) and
the simulated cluster used by replays. The engine never sees either; the process loop asks the
port for a :class:`~policies.snapshot.Snapshot`, gives it to the engine, and hands the engine's
decisions back to the port, which reports one :class:`ActionResult` per decision.

An :class:`ActionResult` says how a decision ended in typed fields (``outcome``, ``why``,
``transient``); :mod:`controller.loop.feedback` adds when to try again (``retry_at``,
``hold_until``) and hands it back to the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Protocol

from policies.budgets import Ledger
from policies.decisions import Decision
from policies.model import Policy
from policies.snapshot import Snapshot

__all__ = [
    "NOT_DONE",
    "NOT_FREED",
    "NOT_LEADER",
    "ActionResult",
    "Cluster",
    "ClusterRuntime",
    "Notice",
    "Outcome",
    "Why",
]

#: The start of the detail of a follower's refusal (a follower decides but never acts).
NOT_LEADER: Final = "not the leader"
#: The start of the detail of a scale-up refused because freeing its GPUs was not carried out.
NOT_FREED: Final = "the GPUs it needs were not freed"


class Why(StrEnum):
    """Why a decision was refused before the cluster was changed, where the reason decides what
    happens next (the detail says it in words; code never parses the detail)."""

    NOT_LEADER = "not_leader"
    """This replica does not lead: a follower decides but never acts; tried again at once."""
    NOT_FREED = "not_freed"
    """A scale-up whose GPUs were not freed (the freeing action was not done): tried again at
    once, with the next victim."""
    NOT_RESTORED = "not_restored"
    """The decisions log has not been read back: no action until it has."""
    NOT_JOURNALED = "not_journaled"
    """The write-ahead intent could not be recorded on the decisions log."""


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
    why: Why | None = None
    """For a refusal whose reason decides the next step (see :class:`Why`)."""
    retry_at: float | None = None
    """Not done: when the decision's service may try again (set by
    :func:`controller.loop.feedback.settle`)."""
    hold_until: float | None = None
    """Not done: until when its pod, node or workload is left out of plans (``None``: not)."""

    @property
    def done(self) -> bool:
        """False for a refusal, a PDB's "not now" or a failure: its budget unit and cooldown
        go back to the engine."""
        return self.outcome not in NOT_DONE


@dataclass(frozen=True, slots=True)
class Notice:
    """A state of a service the engine reports with no decision to carry it (added replicas
    stopped moving its latency, and later do again): an SRE reads it where they read the
    HPA's ``ScalingLimited``, in ``kubectl describe`` of the workload."""

    workload: str
    """``namespace/name`` of the service's workload."""
    kind: str
    """Its kind as the snapshot has it (``Deployment``…)."""
    reason: str
    """A CamelCase Event reason (``LatencyNotScaling``)."""
    message: str
    warning: bool = False


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

    async def notice(self, notice: Notice) -> None:
        """Record a service's state change that no decision carries: a Kubernetes Event on its
        workload (the leader only; a failure is counted, never raised)."""
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


NOT_DONE: Final = frozenset({Outcome.REFUSED, Outcome.BLOCKED, Outcome.FAILED})

"""The cluster port: what the controller needs from a cluster, whichever cluster it is.

Two adapters implement it: :mod:`controller.kube` (a real cluster through the Kubernetes API) and
the simulated cluster used by replays. The engine never sees either; the process loop asks the
port for a :class:`~policies.snapshot.Snapshot`, gives it to the engine, and hands the engine's
decisions back to the port, which reports one :class:`ActionResult` per decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from policies.decisions import Decision
from policies.model import Policy
from policies.snapshot import Snapshot

__all__ = ["ActionResult", "Cluster", "ClusterRuntime", "Outcome"]


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


class ClusterRuntime(Protocol):
    """A cluster adapter as the process runs it: the port plus its lifecycle and leadership."""

    @property
    def cluster(self) -> Cluster: ...

    def is_leader(self) -> bool:
        """True while this replica may write to the cluster (checked before every action)."""
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

"""What becomes of a decision that was not carried out: when to try again, what to leave out of
plans meanwhile, and handing that back to the engine.

The one place the retry rules live, for the live process, replay and simulate alike:
:func:`settle` turns each not-done :class:`~controller.loop.port.ActionResult` into one with
``retry_at`` and ``hold_until`` filled in from its typed fields (``outcome``, ``why``,
``transient``, the decision's kind), and :func:`feed_back` gives the engine those answers (the
budget unit and cooldown come back; the service tries again at ``retry_at``; a pod, node or
workload is left out of plans until ``hold_until``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Final

from controller.loop.port import ActionResult, Outcome, Why
from policies.decisions import Decision, Scale
from policies.engine import Engine

__all__ = [
    "MIG_FAILED_HOLD_OFF_S",
    "RESIZE_FAILED_HOLD_OFF_S",
    "RETRY_HOLD_OFF_S",
    "feed_back",
    "settle",
]

#: How long a pod whose eviction a PodDisruptionBudget refused is skipped as a victim, and how
#: long a service waits to try again after part of its response was not carried out.
RETRY_HOLD_OFF_S: Final = 60.0
#: How long a node whose MIG reconfiguration failed is left out of MIG planning.
MIG_FAILED_HOLD_OFF_S: Final = 3600.0
#: How long a training workload whose shrink failed is not shrunk again (other workloads are
#: shrunk, or pods evicted, meanwhile). A failed resize is usually the owner's rule (a webhook's
#: denial) and fails the same way at once: retried after every hold-off it would hold the
#: breach on one victim. Ten minutes: long enough for the breach to be met by other victims,
#: short enough that a transient API failure does not take the workload off the plan for long.
RESIZE_FAILED_HOLD_OFF_S: Final = 600.0

#: Refusals after which the service tries again at once (with the next victim, or as the
#: leader it may become).
_AT_ONCE: Final = frozenset({Why.NOT_LEADER, Why.NOT_FREED})


def _shrinks_training(decision: Decision) -> bool:
    return (
        isinstance(decision, Scale)
        and decision.role == "training"
        and decision.to_replicas < decision.from_replicas
    )


def _answer(r: ActionResult, now: float) -> tuple[float, float | None]:
    """``(retry_at, hold_until)`` for a not-done result. A PodDisruptionBudget's "not now"
    holds its pod off for :data:`RETRY_HOLD_OFF_S` and lets the service try again at once
    with the next victim (as do a follower's refusal and a scale-up whose GPUs were not
    freed); any other refusal or failure would repeat itself, so the service waits
    :data:`RETRY_HOLD_OFF_S`. A node whose MIG flow failed is left out of MIG planning for
    :data:`MIG_FAILED_HOLD_OFF_S` (another try would likely fail again after draining its
    training). A training workload whose shrink failed in a way that repeats itself is not
    shrunk again for :data:`RESIZE_FAILED_HOLD_OFF_S`: the next try plans other victims (a
    transient failure is retried after the hold-off, as any other)."""
    blocked = r.outcome is Outcome.BLOCKED
    at_once = blocked or r.why in _AT_ONCE
    hold = None
    if blocked and not isinstance(r.decision, Scale):  # a pod (a PDB) or a MIG node
        hold = now + RETRY_HOLD_OFF_S
    elif r.outcome is Outcome.FAILED and r.decision.action in ("mig_convert", "mig_revert"):
        hold = now + MIG_FAILED_HOLD_OFF_S
    elif r.outcome is Outcome.FAILED and not r.transient and _shrinks_training(r.decision):
        hold = now + RESIZE_FAILED_HOLD_OFF_S
    return (now if at_once else now + RETRY_HOLD_OFF_S), hold


def settle(results: Iterable[ActionResult], *, now: float) -> list[ActionResult]:
    """``results`` with ``retry_at`` and ``hold_until`` set on each one not done at ``now``."""
    out = []
    for r in results:
        if not r.done:
            retry_at, hold_until = _answer(r, now)
            r = dataclasses.replace(r, retry_at=retry_at, hold_until=hold_until)
        out.append(r)
    return out


def feed_back(engine: Engine, results: Sequence[ActionResult]) -> None:
    """Tell the engine which of its decisions did not happen, with the answers :func:`settle`
    gave: their budget units and cooldowns come back."""
    for r in results:
        if not r.done:
            engine.not_done(
                r.decision, reason=r.detail, retry_at=r.retry_at, hold_until=r.hold_until
            )

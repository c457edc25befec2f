"""The ledger of actions: sliding-window budgets and cooldowns, the engine's brakes.

Design:

* **One ledger, one verdict per decision.** A :class:`Ledger` holds every action of the last
  budget windows by its decision id (:attr:`policies.decisions.Scale.id` and siblings), whoever
  learnt of it first: the engine when it decides (:meth:`Ledger.open`), the safety gate when it
  lets through an action the engine did not decide (a MIG flow's drain eviction), the actuator's
  outcome (:meth:`Ledger.settle`), and the decisions log, read the same way at start-up and by
  followers live (:meth:`Ledger.record`). An action counts against its budget from the moment it
  is decided until an outcome says it did not happen (refused, blocked, failed); an intent with
  no outcome (the writer crashed mid-write) counts, because it may have happened. Reading a
  record twice changes nothing, so nobody de-duplicates: a replica can read its own records back.
* A :class:`SlidingBudget` allows at most ``max`` actions in any window of ``per`` seconds; it
  keeps the ids and times of the actions inside the window (bounded by the policy) and the
  reservations of writes in flight (which count until settled, however long they take), and
  answers ``remaining(now)`` for metrics and ``used(now, excluding=id)`` for the gate, which
  asks whether a decision already counted is still within its budget right before the write.
* :class:`Cooldowns` remembers the last action per key (a service, a pool) and says whether a
  quiet time has passed. An action that did not happen does not start a cooldown:
  :meth:`Cooldowns.retry` takes its mark back and lets the next try come after a short hold-off
  instead. Time is always passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from policies.decisions import decision_id
from policies.model import BudgetsSpec

__all__ = [
    "BudgetState",
    "Budgets",
    "Cooldowns",
    "Ledger",
    "LogRecord",
    "SlidingBudget",
]

Verdict = Literal["counts", "done", "not_done"]
"""``counts``: decided or intended, outcome unknown; ``done``: carried out; ``not_done``: not."""

#: Outcomes in the decisions log that say an action was carried out.
DONE_OUTCOMES: Final = frozenset({"applied", "already_done"})
#: Outcomes that say it did not.
NOT_DONE_OUTCOMES: Final = frozenset({"refused", "blocked", "failed"})
#: Outcomes that say it may have been or is being carried out: it counts until an outcome.
UNDER_WAY: Final = frozenset({"intent", "in_progress"})


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget at one moment, for metrics and explanations."""

    name: str
    max: int
    per_s: float
    used: int
    remaining: int


class SlidingBudget:
    """At most ``max`` actions in any sliding window of ``per_s`` seconds, by decision id."""

    __slots__ = ("_reserved", "_spent", "max", "name", "per_s")

    def __init__(self, name: str, *, max: int, per_s: float) -> None:
        self.name = name
        self.max = max
        self.per_s = per_s
        self._spent: dict[str, float] = {}
        self._reserved: set[str] = set()

    def _prune(self, now: float) -> None:
        horizon = now - self.per_s
        for key in [k for k, at in self._spent.items() if at <= horizon]:
            del self._spent[key]

    def used(self, now: float, *, excluding: str | None = None) -> int:
        self._prune(now)
        used = len(self._spent) + len(self._reserved)
        return used - (1 if excluding is not None and self.holds(excluding) else 0)

    def remaining(self, now: float) -> int:
        return max(0, self.max - self.used(now))

    def allows(self, now: float) -> bool:
        return self.remaining(now) >= 1

    def holds(self, key: str) -> bool:
        """Whether the action ``key`` counts against this budget now."""
        return key in self._spent or key in self._reserved

    def spend(self, now: float, *, key: str) -> None:
        """Count action ``key`` at ``now``; raises if that would exceed the budget."""
        if key in self._spent:
            return
        if not self.allows(now):
            raise ValueError(f"budget {self.name} exceeded")
        self._spent[key] = now

    def reserve(self, key: str, *, now: float) -> None:
        """Count action ``key`` while its write is in flight; raises past the budget."""
        if not self.holds(key):
            if not self.allows(now):
                raise ValueError(f"budget {self.name} exceeded")
            self._reserved.add(key)

    def count(self, at: float, *, key: str) -> None:
        """Count action ``key`` at ``at`` whatever the budget says: it happened."""
        self._reserved.discard(key)
        self._spent.setdefault(key, at)

    def refund(self, key: str) -> None:
        """Action ``key`` did not happen after all: it no longer counts."""
        self._reserved.discard(key)
        self._spent.pop(key, None)

    def state(self, now: float) -> BudgetState:
        used = self.used(now)
        return BudgetState(self.name, self.max, self.per_s, used, max(0, self.max - used))

    def reconfigure(self, *, max: int, per_s: float) -> None:
        self.max, self.per_s = max, per_s


class Budgets:
    """The policy's three budgets."""

    __slots__ = ("evictions", "mig_conversions", "scale_steps")

    def __init__(self, spec: BudgetsSpec) -> None:
        self.evictions = SlidingBudget(
            "evictions", max=spec.evictions.max, per_s=spec.evictions.per
        )
        self.scale_steps = SlidingBudget(
            "scale_steps", max=spec.scale_steps.max, per_s=spec.scale_steps.per
        )
        self.mig_conversions = SlidingBudget(
            "mig_conversions", max=spec.mig_conversions.max, per_s=spec.mig_conversions.per
        )

    def reconfigure(self, spec: BudgetsSpec) -> None:
        """New limits from a reloaded policy; what was spent still counts."""
        self.evictions.reconfigure(max=spec.evictions.max, per_s=spec.evictions.per)
        self.scale_steps.reconfigure(max=spec.scale_steps.max, per_s=spec.scale_steps.per)
        self.mig_conversions.reconfigure(
            max=spec.mig_conversions.max, per_s=spec.mig_conversions.per
        )

    def for_action(self, action: str) -> SlidingBudget:
        """The budget a decision's ``action`` spends from."""
        if action == "evict":
            return self.evictions
        if action == "scale":
            return self.scale_steps
        return self.mig_conversions

    def states(self, now: float) -> list[BudgetState]:
        """Every budget's state, in a fixed order (for metrics)."""
        return [b.state(now) for b in (self.evictions, self.scale_steps, self.mig_conversions)]

    def horizon_s(self) -> float:
        """The longest budget window: how far back the ledger must remember."""
        return max(self.evictions.per_s, self.scale_steps.per_s, self.mig_conversions.per_s)


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record of the decisions log, as the ledger reads it."""

    id: str
    at: float
    action: str
    cause: str | None
    outcome: str
    """``intent`` (written before the action), or the actuator's outcome."""
    disrupts: str | None = None
    """The workload an eviction or a shrink took a pod from
    (:attr:`~policies.decisions.Evict.disrupts`)."""
    pool: str | None = None
    """The pool a training grow took idle GPUs in (:attr:`~policies.decisions.Scale.pool`)."""

    @staticmethod
    def of(raw: Mapping[str, object]) -> LogRecord:
        """Read a decoded record; ``ValueError`` when a field is missing or of the wrong type.
        Records written before decisions carried an ``id`` get the id they would have had."""
        try:
            at = float(raw["ts"])  # type: ignore[arg-type]
            action, target, outcome = str(raw["action"]), str(raw["target"]), str(raw["outcome"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a decisions-log record: {exc!r}") from exc
        cause, disrupts, pool = raw.get("cause"), raw.get("disrupts"), raw.get("pool")
        return LogRecord(
            id=str(raw.get("id") or decision_id(action, target, at)),
            at=at,
            action=action,
            cause=None if cause is None else str(cause),
            outcome=outcome,
            disrupts=None if disrupts is None else str(disrupts),
            pool=None if pool is None else str(pool),
        )


class Ledger:
    """Budgets and one verdict per decision id; see the module docstring."""

    __slots__ = ("_verdicts", "budgets")

    def __init__(self, spec: BudgetsSpec) -> None:
        self.budgets = Budgets(spec)
        self._verdicts: dict[str, tuple[float, Verdict]] = {}

    def reconfigure(self, spec: BudgetsSpec) -> None:
        self.budgets.reconfigure(spec)

    def open(self, key: str, *, action: str, at: float) -> None:
        """A decision taken here at ``at``: it counts from now on (raises past its budget)."""
        self.budgets.for_action(action).spend(at, key=key)
        self._verdicts[key] = (at, "counts")
        self._prune(at)

    def reserve(self, key: str, *, action: str, now: float) -> None:
        """An action the engine did not decide, about to be written: it counts until settled
        (raises past its budget)."""
        self.budgets.for_action(action).reserve(key, now=now)

    def settle(self, key: str, *, action: str, done: bool, at: float) -> None:
        """The actuator's outcome for decision ``key`` (decided, or first seen, at ``at`` if
        the ledger does not know it yet): a refusal gives its unit back."""
        self._settle(key, budget=self.budgets.for_action(action), done=done, at=at)

    def _settle(self, key: str, *, budget: SlidingBudget, done: bool, at: float) -> None:
        known = self._verdicts.get(key)
        if known is not None and known[1] == "counts":
            at = known[0]  # decided then: the window runs from the decision
        if done:
            budget.count(at, key=key)
        else:
            budget.refund(key)
        self._verdicts[key] = (at, "done" if done else "not_done")
        self._prune(at)

    def record(self, rec: LogRecord) -> bool:
        """Read one decisions-log record: an intent (or a flow under way) counts unless an
        outcome of the same decision says it did not happen; an outcome is final. Idempotent:
        returns whether the record changed the verdict on ``rec.id``."""
        known = self._verdicts.get(rec.id)
        budget = self.budgets.for_action(rec.action)
        if rec.outcome in UNDER_WAY:
            if known is not None:
                return False  # its outcome, or an earlier record of it, is already in
            budget.count(rec.at, key=rec.id)
            self._verdicts[rec.id] = (rec.at, "counts")
            self._prune(rec.at)
            return True
        if rec.outcome not in DONE_OUTCOMES and rec.outcome not in NOT_DONE_OUTCOMES:
            return False  # a dry run, or an outcome this version does not know
        done = rec.outcome in DONE_OUTCOMES
        if known is not None and known[1] == ("done" if done else "not_done"):
            return False
        self._settle(rec.id, budget=budget, done=done, at=rec.at)
        return True

    def verdict(self, key: str) -> Verdict | None:
        """What the ledger knows of decision ``key``: it counts, it did not happen, or nothing."""
        known = self._verdicts.get(key)
        return None if known is None else known[1]

    def _prune(self, now: float) -> None:
        """Forget verdicts older than every budget window (bounded memory)."""
        horizon = now - 2 * self.budgets.horizon_s()
        for key in [k for k, (at, _) in self._verdicts.items() if at < horizon]:
            del self._verdicts[key]


class Cooldowns:
    """Last action time per key; a key is ready once ``cooldown_s`` has passed."""

    __slots__ = ("_last", "_not_before", "_previous")

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._previous: dict[str, float | None] = {}
        self._not_before: dict[str, float] = {}

    def ready(self, key: str, now: float, cooldown_s: float) -> bool:
        return self.remaining_s(key, now, cooldown_s) <= 0.0

    def remaining_s(self, key: str, now: float, cooldown_s: float) -> float:
        last = self._last.get(key)
        left = 0.0 if last is None else max(0.0, cooldown_s - (now - last))
        return max(left, self._not_before.get(key, now) - now)

    def mark(self, key: str, now: float) -> None:
        """An action for ``key`` at ``now`` (a later mark wins)."""
        last = self._last.get(key)
        if last is not None and last >= now:
            return
        self._previous[key] = last
        self._last[key] = now
        self._not_before.pop(key, None)

    def retry(self, key: str, at: float, *, not_before: float) -> None:
        """The action for ``key`` marked at ``at`` did not happen: its mark is taken back, and
        the next try waits until ``not_before`` (a hold-off), not a whole cooldown. Several
        refusals of one round: the latest ``not_before`` holds."""
        if self._last.get(key) == at:
            previous = self._previous.pop(key, None)
            if previous is None:
                del self._last[key]
            else:
                self._last[key] = previous
        self._not_before[key] = max(self._not_before.get(key, not_before), not_before)

    def last(self, key: str) -> float | None:
        return self._last.get(key)

    def forget(self, keep: set[str]) -> None:
        """Drop keys no longer in the policy (bounded memory across reloads)."""
        for table in (self._last, self._previous, self._not_before):
            for key in [k for k in table if k not in keep]:
                del table[key]

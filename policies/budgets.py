"""Sliding-window budgets and cooldowns: the engine's brakes.

Design:

* A :class:`SlidingBudget` allows at most ``max`` units of an action in any window of ``per``
  seconds. It keeps the time of every unit spent inside the window (a deque, at most ``max``
  entries after pruning, so memory is bounded by the policy), and answers ``remaining(now)``
  for metrics. The engine checks ``allows`` before it emits a decision and ``spend``s right
  after, so no sequence of events can make it exceed a budget.
* :class:`Budgets` groups the three the policy names (evictions, scale steps, MIG conversions);
  :meth:`Budgets.reconfigure` applies a reloaded policy's limits while keeping what was spent.
* :class:`Cooldowns` remembers the last action per key (a service, a pool) and says whether a
  quiet time has passed. Time is always passed in.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass

from policies.model import BudgetsSpec

__all__ = ["BudgetState", "Budgets", "Cooldowns", "SlidingBudget"]


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget at one moment, for metrics and explanations."""

    name: str
    max: int
    per_s: float
    used: int
    remaining: int


class SlidingBudget:
    """At most ``max`` units in any sliding window of ``per_s`` seconds."""

    __slots__ = ("_spent", "max", "name", "per_s")

    def __init__(self, name: str, *, max: int, per_s: float) -> None:
        self.name = name
        self.max = max
        self.per_s = per_s
        self._spent: deque[float] = deque()

    def _prune(self, now: float) -> None:
        spent, horizon = self._spent, now - self.per_s
        while spent and spent[0] <= horizon:
            spent.popleft()

    def used(self, now: float) -> int:
        self._prune(now)
        return len(self._spent)

    def remaining(self, now: float) -> int:
        return max(0, self.max - self.used(now))

    def allows(self, now: float, units: int = 1) -> bool:
        return self.remaining(now) >= units

    def spend(self, now: float, units: int = 1) -> None:
        """Record ``units`` spent at ``now``; raises if that would exceed the budget."""
        if not self.allows(now, units):
            raise ValueError(f"budget {self.name} exceeded")
        self._spent.extend([now] * units)

    def refund(self, at: float) -> None:
        """Give back one unit spent at ``at`` (the action did not happen after all)."""
        with contextlib.suppress(ValueError):  # already out of the window: nothing to give
            self._spent.remove(at)

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


class Cooldowns:
    """Last action time per key; a key is ready once ``cooldown_s`` has passed."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def ready(self, key: str, now: float, cooldown_s: float) -> bool:
        last = self._last.get(key)
        return last is None or now - last >= cooldown_s

    def remaining_s(self, key: str, now: float, cooldown_s: float) -> float:
        last = self._last.get(key)
        return 0.0 if last is None else max(0.0, cooldown_s - (now - last))

    def mark(self, key: str, now: float) -> None:
        self._last[key] = now

    def last(self, key: str) -> float | None:
        return self._last.get(key)

    def forget(self, keep: set[str]) -> None:
        """Drop keys no longer in the policy (bounded memory across reloads)."""
        for key in [k for k in self._last if k not in keep]:
            del self._last[key]

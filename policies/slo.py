"""Per-service SLO state machine, and the cheap exceedance counters that feed it.

State machine (pure: ``step(state, level, now, spec) -> state``)::

    ok ──(above objective for breachAfter)──▶ breaching ──(below recoverBelow)──▶ recovering
     ▲                                           ▲                                    │
     └───────(below recoverBelow for recoverAfter)┴──(back above recoverBelow)────────┘
     ▲
     └──(first verdict, judged afresh)── stale ◀──(no verdict for staleAfter)── breaching,
                                                                              recovering

Hysteresis comes from two thresholds and two timers: a service breaches only after its
percentile stays above the objective for ``breachAfter`` (any tick at or below resets the
timer), and recovers only after it stays below ``recoverBelow * objective`` for ``recoverAfter``
(any tick above that sends it back to breaching). Noise around the objective therefore never
flaps the state: from ok it keeps resetting the breach timer, and in breach it stays well above
the recovery threshold. A tick without enough data (``none``) gives no verdict: ok resets its
breach timer, breaching holds, recovering keeps counting (there is no sign of a breach).

No verdict is not a breach. A breaching (or recovering) service whose traffic dies away would
otherwise hold its breach for ever, and a breach blocks training growth in its pool and MIG
conversion everywhere. After ``staleAfter`` of ticks without a verdict it becomes ``stale``: the
breach has expired, there is not enough traffic to judge the service either way. Stale blocks
nothing a healthy service does not (training may grow, nodes may convert) and triggers nothing
(no scale-up, and no scale-down either: silence in the stream may be a broken pipeline rather
than an idle service). The first verdict judges the service afresh, as from ``ok``: above the
objective it breaches again after ``breachAfter``.

Exceedance. Whether P99 exceeds a threshold needs no quantile: with ``n`` requests in the window
of which ``a`` were above ``T``, the window's q-quantile (the element of rank ``floor(q(n-1))``,
as :class:`~policies.windows.LatencyWindow` defines it) is above ``T`` exactly when
``a >= n - floor(q(n-1))``. :class:`ExceedanceWindow` keeps, per interval of the same ring the
latency window uses, the count of requests and of those above the objective and above the
recovery threshold: O(1) per observation and O(intervals) per read, with no sketch error. The
engine ticks every service's state from these counters and merges the sketch (the expensive
read) only for services it acts on or reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from policies.model import SloSpec

__all__ = [
    "STATES",
    "UNBOUNDED",
    "ExceedanceWindow",
    "Level",
    "SloState",
    "State",
    "classify",
    "steady_until",
    "step",
]

State = Literal["ok", "breaching", "recovering", "stale"]
STATES: Final[tuple[State, ...]] = ("ok", "breaching", "recovering", "stale")
"""Every state, in the order reports list them."""
Level = Literal["above", "between", "below", "none"]
"""Where the percentile is: above the objective, between the recovery threshold and the
objective, below the recovery threshold, or unknown (too few samples)."""

_NO_SLOT: Final = -(1 << 62)


@dataclass(frozen=True, slots=True)
class SloState:
    """One service's SLO state. ``since`` is when ``state`` was entered; ``pending_since`` when
    the current transition's timer started (above the objective in ok, below the recovery
    threshold in recovering); ``quiet_since`` when the current run of ticks without a verdict
    started, while breaching or recovering (``None`` otherwise)."""

    state: State = "ok"
    since: float | None = None
    pending_since: float | None = None
    breaches: int = 0
    last_level: Level = "none"
    quiet_since: float | None = None


def classify(value: float | None, spec: SloSpec) -> Level:
    """The level of a percentile ``value`` against ``spec``'s thresholds."""
    if value is None:
        return "none"
    if value > spec.objective_ms:
        return "above"
    if value < spec.objective_ms * spec.recover_below:
        return "below"
    return "between"


def step(state: SloState, level: Level, now: float, spec: SloSpec) -> SloState:
    """The state after one tick at ``now`` with the percentile at ``level``.

    ``state`` itself comes back when nothing changed (the common tick), so an engine ticking
    thousands of services allocates only on transitions; new states are built directly rather
    than through ``dataclasses.replace``, which costs several times more."""
    current, pending, breaches = state.state, state.pending_since, state.breaches
    if current == "stale":
        if level == "none":
            return state
        return step(SloState("ok", now, None, breaches, "none"), level, now, spec)
    if current == "ok":
        if level != "above":
            if pending is None and state.last_level == level:
                return state
            return SloState("ok", state.since, None, breaches, level)
        start = pending if pending is not None else now
        if now - start >= spec.breach_after:
            return SloState("breaching", now, None, breaches + 1, level)
        if pending is not None and state.last_level == level:
            return state
        return SloState("ok", state.since, start, breaches, level)
    if current == "breaching":
        if level == "none":
            return _quiet(state, now, spec)
        if level == "below":
            if spec.recover_after <= 0:
                return SloState("ok", now, None, breaches, level)
            return SloState("recovering", now, now, breaches, level)
        if state.last_level == level:
            return state
        return SloState("breaching", state.since, pending, breaches, level)
    # recovering
    if level == "above" or level == "between":
        return SloState("breaching", now, None, breaches, level)
    start = pending if pending is not None else now
    if now - start >= spec.recover_after:
        return SloState("ok", now, None, breaches, level)
    if level == "none":
        return _quiet(state, now, spec)
    if state.last_level == level:
        return state
    return SloState("recovering", state.since, pending, breaches, level)


def steady_until(state: SloState, spec: SloSpec) -> float:
    """Until when :func:`step` at ``state``'s own level (``last_level``, as every step leaves
    it) returns ``state`` itself: the first of its timers to run out (``breachAfter`` while
    pending in ok, ``recoverAfter`` while recovering, ``staleAfter`` while without a verdict in
    breach); ``inf`` when none runs. An engine need not tick a service before then unless its
    level changes."""
    until = math.inf
    if state.state == "ok" and state.pending_since is not None:
        until = state.pending_since + spec.breach_after
    elif state.state == "recovering" and state.pending_since is not None:
        until = state.pending_since + spec.recover_after
    if state.quiet_since is not None:
        until = min(until, state.quiet_since + spec.stale_after)
    return until


def _quiet(state: SloState, now: float, spec: SloSpec) -> SloState:
    """A tick without a verdict while breaching or recovering: the state holds until
    ``staleAfter`` of them in a row, then it is ``stale``."""
    quiet = state.quiet_since
    if now - (now if quiet is None else quiet) >= spec.stale_after:
        return SloState("stale", now, None, state.breaches, "none")
    if quiet is not None:
        return state
    return SloState(state.state, state.since, state.pending_since, state.breaches, "none", now)


def _level_of(n: int, above_hi: int, above_lo: int, q: float, min_samples: int) -> Level:
    """Where the ``q``-quantile of ``n`` requests stands, ``above_hi`` of them above the high
    threshold and ``above_lo`` above the low one."""
    if n < max(1, min_samples):
        return "none"
    need = n - math.floor(q * (n - 1))
    if above_hi >= need:
        return "above"
    if above_lo >= need:
        return "between"
    return "below"


#: More requests than any window holds: "any number" for :func:`_floor_slack`.
UNBOUNDED: Final = 1 << 62


def _rank_above(n: int, above: int, q: float) -> bool:
    """Whether the element of rank ``floor(q * (n - 1))`` of ``n`` requests (as the latency
    window's sketch ranks), ``above`` of them above a threshold, is above it."""
    return n > 0 and above >= n - math.floor(q * (n - 1))


def _floor_slack(n: int, above: int, q: float) -> int:
    """The most requests ``m`` that ``n`` requests, ``above`` of them above a threshold, can be
    joined by (none above it) with the element of rank ``floor(q * (n + m - 1))`` still above
    it; ``-1`` when it is not above it now (or ``n`` is 0). The need ``N - floor(q * (N - 1))``
    grows by 0 or 1 with each request, so the largest ``N`` is found from the closed form and
    checked exactly (plain arithmetic: the engine asks this at every quiet step of such a
    service)."""
    if not _rank_above(n, above, q):
        return -1
    floor = math.floor
    if q >= 1.0:
        return UNBOUNDED  # the maximum: above the threshold while one request is
    # N (1 - q) <= above - q, give or take the floor's rounding
    total = max(n, min(UNBOUNDED, floor((above - q) / (1.0 - q))))
    while total > n and above < total - floor(q * (total - 1)):
        total -= 1
    while total < UNBOUNDED and above >= total + 1 - floor(q * total):
        total += 1
    return total - n


class ExceedanceWindow:
    """Per-interval counts of requests, and of those above two thresholds, over a sliding window
    aligned exactly with :class:`~policies.windows.LatencyWindow` (same slots, same span).

    Running totals over the ring make a read O(1) while events keep flowing: when the head
    advances, the cells it passes are cleared (at most one ring's worth, amortised O(1)), so every
    cell is within the ring; a read later than the head subtracts only the expired cells.

    An optional third threshold, the ``floor``, counts the requests above it too, so a rule that
    holds while the window's percentile is at or above some latency (the scale-down rule's
    ``below``) can be told so from counts (:meth:`above_floor`) instead of a percentile read.
    It is counted from the first time it is asked (it costs a pass over every event's requests,
    and most services' rules never ask it: a service at its fewest replicas reads nothing)."""

    __slots__ = (
        "_above_floor",
        "_above_hi",
        "_above_lo",
        "_floor",
        "_floor_at",
        "_floor_from",
        "_head",
        "_hi",
        "_interval",
        "_length",
        "_lo",
        "_n",
        "_slots",
        "_totals",
        "unresolved",
    )

    def __init__(
        self,
        *,
        window_s: float,
        interval_s: float,
        high: float,
        low: float,
        floor: float | None = None,
    ) -> None:
        self._length = max(1, round(window_s / interval_s))
        self._interval = float(interval_s)
        self._hi, self._lo = float(high), float(low)
        #: The floor, and the floor counted (``None`` until asked: :meth:`above_floor`).
        self._floor_at = None if floor is None else float(floor)
        self._floor: float | None = None
        #: The first slot whose floor counts are of ``_floor`` (later than every slot when they
        #: cannot be told: a histogram whose last bound is below the floor).
        self._floor_from = _NO_SLOT
        self._head = _NO_SLOT
        self._slots = [_NO_SLOT] * self._length
        self._n = [0] * self._length
        self._above_hi = [0] * self._length
        self._above_lo = [0] * self._length
        self._above_floor = [0] * self._length
        self._totals = [0, 0, 0, 0]
        self.unresolved: float | None = None
        """The last bound of a histogram seen below the objective: its overflow cannot tell
        requests over the objective from those between that bound and the objective (all
        count as over), so the objective cannot be judged. ``None`` while none was seen."""

    @property
    def thresholds(self) -> tuple[float, float]:
        return self._hi, self._lo

    def _clear(self, i: int, slot: int) -> None:
        totals = self._totals
        totals[0] -= self._n[i]
        totals[1] -= self._above_hi[i]
        totals[2] -= self._above_lo[i]
        totals[3] -= self._above_floor[i]
        self._slots[i] = slot
        self._n[i] = self._above_hi[i] = self._above_lo[i] = self._above_floor[i] = 0

    def _index(self, ts: float) -> int:
        slot = int(ts // self._interval)
        head, length = self._head, self._length
        if slot > head:
            start = max(head + 1, slot - length + 1)
            for s in range(start, slot + 1):
                i = s % length
                if self._slots[i] != s:
                    self._clear(i, s)
            self._head = slot
        elif slot <= head - length:
            return -1
        return slot % length

    def add(self, ts: float, value: float) -> int:
        """Count one request at event time ``ts`` (late ones are dropped, as the window does);
        returns 1 when it is above the low threshold, else 0."""
        i = self._index(ts)
        if i < 0:
            return 0
        totals = self._totals
        self._n[i] += 1
        totals[0] += 1
        floor = self._floor
        if floor is not None and value > floor:
            self._above_floor[i] += 1
            totals[3] += 1
        if value > self._lo:
            self._above_lo[i] += 1
            totals[2] += 1
            if value > self._hi:
                self._above_hi[i] += 1
                totals[1] += 1
            return 1
        return 0

    def add_many(self, ts: float, values: Sequence[float]) -> int:
        """:meth:`add` for each of ``values``; returns how many are above the low threshold."""
        i = self._index(ts)
        if i < 0:
            return 0
        hi, lo = self._hi, self._lo
        # v > lo and v > hi, counted by C-level maps (a comparison with NaN is False either way)
        n, a_lo, a_hi = (
            len(values),
            sum(map(lo.__lt__, values)),
            sum(map(max(hi, lo).__lt__, values)),
        )
        self._n[i] += n
        self._above_lo[i] += a_lo
        self._above_hi[i] += a_hi
        self._totals[0] += n
        self._totals[1] += a_hi
        self._totals[2] += a_lo
        floor = self._floor
        if floor is not None:
            a_floor = sum(map(floor.__lt__, values))
            self._above_floor[i] += a_floor
            self._totals[3] += a_floor
        return a_lo

    def add_histogram(self, ts: float, bounds: Sequence[float], counts: Sequence[int]) -> None:
        """Buckets count at their upper bound, as the latency window records them, so both
        agree on which side of a threshold a bucket falls. The overflow bucket counts above
        every threshold: its requests took more than the last bound, by an unknown amount
        (with the last bound under the objective, that errs high; :attr:`unresolved` says so)."""
        i = self._index(ts)
        if i < 0:
            return
        if bounds[-1] < self._hi:
            self.unresolved = bounds[-1]
        floor = self._floor
        if floor is not None and bounds[-1] < floor:
            # its overflow reads one sketch key above the last bound, maybe not above the floor
            self._floor_from = -_NO_SLOT
        last = len(bounds)
        n = a_hi = a_lo = a_floor = 0
        for b, c in enumerate(counts):
            value = bounds[b] if b < last else math.inf
            n += c
            if floor is not None and value > floor:
                a_floor += c
            if value > self._lo:
                a_lo += c
                if value > self._hi:
                    a_hi += c
        self._n[i] += n
        self._above_lo[i] += a_lo
        self._above_hi[i] += a_hi
        self._above_floor[i] += a_floor
        self._totals[0] += n
        self._totals[1] += a_hi
        self._totals[2] += a_lo
        self._totals[3] += a_floor

    def counts(self, now: float) -> tuple[int, int, int]:
        """``(n, above_high, above_low)`` over the window at ``now``."""
        n, hi, lo, _ = self._counts(now)
        return n, hi, lo

    def _counts(self, now: float) -> tuple[int, int, int, int]:
        """``(n, above_high, above_low, above_floor)`` over the window at ``now``."""
        last = int(now // self._interval)
        n, hi, lo, fl = self._totals
        if last == self._head:
            return n, hi, lo, fl  # every cell is within the ring ending at the head
        first = max(last, self._head) - self._length + 1
        for slot, cn, chi, clo, cfl in zip(
            self._slots, self._n, self._above_hi, self._above_lo, self._above_floor, strict=True
        ):
            if (slot < first or slot > last) and slot != _NO_SLOT:
                n -= cn
                hi -= chi
                lo -= clo
                fl -= cfl
        return n, hi, lo, fl

    def above_floor(self, now: float, q: float) -> bool:
        """Whether the window's exact ``q``-quantile at ``now`` (the element of rank
        ``floor(q * (n - 1))``, as the latency window's sketch ranks) is above the floor: as
        many requests above it as from that rank up. ``False`` when the window is empty, has no
        floor or holds intervals whose floor counts are unknown (before the first time it was
        asked, :meth:`refloor`, :meth:`put_interval`, a histogram whose last bound is below the
        floor)."""
        counted = self._floor_counts(now)
        if counted is None:
            return False
        return _rank_above(*counted, q)

    def floor_slack(self, now: float, q: float) -> int:
        """How many more requests, none of them above the floor, the window at ``now`` can
        take with its ``q``-quantile still above the floor (requests above it only add to
        what keeps it there); ``-1`` when it is not above it now or that cannot be told
        (:meth:`above_floor`)."""
        counted = self._floor_counts(now)
        return -1 if counted is None else _floor_slack(*counted, q)

    def _floor_counts(self, now: float) -> tuple[int, int] | None:
        """``(n, above_floor)`` over the window at ``now``; ``None`` when the floor counts
        cannot tell (see :meth:`above_floor`), the first time asked included."""
        if self._floor is None:
            if self._floor_at is not None:  # counted from now on
                self._floor = self._floor_at
                self._totals[3] = 0
                self._above_floor = [0] * self._length
                self._floor_from = max(self._floor_from, self._head + 1)
            return None
        first = max(int(now // self._interval), self._head) - self._length + 1
        if first < self._floor_from:
            return None
        n, _, _, above = self._counts(now)
        return n, above

    def refloor(self, floor: float | None) -> None:
        """Count above ``floor`` instead (a reloaded policy moved it), from the next time it is
        asked: the intervals held then counted above the old one, so :meth:`above_floor` says
        nothing until they leave."""
        if floor != self._floor_at:
            self._floor_at = None if floor is None else float(floor)
            self._floor = None

    def steady_until(self, now: float) -> float:
        """The earliest time after ``now`` at which a read may differ from one at ``now``
        without any write in between: when an interval leaves the window, or one written ahead
        of ``now`` enters it; ``inf`` when the window holds nothing. The latency window has the
        same intervals, so its reads change no sooner."""
        interval, length, head = self._interval, self._length, self._head
        last = int(now // interval)
        first = (last if last > head else head) - length + 1
        if last >= head:
            # Nothing written ahead of the read: the oldest interval in it leaves first. Every
            # cell holds a slot of the ring ending at the head (older ones are cleared as it
            # moves: ``_index``), so slot ``s`` is in cell ``s % length``; the slots from
            # ``first`` on are probed oldest first, and mostly the first probe finds it.
            counts = self._n
            for slot in range(first, head + 1):
                if counts[slot % length]:
                    return (slot + length) * interval
            return math.inf
        # The earliest change in slots (``slot * interval`` grows with ``slot``): one plain
        # loop, the engine asks this of every service it ticked. An int sentinel, not ``inf``:
        # comparing an int with a float is slower than with an int, and this is a hot loop.
        soonest = _NO_SLOT
        for slot, n in zip(self._slots, self._n, strict=True):
            if n and slot >= first:
                at = slot if slot > last else slot + length
                if soonest == _NO_SLOT or at < soonest:
                    soonest = at
        return math.inf if soonest == _NO_SLOT else soonest * interval

    def level(self, now: float, q: float, min_samples: int) -> tuple[Level, int]:
        """Where the window's ``q``-quantile stands, and how many samples it holds."""
        n, above_hi, above_lo, _ = self._counts(now)
        return _level_of(n, above_hi, above_lo, q, min_samples), n

    def level_steady_until(
        self, now: float, q: float, min_samples: int, level: Level, *, ahead: int = 1
    ) -> float:
        """From ``now``, without writes, the first time the window's level may differ from
        ``level`` (the level a read at ``now`` gives), looking up to ``ahead`` changes of the
        window ahead: the first change (:meth:`steady_until`) at which the level read differs,
        else the change after the last one looked at. For a service whose rules read only its
        level (the engine's schedule), in one call."""
        until = self.steady_until(now)
        if until == math.inf:
            return until
        interval, length, head = self._interval, self._length, self._head
        last = int(until // interval)
        while last < head:  # an interval written ahead of ``now`` enters first: read by read
            if self.level(until, q, min_samples)[0] != level:
                return until
            ahead -= 1
            after = self.steady_until(until)
            if ahead <= 0 or after == math.inf or after <= until:
                return after
            until, last = after, int(after // interval)
        # As mostly: the oldest interval leaves first, so the read at ``until`` is past the
        # head. Slot ``s`` is in cell ``s % length`` (see steady_until): the cells before
        # ``first`` (the one that left; ``first`` is at most ``head + 1``) come off the totals,
        # and the oldest from ``first`` on leaves next.
        first = (last if last > head else head) - length + 1
        n, above_hi, above_lo, _ = self._totals
        counts, his, los = self._n, self._above_hi, self._above_lo
        for slot in range(head - length + 1, first):
            i = slot % length
            n -= counts[i]
            above_hi -= his[i]
            above_lo -= los[i]
        if _level_of(n, above_hi, above_lo, q, min_samples) != level:
            return until
        # From ``first`` on the oldest non-empty interval leaves next (as in steady_until):
        # each that leaves comes off the totals, and the level read once it has left is
        # compared, up to ``ahead`` changes in all.
        for slot in range(first, head + 1):
            i = slot % length
            if not counts[i]:
                continue
            ahead -= 1
            if ahead <= 0:
                return (slot + length) * interval
            n -= counts[i]
            above_hi -= his[i]
            above_lo -= los[i]
            if _level_of(n, above_hi, above_lo, q, min_samples) != level:
                return (slot + length) * interval
        return math.inf

    # -- sharded ingest: intervals out (aggregators) and in (deciders), see policies.partials --

    def held_intervals(self) -> list[tuple[int, int, int, int]]:
        """The ring's intervals with requests as ``(slot, n, above_high, above_low)``."""
        floor = self._head - self._length
        return sorted(
            (slot, self._n[i], self._above_hi[i], self._above_lo[i])
            for i, slot in enumerate(self._slots)
            if slot > floor and self._n[i]
        )

    def put_interval(self, slot: int, n: int, above_high: int, above_low: int) -> bool:
        """Make interval ``slot`` hold a merge of partials, replacing what it held; ``False``
        when the slot has left the ring."""
        i = self._index((slot + 0.5) * self._interval)
        if i < 0:
            return False
        totals = self._totals
        totals[0] += n - self._n[i]
        totals[1] += above_high - self._above_hi[i]
        totals[2] += above_low - self._above_lo[i]
        totals[3] -= self._above_floor[i]
        self._n[i], self._above_hi[i], self._above_lo[i] = n, above_high, above_low
        self._above_floor[i] = 0  # partials carry no floor count: reads over it cannot tell
        self._floor_from = max(self._floor_from, slot + 1)
        return True

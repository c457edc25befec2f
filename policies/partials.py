"""Sharded ingest, the pure part: fold events into partials, merge partials into an engine.

An aggregator keeps one :class:`Fold` per source partition it owns. A fold feeds latency events
into windows of the same kind, interval and bin limit as the engine's (:class:`LatencyWindow`,
:class:`ExceedanceWindow`), one pair per service until a write would make the pair recycle an
interval (then another pair starts), so a fold covering more than a window of event time (a
backlog read at full speed) keeps every interval. GPU readings become a sum, a count, a max and
idle marks per GPU and utilization interval. :meth:`Fold.seal` turns it all into a
:class:`~streams.aggregates.Flush` of the offsets it covers; the aggregator then starts a new
fold at the flush's ``next`` offset. The engine's own write path does the latency folding, so a
partial holds exactly what the engine would have recorded for the same events (the clock-skew
rule included: an event stamped more than one interval past the aggregator's clock is taken at
the clock).

A decider keeps a :class:`Merger`. :meth:`Merger.apply` indexes a flush by source partition and
first offset, first dropping the flushes of that partition it replaces (those starting at or
after it: a new owner re-read them, see :mod:`streams.aggregates`); every interval a dropped or
added flush touched is then rebuilt in the engine from the partials that remain
(:meth:`Engine.put_latency`, :meth:`Engine.put_utilization`). Rebuilding an interval from its
partials, instead of adding into it, is what makes replacing a flush exact. Merging DDSketch
stores that have not collapsed is exact, so the merged windows equal one replica's; idle marks
are first/last/latest-busy times, which merge the same whatever the order or repeats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, cast

from ddsketch.store import CollapsingLowestDenseStore

from policies.engine import DEFAULT_UTIL_WINDOW_S, UTIL_SLOTS, Engine
from policies.model import Policy
from policies.slo import ExceedanceWindow
from policies.windows import LatencyWindow
from streams.aggregates import Flush, IdleMark, LatencyCell, UtilCell
from streams.events import Event, GpuUtilization, InferenceLatency

__all__ = ["Fold", "FoldSpec", "Merger"]

#: The engine's windows' sketch bin limit (``LatencyWindow``'s default).
BIN_LIMIT: Final = 2048

_Device = tuple[str, int | str, int | None]
_Source = tuple[str, int]


@dataclass(frozen=True, slots=True)
class _ServiceSpec:
    window_s: float
    interval_s: float
    high: float
    low: float
    metric: str = "e2e"


#: Not looked up yet (``None`` in the cache means: not in the policy).
_UNSEEN: Final = _ServiceSpec(0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class FoldSpec:
    """What a fold needs from the policy: each service's window and thresholds, the
    utilization windows' interval and the idle threshold, as the engine derives them."""

    services: dict[tuple[str, str], _ServiceSpec]
    """By (namespace, name)."""
    util_window_s: float
    idle_below_pct: float

    @classmethod
    def of(cls, policy: Policy) -> FoldSpec:
        spec = policy.spec
        services = {
            (s.namespace, name): _ServiceSpec(
                window_s=s.slo.window,
                interval_s=s.slo.resolution,
                high=s.slo.objective_ms,
                low=s.slo.objective_ms * s.slo.recover_below,
                metric=s.slo.metric,
            )
            for name, s in spec.services.items()
        }
        mig = spec.mig
        return cls(
            services=services,
            util_window_s=mig.convert_after if mig is not None else DEFAULT_UTIL_WINDOW_S,
            idle_below_pct=mig.node_idle_below * 100.0 if mig is not None else 0.0,
        )


class _Latency:
    """One service's events over a run of intervals shorter than its window, so its rings
    never recycle an interval (a write past that starts another :class:`_Latency`)."""

    __slots__ = ("exceed", "hi", "interval_s", "length", "lo", "window")

    def __init__(self, spec: _ServiceSpec, slot: int) -> None:
        self.interval_s = spec.interval_s
        self.window = LatencyWindow(
            window_s=spec.window_s, interval_s=spec.interval_s, bin_limit=BIN_LIMIT
        )
        self.exceed = ExceedanceWindow(
            window_s=spec.window_s, interval_s=spec.interval_s, high=spec.high, low=spec.low
        )
        self.length = self.window.intervals
        self.lo = self.hi = slot

    def takes(self, slot: int) -> bool:
        """Whether ``slot`` can be written without any interval leaving the rings."""
        if self.lo <= slot <= self.hi:
            return True
        lo, hi = min(self.lo, slot), max(self.hi, slot)
        if hi - lo >= self.length:
            return False
        self.lo, self.hi = lo, hi
        return True


class Fold:
    """One source partition's events from offset ``first`` on, folded into per-interval
    partials. ``clock`` is the aggregator's now (epoch seconds), the bound on event time."""

    def __init__(self, spec: FoldSpec, *, topic: str, partition: int, first: int) -> None:
        self.topic, self.partition, self.first = topic, partition, first
        self._spec = spec
        self._util_interval = spec.util_window_s / UTIL_SLOTS
        self._specs: dict[str, _ServiceSpec | None] = {}
        self._latency: dict[str, _Latency] = {}
        self._done: list[tuple[str, _Latency]] = []
        """Folds a service outgrew (see :class:`_Latency`)."""
        self._util: dict[tuple[str, int | str, int | None, int], list[float]] = {}
        """Per (node, gpu, MIG instance, interval): sum, count, max, and for a whole GPU its
        first, last and last busy reading (the idle marks; busy is -inf when none)."""
        self.events = 0
        self.unknown = 0
        self.other_metric = 0

    def observe(self, events: Sequence[Event], clock: float) -> None:
        for event in events:
            if type(event) is GpuUtilization:
                self._observe_util(event, clock)
            else:
                self._observe_latency(cast(InferenceLatency, event), clock)

    def _observe_latency(self, event: InferenceLatency, clock: float) -> None:
        key = event.key
        spec = self._specs.get(key, _UNSEEN)
        if spec is _UNSEEN:
            spec = self._specs[key] = self._spec.services.get((event.namespace, event.service))
        if spec is None:
            self.unknown += 1
            return
        if event.objective != spec.metric:  # not the metric its objective is on
            self.other_metric += 1
            return
        ts: float = event.ts  # type: ignore[assignment]  # decoded to epoch seconds
        if ts > clock + spec.interval_s:
            ts = clock
        slot = int(ts // spec.interval_s)
        fold = self._latency.get(key)
        if fold is None or not fold.takes(slot):
            if fold is not None:
                self._done.append((key, fold))
            fold = self._latency[key] = _Latency(spec, slot)
        if event.latency_ms is not None:
            fold.window.add(ts, event.latency_ms)
            fold.exceed.add(ts, event.latency_ms)
        elif event.samples_ms is not None:
            fold.window.add_many(ts, event.samples_ms)
            fold.exceed.add_many(ts, event.samples_ms)
        elif event.histogram is not None:
            h = event.histogram
            fold.window.add_histogram(ts, h.bounds_ms, h.counts)
            fold.exceed.add_histogram(ts, h.bounds_ms, h.counts)
        self.events += 1

    def _observe_util(self, event: GpuUtilization, clock: float) -> None:
        """A utilization interval is a sum, a count and a max (as in
        :class:`UtilizationWindow`); kept as plain numbers here, one list per GPU and
        interval, since a fold sees few readings of each."""
        interval = self._util_interval
        ts: float = event.ts  # type: ignore[assignment]  # decoded to epoch seconds
        if ts > clock + interval:
            ts = clock
        util = event.util_pct
        whole = event.mig_profile is None
        key = (event.node, event.gpu, None if whole else event.mig_instance, int(ts // interval))
        cell = self._util.get(key)
        if cell is None:
            self._util[key] = [util, 1, util, ts, ts, -math.inf]
            cell = self._util[key]
        else:
            cell[0] += util
            cell[1] += 1
            if util > cell[2]:
                cell[2] = util
            if ts < cell[3]:
                cell[3] = ts
            if ts > cell[4]:
                cell[4] = ts
        if util > self._spec.idle_below_pct and ts > cell[5]:
            cell[5] = ts
        self.events += 1

    def size(self) -> int:
        """About how many bytes :meth:`seal`'s flush takes encoded (a cell's fields ~40 bytes,
        a sketch bin 9): what keeps a flush within one Kafka message."""
        util = len(self._util) * 80
        folds = [*self._latency.values(), *(f for _, f in self._done)]
        return util + sum(
            40 + 9 * (store.max_key - store.min_key + 1 if store.count else 0)
            for fold in folds
            for _, store, _ in fold.window.held_intervals()
        )

    def seal(self, next_offset: int) -> Flush:
        """Everything folded, as the flush of offsets ``[first, next_offset)``."""
        folds = sorted([*self._done, *self._latency.items()], key=lambda kf: (kf[0], kf[1].lo))
        latency = [
            _latency_cell(key, fold, slot, store, zeros, counts)
            for key, fold in folds
            for (slot, store, zeros), counts in zip(
                fold.window.held_intervals(), fold.exceed.held_intervals(), strict=True
            )
        ]
        interval = self._util_interval
        util = [
            UtilCell(node, gpu, instance, slot, interval, total, int(count), peak)
            for (node, gpu, instance, slot), (total, count, peak, *_) in self._util.items()
        ]
        idle = [
            IdleMark(node, str(gpu), slot, interval, first, last, None if busy < 0 else busy)
            for (node, gpu, instance, slot), (*_, first, last, busy) in self._util.items()
            if instance is None
        ]
        return Flush(self.topic, self.partition, self.first, next_offset, latency, util, idle)


def _latency_cell(
    key: str,
    fold: _Latency,
    slot: int,
    store: CollapsingLowestDenseStore,
    zeros: int,
    counts: tuple[int, int, int, int],
) -> LatencyCell:
    if counts[0] != slot:  # both rings take the same writes
        raise AssertionError(f"{key}: latency and exceedance intervals differ")
    if store.count:
        lo = store.min_key
        bins = store.bins[lo - store.offset : store.max_key - store.offset + 1]
    else:
        lo, bins = 0, []
    _, n, above_high, above_low = counts
    return LatencyCell(
        key,
        slot,
        fold.interval_s,
        lo,
        bins,
        store.is_collapsed,
        zeros,
        n,
        above_high,
        above_low,
        fold.window.overflow,
    )


def _store(cell: LatencyCell) -> CollapsingLowestDenseStore:
    store = CollapsingLowestDenseStore(BIN_LIMIT)
    if cell.bins:
        store.bins = list(cell.bins)
        store.offset = store.min_key = cell.min_key
        store.max_key = cell.min_key + len(cell.bins) - 1
        store.count = sum(cell.bins)
        store.is_collapsed = cell.collapsed
    return store


class Merger:
    """The decider's side: flushes in, the engine's windows rebuilt from them."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._flushes: dict[_Source, dict[int, Flush]] = {}
        self._latency: dict[tuple[str, int], dict[tuple[_Source, int], list[LatencyCell]]] = {}
        self._util: dict[tuple[int, float], dict[tuple[_Source, int], list[UtilCell]]] = {}
        self._idle: dict[tuple[int, float], list[IdleMark]] = {}
        """Marks merge the same however often they are merged: kept per interval, merged in
        the engine with the interval's readings."""
        self.replaced = 0
        """Flushes dropped because a later one re-covered their offsets (a rebalance)."""

    def apply(self, flush: Flush) -> None:
        """Index ``flush`` (replacing what it re-covers) and rebuild the intervals touched."""
        lat, util = self.index(flush)
        self.push(lat, util)

    def index(self, flush: Flush) -> tuple[set[tuple[str, int]], set[tuple[int, float]]]:
        """Index ``flush`` only; returns the latency and utilization intervals to rebuild."""
        source = (flush.topic, flush.partition)
        held = self._flushes.setdefault(source, {})
        dropped = [held.pop(first) for first in sorted(held) if first >= flush.first]
        self.replaced += len(dropped)
        lat: set[tuple[str, int]] = set()
        util: set[tuple[int, float]] = set()
        for old in dropped:
            for c in old.latency:
                lat.add((c.service, c.slot))
                self._latency.get((c.service, c.slot), {}).pop((source, old.first), None)
            for u in old.util:
                util.add((u.slot, u.interval_s))
                self._util.get((u.slot, u.interval_s), {}).pop((source, old.first), None)
        held[flush.first] = flush
        for c in flush.latency:
            lat.add((c.service, c.slot))
            per_source = self._latency.setdefault((c.service, c.slot), {})
            per_source.setdefault((source, flush.first), []).append(c)
        for u in flush.util:
            util.add((u.slot, u.interval_s))
            cells = self._util.setdefault((u.slot, u.interval_s), {})
            cells.setdefault((source, flush.first), []).append(u)
        for m in flush.idle:
            util.add((m.slot, m.interval_s))
            self._idle.setdefault((m.slot, m.interval_s), []).append(m)
        return lat, util

    def push(self, latency: Iterable[tuple[str, int]], util: Iterable[tuple[int, float]]) -> None:
        """Rebuild these intervals in the engine from the partials indexed for them."""
        engine = self._engine
        for service, slot in sorted(latency):
            cells = [c for per in self._latency.get((service, slot), {}).values() for c in per]
            store = CollapsingLowestDenseStore(BIN_LIMIT)
            zeros = n = hi = lo = 0
            interval_s = 0.0
            overflow: dict[int, float] = {}
            for cell in cells:
                store.merge(_store(cell))
                overflow.update(cell.overflow)
                zeros += cell.zeros
                n, hi, lo = n + cell.n, hi + cell.above_high, lo + cell.above_low
                interval_s = cell.interval_s
            if cells:
                engine.put_latency(
                    service,
                    slot,
                    interval_s=interval_s,
                    store=store,
                    zeros=zeros,
                    counts=(n, hi, lo),
                    overflow=overflow,
                )
        for slot, interval_s in sorted(util):
            readings: dict[_Device, tuple[float, int, float]] = {}
            for per_flush in self._util.get((slot, interval_s), {}).values():
                for u in per_flush:
                    device = (u.node, u.gpu, u.instance)
                    s, c, m = readings.get(device, (0.0, 0, 0.0))
                    readings[device] = (s + u.total, c + u.count, max(m, u.peak))
            if readings:
                engine.put_utilization(slot, interval_s=interval_s, readings=readings)
            for mark in self._idle.get((slot, interval_s), ()):
                engine.merge_idle(
                    mark.node, mark.gpu, first=mark.first, last=mark.last, busy=mark.busy
                )

    def covered(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Per source partition, the offsets ``[first, next)`` its held flushes cover without
        a gap (a gap would be events lost; it ends the range)."""
        out = {}
        for source, held in self._flushes.items():
            if not held:
                continue
            firsts = sorted(held)
            end = held[firsts[0]].next
            for first in firsts[1:]:
                if first != end:
                    break
                end = held[first].next
            out[source] = (firsts[0], end)
        return out

    def forget_before(self, horizon: float) -> None:
        """Drop partials of intervals that ended before ``horizon`` (epoch seconds): no window
        reaches them any more, so memory stays bounded by the windows, not the run's length.
        A flush goes once none of its intervals is younger."""
        self._latency = {
            k: v for k, v in self._latency.items() if (k[1] + 1) * _interval(v) >= horizon
        }
        self._util = {k: v for k, v in self._util.items() if (k[0] + 1) * k[1] >= horizon}
        self._idle = {k: v for k, v in self._idle.items() if (k[0] + 1) * k[1] >= horizon}
        for held in self._flushes.values():
            for first in [f for f, flush in held.items() if _ends(flush) < horizon]:
                # The newest flush of a partition stays: a re-send replaces from its offset.
                if first != max(held):
                    del held[first]


def _interval(cells: dict[tuple[_Source, int], list[LatencyCell]]) -> float:
    return next(iter(cells.values()))[0].interval_s if cells else 0.0


def _ends(flush: Flush) -> float:
    ends = [(c.slot + 1) * c.interval_s for c in flush.latency]
    ends += [(u.slot + 1) * u.interval_s for u in flush.util]
    return max(ends, default=0.0)

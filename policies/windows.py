"""Sliding windows over event time: latency quantiles and GPU utilization.

Both windows are rings of ``window_s / interval_s`` fixed intervals keyed by *event* time, not
by arrival: interval ``n`` holds what happened in ``[n * interval_s, (n + 1) * interval_s)``.
Nothing here reads a clock; writers pass the event's time, readers pass ``now``.

Writes. The newest interval seen is the ring's head. An event ahead of the head advances it
(the slots it leaves behind are recycled lazily, on their next write, so a long gap costs
nothing); an event within the ring lands in its own interval, so out-of-order delivery inside
the window is harmless; an event older than the ring is *late*: refused, counted in ``late``, and
the write returns ``False``. A window trusts its writer's event time, so one event stamped far
ahead would push the head there and make every on-time event after it late: the engine
(:mod:`policies.engine`) never writes an event more than one interval past its clock.

Reads. A read at ``now`` covers the intervals that start within ``(now - window_s, now]``, i.e.
the ``window_s / interval_s`` intervals ending with the one holding ``now``. Data older than
``window_s`` is never counted, and the oldest counted interval may be partly expired: the
window's resolution is one interval. Reads at a ``now`` past the last event find the data
expired without any write having to happen.

Latency. Each interval holds a DDSketch store (``CollapsingLowestDenseStore``: at most
``bin_limit`` bins whatever the event rate or value range; past that the *lowest* bins collapse,
which costs accuracy on low quantiles only, the ones an autoscaler does not act on). A read merges
the stores into a ``BaseDDSketch`` and asks it for the quantile, so every quantile is within
``relative_accuracy`` of the exact one (the element of rank ``floor(q * (n - 1))``).

The write path bypasses ``DDSketch.add``, which keeps a sum, a min and a max that a window never
reads and makes two method calls per value, where the same work inlined below makes none.
:meth:`LatencyWindow.add` computes the key with the mapping's
own formula (``ceil(log2(v) * multiplier)``, reading the mapping's ``_multiplier``: ddsketch is
pinned) and, when the key falls inside the store's current range, increments the bin as
``DenseStore.add`` does; a key just outside that range but inside the bins already allocated
widens the range in place (:func:`_widen`: ddsketch would re-centre the bins, a list copy, for
every new lowest key); any other key goes through ``store.add`` (growth, collapsing). The tests
check that this yields exactly the quantiles ``DDSketch.add`` does. A batch whose values all key
inside the bins laid out (the common case: a new interval is laid out as the last one) is keyed
by C-level ``map`` calls and counted in one short loop (:func:`_add_inside`), about half the
cost for a 40-value batch. Histogram bounds are keyed once per distinct set of bounds, since
a producer sends the same bounds every time.

Reads are cached on the writes so far and the span of slots read, so repeated reads between
writes cost two comparisons, and a read after writes to the newest interval only re-merges that
interval onto a cached merge of the older ones.

Histograms. A bucket's requests are recorded at the bucket's *upper* bound. A quantile then
errs high by at most its bucket's width (the histogram's resolution,
``bounds[i] / bounds[i - 1] - 1``), plus ``relative_accuracy`` either way. Erring high is the
safe side for an autoscaler. The overflow bucket (above the last bound: Prometheus' ``+Inf``)
has no upper bound; its requests are recorded one sketch key *above* the last bound's, so they
read as more than it (never at it: with bounds ``[50, 100]`` and a 100 ms objective, requests
over 100 ms must read as over the objective), and :meth:`LatencyWindow.above_bound` tells a
reader that a quantile landing there is only known to exceed the last bound.

Utilization. Per interval a sum, a count and a max: constant memory per GPU. A pool's mean is
the mean of its GPUs' means, so a GPU whose exporter reports twice as often does not weigh twice
as much.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from itertools import repeat as _repeat
from operator import add as _add
from operator import mul as _mul
from operator import sub as _sub
from typing import Final

from ddsketch.ddsketch import BaseDDSketch
from ddsketch.mapping import LogarithmicMapping
from ddsketch.store import CollapsingLowestDenseStore

from streams.events import InferenceLatency

__all__ = ["RELATIVE_ACCURACY", "LatencyWindow", "UtilizationWindow", "reads_at_least"]

#: The latency window's sketch reads a latency ``x`` as a value within this fraction of ``x``.
RELATIVE_ACCURACY: Final = 0.01


def reads_at_least(value_ms: float, relative_accuracy: float = RELATIVE_ACCURACY) -> float:
    """A latency above which a request reads at or above ``value_ms`` in a sketch of that
    accuracy (it reads ``x`` as at least ``x * (1 - relative_accuracy)``; a hair more margin
    for rounding), so counts above it tell where the sketch's percentile stands."""
    return value_ms / (1.0 - relative_accuracy) * (1.0 + 1e-9)


_log, _ceil = math.log, math.ceil
_INF = math.inf

#: Returned by the running-sum read when the merge must decide (collapsed stores); never a
#: quantile, latencies being non-negative.
_NO_FAST: Final = -1.0


def _by_slot(cell: _Interval) -> int:
    return cell.slot


def _grow(store: CollapsingLowestDenseStore, key: int) -> None:
    """``store.add(key)`` for a key outside the bins allocated. An empty store whose bins were
    laid out in advance is first put back as ddsketch made it (no bins), so its growth is
    ddsketch's own (re-centring a laid-out empty store on a far key would grow the bins past
    ``bin_limit``)."""
    if not store.count and store.bins:
        store.bins, store.offset = [], 0
    store.add(key)


def _widen(store: CollapsingLowestDenseStore, key: int) -> None:
    """``store.add(key)`` for a key outside ``[min_key, max_key]`` but inside the bins already
    allocated, in a store that has not collapsed: the range widens to the key (or starts at it
    in an empty store whose bins were laid out in advance), as ``DenseStore._extend_range``
    would, without re-centring the bins (a list copy per new lowest key). Only the bins'
    placement differs, never a key's count, ``min_key``, ``max_key`` or when the store
    collapses: its range exceeding ``bin_limit``, as a store's length is at least
    ``min(range, bin_limit)`` whatever its placement."""
    if not store.count:
        store.min_key = store.max_key = key
    elif key < store.min_key:
        store.min_key = key
    else:
        store.max_key = key
    store.bins[key - store.offset] += 1.0
    store.count += 1.0


def _add_inside(store: CollapsingLowestDenseStore, values: Sequence[float], scale: float) -> bool:
    """Add positive ``values`` (all keyable) to a store that has not collapsed when every key
    falls inside the bins already allocated, the keys computed by C-level ``map`` rather than
    a loop: the bins, count and key range come out as adding them one by one would (each key
    inside the range, or widening it as :func:`_widen` does). ``False`` (nothing added) when a
    key falls outside, or a value is NaN: the caller's loop decides."""
    try:
        keys = list(map(_ceil, map(_mul, map(_log, values, _repeat(2.0)), _repeat(scale))))
    except ValueError:  # NaN
        return False
    first, last = min(keys), max(keys)
    bins, off = store.bins, store.offset
    if first < off or last >= off + len(bins):
        return False
    for key in keys:
        bins[key - off] += 1.0
    if store.count:
        store.min_key, store.max_key = min(store.min_key, first), max(store.max_key, last)
    else:
        store.min_key, store.max_key = first, last
    store.count += float(len(keys))
    return True


#: Batches at least this long are keyed by C-level maps (:func:`_add_inside`); shorter ones
#: cost less in the loop than in setting the maps up.
_MAP_BATCH: Final = 8

#: At most this many live intervals, a tail percentile is read by walking keys across them
#: (:meth:`LatencyWindow._scan_quantile`) rather than from the running sum of the older ones.
_SCAN_INTERVALS: Final = 8

#: Where an overflow bucket is put when the last bound is (nearly) zero: 1 µs.
_OVERFLOW_FLOOR_MS: Final = 0.001

#: A slot number no real event time maps to: marks a ring cell that has never been written.
_NO_SLOT: Final = -(1 << 62)


def _ring_length(window_s: float, interval_s: float) -> int:
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(f"interval_s must be finite and positive; got {interval_s}")
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be finite and positive; got {window_s}")
    ratio = window_s / interval_s
    length = round(ratio)
    if length < 1 or abs(ratio - length) > 1e-9 * ratio:
        raise ValueError(
            f"window_s must be a whole multiple of interval_s; got {window_s} / {interval_s}"
        )
    return length


def _slot_of(ts: float, interval_s: float) -> int:
    try:
        return int(ts // interval_s)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"ts must be finite; got {ts}") from exc


class _Ring:
    """Slot arithmetic shared by both windows: which intervals a write may touch, which a read
    covers."""

    __slots__ = ("_head", "_interval_s", "_late", "_length")

    def __init__(self, *, window_s: float, interval_s: float) -> None:
        self._length = _ring_length(window_s, interval_s)
        self._interval_s = float(interval_s)
        self._head = _NO_SLOT
        self._late = 0

    @property
    def late(self) -> int:
        """Writes refused because their interval had already left the ring."""
        return self._late

    @property
    def intervals(self) -> int:
        """Intervals in the ring: the window's memory, in intervals."""
        return self._length

    def _span(self, now: float) -> tuple[int, int]:
        """The first and last slot a read at ``now`` covers (empty when first > last). Plain
        comparisons, not ``max``/``min`` calls: every read starts here."""
        last = _slot_of(now, self._interval_s)
        head = self._head
        if last > head:
            return last - self._length + 1, head
        return head - self._length + 1, last

    def _admit(self, slot: int) -> bool:
        """Whether a write to ``slot`` may land: it advances the head, or counts one more late
        write and is refused when the slot has left the ring (for writes that bypass
        ``_cell``: whole intervals put by a decider)."""
        if slot > self._head:
            self._head = slot
        elif slot <= self._head - self._length:
            self._late += 1
            return False
        return True


class _Interval:
    """One interval of latencies: positive values in a store, zeros counted apart (the
    logarithmic mapping cannot key zero)."""

    __slots__ = ("slot", "store", "zeros")

    def __init__(self, slot: int, bin_limit: int) -> None:
        self.slot = slot
        self.store = CollapsingLowestDenseStore(bin_limit)
        self.zeros = 0


class LatencyWindow(_Ring):
    """Quantiles of request latency (ms) over a sliding window of event time."""

    __slots__ = (
        "_agg",
        "_agg_cells",
        "_agg_count",
        "_agg_off",
        "_agg_zeros",
        "_answers",
        "_bin_limit",
        "_cells",
        "_cold",
        "_cold_key",
        "_full",
        "_full_key",
        "_full_store",
        "_hist_bounds",
        "_hist_keys",
        "_last_cell",
        "_last_slot",
        "_mapping",
        "_max_value",
        "_min_value",
        "_overflow",
        "_read_key",
        "_scale",
        "_writes",
    )

    def __init__(
        self,
        *,
        window_s: float,
        interval_s: float,
        relative_accuracy: float = RELATIVE_ACCURACY,
        bin_limit: int = 2048,
    ) -> None:
        super().__init__(window_s=window_s, interval_s=interval_s)
        if bin_limit < 1:
            raise ValueError(f"bin_limit must be positive; got {bin_limit}")
        self._bin_limit = bin_limit
        self._mapping = LogarithmicMapping(relative_accuracy)
        # The hot path computes keys as ``LogarithmicMapping.key`` does (offset 0).
        self._scale: float = self._mapping._multiplier
        self._min_value: float = self._mapping.min_possible
        self._max_value: float = self._mapping.max_possible
        self._cells = [_Interval(_NO_SLOT, 0) for _ in range(self._length)]
        self._last_slot = _NO_SLOT
        self._last_cell = self._cells[0]
        empty = CollapsingLowestDenseStore(bin_limit)
        self._cold: tuple[CollapsingLowestDenseStore, int] = (empty, 0)
        self._cold_key: tuple[tuple[int, float, int], ...] = ()
        self._full: BaseDDSketch | None = None
        self._full_store = empty
        self._answers: dict[float, float | None] = {}
        self._hist_bounds: list[float] | None = None  # the bounds _hist_keys were made for
        self._hist_keys: list[int | None] = []
        # Sketch key of an overflow bucket -> the last bound it lies above (one per distinct
        # last bound a producer sends: a handful).
        self._overflow: dict[int, float] = {}
        self._full_key: tuple[tuple[int, float, int], ...] = ()
        #: Write calls so far: with the span a read covers, what its answer depends on.
        self._writes = 0
        self._read_key = (-1, 0, 0)
        # The running sum of the older live intervals' bins (see _fast_quantile): bins from key
        # _agg_off, their total, the zeros, and slot -> (interval, count, zeros) when folded.
        self._agg: list[float] = []
        self._agg_off = 0
        self._agg_count = 0.0
        self._agg_zeros = 0
        self._agg_cells: dict[int, tuple[_Interval, float, int]] = {}

    # -- writes -------------------------------------------------------------------------------

    def observe(self, event: InferenceLatency) -> bool:
        """Feed whichever latency form ``event`` carries; ``False`` when it was late."""
        if event.latency_ms is not None:
            return self.add(event.time, event.latency_ms)
        if event.samples_ms is not None:
            return self.add_many(event.time, event.samples_ms)
        if event.histogram is not None:
            return self.add_histogram(event.time, event.histogram.bounds_ms, event.histogram.counts)
        raise ValueError("event carries no latency")  # the decoder makes this unreachable

    def _cell_at(self, ts: float) -> _Interval | None:
        """The interval holding event time ``ts`` (the newest one is remembered), or ``None``
        when ``ts`` is older than the ring."""
        try:
            slot = int(ts // self._interval_s)
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"ts must be finite; got {ts}") from exc
        if slot == self._last_slot:
            self._writes += 1
            return self._last_cell
        return self._cell(slot)

    def add(self, ts: float, value_ms: float) -> bool:
        """Record one latency at event time ``ts``; ``False`` when ``ts`` is older than the ring.

        Raises ``ValueError`` for a negative, NaN or infinite latency.
        """
        cell = self._cell_at(ts)
        if cell is None:
            return False
        if self._min_value < value_ms <= self._max_value:
            key = _ceil(_log(value_ms, 2) * self._scale)
            store = cell.store
            if store.min_key <= key <= store.max_key:
                store.bins[key - store.offset] += 1.0
                store.count += 1.0
            elif (
                store.count and not store.is_collapsed and 0 <= key - store.offset < len(store.bins)
            ):
                _widen(store, key)
            else:
                _grow(store, key)
        elif 0.0 <= value_ms <= self._min_value:
            cell.zeros += 1
        else:
            raise ValueError(f"latency must be finite and non-negative; got {value_ms}")
        return True

    def add_many(self, ts: float, values_ms: Iterable[float]) -> bool:
        """Record a batch of latencies sharing event time ``ts``; ``False`` when late.

        A bad value raises ``ValueError`` after the values before it were recorded: the
        decoder range-checks events, so that is a caller's bug, not data.
        """
        cell = self._cell_at(ts)
        if cell is None:
            return False
        store = cell.store
        scale, lo, hi = self._scale, self._min_value, self._max_value
        if not isinstance(values_ms, list | tuple):
            values_ms = list(values_ms)
        if (
            len(values_ms) >= _MAP_BATCH
            and not store.is_collapsed
            and lo < min(values_ms)
            and max(values_ms) <= hi
            and _add_inside(store, values_ms, scale)
        ):
            return True
        log, ceil = _log, _ceil
        # The store's fields in locals, its count added once: counts are whole numbers, so the
        # sum is the same; both are refreshed around anything that reads or moves them.
        bins, off, first, last = store.bins, store.offset, store.min_key, store.max_key
        zeros = 0
        added = 0.0
        try:
            for value in values_ms:
                if lo < value <= hi:
                    key = ceil(log(value, 2) * scale)
                    if first <= key <= last:
                        bins[key - off] += 1.0
                        added += 1.0
                        continue
                    store.count += added
                    added = 0.0
                    if not store.is_collapsed and 0 <= key - store.offset < len(store.bins):
                        _widen(store, key)
                    else:
                        _grow(store, key)
                    bins, off, first, last = store.bins, store.offset, store.min_key, store.max_key
                elif 0.0 <= value <= lo:
                    zeros += 1
                else:
                    raise ValueError(f"latency must be finite and non-negative; got {value}")
        finally:
            store.count += added
            cell.zeros += zeros
        return True

    def add_histogram(self, ts: float, bounds_ms: Sequence[float], counts: Sequence[int]) -> bool:
        """Record a latency histogram at event time ``ts``; ``False`` when late.

        ``counts[i]`` requests took at most ``bounds_ms[i]`` (and more than the bound before);
        ``counts[-1]`` is the overflow. Each bucket is recorded at its upper bound, so quantiles
        err high by at most one bucket's width; the overflow one key above the last bound (see
        :meth:`above_bound`).
        """
        if bounds_ms != self._hist_bounds:
            self._hist_keys = self._bucket_keys(bounds_ms)
            self._hist_bounds = list(bounds_ms)
        keys = self._hist_keys
        if len(counts) != len(keys):
            raise ValueError(f"counts needs len(bounds_ms)+1 = {len(keys)} entries")
        if counts and min(counts) < 0:
            raise ValueError("counts must be non-negative")
        cell = self._cell(_slot_of(ts, self._interval_s))
        if cell is None:
            return False
        store = cell.store
        if not store.count and store.bins:
            store.bins, store.offset = [], 0  # see _grow
        for key, n in zip(keys, counts, strict=True):
            if n:
                if key is None:
                    cell.zeros += n
                else:
                    store.add(key, float(n))
        return True

    def _bucket_keys(self, bounds_ms: Sequence[float]) -> list[int | None]:
        """The sketch key of each bucket's representative (``None`` for zero), overflow last.

        Producers send the same bounds every time, so :meth:`add_histogram` caches these.
        """
        if not bounds_ms:
            raise ValueError("bounds_ms must not be empty")
        if any(b <= a for a, b in pairwise(bounds_ms)):
            raise ValueError("bounds_ms must be strictly increasing")
        keys: list[int | None] = []
        for bound in bounds_ms:
            if self._min_value < bound <= self._max_value:
                keys.append(self._mapping.key(bound))
            elif 0.0 <= bound <= self._min_value:
                keys.append(None)
            else:
                raise ValueError(f"bounds must be finite and non-negative; got {bound}")
        last = keys[-1] if keys[-1] is not None else self._mapping.key(_OVERFLOW_FLOOR_MS)
        self._overflow[last + 1] = float(bounds_ms[-1])
        keys.append(last + 1)
        return keys

    def _cell(self, slot: int) -> _Interval | None:
        """The interval for ``slot``, advancing the head or recycling a stale cell as needed;
        ``None`` (and one more late write) when the slot has left the ring."""
        self._writes += 1
        if slot > self._head:
            self._head = slot
        elif slot <= self._head - self._length:
            self._late += 1
            return None
        index = slot % self._length
        cell = self._cells[index]
        if cell.slot != slot:
            cell = self._cells[index] = _Interval(slot, self._bin_limit)
            # Lay the new store's bins out as the last one written (the previous interval,
            # usually): its values mostly fall inside, so few writes need ddsketch's growth.
            prev = self._last_cell.store
            if prev.bins and not prev.is_collapsed:
                cell.store.bins = [0.0] * len(prev.bins)
                cell.store.offset = prev.offset
        self._last_slot, self._last_cell = slot, cell
        return cell

    # -- reads --------------------------------------------------------------------------------

    def quantile(self, now: float, q: float) -> float | None:
        """The ``q``-quantile (0 ≤ q ≤ 1) of latencies in the window at ``now``; ``None`` when
        the window holds none."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be within [0, 1]; got {q}")
        first, last = self._span(now)
        read = (self._writes, first, last)
        if read != self._read_key:
            self._read_key = read
            self._answers = {}
        answers = self._answers
        if q in answers:
            return answers[q]
        live = self._cells_in(first, last)
        if not live:
            value = None
        else:
            value = self._fast_quantile(live, q)
            if value == _NO_FAST:
                key = tuple([(c.slot, c.store.count, c.zeros) for c in live])
                got = self._sketch(live, key).get_quantile_value(q)
                value = None if got is None else float(got)
        answers[q] = value
        return value

    def above_bound(self, now: float, q: float) -> float | None:
        """The histogram bound the ``q``-quantile at ``now`` is only known to exceed, when it
        lands in a histogram's overflow bucket (``None`` otherwise): its value,
        :meth:`quantile`'s answer, is then a floor, not a measurement."""
        value = self.quantile(now, q)
        if value is None or not self._overflow:
            return None
        return self._overflow.get(self._mapping.key(value))

    def count(self, now: float) -> int:
        """How many latencies the window holds at ``now``."""
        return sum(int(c.store.count) + c.zeros for c in self._live(now))

    def oldest(self, now: float) -> float | None:
        """Start time of the oldest non-empty interval in the window, so a caller can tell how
        long the window has been observed; ``None`` when empty."""
        live = self._live(now)
        return live[0].slot * self._interval_s if live else None

    def _live(self, now: float) -> list[_Interval]:
        """Non-empty intervals covered by a read at ``now``, oldest first."""
        return self._cells_in(*self._span(now))

    def _cells_in(self, first: int, last: int) -> list[_Interval]:
        """Non-empty intervals of slots ``first`` to ``last``, oldest first: slot by slot (at
        most one ring's worth, each in its own cell), so no sort."""
        cells, length = self._cells, self._length
        live = []
        for slot in range(first, last + 1):
            c = cells[slot % length]
            if c.slot == slot and (c.store.count or c.zeros):
                live.append(c)
        return live

    # -- reads: the running sum of the older intervals ----------------------------------------

    def _drop_merges(self) -> None:
        empty = CollapsingLowestDenseStore(self._bin_limit)
        self._cold, self._cold_key = (empty, 0), ()
        self._full, self._full_store, self._full_key = None, empty, ()

    def _drop_sum(self) -> None:
        self._agg, self._agg_off, self._agg_count, self._agg_zeros = [], 0, 0.0, 0
        self._agg_cells = {}

    def _fast_quantile(self, live: list[_Interval], q: float) -> float | None:
        """The quantile from the running sum of the older intervals plus the newest one, or
        :data:`_NO_FAST` when a store collapsed or the intervals span more than ``bin_limit``
        keys (then the merge of :meth:`_sketch` is what defines the answer)."""
        lo, hi = _INF, -_INF
        collapsed = False
        # Counts are whole numbers, so these sums are exact in any order.
        zeros = total = 0.0
        stores = []  # the non-empty ones' bins, offset and key range, for _scan_quantile
        for c in live:
            store = c.store
            if store.is_collapsed:
                collapsed = True
                break
            zeros += c.zeros
            n = store.count
            if n:
                total += n
                first, last = store.min_key, store.max_key
                if first < lo:
                    lo = first
                if last > hi:
                    hi = last
                stores.append((store.bins, store.offset, first, last))
        if collapsed or (hi >= lo and hi - lo + 1 > self._bin_limit):
            if self._agg:
                self._drop_sum()
            return _NO_FAST
        if self._full is not None or self._cold_key:
            self._drop_merges()
        # As BaseDDSketch.get_quantile_value on the merged store (no negative values).
        rank = q * (zeros + total - 1)
        if rank < zeros:
            return 0.0
        r = rank - zeros
        if not total:
            return None  # unreachable: a live interval holds a value
        if len(live) <= _SCAN_INTERVALS and not 0.1 < q < 0.9:
            return self._scan_quantile(stores, q, r, total, (lo, hi))
        *older, newest = live
        self._sync(older, lo, hi)
        store = newest.store
        bins, off = self._agg, self._agg_off
        if store.count:
            bins = bins[:]
            a = store.min_key - off
            b = store.max_key + 1 - off
            bins[a:b] = map(
                _add, bins[a:b], store.bins[a + off - store.offset : b + off - store.offset]
            )
        # The smallest key whose cumulative count exceeds r (DenseStore.key_at_rank); counts are
        # whole numbers, so summing from either end gives the same exact comparisons.
        if q >= 0.5:
            cum = total
            i = int(hi) - off
            while True:
                n = bins[i]
                if n and cum - n <= r:
                    break
                cum -= n
                i -= 1
        else:
            cum = 0.0
            i = int(lo) - off
            while True:
                cum += bins[i]
                if cum > r:
                    break
                i += 1
        return float(self._mapping.value(i + off))

    def _scan_quantile(
        self,
        stores: list[tuple[list[float], int, int, int]],
        q: float,
        r: float,
        total: float,
        keys: tuple[float, float],
    ) -> float:
        """:meth:`_fast_quantile`'s answer (the key of rank ``r`` among ``total`` positive
        values, within ``keys``) without the running sum: walking keys in from the near end (a
        tail percentile is a few keys from it), each key's count summed over the few live
        intervals' ``stores`` (bins, offset, first and last key of each non-empty one). Counts
        are whole numbers: the same key."""
        key, step = (int(keys[1]), -1) if q >= 0.5 else (int(keys[0]), 1)
        cum = total if q >= 0.5 else 0.0
        while True:
            n = 0.0
            for bins, off, first, last in stores:
                if first <= key <= last:
                    n += bins[key - off]
            if q >= 0.5:
                if n and cum - n <= r:
                    break
                cum -= n
            else:
                cum += n
                if cum > r:
                    break
            key += step
        return float(self._mapping.value(key))

    def _sync(self, older: list[_Interval], lo: float, hi: float) -> None:
        """Make the running sum hold exactly ``older``: subtract intervals that left (or were
        recycled), add those that joined; rebuild when a folded interval was written again.
        Bin counts are whole numbers, so adding and subtracting them is exact."""
        folded = self._agg_cells
        want = {c.slot: c for c in older}
        for slot, (cell, count, zeros) in list(folded.items()):
            if cell.store.count != count or cell.zeros != zeros:
                self._drop_sum()  # written since it was folded: its old bins are unknown
                folded = self._agg_cells
                break
            if want.get(slot) is not cell:
                self._fold(cell, -1)
                del folded[slot]
        if not folded and self._agg:
            self._drop_sum()
            folded = self._agg_cells
        if hi >= lo:
            bins, off = self._agg, self._agg_off
            if not bins or lo < off or hi >= off + len(bins):
                self._layout(int(lo), int(hi))
        for slot, cell in want.items():
            if slot not in folded:
                self._fold(cell, 1)
                folded[slot] = (cell, cell.store.count, cell.zeros)

    def _layout(self, lo: int, hi: int) -> None:
        """Re-lay the running sum over keys ``[lo, hi]`` plus some room (``bin_limit`` at most);
        its non-zero bins all lie in ``[lo, hi]``."""
        room = min(64, (self._bin_limit - (hi - lo + 1)) // 2)
        new_off = lo - room
        new = [0.0] * (hi - lo + 1 + 2 * room)
        old, off = self._agg, self._agg_off
        a, b = max(off, new_off), min(off + len(old), new_off + len(new))
        if a < b:
            new[a - new_off : b - new_off] = old[a - off : b - off]
        self._agg, self._agg_off = new, new_off

    def _fold(self, cell: _Interval, sign: int) -> None:
        store = cell.store
        if sign > 0:
            self._agg_zeros += cell.zeros
        else:
            self._agg_zeros -= cell.zeros
        if not store.count:
            return
        bins, off = self._agg, self._agg_off
        a, b = store.min_key - off, store.max_key + 1 - off
        src = store.bins[a + off - store.offset : b + off - store.offset]
        if sign > 0:
            bins[a:b] = map(_add, bins[a:b], src)
            self._agg_count += store.count
        else:
            bins[a:b] = map(_sub, bins[a:b], src)
            self._agg_count -= store.count

    def _sketch(
        self, live: list[_Interval], key: tuple[tuple[int, float, int], ...]
    ) -> BaseDDSketch:
        """The merge of the live intervals, from cache when they have not changed."""
        if key == self._full_key and self._full is not None:
            return self._full
        *older, newest = live
        if key[:-1] != self._cold_key:
            merged = CollapsingLowestDenseStore(self._bin_limit)
            for cell in older:
                merged.merge(cell.store)
            self._cold = (merged, sum(c.zeros for c in older))
            self._cold_key = key[:-1]
        cold_store, cold_zeros = self._cold
        store = CollapsingLowestDenseStore(self._bin_limit)
        store.copy(cold_store)
        store.merge(newest.store)
        self._full_store = store
        self._full = BaseDDSketch(
            mapping=self._mapping,
            store=store,
            negative_store=CollapsingLowestDenseStore(self._bin_limit),
            zero_count=float(cold_zeros + newest.zeros),
        )
        self._full_key = key
        return self._full

    # -- sharded ingest: intervals out (aggregators) and in (deciders), see policies.partials --

    def held_intervals(self) -> list[tuple[int, CollapsingLowestDenseStore, int]]:
        """The ring's non-empty intervals as ``(slot, store, zeros)``, oldest first."""
        floor = self._head - self._length
        cells = [c for c in self._cells if c.slot > floor and (c.store.count or c.zeros)]
        cells.sort(key=_by_slot)
        return [(c.slot, c.store, c.zeros) for c in cells]

    @property
    def overflow(self) -> dict[int, float]:
        """The sketch keys of the histogram overflow buckets seen -> the last bound each lies
        above, for partials to carry to a decider's window (:meth:`put_interval`)."""
        return dict(self._overflow)

    def put_interval(
        self,
        slot: int,
        store: CollapsingLowestDenseStore,
        zeros: int,
        *,
        overflow: Mapping[int, float] | None = None,
    ) -> bool:
        """Make interval ``slot`` hold ``store`` and ``zeros`` (a merge of partials), replacing
        what it held; ``False`` (a late write) when the slot has left the ring. The store must
        have this window's bin limit; ``overflow`` is :attr:`overflow` of the windows the
        partials came from."""
        if overflow:
            self._overflow.update(overflow)
        if store.bin_limit != self._bin_limit:
            raise ValueError(f"store has bin_limit {store.bin_limit}; expected {self._bin_limit}")
        if self._cell(slot) is None:
            return False
        cell = _Interval(slot, self._bin_limit)
        cell.store, cell.zeros = store, zeros
        self._cells[slot % self._length] = cell
        self._last_slot, self._last_cell = slot, cell
        self._drop_merges()
        self._drop_sum()
        return True


class UtilizationWindow(_Ring):
    """Utilization (percent) of one GPU or MIG instance over a sliding window of event time."""

    __slots__ = ("_counts", "_maxes", "_slots", "_sums", "epoch")

    def __init__(self, *, window_s: float, interval_s: float) -> None:
        super().__init__(window_s=window_s, interval_s=interval_s)
        #: Counts the writes that may take readings out of a read: the head moving on (the
        #: oldest interval leaves) and intervals put whole. Between two, at the same slot of
        #: ``now``, a read only gains readings.
        self.epoch = 0
        self._slots = [_NO_SLOT] * self._length
        self._sums = [0.0] * self._length
        self._counts = [0] * self._length
        self._maxes = [0.0] * self._length

    def add(self, ts: float, util_pct: float) -> bool:
        """Record one reading at event time ``ts``; ``False`` when ``ts`` is older than the
        ring."""
        if not 0.0 <= util_pct <= 100.0:
            raise ValueError(f"util_pct must be within [0, 100]; got {util_pct}")
        try:
            slot = int(ts // self._interval_s)
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"ts must be finite; got {ts}") from exc
        if slot > self._head:
            self._head = slot
            self.epoch += 1
        elif slot <= self._head - self._length:
            self._late += 1
            return False
        i = slot % self._length
        if self._slots[i] != slot:
            self._slots[i] = slot
            self._sums[i] = util_pct
            self._counts[i] = 1
            self._maxes[i] = util_pct
        else:
            self._sums[i] += util_pct
            self._counts[i] += 1
            if util_pct > self._maxes[i]:
                self._maxes[i] = util_pct
        return True

    def mean(self, now: float) -> float | None:
        """Mean of the readings in the window at ``now``; ``None`` when there are none."""
        total, n = self.totals(now)
        return total / n if n else None

    def totals(self, now: float) -> tuple[float, int]:
        """The sum and the number of the readings in the window at ``now``, as :meth:`mean`
        divides them. One pass, no intermediate list: the engine reads a pool's mean often."""
        first, last = self._span(now)
        total, n = 0.0, 0
        for slot, s, c in zip(self._slots, self._sums, self._counts, strict=True):
            if first <= slot <= last:
                total += s
                n += c
        return total, n

    def max(self, now: float) -> float | None:
        """Highest reading in the window at ``now``; ``None`` when there are none."""
        live = self._live(now)
        return max(self._maxes[i] for i in live) if live else None

    def oldest(self, now: float) -> float | None:
        """Start time of the oldest interval with a reading in the window; ``None`` when
        empty."""
        live = self._live(now)
        return min(self._slots[i] for i in live) * self._interval_s if live else None

    def steady_until(self, now: float) -> float:
        """The earliest time after ``now`` at which a read may differ from one at ``now``
        without any write in between: when an interval leaves the window, or one written ahead
        of ``now`` enters it; ``inf`` when the window holds nothing."""
        interval, length = self._interval_s, self._length
        last = _slot_of(now, interval)
        first = max(last, self._head) - length + 1
        until = _INF
        for slot in self._slots:
            if slot >= first:
                until = min(until, (slot if slot > last else slot + length) * interval)
        return until

    def _live(self, now: float) -> list[int]:
        """Ring indices with readings covered by a read at ``now``."""
        first, last = self._span(now)
        return [i for i, slot in enumerate(self._slots) if first <= slot <= last]

    # -- sharded ingest: intervals in (deciders), see policies.partials -----------------------

    def put_interval(self, slot: int, total: float, count: int, peak: float) -> bool:
        """Make interval ``slot`` hold a merge of partials (sum, count, max), replacing what it
        held; ``False`` (a late write) when the slot has left the ring."""
        if not self._admit(slot):
            return False
        self.epoch += 1
        i = slot % self._length
        self._slots[i], self._sums[i], self._counts[i], self._maxes[i] = slot, total, count, peak
        return True

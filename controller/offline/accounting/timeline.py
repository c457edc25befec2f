"""Time series for the report, in bounded memory whatever the recording's length.

A replay ticks every ``dt`` seconds of event time, for as long as the recording lasts, which is
not known in advance (the events are streamed). :class:`Timeline` keeps every series in at most
``capacity`` buckets of equal width: bucket ``b`` covers ticks ``[b * stride, (b + 1) * stride)``.
When a tick falls past the last bucket, adjacent buckets are merged pairwise and the stride
doubles, so a run ends with between ``capacity / 2`` and ``capacity`` buckets and every series
costs O(capacity) memory. A run that knows how many ticks it will have (a replay whose recording
was scanned first) starts at the stride the doubling would end with: the same buckets, without
the work of filling the narrow ones first (see :meth:`Timeline.stride_for`).

Each channel says how its values combine within a bucket:

* ``mean`` — sum and count; a bucket's value is the mean of the values added to it (utilization,
  GPUs by use: the mean over the bucket's ticks);
* ``max`` — the largest value added (the windowed P99: a plot of maxima never hides a peak, which
  is the honest reduction for an SLO);
* ``sum`` — a total (actions taken in the bucket).

Merging two buckets applies the same rule, so the result is what one pass with the coarser
stride would have produced. Empty buckets read as ``None`` (no data, drawn as a gap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

__all__ = ["Aggregate", "Timeline"]

Aggregate = Literal["mean", "max", "sum"]


class _Channel:
    __slots__ = ("agg", "count", "value")

    def __init__(self, agg: Aggregate, capacity: int) -> None:
        self.agg = agg
        self.value = [0.0] * capacity
        self.count = [0] * capacity

    def add(self, b: int, v: float, n: int = 1) -> None:
        if self.agg == "max":
            if self.count[b] == 0 or v > self.value[b]:
                self.value[b] = v
        else:
            self.value[b] += v * n
        self.count[b] += n

    def halve(self) -> None:
        n = len(self.value)
        value, count = self.value, self.count
        for i in range(n // 2):
            a, b = 2 * i, 2 * i + 1
            if self.agg == "max":
                if count[a] and count[b]:
                    v = max(value[a], value[b])
                else:
                    v = value[a] if count[a] else value[b]
            else:
                v = value[a] + value[b]
            value[i], count[i] = v, count[a] + count[b]
        for i in range(n // 2, n):
            value[i], count[i] = 0.0, 0

    def read(self, buckets: int) -> list[float | None]:
        out: list[float | None] = []
        for i in range(buckets):
            c = self.count[i]
            if c == 0:
                out.append(None if self.agg != "sum" else 0.0)
            elif self.agg == "mean":
                out.append(self.value[i] / c)
            else:
                out.append(self.value[i])
        return out


class Timeline:
    """Series sampled on a regular tick, downsampled to at most ``capacity`` points each."""

    def __init__(
        self, *, start: float, dt: float, capacity: int = 600, ticks: int | None = None
    ) -> None:
        if capacity < 2 or capacity % 2:
            raise ValueError(f"capacity must be even and at least 2; got {capacity}")
        self.start = start
        self.dt = dt
        self.capacity = capacity
        self.stride = 1 if ticks is None else self.stride_for(ticks, capacity)
        self._channels: dict[str, _Channel] = {}
        self._last = -1

    @staticmethod
    def stride_for(ticks: int, capacity: int) -> int:
        """The stride a run of ``ticks`` ticks ends with: the least power of two that puts its
        last tick in one of ``capacity`` buckets (a longer run goes on doubling it)."""
        stride = 1
        while (ticks - 1) // stride >= capacity:
            stride *= 2
        return stride

    def channel(self, name: str, agg: Aggregate) -> None:
        """Declare a series (before or during the run; a late one reads empty until then)."""
        if name not in self._channels:
            self._channels[name] = _Channel(agg, self.capacity)

    def bucket(self, tick: int) -> int:
        """The bucket of tick number ``tick`` (ticks count from ``start``), making room."""
        b = tick // self.stride
        while b >= self.capacity:
            for ch in self._channels.values():
                ch.halve()
            self.stride *= 2
            b = tick // self.stride
        if tick > self._last:
            self._last = tick
        return b

    def add(self, name: str, bucket: int, value: float) -> None:
        """Add ``value`` to channel ``name`` in ``bucket`` (from :meth:`bucket`, this tick)."""
        self._channels[name].add(bucket, value)

    def adder(self, name: str) -> Callable[[int, float], None]:
        """:meth:`add` for channel ``name`` as one call ``(bucket, value)``: for a value added
        every tick (the channel object outlives every halving)."""
        return self._channels[name].add

    def cells(self, name: str) -> tuple[list[float], list[int]]:
        """Channel ``name``'s per-bucket values and counts, for a caller that adds to one bucket
        many times in a loop and writes back once (the lists outlive every halving)."""
        ch = self._channels[name]
        return ch.value, ch.count

    def add_many(self, name: str, bucket: int, value: float, n: int) -> None:
        """Add ``value`` ``n`` times (``n`` ticks of one bucket that saw the same value); exact
        for integer values, as repeated :meth:`add` calls would be."""
        self._channels[name].add(bucket, value, n)

    def is_sample_tick(self, tick: int) -> bool:
        """True on the first tick of a bucket: when an expensive value is worth computing."""
        return tick % self.stride == 0

    def times(self) -> list[float]:
        """Start time (event time, epoch seconds) of each bucket with data so far."""
        n = self._last // self.stride + 1 if self._last >= 0 else 0
        width = self.stride * self.dt
        return [self.start + i * width for i in range(n)]

    def series(self) -> dict[str, list[float | None]]:
        """Every channel's values, aligned with :meth:`times`."""
        n = len(self.times())
        return {name: ch.read(n) for name, ch in sorted(self._channels.items())}

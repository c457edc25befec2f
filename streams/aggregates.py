"""Wire format of sharded ingest: the partial aggregates aggregators publish, deciders merge.

An aggregator owns some partitions of the event topics (Kafka's consumer group decides which).
For each owned partition it folds events into per-interval partials and, about once a second,
publishes a :class:`Flush`: everything folded from one contiguous range of that partition's
offsets, ``[first, next)``, and folds on from ``next``. It commits ``next`` only once the flush
is acknowledged, and publishes a partition's next flush only then, so the published flushes of
a partition not yet covered by a commit are contiguous and the first *starts* at the committed
offset (at most two: one acknowledged, its commit on the way, and the one after it).

That is what makes a rebalance lose nothing and double-count nothing. The new owner resumes at
the committed offset ``c``; its first flush also starts at ``c``. A decider that receives a flush
of a partition starting at ``c`` therefore drops every flush of that partition it holds starting
at ``c`` or later (those offsets are being re-read) before adding the new one. The topic is
compacted under ``topic/partition/first``, so a re-sent flush also replaces its predecessor on
the broker; no two flushes share a key, so the topic is also time-limited (``compact,delete``,
:func:`controller.process.aggregate.ensure_aggregates_topic`).

Cells carry their interval (``slot`` and ``interval_s``), so a decider merges each into the
window interval it belongs to, whenever it arrives. Latency cells carry the DDSketch store's bins
(exact to merge) and the exceedance counters; utilization cells a sum, a count and a max; idle
marks the first, last and last busy reading of a GPU (monotonic: merging twice changes nothing).
Encoded as msgpack with positional fields: a flush of a few hundred services is tens of KB.
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = [
    "AGGREGATES_TOPIC",
    "Flush",
    "IdleMark",
    "LatencyCell",
    "UtilCell",
    "decode_flush",
    "encode_flush",
]

AGGREGATES_TOPIC: Final = "ebbtide.aggregates"


class LatencyCell(msgspec.Struct, array_like=True, frozen=True):
    """One service's latencies in one interval, from one flush."""

    service: str
    """``namespace/name``."""
    slot: int
    interval_s: float
    min_key: int
    """Sketch key of ``bins[0]``."""
    bins: list[float]
    collapsed: bool
    zeros: int
    n: int
    above_high: int
    above_low: int
    overflow: dict[int, float] = msgspec.field(default_factory=dict)
    """Sketch keys holding a histogram's overflow bucket -> the last bound they lie above
    (:meth:`policies.windows.LatencyWindow.above_bound`); absent in older flushes."""


class UtilCell(msgspec.Struct, array_like=True, frozen=True):
    """One GPU's (or MIG instance's) readings in one interval, from one flush."""

    node: str
    gpu: int | str
    instance: int | None
    """The MIG instance, ``None`` for a whole GPU."""
    slot: int
    interval_s: float
    total: float
    count: int
    peak: float


class IdleMark(msgspec.Struct, array_like=True, frozen=True):
    """A whole GPU's first and last reading in one utilization interval, and its last reading
    above the idle threshold there."""

    node: str
    gpu: str
    slot: int
    interval_s: float
    first: float
    last: float
    busy: float | None


class Flush(msgspec.Struct, array_like=True, frozen=True):
    """What one aggregator folded from offsets ``[first, next)`` of one source partition."""

    topic: str
    partition: int
    first: int
    next: int
    latency: list[LatencyCell]
    util: list[UtilCell]
    idle: list[IdleMark]

    @property
    def key(self) -> bytes:
        """The compaction key: a re-sent flush replaces its predecessor."""
        return f"{self.topic}/{self.partition}/{self.first}".encode()


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Flush)


def encode_flush(flush: Flush) -> bytes:
    return _encoder.encode(flush)


def decode_flush(data: bytes) -> Flush:
    """The flush in ``data``; ``ValueError`` saying what is wrong with it."""
    try:
        flush = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not an aggregates flush: {exc}") from exc
    if flush.next < flush.first:
        raise ValueError(f"flush of {flush.topic}[{flush.partition}] ends before it starts")
    return flush

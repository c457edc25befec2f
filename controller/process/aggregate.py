"""``ebbtide run --role aggregate``: one aggregating replica of sharded ingest.

Aggregators share one Kafka consumer group, so the event topics' partitions are split between
them by Kafka (and moved by Kafka when one joins, leaves or dies). Each keeps a
:class:`~policies.partials.Fold` per owned partition; the consumer's checkpoint (every
``flush_every_s``, also while idle, on revocation and on stop) seals each fold into a
:class:`~streams.aggregates.Flush`, starts publishing it to the compacted aggregates topic and
starts a new fold at its ``next`` offset; a flush's ``next`` is committed once the broker has
acknowledged it (at the next checkpoint, or at once on revocation and stop). The guarantees that
follow (nothing lost, nothing counted twice over a rebalance) are spelled out in
:mod:`streams.aggregates`.

A batch fetched before a revocation but handed over after it (the queue between fetching and
folding) is dropped: its partitions were reset to their committed offsets and are fetched again.
The aggregator never decides and never talks to the cluster; deciders (``--role decide``)
merge the flushes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import structlog
from prometheus_client import CollectorRegistry

from controller.process.health import HealthServer
from controller.process.settings import Settings
from policies.engine import DEFAULT_UTIL_WINDOW_S, Engine
from policies.model import Policy
from policies.partials import Fold, FoldSpec, Merger
from streams.aggregates import decode_flush, encode_flush
from streams.aggregates_reader import AggregatesReader
from streams.connection import KafkaConfig, ensure_topics
from streams.consumer import Batch, ConsumerSettings, EventConsumer, TopicPartition
from streams.events import EventDecoder
from streams.producer import DeadLetter, KafkaProducer
from streams.stream_errors import ProduceError

__all__ = [
    "Aggregator",
    "AggregatorStats",
    "PartialsFeed",
    "aggregates_retention_s",
    "ensure_aggregates_topic",
    "longest_window_s",
    "run_aggregator",
]

log = structlog.get_logger("ebbtide.aggregate")


#: Kept on the aggregates topic past what a decider rewinds over: room for an aggregator that
#: publishes a backlog late (its flushes carry event time, their Kafka timestamps are later) and
#: for a decider that restarts while the topic is being cleaned.
RETENTION_MARGIN_S: Final = 3600.0


def longest_window_s(policy: Policy) -> float:
    """How far back the engine's windows reach: the longest window of any objective (further
    ones included), or the utilization window (MIG ``convertAfter``, else the engine's
    default)."""
    spec = policy.spec
    util = spec.mig.convert_after if spec.mig is not None else DEFAULT_UTIL_WINDOW_S
    windows = (o.window for svc in spec.services.values() for o in svc.all_objectives())
    return max([util, *windows])


def aggregates_retention_s(policy: Policy, settings: Settings) -> float:
    """How long the aggregates topic keeps a flush: ``shards.aggregates_retention_s`` when set,
    else what a decider rewinds over (the longest window + ``kafka.rewind_margin_s``) plus
    :data:`RETENTION_MARGIN_S`. Every flush has a key of its own, so compaction alone never
    removes one: time is what bounds the topic."""
    if settings.shards.aggregates_retention_s is not None:
        return settings.shards.aggregates_retention_s
    return longest_window_s(policy) + settings.kafka.rewind_margin_s + RETENTION_MARGIN_S


async def ensure_aggregates_topic(
    kafka: KafkaConfig,
    topic: str,
    *,
    retention_s: float,
    replication_factor: int | None = None,
) -> None:
    """The aggregates topic: one partition (flushes of a source partition must stay in order;
    the volume is a few messages per second per source partition), compacted by flush key (a
    re-sent flush replaces its predecessor) *and* deleted after ``retention_s`` (each flush
    has a key of its own, so compaction alone would keep every flush for ever). An existing
    topic is left as it is (docs/deploy.md says how to change it)."""
    await ensure_topics(
        kafka,
        [topic],
        replication_factor=replication_factor,
        configs={"cleanup.policy": "compact,delete", "retention.ms": str(int(retention_s * 1000))},
    )


#: Size past which a fold is published at once rather than at the next flush: a flush is one
#: Kafka message (1 MB by default), and a backlog read at full speed spans many intervals per
#: second. The size is looked at every :data:`SIZE_CHECK_EVERY` events of a partition, within a
#: batch, and cut there; an event adds at most one interval's sketch to a fold, and a sketch
#: holds at most :data:`~policies.partials.BIN_LIMIT` bins, about 18.5 kB encoded, so a flush
#: stays under 256 kB + 32 x 18.5 kB = 848 kB whatever the batch.
MAX_FLUSH_BYTES = 256 * 1024
SIZE_CHECK_EVERY = 32
#: Messages per fetch for an aggregator (the single-replica path fetches 5,000).
BATCH_RECORDS = 500


@dataclass(slots=True)
class AggregatorStats:
    folded: int = 0
    """Events folded into partials."""
    stale: int = 0
    """Events of batches fetched before a revocation, dropped (they are fetched again)."""
    flushes: int = 0
    """Flushes acknowledged by the broker."""


class Aggregator:
    """Folds the partitions the group gives it; see the module docstring."""

    def __init__(
        self,
        kafka: KafkaConfig,
        policy: Policy,
        *,
        topic: str,
        consumer: ConsumerSettings,
        decoder: EventDecoder | None = None,
        deadletter_topic: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if consumer.group_id is None:
            raise ValueError("aggregators share partitions through a consumer group: set one")
        self._kafka = kafka
        self._spec = FoldSpec.of(policy)
        self._topic = topic
        self._consumer_settings = consumer
        self._decoder = decoder
        self._deadletter_topic = deadletter_topic
        self._clock = clock
        self._folds: dict[TopicPartition, tuple[int, Fold, int]] = {}
        """Per partition: (consumer generation, fold, offset after its last event)."""
        self._sending: dict[TopicPartition, asyncio.Future[None]] = {}
        """Per partition, the publishing of its flush in flight (at most one)."""
        self._unsent: dict[TopicPartition, tuple[bytes, bytes, int]] = {}
        """Per partition in flight: its flush encoded, its key and its ``next`` offset."""
        self._durable: dict[TopicPartition, int] = {}
        """Per partition, the offset up to which acknowledged flushes cover it."""
        self._producer: KafkaProducer | None = None
        self._stop = asyncio.Event()
        self.consumer: EventConsumer | None = None
        self.stats = AggregatorStats()

    def stop(self) -> None:
        self._stop.set()
        if self.consumer is not None:
            self.consumer.stop()

    async def run(self) -> None:
        """Consume, fold and publish until :meth:`stop`; the last folds are published and
        their offsets committed on the way out."""
        async with KafkaProducer(self._kafka, linger_ms=5) as producer:
            self._producer = producer
            dead = (
                DeadLetter(producer, topic=self._deadletter_topic)
                if self._deadletter_topic
                else None
            )
            self.consumer = EventConsumer(
                self._kafka,
                self._fold,
                settings=self._consumer_settings,
                decoder=self._decoder,
                dead_letter=dead,
                clock=self._clock,
                checkpoint=self._checkpoint,
            )
            if self._stop.is_set():
                return
            await self.consumer.run()

    async def _fold(self, batch: Batch) -> None:
        """The consumer's handler: fold each partition's events into its fold, publishing a
        fold as soon as it outgrows :data:`MAX_FLUSH_BYTES` (a flush is one message)."""
        consumer = self.consumer
        assert consumer is not None
        generation = batch.generation
        now = self._clock()
        events = batch.events
        for tp, (start, end, first) in batch.spans.items():
            held = self._folds.get(tp)
            fresh = held is None or held[0] != generation
            fold = self._fold_at(tp, first) if fresh or held is None else held[1]
            at = start
            while at < end and consumer.generation == generation:  # else revoked meanwhile
                cut = min(end, at + SIZE_CHECK_EVERY)
                fold.observe(events[at:cut], now)
                self.stats.folded += cut - at
                self._folds[tp] = (generation, fold, batch.offset_of(tp, cut))
                at = cut
                if fold.size() > MAX_FLUSH_BYTES:
                    await consumer.commit([tp])  # seals it and starts the next fold at the cut
                    fold = self._folds[tp][1]
            self.stats.stale += end - at

    async def _checkpoint(
        self, partitions: Sequence[TopicPartition]
    ) -> Mapping[TopicPartition, int]:
        """Seal the folds of ``partitions`` that hold anything new, start publishing them and
        start new folds where they ended; returns the offsets now safe to commit: those of
        flushes the broker acknowledged.

        Folding does not wait for the acknowledgement (a backlog would otherwise be read at
        the pace of the broker's round trips), except on revocation and stop, or when a fold
        outgrows :data:`MAX_FLUSH_BYTES` while the previous flush of its partition is still in
        flight. At most one flush per partition is in flight, so flushes of a partition reach
        the topic in order, and a failed one is re-sent before any later one is sealed: nothing
        after it is committed meanwhile, and it is the one that starts at the committed offset.
        """
        assert self.consumer is not None
        final = self._stop.is_set()
        for tp in partitions:
            held = self._folds.get(tp)
            last = final or held is None or held[0] != self.consumer.generation  # revoked
            sending = self._sending.get(tp)
            if sending is not None:
                busy = not sending.done() and not last and held is not None
                if busy and held is not None and held[1].size() <= MAX_FLUSH_BYTES:
                    continue  # keep folding; sealed once this one is acknowledged
                await self._acknowledged(tp)
            if held is not None and held[2] > held[1].first:
                flush = held[1].seal(held[2])
                self._folds[tp] = (held[0], self._fold_at(tp, flush.next), flush.next)
                self._send(tp, encode_flush(flush), flush.key, flush.next)
                self.stats.flushes += 1
                if last:
                    await self._acknowledged(tp)
            elif held is not None and tp not in self._sending:
                self._durable[tp] = held[2]
        return {tp: self._durable[tp] for tp in partitions if tp in self._durable}

    def _fold_at(self, tp: TopicPartition, first: int) -> Fold:
        return Fold(self._spec, topic=tp.topic, partition=tp.partition, first=first)

    def _send(self, tp: TopicPartition, value: bytes, key: bytes, next_offset: int) -> None:
        assert self._producer is not None
        task = asyncio.ensure_future(self._producer.send_and_wait(self._topic, value, key=key))
        self._sending[tp] = task
        self._unsent[tp] = (value, key, next_offset)

    async def _acknowledged(self, tp: TopicPartition) -> None:
        """Wait for the flush of ``tp`` in flight; re-send it (once, awaited) if it failed,
        raising if that fails too: it stays in flight, to be re-sent at the next checkpoint."""
        value, key, next_offset = self._unsent[tp]
        try:
            await self._sending[tp]
        except ProduceError:
            self._send(tp, value, key, next_offset)
            await self._sending[tp]
        del self._sending[tp], self._unsent[tp]
        self._durable[tp] = next_offset


async def run_aggregator(settings: Settings, policy: Policy) -> None:
    """The ``--role aggregate`` process: the aggregator, and ``/healthz`` and ``/readyz``
    (ready once the group has given it partitions and the broker answers) until SIGTERM."""
    s, k = settings, settings.kafka
    kafka = k.connection()
    await ensure_topics(
        kafka,
        [k.latency_topic, k.gpu_topic, k.deadletter_topic],
        replication_factor=k.replication_factor,
    )
    await ensure_aggregates_topic(
        kafka,
        s.shards.aggregates_topic,
        retention_s=aggregates_retention_s(policy, s),
        replication_factor=k.replication_factor,
    )
    aggregator = Aggregator(
        kafka,
        policy,
        topic=s.shards.aggregates_topic,
        consumer=ConsumerSettings(
            group_id=s.shards.group_id,
            topics=(k.latency_topic, k.gpu_topic),
            commit_interval_s=s.shards.flush_every_s,
            max_records=BATCH_RECORDS,
            session_timeout_ms=int(s.shards.session_timeout_s * 1000),
            heartbeat_interval_ms=int(s.shards.heartbeat_s * 1000),
            drain_timeout_s=s.shutdown_timeout_s / 4,
            close_timeout_s=s.shutdown_timeout_s / 8,
        ),
        decoder=EventDecoder(k.limits(), topics=k.topics()),
        deadletter_topic=k.deadletter_topic,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, aggregator.stop)

    def not_ready() -> list[str]:
        stats = aggregator.consumer.stats if aggregator.consumer else None
        if stats is None or stats.last_fetch_ok is None:
            return ["not consuming yet"]
        return [] if stats.caught_up else ["no partitions assigned or catching up"]

    http = HealthServer(s.http.address, registry=CollectorRegistry(), ready=not_ready, alive=list)
    await http.start()
    log.info("aggregator.started", group=s.shards.group_id, topic=s.shards.aggregates_topic)
    try:
        await aggregator.run()
    finally:
        await http.close()
        log.info("aggregator.stopped", **dataclasses.asdict(aggregator.stats))


class PartialsFeed:
    """A decider's ingest (``--role decide``): every decider replica reads the whole
    aggregates topic without a group (it is small), from ``rewind_s`` back, and merges each
    flush into its engine, so a follower's windows are as warm as the leader's. Ready
    (:attr:`caught_up`) once read up to the end offsets seen at start."""

    def __init__(
        self,
        kafka: KafkaConfig,
        topic: str,
        engine: Engine,
        *,
        rewind_s: float,
        partitions_refresh_s: float = 30.0,
        on_merged: Callable[[], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kafka, self._topic, self._rewind_s = kafka, topic, rewind_s
        self._on_merged, self._clock = on_merged, clock
        self.merger = Merger(engine)
        self._reader = AggregatesReader(kafka, topic, partitions_refresh_s=partitions_refresh_s)
        self.flushes = 0
        self.refused = 0
        self._stop = asyncio.Event()
        self._last_forget = 0.0

    def stop(self) -> None:
        self._stop.set()

    @property
    def caught_up(self) -> bool:
        return self._reader.caught_up

    @property
    def unassigned(self) -> list[int]:
        """Partitions of the aggregates topic not read yet (see :class:`TopicReader`)."""
        return self._reader.unassigned

    async def run(self) -> None:
        """Merge flushes from ``rewind_s`` back, then as they come, until :meth:`stop`."""
        reading = asyncio.create_task(
            self._reader.run(self._clock() - self._rewind_s, self._apply), name="ebbtide-partials"
        )
        stopped = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait((reading, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reading, stopped):
                task.cancel()
            await asyncio.wait((reading, stopped))
        if not stopped.cancelled() and reading.done() and not reading.cancelled():
            reading.result()  # the reader ended by itself: raise why

    def _apply(self, value: bytes) -> None:
        try:
            flush = decode_flush(value)
        except ValueError as exc:
            self.refused += 1
            log.warning("partials.refused", error=str(exc), record=value[:100])
            return
        self.merger.apply(flush)
        self.flushes += 1
        now = self._clock()
        if now - self._last_forget > 10.0:
            self._last_forget = now
            self.merger.forget_before(now - self._rewind_s)
        self._on_merged()

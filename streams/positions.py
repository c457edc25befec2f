"""Where a reader starts, and where it has to get to before it has caught up.

A reader that rebuilds state from a topic (sliding windows, the decisions log) starts at a point
in time, not at a committed offset: Kafka finds, per partition, the first message at or after
that time (``offsets_for_times``). Where there is none the reader starts at the partition's end,
and what arrives there after the start (before the first fetch answers, too) is read.

The embedded broker's lookups are not exact: on some topics its time lookup answers offset 0 for
any time, and its ``ListOffsets`` for the end (``seek_to_end``, ``end_offsets``) can be too low.
So, until a partition has given a message at or after the start time, older messages are
dropped by their own timestamp: a reader may fetch more than it needs, never keep less.

It has *caught up* once every partition is read up to the end offset it had when the reader
first fetched it, the high watermark of that fetch answer (for the same reason).

A reader without a group also has to notice partitions added to its topics later
(``kafka-topics --alter --partitions``): Kafka's group coordinator rebalances a group onto them,
but nothing does for a reader that assigned itself what it listed at start, and the keys that
move to the new partitions would never be read again. :class:`PartitionWatch` re-lists the
topics every so often (a metadata request, what the reader's broker probe already sends) and
assigns what is new *from its beginning*: a partition created after the reader started holds
only messages produced since, all newer than any start time, so its first offset is where a
time lookup would land anyway (and needs no lookup this broker may answer wrongly).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.stream_errors import KafkaUnavailable

__all__ = ["PartitionWatch", "StartLine", "partitions_of"]

log = structlog.get_logger(__name__)


async def partitions_of(
    consumer: AIOKafkaConsumer, topic: str, timeout_s: float = 10.0
) -> set[int]:
    """The topic's partition numbers; :class:`KafkaUnavailable` if the broker does not know it."""
    deadline = time.monotonic() + timeout_s
    while (partitions := consumer.partitions_for_topic(topic)) is None:
        if time.monotonic() > deadline:
            raise KafkaUnavailable(f"topic {topic!r} does not exist on the broker")
        await consumer.topics()  # refreshes the cluster metadata
        await asyncio.sleep(0.05)
    return set(partitions)


class StartLine:
    """The start offsets and the end offsets seen at start of one reader's partitions."""

    def __init__(self) -> None:
        self.ends: dict[TopicPartition, int] = {}
        """Per partition, its end offset when first fetched: the line to reach."""
        self._since_ms = 0
        self._by_time: set[TopicPartition] = set()

    async def seek_to_time(
        self, consumer: AIOKafkaConsumer, partitions: Sequence[TopicPartition], since_s: float
    ) -> None:
        """Move each partition to its first message at or after ``since_s`` (epoch seconds), or
        to its end when there is none (tansu answers "none" with timestamp -1 and offset 0, Kafka
        with offset -1, which aiokafka turns into ``None``)."""
        self._since_ms = int(since_s * 1000)
        found = await consumer.offsets_for_times({tp: self._since_ms for tp in partitions})
        for tp in partitions:
            self._by_time.add(tp)
            at = found.get(tp)
            if at is None or at.timestamp < 0:
                await consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, at.offset)

    def settle(
        self, consumer: AIOKafkaConsumer, records: Mapping[TopicPartition, list[Any]]
    ) -> dict[TopicPartition, list[Any]]:
        """After each fetch: note the end offsets seen for the first time, and return ``records``
        without what is older than the start."""
        for tp in consumer.assignment():
            if tp not in self.ends and (highwater := consumer.highwater(tp)) is not None:
                self.ends[tp] = highwater
        out: dict[TopicPartition, list[Any]] = {}
        for tp, messages in records.items():
            if tp in self._by_time:
                first = next(
                    (i for i, m in enumerate(messages) if m.timestamp >= self._since_ms), None
                )
                if first is None:
                    continue
                self._by_time.discard(tp)
                messages = messages[first:]
            out[tp] = messages
        return out

    def behind(
        self, partitions: Iterable[TopicPartition], done: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int | None, int | None]]:
        """Partitions not yet read up to their line: (offset done or ``None``, line or ``None``
        while no fetch has reported it)."""
        out: dict[TopicPartition, tuple[int | None, int | None]] = {}
        for tp in partitions:
            at, end = done.get(tp), self.ends.get(tp)
            if end is None or at is None or at < end:
                out[tp] = (at, end)
        return out

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Drop partitions that moved to another group member."""
        for tp in partitions:
            self.ends.pop(tp, None)
            self._by_time.discard(tp)


class PartitionWatch:
    """Keeps a reader without a consumer group assigned to every partition of its topics.

    :meth:`check` (when :meth:`due`, every ``every_s``) lists the topics' partitions with a
    fresh metadata request (aiokafka's own cache is refreshed only every
    ``metadata_max_age_ms``), assigns the new ones at their beginning and keeps every assigned
    partition where it was (``assign`` replaces an assignment, positions included).
    :attr:`unassigned` holds the partitions listed but not started: empty, unless starting
    them failed (the next check tries again), for readiness and metrics to show.
    """

    def __init__(
        self,
        topics: Sequence[str],
        *,
        every_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topics = tuple(topics)
        self.every_s = every_s
        self.unassigned: set[TopicPartition] = set()
        self._clock = clock
        self._last = clock()

    def due(self) -> bool:
        return self._clock() - self._last >= self.every_s

    async def check(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        """Assign the partitions listed now and not assigned yet, each from its beginning;
        return them. Broker errors (``KafkaError``) propagate, with :attr:`unassigned` telling
        what is left to start."""
        self._last = self._clock()
        cluster = await consumer._client.fetch_all_metadata()
        listed = {
            TopicPartition(topic, p)
            for topic in self.topics
            for p in cluster.partitions_for_topic(topic) or ()
        }
        assigned = consumer.assignment()
        new = sorted(listed - assigned)
        if new:
            self.unassigned |= set(new)
            positions = {tp: await consumer.position(tp) for tp in assigned}
            consumer.assign(sorted(assigned | set(new)))
            for tp, offset in positions.items():
                consumer.seek(tp, offset)
        if self.unassigned:
            # Assigned, not yet started: until this succeeds they count as unassigned, and a
            # fetch meanwhile may start them by the client's reset policy, so start them again.
            await consumer.seek_to_beginning(*sorted(self.unassigned))
            log.info(
                "ingest.partitions_added",
                partitions=[f"{tp.topic}[{tp.partition}]" for tp in sorted(self.unassigned)],
            )
            self.unassigned = set()
        return new

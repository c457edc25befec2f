"""Partitions added to a topic after a group-less reader started are read, from their beginning.

tansu 0.6.0 does not implement CreatePartitions (it advertises no such API version, and
aiokafka's ``create_partitions`` raises ``IncompatibleBrokerVersion``), so ``kafka-topics
--alter --partitions`` cannot be run against it. The tests create the topic with all its
partitions on the real broker and hide the later ones from the clients' metadata answers until
they "are added" (:class:`HiddenPartitions`): what a reader listed at start, and what the broker
lists after the alter, are then exactly what Kafka would give; fetching, seeking and assigning
are the real broker's.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import KafkaConnectionError
from test_consumer import Collector, Topics, consumer_for, wait_until

from streams.capture import TopicReader
from streams.connection import KafkaConfig, ensure_topics
from streams.events import InferenceLatency, encode_event
from streams.positions import PartitionWatch


class HiddenPartitions:
    """Clients' metadata lists only the first ``shown[topic]`` partitions of a topic, as the
    broker did before partitions were added; :meth:`add` is the ``--alter --partitions``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.shown: dict[str, int] = {}
        listed = ClusterMetadata.partitions_for_topic

        def partitions_for_topic(cluster: ClusterMetadata, topic: str) -> set[int] | None:
            parts: set[int] | None = listed(cluster, topic)
            n = self.shown.get(topic)
            return parts if parts is None or n is None else {p for p in parts if p < n}

        monkeypatch.setattr(ClusterMetadata, "partitions_for_topic", partitions_for_topic)

    def add(self, topic: str) -> None:
        self.shown.pop(topic)


async def send(config: KafkaConfig, topic: str, partition: int, ms: float) -> None:
    """One latency event (``latency_ms`` numbers it) to one partition."""
    producer = AIOKafkaProducer(**config.client_kwargs())
    await producer.start()
    try:
        event = InferenceLatency(ts=time.time(), service=f"s{ms:g}", latency_ms=ms)
        await producer.send_and_wait(topic, encode_event(event), partition=partition)
    finally:
        await producer.stop()


async def test_a_consumer_without_a_group_reads_partitions_added_after_it_started(
    kafka_config: KafkaConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After partitions are added, their events (also those produced before the consumer saw
    them) are handed over, and the partition it read all along is neither re-read nor left."""
    topics = Topics()
    await topics.create(kafka_config, partitions=3)
    await send(kafka_config, topics.latency, 2, 1.0)  # lands before the reader lists it
    await send(kafka_config, topics.latency, 0, 2.0)  # found by time at start
    hidden = HiddenPartitions(monkeypatch)
    hidden.shown = {topics.latency: 1, topics.gpu: 1}
    got = Collector()
    consumer = consumer_for(
        kafka_config, topics, got, group=None, rewind_s=60.0, partitions_refresh_s=0.1
    )
    task = asyncio.create_task(consumer.run())
    try:
        await wait_until(lambda: consumer.stats.caught_up and len(got.events) == 1)
        hidden.add(topics.latency)
        await send(kafka_config, topics.latency, 2, 3.0)
        await send(kafka_config, topics.latency, 1, 4.0)
        await send(kafka_config, topics.latency, 0, 5.0)
        await wait_until(lambda: len(got.events) >= 5)
    finally:
        consumer.stop()
        await task
    assert sorted(e.latency_ms or 0.0 for e in got.events) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert consumer.stats.unassigned == set()
    assert {p for t, p in consumer.stats.lag if t == topics.latency} == {0, 1, 2}


async def test_the_topic_reader_follows_partitions_added_after_it_started(
    kafka_config: KafkaConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:meth:`TopicReader.follow` (the decisions log, the aggregates) reads a partition added
    after :meth:`~TopicReader.since` from its beginning."""
    topic = f"log-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka_config, [topic], partitions=2)
    hidden = HiddenPartitions(monkeypatch)
    hidden.shown = {topic: 1}
    reader = TopicReader(kafka_config, topic, partitions_refresh_s=0.1)
    await reader.start()
    values: list[bytes] = []
    try:
        assert await reader.since(time.time() - 60) == []
        following = asyncio.create_task(reader.follow(values.append))
        try:
            await send(kafka_config, topic, 0, 1.0)
            await wait_until(lambda: len(values) == 1)
            hidden.add(topic)
            await send(kafka_config, topic, 1, 2.0)
            await wait_until(lambda: len(values) == 2)
        finally:
            following.cancel()
            await asyncio.wait((following,))
    finally:
        await reader.stop()
    assert [b'"latency_ms":2' in v for v in values] == [False, True]
    assert reader.unassigned == []


async def test_a_partition_that_could_not_be_started_stays_unassigned_until_it_is(
    kafka_config: KafkaConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed start leaves the new partition in ``unassigned`` (what ``/readyz`` and
    ``ebbtide_partitions_unassigned`` show), and the next check starts it."""
    topic = f"w-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka_config, [topic], partitions=2)
    consumer = AIOKafkaConsumer(**kafka_config.client_kwargs(), group_id=None)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        watch = PartitionWatch([topic], every_s=30.0)
        seek = consumer.seek_to_beginning

        async def refused(*partitions: TopicPartition) -> None:
            raise KafkaConnectionError("broker gone")

        monkeypatch.setattr(consumer, "seek_to_beginning", refused)
        with pytest.raises(KafkaConnectionError):
            await watch.check(consumer)
        assert watch.unassigned == {TopicPartition(topic, 1)}
        monkeypatch.setattr(consumer, "seek_to_beginning", seek)
        assert await watch.check(consumer) == []  # assigned already: only started now
        assert watch.unassigned == set()
        assert consumer.assignment() == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
    finally:
        await consumer.stop()

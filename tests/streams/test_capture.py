"""TopicReader against the embedded broker: ``since`` reads exactly up to the end offsets seen
at its start, or says it could not."""

from __future__ import annotations

import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer

from streams.capture import TopicReader
from streams.connection import KafkaConfig, ensure_topics
from streams.stream_errors import IncompleteRead

pytestmark = pytest.mark.slow


async def topic_with(config: KafkaConfig, values: list[bytes], *, partitions: int = 2) -> str:
    """A new topic holding ``values``, spread round-robin over its partitions."""
    topic = f"cap-{uuid.uuid4().hex[:8]}"
    await ensure_topics(config, [topic], partitions=partitions)
    await send(config, topic, values, partitions=partitions)
    return topic


async def send(config: KafkaConfig, topic: str, values: list[bytes], *, partitions: int) -> None:
    producer = AIOKafkaProducer(**config.client_kwargs(), linger_ms=5)
    await producer.start()
    try:
        for i, value in enumerate(values):
            await producer.send(topic, value, partition=i % partitions)
        await producer.flush()
    finally:
        await producer.stop()


async def test_since_reads_everything_after_the_time_and_nothing_before(
    kafka_config: KafkaConfig,
) -> None:
    """Values appended before ``since_s`` are skipped, every later one is returned; a time
    after the last value returns nothing (the broker's "no such offset" is not offset 0)."""
    topic = await topic_with(kafka_config, [b"old-%d" % i for i in range(10)])
    cut = time.time()
    while time.time() <= cut + 0.002:  # the broker's clock has to pass the cut (ms resolution)
        pass
    await send(kafka_config, topic, [b"new-%d" % i for i in range(6)], partitions=2)
    for since, want in ((cut, [b"new-%d" % i for i in range(6)]), (time.time() + 1, [])):
        reader = TopicReader(kafka_config, topic)
        await reader.start()
        try:
            assert sorted(await reader.since(since)) == sorted(want)
        finally:
            await reader.stop()


async def test_since_that_cannot_finish_in_time_raises_and_says_how_far_it_got(
    kafka_config: KafkaConfig,
) -> None:
    """A read that cannot reach the end offsets seen at its start within the timeout raises
    IncompleteRead naming the topic and each unfinished partition's position, instead of
    returning part of the data as if it were all."""
    topic = await topic_with(kafka_config, [b"x" * 200] * 20_000)
    reader = TopicReader(kafka_config, topic)
    await reader.start()
    try:
        with pytest.raises(IncompleteRead) as caught:
            # no time at all: a short timeout raced one fetch that returned everything
            await reader.since(0, timeout_s=0.0)
    finally:
        await reader.stop()
    error = caught.value
    assert error.topic == topic
    assert error.progress  # at least one partition unfinished
    for partition, (position, end) in error.progress.items():
        assert 0 <= partition < 2
        assert end is None or position < end
    assert f"{topic!r}" in str(error)
    assert "partition" in str(error)

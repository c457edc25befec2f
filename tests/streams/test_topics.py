"""Topics the controller creates: replicated like Kafka's own internal topics by default."""

from __future__ import annotations

import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from streams.connection import KafkaConfig, default_replication, ensure_topics


@pytest.mark.parametrize(("brokers", "factor"), [(1, 1), (2, 2), (3, 3), (5, 3), (0, 1)])
def test_default_replication_is_three_or_every_broker(brokers: int, factor: int) -> None:
    """Three replicas where the cluster has them; never more than it has brokers."""
    assert default_replication(brokers) == factor


async def replicas(config: KafkaConfig, topic: str) -> int:
    admin = AIOKafkaAdminClient(**config.client_kwargs())
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return len(described["partitions"][0]["replicas"])
    finally:
        await admin.close()


@pytest.mark.parametrize(("factor", "want"), [(None, 1), (2, 2)], ids=["default", "explicit"])
async def test_topics_are_created_with_the_cluster_sized_default(
    kafka_config: KafkaConfig, factor: int | None, want: int
) -> None:
    """On a one-broker cluster the default is one replica (three would be refused by Kafka);
    an explicit factor is used as given. (The embedded broker records the factor asked for but
    does not refuse one above its broker count, so that refusal is not exercised here.)"""
    topic = f"created-{uuid.uuid4().hex}"
    await ensure_topics(kafka_config, [topic], replication_factor=factor)
    assert await replicas(kafka_config, topic) == want

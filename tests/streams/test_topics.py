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


async def test_topics_are_created_with_the_cluster_sized_default(kafka_config: KafkaConfig) -> None:
    """On a one-broker cluster the default is one replica (three would be refused by Kafka;
    the embedded broker does not enforce it, so that refusal is not exercised here)."""
    topic = f"created-{uuid.uuid4().hex}"
    await ensure_topics(kafka_config, [topic])
    admin = AIOKafkaAdminClient(**kafka_config.client_kwargs())
    await admin.start()
    try:
        assert topic in await admin.list_topics()
    finally:
        await admin.close()

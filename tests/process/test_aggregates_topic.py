"""The aggregates topic is bounded in time: ``compact,delete`` with a retention derived from
the policy, checked in the topic configuration the broker stores (tansu keeps and describes a
topic's configs as Kafka does)."""

from __future__ import annotations

import uuid
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from controller.process.aggregate import aggregates_retention_s, ensure_aggregates_topic
from controller.process.settings import load_settings
from policies.loader import load_policy_text
from streams.connection import KafkaConfig

POLICY = """\
apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata: {name: retention}
spec:
  pools:
    whole: {nodeSelector: {ebbtide.io/pool: whole}, kind: whole}
  services:
    chat:
      namespace: serving
      pool: whole
      slo: {percentile: 99, objectiveMs: 100, window: 2h, resolution: 30s}
"""


async def _topic_configs(config: KafkaConfig, topic: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(**config.client_kwargs())
    await admin.start()
    try:
        (response,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)]
        )
    finally:
        await admin.close()
    ((_, _, _, name, entries),) = response.resources
    assert name == topic
    return {entry[0]: entry[1] for entry in entries}


async def test_the_aggregates_topic_is_created_compacted_and_deleted_after_its_retention(
    kafka_config: KafkaConfig,
) -> None:
    """Created with ``cleanup.policy=compact,delete`` and ``retention.ms`` = the longest window
    + the rewind margin + 1 h: every flush has a key of its own, so compaction alone kept all."""
    policy = load_policy_text(POLICY, "retention.yaml")
    settings = load_settings(None, policies=[Path("p.yaml")])
    retention = aggregates_retention_s(policy, settings)
    assert retention == 2 * 3600 + settings.kafka.rewind_margin_s + 3600
    topic = f"agg-{uuid.uuid4().hex[:8]}"
    await ensure_aggregates_topic(kafka_config, topic, retention_s=retention)
    configs = await _topic_configs(kafka_config, topic)
    assert configs["cleanup.policy"] == "compact,delete"
    assert configs["retention.ms"] == str(int(retention * 1000))


def test_the_aggregates_retention_setting_overrides_the_derived_one() -> None:
    """``shards.aggregates_retention_s`` wins over what the policy's windows give."""
    policy = load_policy_text(POLICY, "retention.yaml")
    settings = load_settings(
        None, policies=[Path("p.yaml")], shards={"aggregates_retention_s": 86400.0}
    )
    assert aggregates_retention_s(policy, settings) == 86400.0

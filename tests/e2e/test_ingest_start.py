"""Where a controller replica starts reading, when it is ready, and how fast it stops: an
in-process :class:`Controller` on the embedded broker and a simulated cluster."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.process.app import Controller, load_policy_files
from controller.process.settings import load_settings
from controller.simcluster.sim_runtime import SimRuntime
from streams.broker import EmbeddedBroker
from streams.connection import KafkaConfig, ensure_topics
from streams.producer import KafkaProducer
from support.e2e import HERE

pytestmark = pytest.mark.slow
SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "scenario-small.yaml"
WINDOW_S = 4.0
"""The longest window of tests/e2e/policy.yaml (chat's SLO window; MIG convertAfter is 3s)."""


class Replica:
    """One controller replica on topics of its test's own, started and stopped by the test."""

    def __init__(self, broker: EmbeddedBroker, tag: str, **settings: Any) -> None:
        kafka = {
            "bootstrap": broker.bootstrap,
            "latency_topic": f"lat-{tag}",
            "gpu_topic": f"gpu-{tag}",
            "deadletter_topic": f"dead-{tag}",
            "decisions_topic": None,
        } | settings.pop("kafka", {})
        self.settings = load_settings(
            policies=[HERE / "policy.yaml"],
            cluster=f"sim:{SCENARIO}",
            kafka=kafka,
            http={"address": "127.0.0.1:0"},
            **settings,
        )
        policy = load_policy_files(self.settings)
        runtime = SimRuntime.from_file(SCENARIO, policy, dry_run=self.settings.dry_run_for(policy))
        self.controller = Controller(self.settings, runtime, policy)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.controller.run())

    async def readyz(self) -> int:
        """The /readyz status, 0 while the endpoint is not serving yet."""
        port = self.controller.http.port
        if port == 0:
            return 0
        async with aiohttp.ClientSession() as session:
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                    return response.status
            except aiohttp.ClientConnectionError:
                return 0

    async def wait_ready(self, within: float = 30) -> None:
        deadline = time.monotonic() + within
        while await self.readyz() != 200:
            assert self.task is not None
            assert not self.task.done(), "the controller stopped before it was ready"
            assert time.monotonic() < deadline, "the controller did not get ready in time"
            await asyncio.sleep(0.02)

    async def stop(self) -> float:
        """Stop (as SIGTERM does) and return how long the shutdown took."""
        assert self.task is not None
        started = time.monotonic()
        self.controller.stop()
        await asyncio.wait_for(self.task, 60)
        return time.monotonic() - started


async def produce_latency(broker: EmbeddedBroker, topic: str, count: int) -> None:
    event = {"type": "inference.latency", "ts": time.time(), "service": "chat",
             "namespace": "serving", "latency_ms": 20.0}  # fmt: skip
    async with KafkaProducer(KafkaConfig(broker.bootstrap), linger_ms=20) as producer:
        for _ in range(count):
            await producer.send(topic, json.dumps(event).encode(), key=b"serving/chat")
        await producer.flush()


async def test_ready_only_once_the_backlog_at_start_is_applied(
    kafka_broker: EmbeddedBroker,
) -> None:
    """/readyz stays 503 until the replica has applied every event the topics held when it
    started — not merely until it has reached the broker."""
    tag = uuid.uuid4().hex[:8]
    replica = Replica(kafka_broker, tag)
    await ensure_topics(KafkaConfig(kafka_broker.bootstrap), [f"lat-{tag}"], partitions=3)
    backlog = 30_000
    await produce_latency(kafka_broker, f"lat-{tag}", backlog)
    replica.start()
    try:
        await replica.wait_ready()  # polls every 20 ms: sees the first 200
        assert replica.controller.engine.observed == backlog
    finally:
        await replica.stop()


async def test_a_new_replica_starts_at_now_minus_the_longest_window(
    kafka_broker: EmbeddedBroker,
) -> None:
    """Events older than the longest window (plus margin) are not read at all; every event
    within it is, and the replica is ready once it has applied them."""
    tag = uuid.uuid4().hex[:8]
    topic = f"lat-{tag}"
    await ensure_topics(KafkaConfig(kafka_broker.bootstrap), [topic], partitions=2)
    await produce_latency(kafka_broker, topic, 500)
    await asyncio.sleep(WINDOW_S + 0.5)  # not a synchronisation: the old events age out
    await produce_latency(kafka_broker, topic, 300)
    replica = Replica(kafka_broker, tag, kafka={"rewind_margin_s": 0})
    replica.start()
    try:
        await replica.wait_ready()
        assert replica.controller.engine.observed == 300
    finally:
        await replica.stop()


async def test_stopping_while_the_consumer_starts_keeps_the_shutdown_bound(
    kafka_broker: EmbeddedBroker,
) -> None:
    """A stop (SIGTERM) that arrives while the consumer is still starting up ends the process
    within shutdown_timeout_s, whatever the broker is doing meanwhile."""
    tag = uuid.uuid4().hex[:8]
    replica = Replica(kafka_broker, tag, shutdown_timeout_s=2)
    replica.start()
    deadline = time.monotonic() + 30
    while await replica.readyz() == 0:  # serving: the consumer is constructed and started
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    took = await replica.stop()
    assert took <= 2.0 + 0.3

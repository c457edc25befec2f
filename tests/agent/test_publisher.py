"""The agent loop: events from readings, the rate bound, backoff, and the embedded broker."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer

from agent.fake_kubelet import pod, serve_kubelet
from agent.fake_nvml import h100_node
from controller.agent.nvml import GpuReading, MigReading, NvmlReader, Sample
from controller.agent.pods import PodAttribution, PodResourcesClient, encode_response
from controller.agent.publisher import Agent, AgentSettings, TokenBucket, to_events
from streams.broker import free_port
from streams.connection import KafkaConfig, ensure_topics
from streams.events import EventDecoder, GpuUtilization
from streams.producer import KafkaProducer

NODE = "gpu-h100-3"
SAMPLE = Sample(
    gpus=(GpuReading(0, "GPU-0", "H100", 87.0, 40000.0, 81559.0),),
    migs=(
        MigReading(2, "GPU-2", "MIG-a", "1g.10gb", 7, 0, None, 4928.0, 9856.0),
        MigReading(2, "GPU-2", "MIG-b", "1g.10gb", 8, 0, 35.0, 0.0, 9856.0),
    ),
    failures=(),
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- building events --------------------------------------------------------------------------


def test_events_for_gpus_and_mig_with_memory_fallback() -> None:
    """Whole GPU → index event; MIG → parent index + profile + GI id; no MIG util → memory %."""
    out, no_util = to_events(SAMPLE, node=NODE, ts=5.0, owners={}, mig_util="memory")
    assert no_util == 1
    assert [(o.event, o.util_source) for o in out] == [
        (GpuUtilization(5.0, NODE, 0, 87.0, None, None, 40000.0, 81559.0), "nvml"),
        (GpuUtilization(5.0, NODE, 2, 50.0, "1g.10gb", 7, 4928.0, 9856.0), "memory"),
        (GpuUtilization(5.0, NODE, 2, 35.0, "1g.10gb", 8, 0.0, 9856.0), "nvml"),
    ]


def test_mig_without_util_is_skipped_on_request() -> None:
    """mig_util='skip' publishes no event for an instance NVML has no utilization for."""
    out, no_util = to_events(SAMPLE, node=NODE, ts=5.0, owners={}, mig_util="skip")
    assert no_util == 1
    assert [(o.event.gpu, o.event.mig_instance) for o in out] == [(0, None), (2, 8)]


@pytest.mark.parametrize(
    ("owners", "expected"),
    [
        pytest.param({"GPU-0": "ml/t", "MIG-b": "prod/c"}, ["ml/t", None, "prod/c"], id="uuids"),
        pytest.param({"0": "ml/t"}, ["ml/t", None, None], id="index-strategy"),
        pytest.param({"MIG-GPU-2/7/0": "ml/x"}, [None, "ml/x", None], id="legacy-mig-id"),
        pytest.param({}, [None, None, None], id="unknown"),
    ],
)
def test_pod_attribution_by_device_id(owners: dict[str, str], expected: list[str | None]) -> None:
    """The pod field follows whichever id form the device plugin used."""
    out, _ = to_events(SAMPLE, node=NODE, ts=5.0, owners=owners, mig_util="memory")
    assert [o.event.pod for o in out] == expected


def test_token_bucket_bounds_any_span() -> None:
    """Over any span T the bucket grants at most rate*T + burst, and refills with time."""
    clock = FakeClock()
    bucket = TokenBucket(10.0, 5, clock=clock)
    assert bucket.take(8) == 5
    assert bucket.take(1) == 0
    clock.now += 0.25
    assert bucket.take(8) == 2
    clock.now += 100.0
    assert bucket.take(8) == 5  # never more than the burst banked


# -- backoff (no broker: a producer that fails on demand) -------------------------------------


class FlakyProducer:
    def __init__(self) -> None:
        self.up = False
        self.sent: list[bytes] = []

    async def send_and_wait(self, topic: str, value: bytes | None, **kwargs: Any) -> None:
        if not self.up:
            raise ConnectionError("broker down")
        assert value is not None
        self.sent.append(value)


async def test_broker_outage_backs_off_and_drops_instead_of_queueing() -> None:
    """Failed rounds drop their events and back off exponentially; nothing is replayed."""
    clock = FakeClock()
    producer = FlakyProducer()
    with NvmlReader(h100_node()) as reader:
        agent = Agent(
            AgentSettings(node=NODE, max_rate=1000.0, backoff_s=(1.0, 4.0)),
            reader=reader,
            connect=None,  # type: ignore[arg-type]  # rounds are driven by hand
            clock=clock,
        )
        as_producer = cast(KafkaProducer, producer)

        async def rnd() -> None:
            await agent.round(as_producer)

        await rnd()  # fails: 6 dropped, back off 1 s
        assert (agent.stats.dropped, agent.stats.publish_errors) == (6, 1)
        clock.now += 0.5
        await rnd()  # inside the backoff: dropped without trying
        assert (agent.stats.dropped, agent.stats.publish_errors) == (12, 1)
        clock.now += 0.6
        await rnd()  # tries again, fails: back off 2 s
        clock.now += 1.5
        await rnd()
        assert (agent.stats.dropped, agent.stats.publish_errors) == (24, 2)
        producer.up = True
        clock.now += 0.6
        await rnd()
    assert agent.stats.published == len(producer.sent) == 6
    assert agent.stats.rounds == 5


# -- against the embedded broker --------------------------------------------------------------


@pytest.fixture
async def topic(kafka_config: KafkaConfig) -> str:
    name = f"agent-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka_config, [name], partitions=2)
    return name


async def consume(config: KafkaConfig, topic: str, *, until: Callable[[int], bool]) -> list[Any]:
    reader = AIOKafkaConsumer(topic, **config.client_kwargs(), auto_offset_reset="earliest")
    await reader.start()
    records: list[Any] = []
    try:
        deadline = time.monotonic() + 15
        while not until(len(records)) and time.monotonic() < deadline:
            for batch in (await reader.getmany(timeout_ms=200)).values():
                records.extend(batch)
    finally:
        await reader.stop()
    return records


@asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[asyncio.Task[Any]]:
    task = asyncio.create_task(agent.run(), name="agent")
    try:
        yield task
    finally:
        agent.stop()
        await asyncio.wait_for(task, 15)


async def wait_until(check: Callable[[], bool], within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.mark.slow
async def test_publishes_valid_events_keyed_by_node(
    kafka_config: KafkaConfig,
    topic: str,
    socket_path: Path,
) -> None:
    """GPUs, MIG instances, a lost GPU: valid events keyed by node, pods named, loss counted."""
    owners = [pod("ml", "trainer-0", "GPU-0000"), pod("prod", "chat-1", "MIG-cccc")]
    kubelet = await serve_kubelet(socket_path, lambda: encode_response(owners))
    settings = AgentSettings(
        node=NODE, interval_s=0.1, topic=topic, max_rate=1000.0, publish_timeout_s=10.0
    )
    nvml = h100_node(lost=1)
    with NvmlReader(nvml) as reader:
        agent = Agent(
            settings,
            reader=reader,
            connect=lambda: KafkaProducer(kafka_config),
            attribution=PodAttribution(PodResourcesClient(str(socket_path))),
        )
        async with running(agent):
            await wait_until(lambda: agent.stats.rounds >= 2 and agent.stats.published >= 10)
    await kubelet.stop(None)

    records = await consume(kafka_config, topic, until=lambda n: n >= agent.stats.published)
    assert len(records) == agent.stats.published
    assert agent.stats.device_failures >= 2
    assert agent.stats.failures_by_device.keys() == {"1"}
    decoder = EventDecoder()
    events = [decoder.decode(r.value, now=time.time()) for r in records]
    assert all(isinstance(e, GpuUtilization) for e in events), events
    assert {r.key for r in records} == {NODE.encode()}
    seen = {
        (e.gpu, e.mig_profile, e.mig_instance, e.pod, dict(r.headers)["ebbtide-util-source"])
        for e, r in zip(events, records, strict=True)
        if isinstance(e, GpuUtilization)
    }
    assert seen == {
        (0, None, None, "ml/trainer-0", b"nvml"),
        (3, None, None, None, b"nvml"),
        (2, "1g.10gb", 7, None, b"memory"),
        (2, "1g.10gb", 8, None, b"memory"),
        (2, "3g.40gb", 2, "prod/chat-1", b"memory"),
    }


@pytest.mark.slow
async def test_rate_limit_holds_against_the_broker(kafka_config: KafkaConfig, topic: str) -> None:
    """Offered ~120 events/s, the broker receives at most max_rate*T + burst."""
    settings = AgentSettings(
        node=NODE, interval_s=0.05, topic=topic, max_rate=20.0, burst=4, publish_timeout_s=10.0
    )
    with NvmlReader(h100_node()) as reader:
        agent = Agent(settings, reader=reader, connect=lambda: KafkaProducer(kafka_config))
        started = time.monotonic()
        async with running(agent):
            # A pace, not synchronisation: the period the rate is measured over.
            await asyncio.sleep(1.5)
        elapsed = time.monotonic() - started
    records = await consume(kafka_config, topic, until=lambda n: n >= agent.stats.published)
    assert len(records) == agent.stats.published
    assert agent.stats.published <= 20.0 * elapsed + 4
    assert agent.stats.published >= 20  # the limit throttles, it does not stall
    assert agent.stats.rate_limited > 0
    gpus = {(e.gpu, e.mig_instance) for r in records if isinstance(e := _decode(r), GpuUtilization)}
    assert len(gpus) == 6  # rotation: every device gets through despite the limit


def _decode(record: Any) -> object:
    return EventDecoder().decode(record.value, now=time.time())


async def test_unreachable_broker_is_retried_until_stopped() -> None:
    """A broker that refuses connections is retried with backoff; stop() ends the agent."""
    config = KafkaConfig(bootstrap=f"127.0.0.1:{free_port()}")
    settings = AgentSettings(node=NODE, backoff_s=(0.05, 0.1))
    with NvmlReader(h100_node()) as reader:
        agent = Agent(settings, reader=reader, connect=lambda: KafkaProducer(config))
        async with running(agent) as task:
            await wait_until(lambda: agent.stats.connect_failures >= 2)
        assert task.done()
    assert agent.stats.published == 0

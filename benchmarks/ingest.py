"""Ingest throughput: raw aiokafka ``getmany`` vs Ebbtide's full ingest path, side by side.

Both read the same M single-sample latency events from one embedded broker in one run:

(a) raw: a group-less ``AIOKafkaConsumer`` drains the topic with ``getmany`` and does nothing
    with the messages — the ceiling set by aiokafka and the broker;
(b) full: :class:`streams.consumer.EventConsumer` — decode, validate, dead-letter check, hand
    over to a handler, commit offsets.

Runs alternate (a, b, a, b, …) so machine noise hits both alike; the medians and their ratio
are printed. Usage: ``python benchmarks/ingest.py [--events 200000] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.broker import EmbeddedBroker
from streams.connection import KafkaConfig, ensure_topics
from streams.consumer import Batch, ConsumerSettings, EventConsumer
from streams.events import EventDecoder, InferenceLatency, encode_event
from streams.producer import KafkaProducer

TOPIC = "bench.inference.latency"
PARTITIONS = 4


async def produce(config: KafkaConfig, count: int) -> None:
    base = time.time()
    async with KafkaProducer(config, linger_ms=20) as producer:
        for i in range(count):
            service = f"svc-{i % 200}"
            event = InferenceLatency(
                ts=base, service=service, namespace="prod", latency_ms=float(i % 500)
            )
            await producer.send(TOPIC, encode_event(event), key=f"prod/{service}".encode())


async def raw(config: KafkaConfig, count: int) -> float:
    consumer = AIOKafkaConsumer(
        **config.client_kwargs(), enable_auto_commit=False, max_partition_fetch_bytes=4 << 20
    )
    await consumer.start()
    partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    await consumer.seek_to_beginning(*partitions)
    seen = 0
    started = 0.0
    while seen < count:
        batches = await consumer.getmany(timeout_ms=200, max_records=5_000)
        if batches and not seen:
            # As the full path's clock: from the moment the first records are in hand.
            started = time.perf_counter()
        seen += sum(len(messages) for messages in batches.values())
    elapsed = time.perf_counter() - started
    await consumer.stop()
    return count / elapsed


async def full(config: KafkaConfig, count: int) -> float:
    applied = 0
    started = 0.0
    done = asyncio.Event()

    async def handler(batch: Batch) -> None:
        nonlocal applied, started
        if not applied:
            # The clock starts at the first batch, leaving out the group join (half the session
            # timeout on this broker), as the raw consumer's clock leaves out its start-up.
            started = time.perf_counter() - (time.time() - batch.fetched_at)
        applied += len(batch.events)
        if applied >= count:
            done.set()

    consumer = EventConsumer(
        config,
        handler,
        settings=ConsumerSettings(
            group_id=f"bench-{uuid.uuid4().hex[:8]}",
            topics=(TOPIC,),
            session_timeout_ms=2000,
            heartbeat_interval_ms=500,
        ),
        decoder=EventDecoder(topics={"inference.latency": TOPIC, "gpu.utilization": "unused"}),
    )
    task = asyncio.create_task(consumer.run())
    await done.wait()
    elapsed = time.perf_counter() - started
    consumer.stop()
    await task
    assert consumer.stats.accepted[TOPIC] >= count
    assert not consumer.stats.rejected
    return count / elapsed


async def main(events: int, runs: int) -> None:
    with EmbeddedBroker(port=0) as broker:
        config = KafkaConfig(broker.bootstrap)
        await ensure_topics(config, [TOPIC], partitions=PARTITIONS)
        t = time.perf_counter()
        await produce(config, events)
        print(f"produced {events:,} events in {time.perf_counter() - t:.1f}s")
        raws, fulls = [], []
        for run in range(runs):
            raws.append(await raw(config, events))
            fulls.append(await full(config, events))
            print(f"run {run + 1}: raw {raws[-1]:>10,.0f} ev/s   full {fulls[-1]:>10,.0f} ev/s")
    r, f = statistics.median(raws), statistics.median(fulls)
    print(f"median over {runs} runs of {events:,} single-sample latency events:")
    print(f"  (a) raw aiokafka getmany : {r:>10,.0f} events/s")
    print(f"  (b) full ingest path     : {f:>10,.0f} events/s")
    print(f"  ratio full/raw           : {f / r:.2f}  (issue 27: >= 0.70)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.runs))

"""The ingest path against a real Kafka-protocol broker: delivery, dead-letters, recovery."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.broker import EmbeddedBroker
from streams.connection import KafkaConfig, ensure_topics
from streams.consumer import Batch, ConsumerSettings, EventConsumer
from streams.events import EventDecoder, InferenceLatency, Limits
from streams.hold import IngestHold
from streams.producer import DeadLetter, EventProducer, KafkaProducer

FAST = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500, "commit_interval_s": 0.1}


class Topics:
    """Unique topic names for one test on the shared broker."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.latency = f"lat-{tag}"
        self.gpu = f"gpu-{tag}"
        self.dead = f"dead-{tag}"
        self.by_type = {"inference.latency": self.latency, "gpu.utilization": self.gpu}

    async def create(self, config: KafkaConfig, partitions: int = 3) -> None:
        await ensure_topics(config, [self.latency, self.gpu, self.dead], partitions=partitions)


def latency_event(seq: int, service: str = "chat") -> InferenceLatency:
    return InferenceLatency(ts=time.time(), service=service, namespace="prod", latency_ms=seq)


async def produce(config: KafkaConfig, topics: Topics, events: list[InferenceLatency]) -> None:
    async with EventProducer(config, topics=topics.by_type) as producer:
        for event in events:
            await producer.publish(event)


class Collector:
    """A handler that records what it was handed, and the offset each batch gives each event."""

    def __init__(self) -> None:
        self.events: list[InferenceLatency] = []
        self.batches = 0
        self.offsets: dict[float | None, int] = {}
        """By latency (the tests number events by it): the event's offset, per its batch."""

    async def __call__(self, batch: Batch) -> None:
        self.batches += 1
        self.events.extend(e for e in batch.events if isinstance(e, InferenceLatency))
        for tp, (start, end, _) in batch.spans.items():
            for i in range(start, end):
                event = batch.events[i]
                if isinstance(event, InferenceLatency):
                    self.offsets[event.latency_ms] = batch.offset_of(tp, i)


def consumer_for(
    config: KafkaConfig,
    topics: Topics,
    handler: Callable[[Batch], Awaitable[None]],
    *,
    group: str | None,
    dead_letter: DeadLetter | None = None,
    limits: Limits | None = None,
    clock: Callable[[], float] = time.time,
    hold: IngestHold | None = None,
    **settings: Any,
) -> EventConsumer:
    return EventConsumer(
        config,
        handler,
        settings=ConsumerSettings(
            group_id=group, topics=(topics.latency, topics.gpu), **(FAST | settings)
        ),
        decoder=EventDecoder(limits, topics=topics.by_type),
        dead_letter=dead_letter,
        clock=clock,
        hold=hold,
    )


async def wait_until(predicate: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def committed(config: KafkaConfig, group: str, topic: str, partitions: int) -> int:
    """Sum of the group's committed offsets over the topic's partitions."""
    reader = AIOKafkaConsumer(**config.client_kwargs(), group_id=group, enable_auto_commit=False)
    await reader.start()
    try:
        offsets = [await reader.committed(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        await reader.stop()
    return sum(o or 0 for o in offsets)


@pytest.mark.slow
async def test_round_trip_commits_and_a_restarted_consumer_resumes(
    kafka_config: KafkaConfig,
) -> None:
    """Every produced event is handed over once per key order; stop commits exactly what was
    applied, and a second consumer of the group starts where the first stopped."""
    topics, group = Topics(), f"g-{uuid.uuid4().hex[:6]}"
    await topics.create(kafka_config)
    services = ["chat", "embed", "rerank", "asr"]
    first_half = [latency_event(i, services[i % 4]) for i in range(600)]
    await produce(kafka_config, topics, first_half)

    one = Collector()
    consumer = consumer_for(kafka_config, topics, one, group=group)
    task = asyncio.create_task(consumer.run())
    await wait_until(lambda: len(one.events) == 600)
    consumer.stop()
    await task
    assert await committed(kafka_config, group, topics.latency, 3) == 600

    second_half = [latency_event(600 + i, services[i % 4]) for i in range(400)]
    await produce(kafka_config, topics, second_half)
    two = Collector()
    consumer = consumer_for(kafka_config, topics, two, group=group)
    task = asyncio.create_task(consumer.run())
    # A re-delivered event would precede the new ones of its partition: all 400 in means any
    # re-delivery has arrived too, and the exact comparison below sees it.
    await wait_until(lambda: len(two.events) >= 400)
    consumer.stop()
    await task

    assert sorted(e.latency_ms for e in two.events) == [float(600 + i) for i in range(400)]
    for service in services:
        for seen in (one.events, two.events):
            seq = [e.latency_ms for e in seen if e.service == service]
            assert seq == sorted(seq), f"{service} out of order"
    assert consumer.stats.accepted[topics.latency] == 400
    assert consumer.stats.lag.get((topics.latency, 0), 0) == 0


@pytest.mark.slow
async def test_bad_messages_go_to_the_dead_letter_topic_with_their_reason(
    kafka_config: KafkaConfig,
) -> None:
    """A mixed stream: every valid event accepted, every bad one dead-lettered with the
    original bytes, key, source position and reason; the counts add up and nothing crashes.
    Each accepted event's batch still knows its offset, the rejected ones skipped."""
    topics, group = Topics(), f"g-{uuid.uuid4().hex[:6]}"
    await topics.create(kafka_config, partitions=1)
    good = [json.dumps(_event_dict(i)).encode() for i in range(50)]
    bad: list[tuple[bytes | None, str]] = [
        (b"\x00\xffgarbage", "malformed"),
        (json.dumps(_event_dict(1) | {"latency_ms": "slow"}).encode(), "invalid"),
        (b'{"type":"inference.latency","ts":1,"service":"a","latency_ms":NaN}', "malformed"),
        (json.dumps(_event_dict(1) | {"latency_ms": -4}).encode(), "invalid"),
        (json.dumps(_event_dict(1) | {"model": "m" * 2000}).encode(), "too_large"),
        (json.dumps(_event_dict(1) | {"ts": time.time() + 86400}).encode(), "future_timestamp"),
        (b'{"type":"gpu.utilization","ts":1,"node":"n","gpu":0,"util_pct":50}', "wrong_topic"),
        (None, "malformed"),  # a tombstone
    ]
    async with KafkaProducer(kafka_config) as producer:
        for i, value in enumerate(good):
            await producer.send(topics.latency, value, key=b"prod/chat")
            if i % 6 == 0 and i // 6 < len(bad):
                raw, _ = bad[i // 6]
                await producer.send(topics.latency, raw, key=b"k-bad", headers=[("trace", b"t")])
    sent_bad = bad

    handled = Collector()
    async with KafkaProducer(kafka_config) as dlq_producer:
        consumer = consumer_for(
            kafka_config,
            topics,
            handled,
            group=group,
            dead_letter=DeadLetter(dlq_producer, topic=topics.dead),
            limits=Limits(max_message_bytes=1500),
        )
        task = asyncio.create_task(consumer.run())
        await wait_until(lambda: sum(consumer.stats.consumed.values()) == len(good) + len(sent_bad))
        consumer.stop()
        await task

    stats = consumer.stats
    assert len(handled.events) == len(good) == stats.accepted[topics.latency]
    assert sum(stats.rejected.values()) == len(sent_bad)
    assert stats.consumed[topics.latency] == len(good) + len(sent_bad)
    # good i follows the bad ones sent after goods 0, 6, 12, ... (8 of them)
    assert handled.offsets == {float(i): i + min(8, (i + 5) // 6) for i in range(len(good))}

    reader = AIOKafkaConsumer(
        topics.dead, **kafka_config.client_kwargs(), auto_offset_reset="earliest"
    )
    await reader.start()
    dead: list[Any] = []
    try:
        deadline = time.monotonic() + 10
        while len(dead) < len(sent_bad) and time.monotonic() < deadline:
            for messages in (await reader.getmany(timeout_ms=200)).values():
                dead.extend(messages)
    finally:
        await reader.stop()
    assert len(dead) == len(sent_bad)
    for message, (raw, code) in zip(dead, sent_bad, strict=True):
        headers = dict(message.headers)
        assert message.value == raw
        assert message.key == b"k-bad"
        assert headers["ebbtide-reason-code"].decode() == code
        assert headers["ebbtide-reason"]  # the precise detail, never empty
        assert headers["ebbtide-source-topic"].decode() == topics.latency
        assert int(headers["ebbtide-source-offset"]) >= 0
        assert headers["trace"] == b"t"


def _event_dict(seq: int) -> dict[str, Any]:
    return {
        "type": "inference.latency",
        "ts": time.time(),
        "service": "chat",
        "namespace": "prod",
        "latency_ms": float(seq),
    }


@pytest.mark.slow
async def test_consumer_recovers_by_itself_after_a_broker_restart(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    """With durable broker storage, a broker outage mid-stream loses nothing: the consumer
    reconnects on its own and gets every event produced before, during and after."""
    broker = make_broker(persistent=True)
    config = KafkaConfig(broker.bootstrap)
    topics, group = Topics(), "restart"
    await topics.create(config, partitions=2)
    seen = Collector()
    consumer = consumer_for(config, topics, seen, group=group, retry_backoff_s=(0.05, 0.5))
    task = asyncio.create_task(consumer.run())
    await produce(config, topics, [latency_event(i) for i in range(100)])
    await wait_until(lambda: len(seen.events) >= 100)

    broker.stop()
    await asyncio.sleep(1.5)  # not a synchronisation: how long the outage lasts
    broker.start()
    await produce(config, topics, [latency_event(100 + i) for i in range(100)])
    await wait_until(lambda: len({e.latency_ms for e in seen.events}) == 200, within=60)
    consumer.stop()
    await asyncio.wait_for(task, 30)
    assert {e.latency_ms for e in seen.events} == {float(i) for i in range(200)}


@pytest.mark.slow
async def test_a_failing_handler_is_retried_and_nothing_is_committed_past_it(
    kafka_config: KafkaConfig,
) -> None:
    """Offsets move only after the handler accepts a batch; a raising handler is retried, and
    stopping while it fails commits nothing of the refused batch."""
    topics, group = Topics(), f"g-{uuid.uuid4().hex[:6]}"
    await topics.create(kafka_config, partitions=1)
    await produce(kafka_config, topics, [latency_event(i) for i in range(20)])
    calls = 0

    async def refuse(batch: Batch) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("downstream is down")

    consumer = consumer_for(
        kafka_config, topics, refuse, group=group, retry_backoff_s=(0.01, 0.02), drain_timeout_s=0.3
    )
    task = asyncio.create_task(consumer.run())
    await wait_until(lambda: calls >= 3)
    consumer.stop()
    await task
    assert consumer.stats.handler_failures >= 3
    assert await committed(kafka_config, group, topics.latency, 1) == 0

    later = Collector()
    consumer = consumer_for(kafka_config, topics, later, group=group)
    task = asyncio.create_task(consumer.run())
    await wait_until(lambda: len(later.events) == 20)
    consumer.stop()
    await task
    assert await committed(kafka_config, group, topics.latency, 1) == 20


@pytest.mark.slow
async def test_a_slow_handler_applies_backpressure(kafka_config: KafkaConfig) -> None:
    """With a slow handler, no more than ``queue_batches`` batches wait in memory."""
    topics, group = Topics(), f"g-{uuid.uuid4().hex[:6]}"
    await topics.create(kafka_config, partitions=1)
    await produce(kafka_config, topics, [latency_event(i) for i in range(2000)])
    handled = Collector()
    peak = 0

    async def slow(batch: Batch) -> None:
        nonlocal peak
        peak = max(peak, consumer._queue.qsize())
        await asyncio.sleep(0.02)
        await handled(batch)

    consumer = consumer_for(
        kafka_config, topics, slow, group=group, max_records=50, queue_batches=2
    )
    task = asyncio.create_task(consumer.run())
    await wait_until(lambda: len(handled.events) == 2000, within=60)
    consumer.stop()
    await task
    assert 0 < peak <= 2
    assert handled.batches >= 40


@pytest.mark.slow
async def test_what_a_batch_wakes_runs_before_the_next_queued_batch(
    kafka_config: KafkaConfig,
) -> None:
    """Issue 27: with batches queued behind a slow one, the task a handler wakes (the
    controller's evaluation) runs between batches, not once the backlog is applied."""
    topics, group = Topics(), f"g-{uuid.uuid4().hex[:6]}"
    await topics.create(kafka_config, partitions=1)
    await produce(kafka_config, topics, [latency_event(i) for i in range(600)])
    order: list[str] = []
    wake = asyncio.Event()
    applied = 0

    async def handler(batch: Batch) -> None:
        nonlocal applied
        if not order:  # the first batch: let the fetcher fill the queue behind it
            await wait_until(consumer._queue.full, within=30)
        applied += len(batch.events)
        order.append("apply")
        wake.set()

    async def evaluator() -> None:
        while True:
            await wake.wait()
            wake.clear()
            order.append("evaluate")

    consumer = consumer_for(
        kafka_config, topics, handler, group=group, max_records=50, queue_batches=4
    )
    evaluating = asyncio.create_task(evaluator())
    task = asyncio.create_task(consumer.run())
    await wait_until(lambda: applied == 600, within=60)
    consumer.stop()
    await task
    evaluating.cancel()
    assert order.count("apply") >= 12
    assert "apply, apply" not in ", ".join(order)


@pytest.mark.slow
async def test_a_round_trip_completed_during_a_batch_goes_before_the_next_batch(
    kafka_config: KafkaConfig,
) -> None:
    """Issue 27: a decision being carried out is a chain of round trips (the intent's ack, the
    API server's answer). When an answer arrives on a socket while a batch is applied, the
    loop's next turn runs its I/O callback, which schedules the waiting task's step; that step
    must run before the next queued batch, or every round trip waits behind two batches."""
    topics, group = Topics(), f"g-{uuid.uuid4().hex[:6]}"
    await topics.create(kafka_config, partitions=1)
    await produce(kafka_config, topics, [latency_event(i) for i in range(600)])
    loop = asyncio.get_running_loop()
    server_end, client_end = socket.socketpair()
    client_end.setblocking(False)
    order: list[str] = []
    asked = 0
    applied = 0

    async def handler(batch: Batch) -> None:
        nonlocal applied, asked
        if not order:  # the first batch: let the fetcher fill the queue behind it
            await wait_until(consumer._queue.full, within=30)
        applied += len(batch.events)
        order.append("apply")
        if asked:  # the answer arrives while this batch is applied
            server_end.send(b"x" * asked)
            asked = 0

    async def carry_out() -> None:
        nonlocal asked
        for _ in range(6):
            asked = 1
            await loop.sock_recv(client_end, 1)
            order.append("round trip")

    consumer = consumer_for(
        kafka_config, topics, handler, group=group, max_records=50, queue_batches=4
    )
    acting = asyncio.create_task(carry_out())
    task = asyncio.create_task(consumer.run())
    try:
        await wait_until(lambda: applied == 600, within=60)
        consumer.stop()
        await task
        await acting
    finally:
        server_end.close()
        client_end.close()
    last = max(i for i, step in enumerate(order) if step == "round trip")
    assert order.count("round trip") == 6
    assert "apply, apply" not in ", ".join(order[: last + 1])


class _CountedHold(IngestHold):
    """Counts the ingest tasks parked on the hold, so a test knows both are."""

    def __init__(self) -> None:
        super().__init__(max_s=60)
        self.parked = 0

    async def wait(self) -> None:
        if not self.holding:
            return await super().wait()
        self.parked += 1
        try:
            await super().wait()
        finally:
            self.parked -= 1


@pytest.mark.slow
async def test_the_consumer_neither_fetches_nor_hands_over_while_held(
    kafka_config: KafkaConfig,
) -> None:
    """Issue 27: while a tick holds ingest, the consumer starts no fetch and hands over no
    batch (so the tick's round trips do not queue behind a backlog); released, it goes on and
    nothing is lost."""
    topics, group = Topics(), f"g-{uuid.uuid4().hex[:6]}"
    await topics.create(kafka_config, partitions=1)
    hold = _CountedHold()
    seen: list[tuple[str, bool]] = []
    handled = Collector()

    async def handler(batch: Batch) -> None:
        seen.append(("hand over", hold.holding))
        await handled(batch)

    consumer = consumer_for(kafka_config, topics, handler, group=group, hold=hold, max_records=50)
    fetch = consumer._fetch

    async def watched_fetch(stopped: asyncio.Future[None]) -> Any:
        seen.append(("fetch", hold.holding))
        return await fetch(stopped)

    consumer._fetch = watched_fetch  # type: ignore[method-assign]
    task = asyncio.create_task(consumer.run())
    await produce(kafka_config, topics, [latency_event(i) for i in range(100)])
    await wait_until(lambda: len(handled.events) == 100)
    async with hold.held():
        await produce(kafka_config, topics, [latency_event(i) for i in range(100, 400)])
        # the fetch in flight when the hold was taken may complete; then both tasks park
        await wait_until(lambda: hold.parked == 2)
        during = len(handled.events)
    await wait_until(lambda: len(handled.events) == 400)
    consumer.stop()
    await task
    assert during == 100
    assert ("hand over", True) not in seen
    assert ("fetch", True) not in seen
    assert [e.latency_ms for e in handled.events] == list(range(400))
    assert hold.overruns == 0


@pytest.mark.slow
async def test_stopping_during_a_group_join_is_bounded_by_the_close_timeout(
    kafka_config: KafkaConfig,
) -> None:
    """A stop that arrives while the group join is still in progress (seconds on this broker,
    a whole rebalance on Kafka) returns within close_timeout_s, and leaves no task behind."""
    topics = Topics()
    await topics.create(kafka_config)
    consumer = consumer_for(
        kafka_config,
        topics,
        Collector(),
        group=f"g-{uuid.uuid4().hex[:6]}",
        session_timeout_ms=10_000,  # the embedded broker answers a first join after 5 s
        heartbeat_interval_ms=3_000,
        close_timeout_s=0.5,
    )
    task = asyncio.create_task(consumer.run())
    await wait_until(lambda: consumer.stats.last_fetch_ok is not None)  # connected
    assert not consumer.stats.caught_up  # not assigned yet: the join is in progress
    started = time.monotonic()
    consumer.stop()
    await task
    assert time.monotonic() - started < 0.5 + 0.5


@pytest.mark.slow
async def test_without_a_group_each_partition_starts_at_the_rewind_time(
    kafka_config: KafkaConfig,
) -> None:
    """Group-less, the consumer starts each partition at its first message ``rewind_s`` back:
    older events are not read, every newer one is (also on a partition with none, which starts
    at its end), it is caught up once they are applied, and nothing is committed."""
    topics = Topics()
    await topics.create(kafka_config)
    await produce(kafka_config, topics, [latency_event(i) for i in range(300)])
    cut = time.time()
    while time.time() <= cut + 0.002:  # the broker's clock has to pass the cut (ms resolution)
        pass
    await produce(kafka_config, topics, [latency_event(1000 + i) for i in range(200)])
    seen = Collector()
    # The rewind is taken from the consumer's clock when it starts, not when it is built: a
    # frozen clock makes the start line exactly the cut however long the start takes.
    consumer = consumer_for(
        kafka_config, topics, seen, group=None, rewind_s=1.0, clock=lambda: cut + 1.0
    )
    task = asyncio.create_task(consumer.run())
    await wait_until(lambda: consumer.stats.caught_up)
    assert sorted(e.latency_ms for e in seen.events) == [float(1000 + i) for i in range(200)]
    await produce(kafka_config, topics, [latency_event(2000)])
    await wait_until(lambda: len(seen.events) == 201)
    consumer.stop()
    await task
    assert consumer.stats.commits == 0
    assert sum(consumer.stats.lag.values()) == 0


@pytest.mark.slow
async def test_caught_up_only_once_the_backlog_seen_at_start_is_applied(
    kafka_config: KafkaConfig,
) -> None:
    """In a group, ``caught_up`` turns true only after the join, once every event the topics
    held when first fetched was applied — never while nothing is assigned."""
    topics, group = Topics(), f"g-{uuid.uuid4().hex[:6]}"
    await topics.create(kafka_config)
    await produce(kafka_config, topics, [latency_event(i) for i in range(3000)])
    seen = Collector()
    early: list[int] = []

    async def apply(batch: Batch) -> None:
        if consumer.stats.caught_up:  # a batch of the backlog is still being handed over
            early.append(len(seen.events))
        await seen(batch)

    consumer = consumer_for(kafka_config, topics, apply, group=group, max_records=100)
    task = asyncio.create_task(consumer.run())
    await wait_until(lambda: consumer.stats.caught_up)
    consumer.stop()
    await task
    assert early == []
    assert len(seen.events) == 3000


async def test_a_batch_carries_the_generation_its_records_were_fetched_in(
    kafka_config: KafkaConfig,
) -> None:
    """A revocation that lands between the fetch's answer and the fetch loop's next step (the
    group coordinator runs in its own task) must not stamp the batch with the new generation:
    its records belong to the old assignment and are fetched again from the committed offset,
    so a handler keeping per-partition state (the aggregator) would count them twice."""
    topics = Topics()
    await topics.create(kafka_config)
    generations: list[int] = []

    async def handler(batch: Batch) -> None:
        generations.append(batch.generation)

    consumer = consumer_for(kafka_config, topics, handler, group=None)
    await consumer.start()
    fetch = consumer._consumer.getmany

    async def getmany(*args: Any, **kwargs: Any) -> Any:
        records = await fetch(*args, **kwargs)
        if records and consumer.generation == 0:

            def revoke() -> None:  # what EventConsumer.release does first
                consumer.generation += 1

            asyncio.get_running_loop().call_soon(revoke)
        return records

    consumer._consumer.getmany = getmany  # type: ignore[method-assign]
    task = asyncio.create_task(consumer.run())
    await wait_until(lambda: consumer.stats.caught_up)  # at the end: reads what comes next
    await produce(kafka_config, topics, [latency_event(i) for i in range(5)])
    await wait_until(lambda: bool(generations))
    consumer.stop()
    await task
    assert generations[0] == 0


async def test_checkpoints_never_overlap() -> None:
    """The periodic commit (apply side) and a revocation's (the group coordinator's task) may
    both ask for a checkpoint; the aggregator's reads its folds before awaiting a broker's
    acknowledgement and writes them after, so two at once would seal a fold twice or drop a
    newer one. The second waits for the first."""
    running = most = 0

    async def checkpoint(partitions: Any) -> dict[TopicPartition, int]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        for _ in range(3):
            await asyncio.sleep(0)  # awaiting an acknowledgement
        running -= 1
        return {}

    consumer = EventConsumer(
        KafkaConfig("127.0.0.1:9"),
        Collector(),
        settings=ConsumerSettings(group_id="g"),
        checkpoint=checkpoint,
    )
    await asyncio.gather(consumer.commit(), consumer.release([]), consumer.commit())
    assert most == 1


async def test_events_produced_between_the_start_and_the_first_fetch_are_read(
    kafka_config: KafkaConfig,
) -> None:
    """A partition with nothing since the rewind time starts at its end; what arrives before
    the first fetch answers is newer than the start and is read, not skipped to the high
    watermark that answer reports."""
    topics = Topics()
    await topics.create(kafka_config)
    seen = Collector()
    consumer = consumer_for(kafka_config, topics, seen, group=None)
    await consumer.start()
    fetch = consumer._consumer.getmany
    produced = False

    async def getmany(*args: Any, **kwargs: Any) -> Any:
        nonlocal produced
        if not produced:
            produced = True
            await produce(kafka_config, topics, [latency_event(i) for i in range(5)])
        return await fetch(*args, **kwargs)

    consumer._consumer.getmany = getmany  # type: ignore[method-assign]
    task = asyncio.create_task(consumer.run())
    try:
        await wait_until(lambda: len(seen.events) == 5, within=10)
    finally:
        consumer.stop()
        await task
    assert sorted(e.latency_ms for e in seen.events) == [float(i) for i in range(5)]

"""Kafka ↔ recording: ``record`` captures topics to a file, ``publish`` plays a file back.

``record`` reads with a group-less consumer assigned to every partition, so capturing never
joins (or rebalances) the controller's consumer group. ``publish`` sends messages in file order
through one producer, so messages with the same key stay in order, and sleeps between them so
inter-arrival times are those of the recording divided by ``speed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgspec
import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from streams.connection import KafkaConfig
from streams.positions import PartitionWatch, StartLine, partitions_of
from streams.producer import KafkaProducer, RawMessage
from streams.recording import BadLine, RecordingWriter, read_recording
from streams.stream_errors import IncompleteRead, KafkaUnavailable, RecordingError

__all__ = ["PublishResult", "TopicReader", "publish", "record"]

log = structlog.get_logger(__name__)


async def record(
    config: KafkaConfig,
    out: Path,
    *,
    topics: Sequence[str],
    max_events: int | None = None,
    duration_s: float | None = None,
    idle_s: float | None = None,
    from_beginning: bool = True,
    on_progress: Callable[[int], None] | None = None,
    on_started: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Capture ``topics`` into ``out`` until a limit is reached; return the message count.

    Stops after ``max_events`` messages, after ``duration_s`` seconds, once nothing arrived
    for ``idle_s`` seconds, or when ``stop`` is set — whichever comes first; the file is then
    closed validly (a gzip trailer, every line flushed). ``on_started`` gets the number of
    partitions once every position is fixed: with ``from_beginning=False`` a message sent
    after it is recorded and none sent before it is.
    """
    consumer = AIOKafkaConsumer(
        **config.client_kwargs(),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    try:
        await consumer.start()
    except KafkaError as exc:
        await consumer.stop()
        raise KafkaUnavailable(f"cannot reach Kafka: {exc}") from exc
    try:
        partitions = [
            TopicPartition(topic, p)
            for topic in topics
            for p in sorted(await partitions_of(consumer, topic))
        ]
        consumer.assign(partitions)
        if from_beginning:
            await consumer.seek_to_beginning(*partitions)
        else:
            await _seek_to_now(consumer, partitions)
        if on_started is not None:
            on_started(len(partitions))
        started = last_seen = time.monotonic()
        with RecordingWriter(out, source="kafka", topics=list(topics)) as writer:
            while max_events is None or writer.count < max_events:
                now = time.monotonic()
                if stop is not None and stop.is_set():
                    break
                if duration_s is not None and now - started >= duration_s:
                    break
                if idle_s is not None and now - last_seen >= idle_s:
                    break
                batches = await consumer.getmany(timeout_ms=100, max_records=10_000)
                for tp, messages in sorted(batches.items()):
                    for m in messages:
                        if max_events is not None and writer.count >= max_events:
                            break
                        writer.write(
                            RawMessage(
                                tp.topic, tp.partition, m.offset, m.key, m.value,
                                tuple(m.headers or ()), m.timestamp,
                            )
                        )  # fmt: skip
                if batches:
                    last_seen = time.monotonic()
                    if on_progress is not None:
                        on_progress(writer.count)
            return writer.count
    finally:
        await consumer.stop()


async def _seek_to_now(consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> None:
    """Fix each partition's position at its end now, not lazily at the first fetch (which
    would also miss what arrives in between). The end is the high watermark a fetch reports:
    this broker's ``ListOffsets`` answer (``end_offsets``, ``seek_to_end``) can be too low."""
    await consumer.seek_to_end(*partitions)
    await consumer.getmany(*partitions, timeout_ms=500)
    for tp in partitions:
        highwater = consumer.highwater(tp)
        if highwater is not None:
            consumer.seek(tp, highwater)
        await consumer.position(tp)


class TopicReader:
    """Reads one topic without a consumer group: catch up from a point in time, then follow.

    Used for the controller's own decisions log: at start-up, the actions of the last hours
    (so budgets and cooldowns survive restarts); afterwards, the records other replicas write
    (so a follower knows what the leader did before it takes over). :meth:`since` ends when
    each partition is read up to the end offset it had when the read began (its high watermark
    in the first fetch answer: ``highwater`` is what this broker reports right, ``end_offsets``
    is not), or raises :class:`IncompleteRead`: it never returns part of the data as if it were
    all. :meth:`follow` continues from there, so nothing falls between the two, and reads
    partitions added to the topic meanwhile from their beginning (listed every
    ``partitions_refresh_s``, see :class:`~streams.positions.PartitionWatch`).
    """

    def __init__(
        self, config: KafkaConfig, topic: str, *, partitions_refresh_s: float = 30.0
    ) -> None:
        self.topic = topic
        self.caught_up = False
        """:meth:`follow` found nothing new once: it has read what there was."""
        self._consumer = AIOKafkaConsumer(
            **config.client_kwargs(), group_id=None, enable_auto_commit=False
        )
        self._watch = PartitionWatch([topic], every_s=partitions_refresh_s)

    @property
    def unassigned(self) -> list[int]:
        """Partitions of the topic the broker lists and this reader does not read yet (starting
        them failed; retried every ``partitions_refresh_s``)."""
        return sorted(tp.partition for tp in self._watch.unassigned)

    async def start(self) -> None:
        try:
            await self._consumer.start()
        except KafkaError as exc:
            await self._consumer.stop()
            raise KafkaUnavailable(f"cannot reach Kafka: {exc}") from exc
        numbers = sorted(await partitions_of(self._consumer, self.topic))
        self._partitions = [TopicPartition(self.topic, p) for p in numbers]
        self._consumer.assign(self._partitions)

    async def stop(self) -> None:
        await self._consumer.stop()

    async def since(self, since_s: float, *, timeout_s: float = 15.0) -> list[bytes]:
        """Every value from ``since_s`` (epoch seconds) on, in partition order, up to at least
        the end offsets seen at the start; :class:`IncompleteRead` after ``timeout_s``. Call it
        once, before :meth:`follow`."""
        consumer = self._consumer
        line = StartLine()
        await line.seek_to_time(consumer, self._partitions, since_s)
        pending = set(self._partitions)
        values: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                behind = line.behind(pending, {tp: await consumer.position(tp) for tp in pending})
                progress = {tp.partition: (at or 0, end) for tp, (at, end) in behind.items()}
                raise IncompleteRead(self.topic, progress=progress, timeout_s=timeout_s)
            try:
                fetched = await consumer.getmany(*pending, timeout_ms=int(min(left, 0.2) * 1000))
            except KafkaError as exc:
                log.warning("tail.fetch_failed", topic=self.topic, error=repr(exc))
                continue
            for messages in line.settle(consumer, fetched).values():
                values.extend(m.value for m in messages if m.value is not None)
            done = {tp: await consumer.position(tp) for tp in pending}
            pending = set(line.behind(pending, done))
        return values

    async def follow(self, on_value: Callable[[bytes], None]) -> None:
        """Hand every new value to ``on_value`` until cancelled; broker errors are retried.
        :attr:`caught_up` once a fetch found nothing new."""
        while True:
            try:
                if self._watch.due():
                    await self._watch.check(self._consumer)
                batches = await self._consumer.getmany(timeout_ms=500)
            except KafkaError as exc:
                log.warning("tail.fetch_failed", topic=self.topic, error=repr(exc))
                await asyncio.sleep(1.0)
                continue
            if not batches:
                self.caught_up = True
            for messages in batches.values():
                for m in messages:
                    if m.value is not None:
                        on_value(m.value)


@dataclass(frozen=True, slots=True)
class PublishResult:
    sent: int
    bad_lines: int
    seconds: float
    stopped: bool = False
    """Ended early by its ``stop`` event (SIGINT/SIGTERM), not at the recording's end."""


async def publish(
    config: KafkaConfig,
    recording: Path,
    *,
    speed: float | None = 1.0,
    topic_map: dict[str, str] | None = None,
    retime: bool = False,
    on_progress: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> PublishResult:
    """Send every message of ``recording`` to Kafka; ``speed=None`` means as fast as possible.
    Setting ``stop`` ends it early, after flushing what was sent (``stopped`` in the result).

    Kafka timestamps are the recording's shifted to now (old ones would fall to retention).
    The events' own ``ts`` fields are sent as recorded, unless ``retime``: then they are moved
    so the first event happens now and later ones follow at the recording's pace divided by
    ``speed`` — what a live controller, which judges windows by its own clock, needs to see.
    A damaged recording raises :class:`~streams.stream_errors.RecordingError` saying how many
    messages were sent before the damage (they stay sent).
    """
    retimer = _Retimer(speed or 1.0) if retime else None
    started = time.monotonic()
    first_ts: int | None = None
    shift_ms = 0
    sent = bad = 0
    async with KafkaProducer(config) as producer:
        try:
            for message in read_recording(recording):
                if stop is not None and stop.is_set():
                    break
                if isinstance(message, BadLine):
                    bad += 1
                    log.warning("publish.bad_line", line=message.line, reason=message.reason)
                    continue
                if message.ts_ms is not None and first_ts is None:
                    first_ts = message.ts_ms
                    shift_ms = int(time.time() * 1000) - first_ts
                if message.ts_ms is not None and first_ts is not None and speed is not None:
                    delay = (message.ts_ms - first_ts) / 1000 / speed - (time.monotonic() - started)
                    if delay > 0:
                        await producer.flush()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(delay):
                                await (stop or asyncio.Event()).wait()
                        if stop is not None and stop.is_set():
                            break
                await producer.send(
                    (topic_map or {}).get(message.topic, message.topic),
                    retimer(message.value) if retimer else message.value,
                    key=message.key,
                    headers=message.headers,
                    timestamp_ms=message.ts_ms + shift_ms if message.ts_ms is not None else None,
                )
                sent += 1
                if on_progress is not None and sent % 1000 == 0:
                    on_progress(sent)
        except RecordingError as exc:
            await producer.flush()
            raise RecordingError(f"{exc}; published {sent} messages before it") from exc
        await producer.flush()
    stopped = stop is not None and stop.is_set()
    return PublishResult(
        sent=sent, bad_lines=bad, seconds=time.monotonic() - started, stopped=stopped
    )


class _Retimer:
    """Moves each event's ``ts`` to ``now₀ + (ts - first ts) / speed``; leaves anything that
    is not a JSON object with a usable ``ts`` untouched (so it is rejected as recorded)."""

    def __init__(self, speed: float) -> None:
        self._speed = speed
        self._origin: tuple[float, float] | None = None  # (first event ts, wall time then)

    def __call__(self, value: bytes) -> bytes:
        try:
            obj = msgspec.json.decode(value)
            ts = obj["ts"]
            seconds = float(ts) if not isinstance(ts, str) else _rfc3339(ts)
        except (msgspec.DecodeError, TypeError, KeyError, ValueError):
            return value
        if self._origin is None:
            self._origin = (seconds, time.time())
        first, wall = self._origin
        obj["ts"] = wall + (seconds - first) / self._speed
        return msgspec.json.encode(obj)


def _rfc3339(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

"""The ingest path: Kafka → decode and validate → dead-letter or hand over → commit.

Two ways to read, chosen by ``ConsumerSettings.group_id``:

* **in a consumer group**: partitions are shared among the group's members and each resumes
  where the group's committed offsets say; offsets are committed only once applied (below);
* **without a group** (``group_id=None``): the consumer assigns itself every partition and starts
  each at its first message ``rewind_s`` seconds back (or at its end), found by time. Nothing is
  committed and nothing is left behind on the broker. This is for consumers whose state is the
  recent past only, such as the controller's sliding windows: its state is in memory, so after
  a restart it has to re-read its longest window whatever a group had committed. Partitions
  added to the topics later are found by re-listing them every ``partitions_refresh_s`` and
  read from their beginning (:class:`~streams.positions.PartitionWatch`); a group gets them
  from Kafka's rebalance.

Either way the consumer is *caught up* (:attr:`ConsumerStats.caught_up`) once every assigned
partition is applied up to the end offset it had when first fetched (see
:mod:`streams.positions`): readiness means that, not merely a reachable broker.

Two tasks joined by a bounded queue:

* the **fetch** task calls ``getmany``, decodes each partition's messages at once
  (:meth:`EventDecoder.decode_many`), sends each rejected message to the dead-letter topic
  (awaited, so it is safe before anything after it is committed), and puts a :class:`Batch` on
  the queue. When the queue is full the task waits, so
  a slow handler slows fetching down instead of growing memory (backpressure);
* the **apply** task hands each batch to the downstream handler. Only once the handler has
  returned are the batch's offsets marked applied; applied offsets are committed every
  ``commit_interval_s``, on partition revocation and on stop.

In a group, delivery is therefore at-least-once: after a crash, events applied but not yet
committed are consumed again. That is harmless because what the engine builds from them is
idempotent in effect — a duplicate latency sample moves a sliding-window quantile by at most one
sample, a duplicate utilization reading does not move a windowed mean by more than its own
weight, and actions are keyed by the cluster state they act on (an already-evicted pod is not
evicted again).

Closing is bounded by ``close_timeout_s``: leaving a group waits for a join in progress (half a
session on the embedded broker, a whole rebalance on Kafka), and shutdown has a deadline.

Broker loss is survived by aiokafka's own reconnects; errors that escape it are logged and retried
with capped exponential backoff. A handler that raises is retried the same way: the batch is
never skipped, because skipping would lose events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from streams.connection import KafkaConfig
from streams.events import DEFAULT_TOPICS, Event, EventDecoder, Rejection
from streams.hold import IngestHold
from streams.positions import PartitionWatch, StartLine, partitions_of
from streams.producer import DeadLetter, RawMessage
from streams.stream_errors import KafkaUnavailable

__all__ = [
    "Batch",
    "Checkpoint",
    "ConsumerSettings",
    "ConsumerStats",
    "EventConsumer",
    "Handler",
    "TopicPartition",
]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Batch:
    """Valid events from one fetch, in partition order, and the offsets they complete."""

    events: Sequence[Event]
    positions: dict[TopicPartition, int]
    """Per partition, the next offset to consume once this batch is applied."""
    fetched_at: float
    """``time.time()`` when the fetch returned, for decision-latency accounting."""
    spans: Mapping[TopicPartition, tuple[int, int, int]] = field(default_factory=dict)
    """Per partition: where its events lie in ``events`` (start, end) and the offset of its
    first message, for handlers that keep state per source partition."""
    generation: int = 0
    """:attr:`EventConsumer.generation` when fetched: a batch of an older generation was
    fetched before partitions were last revoked, and is fetched again after."""
    offsets: Mapping[TopicPartition, Sequence[int]] = field(default_factory=dict)
    """The offsets of a partition's events where they do not simply count on from its span's
    first offset (a message was rejected, or the log has a gap: a transaction marker)."""

    def offset_of(self, tp: TopicPartition, index: int) -> int:
        """The offset of ``events[index]``, an event of partition ``tp``, or the next offset to
        consume when ``index`` is the end of its span: where a handler that keeps state per
        partition can cut it (see :mod:`controller.process.aggregate`)."""
        start, end, first = self.spans[tp]
        if index == end:
            return self.positions[tp]
        held = self.offsets.get(tp)
        return first + index - start if held is None else held[index - start]


Handler = Callable[[Batch], Awaitable[None]]
Checkpoint = Callable[[Sequence[TopicPartition]], Awaitable[Mapping[TopicPartition, int]]]
"""Make what was applied of these partitions durable elsewhere; return, per partition, the
offset up to which it is, so safe to commit (see :class:`EventConsumer`)."""


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """How the ingest path consumes; defaults suit production, tests shorten the timeouts."""

    group_id: str | None = "ebbtide"
    """The consumer group; ``None`` reads every partition without one, from ``rewind_s`` back."""
    rewind_s: float = 0.0
    """Without a group: start each partition at its first message this many seconds before the
    clock's now (0: at its end). A group resumes from its committed offsets instead."""
    topics: tuple[str, ...] = tuple(DEFAULT_TOPICS.values())
    max_records: int = 1_000
    """Most messages in one ``getmany``, so one batch: the most a handler takes in one turn
    of the event loop before the tasks it woke (an evaluation) run. Bigger batches made a
    decision under heavy traffic wait behind batches of background events (BENCHMARKS.md,
    "Reaction time")."""
    queue_batches: int = 8
    """Batches fetched ahead of the handler before fetching waits."""
    commit_interval_s: float = 1.0
    """Applied offsets are committed at most this often (and on revoke and stop)."""
    fetch_timeout_ms: int = 200
    fetch_max_wait_ms: int = 50
    """How long the broker may hold a fetch waiting for data: a bound on reaction time."""
    auto_offset_reset: str = "earliest"
    """In a group: where a partition without a committed offset starts."""
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    max_partition_fetch_bytes: int = 4 * 1024 * 1024
    retry_backoff_s: tuple[float, float] = (0.1, 5.0)
    """Initial and maximum delay between retries of a failing fetch, handler or dead-letter."""
    drain_timeout_s: float = 10.0
    """On stop, how long queued batches may still be applied before they are abandoned."""
    probe_every_s: float = 2.0
    """How often an idle consumer asks the broker for metadata to know it is still reachable."""
    close_timeout_s: float = 2.0
    """On stop, how long closing the client (leaving the group) may take."""
    partitions_refresh_s: float = 30.0
    """Without a group: how often the topics' partitions are listed again, so partitions added
    later are read (from their beginning). Producers write to a new partition only once their
    own metadata is refreshed (Kafka's ``metadata.max.age.ms``, 5 min), and nothing is lost by
    a late check; 30 s keeps what lands there well inside an SLO window for one metadata
    request per 30 s."""

    def __post_init__(self) -> None:
        if not self.partitions_refresh_s > 0:
            raise ValueError(
                f"partitions_refresh_s must be positive; got {self.partitions_refresh_s}"
            )
        if self.group_id is not None and self.rewind_s:
            raise ValueError(
                "rewind_s applies without a group only: a group resumes from its offsets"
            )


@dataclass(slots=True)
class ConsumerStats:
    """Counters read by metrics and tests; updated once per batch, not per message."""

    consumed: Counter[str] = field(default_factory=Counter)
    accepted: Counter[str] = field(default_factory=Counter)
    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)
    """By (topic, rejection code)."""
    commits: int = 0
    commit_failures: int = 0
    fetch_failures: int = 0
    handler_failures: int = 0
    last_fetch_ok: float | None = None
    """``time.monotonic()`` when the broker last answered (a fetch with data, or the periodic
    metadata probe: an empty ``getmany`` says nothing, aiokafka returns one while disconnected)."""
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    """Per (topic, partition): the broker's high watermark minus the applied offset."""
    caught_up: bool = False
    """Partitions are assigned and each was applied up to the end offset it had when first
    fetched. Stays true once reached: falling behind later is what ``lag`` measures."""
    behind: dict[tuple[str, int], tuple[int | None, int | None]] = field(default_factory=dict)
    """Until caught up, per (topic, partition) still behind: (applied offset or ``None``, end
    offset seen at start or ``None`` while not yet fetched)."""
    unassigned: set[tuple[str, int]] = field(default_factory=set)
    """Without a group: (topic, partition) the broker lists and this consumer does not read,
    because assigning them failed (retried every ``partitions_refresh_s``)."""


class _Backoff:
    def __init__(self, initial: float, maximum: float) -> None:
        self._initial, self._max, self._next = initial, maximum, initial

    def reset(self) -> None:
        self._next = self._initial

    async def wait(self) -> None:
        await asyncio.sleep(self._next)
        self._next = min(self._next * 2, self._max)


class EventConsumer:
    """Consumes, validates and hands over events; see the module docstring for guarantees.

    ``clock`` returns epoch seconds: the future-timestamp rule and, without a group, the
    rewind's start line (read when the consumer starts) use it.

    With a ``checkpoint`` (in a group), what is committed is not "applied" but what the
    checkpoint says is durable: a handler that only aggregates (the sharded aggregators)
    publishes its aggregates in the checkpoint, and offsets are committed after that, every
    ``commit_interval_s`` (also while idle), on revocation and on stop.

    With a ``hold`` (:mod:`streams.hold`), neither task fetches nor hands over a batch while the
    decision path holds ingest (at most the hold's ``max_s``), so a decision being carried out
    does not queue behind a backlog of background events.
    """

    def __init__(
        self,
        config: KafkaConfig,
        handler: Handler,
        *,
        settings: ConsumerSettings | None = None,
        decoder: EventDecoder | None = None,
        dead_letter: DeadLetter | None = None,
        clock: Callable[[], float] = time.time,
        checkpoint: Checkpoint | None = None,
        hold: IngestHold | None = None,
    ) -> None:
        self.settings = settings or ConsumerSettings()
        self._hold = hold
        self._checkpoint = checkpoint
        self.generation = 0
        """Counts revocations (see :attr:`Batch.generation`)."""
        self.stats = ConsumerStats()
        self._handler = handler
        self._decoder = decoder or EventDecoder(topics=DEFAULT_TOPICS)
        self._dead_letter = dead_letter
        self._clock = clock
        self._consumer = AIOKafkaConsumer(
            **config.client_kwargs(),
            group_id=self.settings.group_id,
            enable_auto_commit=False,
            auto_offset_reset=self.settings.auto_offset_reset,
            session_timeout_ms=self.settings.session_timeout_ms,
            heartbeat_interval_ms=self.settings.heartbeat_interval_ms,
            max_partition_fetch_bytes=self.settings.max_partition_fetch_bytes,
            fetch_max_wait_ms=self.settings.fetch_max_wait_ms,
        )
        self._queue: asyncio.Queue[Batch | None] = asyncio.Queue(self.settings.queue_batches)
        self._line = StartLine()
        self._watch = (
            PartitionWatch(self.settings.topics, every_s=self.settings.partitions_refresh_s)
            if self.settings.group_id is None
            else None
        )
        self._fetched: dict[TopicPartition, int] = {}
        self._applied: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._last_commit = 0.0
        self._committing = asyncio.Lock()
        """One commit at a time: the apply side's and a revocation's (the group coordinator's
        task) would otherwise run the checkpoint concurrently."""
        self._stopping = asyncio.Event()
        self._started = False

    async def start(self) -> None:
        """Connect, then subscribe (the group is joined while fetching) or, without a group,
        assign every partition at its start. :class:`KafkaUnavailable` if Kafka is unreachable."""
        consumer, settings = self._consumer, self.settings
        try:
            await consumer.start()
            if settings.group_id is not None:
                consumer.subscribe(list(settings.topics), listener=_Revoked(self))
            else:
                partitions = [
                    TopicPartition(topic, p)
                    for topic in settings.topics
                    for p in sorted(await partitions_of(consumer, topic))
                ]
                consumer.assign(partitions)
                await self._line.seek_to_time(
                    consumer, partitions, self._clock() - settings.rewind_s
                )
        except (KafkaError, ConnectionError) as exc:
            await consumer.stop()
            raise KafkaUnavailable(f"cannot reach Kafka: {exc}") from exc
        self._started = True

    def stop(self) -> None:
        """Ask :meth:`run` to finish: stop fetching, apply what is queued, commit, close."""
        self._stopping.set()

    async def run(self) -> None:
        """Consume until :meth:`stop`; returns after the final commit and close."""
        if not self._started:
            await self.start()
        fetch = asyncio.create_task(self._fetch_loop(), name="ebbtide-fetch")
        apply = asyncio.create_task(self._apply_loop(), name="ebbtide-apply")
        try:
            await fetch
            await self._queue.put(None)
            try:
                async with asyncio.timeout(self.settings.drain_timeout_s):
                    await asyncio.shield(apply)
            except TimeoutError:
                log.warning("ingest.drain_timeout", abandoned_batches=self._queue.qsize())
                apply.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await apply
        finally:
            for task in (fetch, apply):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await self.commit()
            await self._close()
            self._started = False

    async def _close(self) -> None:
        """Close the client within ``close_timeout_s``. Past it the group is not left politely:
        the broker expires the member after its session timeout, as if it had crashed."""
        try:
            async with asyncio.timeout(self.settings.close_timeout_s):
                await self._consumer.stop()
        except TimeoutError:
            log.warning("ingest.close_timeout", seconds=self.settings.close_timeout_s)
            # stop() was cancelled while waiting for the group coordinator; the fetcher and the
            # connections it would have closed next are closed here (aiokafka has no timeout).
            await self._consumer._fetcher.close()
            await self._consumer._client.close()

    # -- fetch side -----------------------------------------------------------------------------

    async def _probe(self) -> None:
        """Ask the broker for metadata; note when it answers (readiness reads that)."""
        try:
            async with asyncio.timeout(self.settings.probe_every_s * 2):
                await self._consumer.topics()
        except (KafkaError, TimeoutError) as exc:
            log.warning("ingest.broker_unreachable", error=repr(exc))
            return
        self.stats.last_fetch_ok = time.monotonic()

    async def _fetch_loop(self) -> None:
        backoff = _Backoff(*self.settings.retry_backoff_s)
        last_probe = 0.0
        stopped = asyncio.ensure_future(self._stopping.wait())
        try:
            while not stopped.done():
                if time.monotonic() - last_probe >= self.settings.probe_every_s:
                    last_probe = time.monotonic()
                    await self._probe()
                if self._watch is not None and self._watch.due():
                    await self._assign_new_partitions(self._watch)
                if self._hold is not None:
                    await self._hold.wait()
                try:
                    fetched = await self._fetch(stopped)
                except KafkaError as exc:
                    self.stats.fetch_failures += 1
                    log.warning("ingest.fetch_failed", error=repr(exc))
                    await backoff.wait()
                    continue
                if fetched is None:
                    return  # stopped while waiting for the fetch
                backoff.reset()
                records, generation = fetched
                records = self._line.settle(self._consumer, records)
                if records:
                    self.stats.last_fetch_ok = time.monotonic()
                    batch = await self._decode(records, generation)
                    if batch is None or not await self._enqueue(batch):
                        return  # stopped first: nothing of this batch is committed
                    self._fetched.update(batch.positions)
                await self._track_progress()
        finally:
            stopped.cancel()
            await asyncio.wait((stopped,))

    async def _assign_new_partitions(self, watch: PartitionWatch) -> None:
        """Read partitions added to the topics since start (in the fetch task: ``assign``
        must not run beside a ``getmany``)."""
        try:
            await watch.check(self._consumer)
        except KafkaError as exc:
            log.warning("ingest.partitions_check_failed", error=repr(exc))
        self.stats.unassigned = {(tp.topic, tp.partition) for tp in watch.unassigned}

    async def _fetch(
        self, stopped: asyncio.Future[Any]
    ) -> tuple[dict[TopicPartition, list[Any]], int] | None:
        """One ``getmany`` and the generation its records belong to, given up (``None``) when
        stop is asked for meanwhile: in a group, aiokafka's ``getmany`` ignores its timeout
        until the join in progress is over."""
        fetching = asyncio.ensure_future(self._getmany())
        try:
            await asyncio.wait((fetching, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not fetching.done():
                fetching.cancel()
                await asyncio.wait((fetching,))
        if fetching.cancelled():
            return None
        return fetching.result()

    async def _getmany(self) -> tuple[dict[TopicPartition, list[Any]], int]:
        """``getmany`` with :attr:`generation` read in the step it answers in. aiokafka hands
        over no records while a rebalance is in progress, so they belong to this generation;
        read later, a revocation run by the group coordinator's task in between would have
        stamped records of the old assignment (fetched again after it) with the new one."""
        records = await self._consumer.getmany(
            timeout_ms=self.settings.fetch_timeout_ms, max_records=self.settings.max_records
        )
        return records, self.generation

    async def _enqueue(self, batch: Batch) -> bool:
        """Wait for room in the queue (backpressure); False if asked to stop meanwhile."""
        while True:
            try:
                async with asyncio.timeout(0.25):
                    await self._queue.put(batch)
                return True
            except TimeoutError:
                if self._stopping.is_set():
                    return False

    async def _decode(
        self, records: dict[TopicPartition, list[Any]], generation: int
    ) -> Batch | None:
        fetched_at = time.time()
        now = self._clock()
        decode_many = self._decoder.decode_many
        events: list[Event] = []
        positions: dict[TopicPartition, int] = {}
        spans: dict[TopicPartition, tuple[int, int, int]] = {}
        rejected: list[tuple[RawMessage, Rejection]] = []
        offsets: dict[TopicPartition, list[int]] = {}
        stats = self.stats
        for tp, messages in records.items():
            accepted_before = len(events)
            accepted, refused = decode_many([m.value for m in messages], now=now, topic=tp.topic)
            events += accepted
            rejected += ((_raw(tp, messages[i]), why) for i, why in refused.items())
            if messages[-1].offset - messages[0].offset + 1 != len(accepted):
                offsets[tp] = [m.offset for i, m in enumerate(messages) if i not in refused]
            positions[tp] = messages[-1].offset + 1
            spans[tp] = (accepted_before, len(events), messages[0].offset)
            stats.consumed[tp.topic] += len(messages)
            stats.accepted[tp.topic] += len(accepted)
        for raw, rejection in rejected:
            stats.rejected[raw.topic, rejection.code] += 1
            log.info(
                "ingest.rejected",
                topic=raw.topic,
                partition=raw.partition,
                offset=raw.offset,
                code=rejection.code,
                reason=rejection.detail,
            )
        if rejected and not await self._dead_letter_all(rejected):
            return None
        return Batch(
            events,
            positions,
            fetched_at=fetched_at,
            spans=spans,
            generation=generation,
            offsets=offsets,
        )

    async def _dead_letter_all(self, rejected: list[tuple[RawMessage, Rejection]]) -> bool:
        """Send every rejected message to the dead-letter topic; False if stopped first."""
        if self._dead_letter is None:
            return True
        backoff = _Backoff(*self.settings.retry_backoff_s)
        while True:
            try:
                for raw, rejection in rejected:
                    await self._dead_letter.send(raw, rejection)
                await self._dead_letter.flush()
                return True
            except KafkaError as exc:
                log.warning("ingest.deadletter_failed", error=repr(exc), messages=len(rejected))
                if self._stopping.is_set():
                    return False
                await backoff.wait()

    async def _track_progress(self) -> None:
        """Update lag and, until caught up, which partitions are still behind their line."""
        consumer, stats = self._consumer, self.stats
        assigned = consumer.assignment()
        done: dict[TopicPartition, int] = {}
        for tp in assigned:
            if tp in self._fetched:  # something was fetched: applied is what counts
                if tp in self._applied:
                    done[tp] = self._applied[tp]
                continue
            with contextlib.suppress(IllegalStateError):  # revoked meanwhile
                done[tp] = await consumer.position(tp)  # nothing in flight: fetched = applied
        self._note_lag(done)
        if not stats.caught_up:
            behind = self._line.behind(assigned, done)
            stats.behind = {(tp.topic, tp.partition): where for tp, where in behind.items()}
            stats.caught_up = bool(assigned) and not behind

    def _note_lag(self, done: Mapping[TopicPartition, int]) -> None:
        """Lag is what is in the log past what was applied (``done``), on partitions still
        assigned (a batch applied after its partition moved away says nothing of it here)."""
        assigned = self._consumer.assignment()
        for tp, at in done.items():
            if tp in assigned and (highwater := self._consumer.highwater(tp)) is not None:
                self.stats.lag[tp.topic, tp.partition] = max(0, highwater - at)

    # -- apply side -----------------------------------------------------------------------------

    async def _apply_loop(self) -> None:
        backoff = _Backoff(*self.settings.retry_backoff_s)
        while (batch := await self._next_batch()) is not None:
            if self._hold is not None:
                await self._hold.wait()
            while True:
                try:
                    await self._handler(batch)
                    break
                except Exception:
                    self.stats.handler_failures += 1
                    log.exception("ingest.handler_failed", events=len(batch.events))
                    await backoff.wait()
            backoff.reset()
            self._applied.update(batch.positions)
            self._note_lag(batch.positions)  # not only at the next fetch: it may be a while
            if time.monotonic() - self._last_commit >= self.settings.commit_interval_s:
                await self.commit()
            await _give_way()

    async def _next_batch(self) -> Batch | None:
        """The next batch; with a checkpoint, an idle consumer commits meanwhile (so the
        aggregates of the last events are published without waiting for more)."""
        if self._checkpoint is None:
            return await self._queue.get()
        while True:
            try:
                async with asyncio.timeout(self.settings.commit_interval_s):
                    return await self._queue.get()
            except TimeoutError:
                await self.commit()

    async def commit(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        """Commit applied offsets (of ``partitions``, default all still assigned), or with a
        checkpoint those it made durable; without a group there is nothing to commit to."""
        if self.settings.group_id is None:
            return
        async with self._committing:
            await self._commit(partitions)

    async def _commit(self, partitions: Sequence[TopicPartition] | None) -> None:
        assigned = self._consumer.assignment()
        wanted = assigned if partitions is None else set(partitions) & assigned
        self._last_commit = time.monotonic()
        durable: Mapping[TopicPartition, int] = self._applied
        if self._checkpoint is not None:
            try:
                durable = await self._checkpoint(sorted(wanted))
            except Exception:
                self.stats.commit_failures += 1
                log.exception("ingest.checkpoint_failed")
                return
        offsets = {
            tp: offset
            for tp, offset in durable.items()
            if tp in wanted and self._committed.get(tp) != offset
        }
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except KafkaError as exc:
            self.stats.commit_failures += 1
            log.warning("ingest.commit_failed", error=repr(exc))
            return
        self.stats.commits += 1
        self._committed.update(offsets)

    async def release(self, partitions: Sequence[TopicPartition]) -> None:
        """Commit and forget ``partitions`` before they move to another group member."""
        self.generation += 1
        await self.commit(partitions)
        self._line.forget(partitions)
        for tp in partitions:
            self._fetched.pop(tp, None)
            self._applied.pop(tp, None)
            self._committed.pop(tp, None)
            self.stats.lag.pop((tp.topic, tp.partition), None)


class _Revoked(ConsumerRebalanceListener):  # type: ignore[misc]
    """Commit what was applied on partitions that are about to move to another member."""

    def __init__(self, owner: EventConsumer) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._owner.release(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info(
            "ingest.assigned", partitions=sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned)
        )


async def _give_way() -> None:
    """Let the other tasks go first before the next batch: a full queue's get does
    not suspend, so without this the batches queued would all be applied before what the first
    one woke (an evaluation) ran; and asyncio runs ready callbacks in order, so one yield lets
    an I/O completion run (a broker's ack of an intent, an API server's answer) but not the
    task step it schedules, which would wait behind the next batch: each round trip of a
    decision being carried out would cost two batches. Three yields let both go first."""
    for _ in range(3):
        await asyncio.sleep(0)


def _raw(tp: TopicPartition, message: object) -> RawMessage:
    m = message
    return RawMessage(
        topic=tp.topic,
        partition=tp.partition,
        offset=m.offset,  # type: ignore[attr-defined]
        key=m.key,  # type: ignore[attr-defined]
        value=m.value,  # type: ignore[attr-defined]
        headers=tuple(m.headers or ()),  # type: ignore[attr-defined]
        timestamp_ms=m.timestamp,  # type: ignore[attr-defined]
    )

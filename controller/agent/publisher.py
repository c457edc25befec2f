"""The agent's loop: sample NVML every interval, publish one ``gpu.utilization`` event per device.

One **round** per interval: read every device (in a worker thread, since an NVML call on a
failing card can block), ask the kubelet which pod holds each device, build and validate the
events, then send them all at once and wait for the broker's acknowledgement of the whole
round (aiokafka batches them: one flush per round). Rounds never overlap and a round that
overruns the interval skips the missed ticks instead of catching up in a burst.

Never flooding the broker:

* a :class:`TokenBucket` bounds the rate: over any span ``T`` at most ``max_rate * T + burst``
  events leave. Events over the budget are dropped (counted as ``rate_limited``), not queued:
  the next round carries fresher readings anyway. Rounds rotate which devices go first, so a
  tight limit does not starve the same device every round;
* nothing is kept across rounds: while the broker is unavailable (a round's sends fail or time
  out), rounds back off exponentially and the samples of skipped rounds are dropped (counted
  as ``dropped``), so memory stays bounded and no stale burst follows a recovery. When the
  producer cannot even connect, the agent retries with the same backoff.

MIG instances without NVML utilization (see :mod:`controller.agent.nvml`): with
``mig_util="memory"`` (the default) the event's ``util_pct`` is the instance's memory
occupancy, and the Kafka header ``ebbtide-util-source: memory`` says so (``nvml`` otherwise);
with ``"skip"`` no event is published for such an instance. Either way it is counted in
``mig_util_unavailable``.

Every event is round-tripped through :class:`~streams.events.EventDecoder` before sending, so
the agent cannot put an event on the wire that the controller would dead-letter.

MIG reconfiguration (with a :class:`~controller.agent.migwatch.MigWatch`): while the node's
``nvidia.com/mig.config.state`` is ``pending`` or ``rebooting`` the agent holds no NVML handle
(``nvmlShutdown``) so the MIG manager's GPU reset can succeed, and publishes nothing; it
initialises NVML again when the state moves on. A follower task applies each change as it is
seen — also while the producer is backing off — and every round checks again; one lock keeps
a release from cutting into a read in progress. ``AgentStats.nvml_held`` and
``nvml_releases`` show it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import structlog

from controller.agent.nvml import NvmlReader, NvmlUnavailable, Sample
from controller.agent.pods import PodAttribution
from streams.events import (
    DEFAULT_TOPICS,
    GPU_UTILIZATION,
    EventDecoder,
    GpuUtilization,
    Rejection,
    encode_event,
)
from streams.producer import KafkaProducer

if TYPE_CHECKING:  # the Kubernetes client is loaded only by agents that watch their node
    from controller.agent.migwatch import MigWatch

__all__ = ["Agent", "AgentSettings", "AgentStats", "Outgoing", "TokenBucket", "to_events"]

log = structlog.get_logger(__name__)

MigUtil = Literal["memory", "skip"]
UTIL_SOURCE_HEADER = "ebbtide-util-source"


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """How the agent samples and publishes."""

    node: str
    """The Kafka key and the ``node`` field of every event."""
    interval_s: float = 5.0
    """Time between the starts of two rounds."""
    max_rate: float = 20.0
    """Events per second, sustained."""
    burst: int | None = None
    """Events allowed at once; default ``ceil(max_rate * interval_s)``, one round's worth."""
    mig_util: MigUtil = "memory"
    """What to publish for a MIG instance whose utilization NVML does not report."""
    topic: str = DEFAULT_TOPICS[GPU_UTILIZATION]
    publish_timeout_s: float | None = None
    """How long a round waits for the broker's acknowledgement; default the interval, within
    [1s, 10s]."""
    backoff_s: tuple[float, float] = (1.0, 60.0)
    """First and longest pause after a failed round or connection."""

    @property
    def bucket_size(self) -> int:
        return self.burst or max(1, math.ceil(self.max_rate * self.interval_s))


@dataclass(slots=True)
class AgentStats:
    """Counters since start; the CLI logs them on exit."""

    rounds: int = 0
    published: int = 0
    device_failures: int = 0
    """Device readings that failed (a lost GPU counts once per round)."""
    failures_by_device: Counter[str] = field(default_factory=Counter)
    mig_util_unavailable: int = 0
    rate_limited: int = 0
    dropped: int = 0
    """Events not sent because the broker was unavailable (backoff or a failed round)."""
    invalid: int = 0
    """Events the decoder refused (a bug or a bizarre reading); never sent."""
    publish_errors: int = 0
    connect_failures: int = 0
    nvml_held: bool = True
    """NVML is initialised now (false while released for a MIG reconfiguration)."""
    nvml_releases: int = 0
    """Times NVML was shut down for a MIG reconfiguration."""
    released_rounds: int = 0
    """Rounds skipped because NVML was released (or could not be initialised again)."""


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` banked; :meth:`take` never waits."""

    def __init__(self, rate: float, burst: int, *, clock: Callable[[], float]) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst ≥ 1; got {rate}, {burst}")
        self._rate, self._burst, self._clock = rate, float(burst), clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self, wanted: int) -> int:
        """Grant up to ``wanted`` tokens now; returns how many were granted."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        granted = min(wanted, int(self._tokens))
        self._tokens -= granted
        return granted


@dataclass(frozen=True, slots=True)
class Outgoing:
    event: GpuUtilization
    util_source: Literal["nvml", "memory"]


def _memory_pct(used: float, total: float) -> float:
    return 0.0 if total <= 0 else min(100.0, 100.0 * used / total)


def _pod(owners: Mapping[str, str], *ids: str) -> str | None:
    return next((owners[i] for i in ids if i in owners), None)


def to_events(
    sample: Sample, *, node: str, ts: float, owners: Mapping[str, str], mig_util: MigUtil
) -> tuple[list[Outgoing], int]:
    """Events for one round, and how many MIG instances had no NVML utilization."""
    out: list[Outgoing] = []
    no_util = 0
    for gpu in sample.gpus:
        if gpu.util_pct is None:  # a whole GPU without utilization: nothing honest to say
            log.debug("gpu reports no utilization", gpu=gpu.index)
            continue
        event = GpuUtilization(
            ts=ts,
            node=node,
            gpu=gpu.index,
            util_pct=gpu.util_pct,
            mem_used_mib=gpu.mem_used_mib,
            mem_total_mib=gpu.mem_total_mib,
            pod=_pod(owners, gpu.uuid, str(gpu.index)),
        )
        out.append(Outgoing(event, "nvml"))
    for mig in sample.migs:
        util, source = mig.util_pct, "nvml"
        if util is None:
            no_util += 1
            if mig_util == "skip":
                continue
            util, source = _memory_pct(mig.mem_used_mib, mig.mem_total_mib), "memory"
        legacy_id = f"MIG-{mig.gpu_uuid}/{mig.gpu_instance}/{mig.compute_instance}"
        event = GpuUtilization(
            ts=ts,
            node=node,
            gpu=mig.gpu_index,
            util_pct=util,
            mig_profile=mig.profile,
            mig_instance=mig.gpu_instance,
            mem_used_mib=mig.mem_used_mib,
            mem_total_mib=mig.mem_total_mib,
            pod=_pod(owners, mig.uuid, legacy_id),
        )
        out.append(Outgoing(event, "nvml" if source == "nvml" else "memory"))
    return out, no_util


class Agent:
    """Runs rounds until :meth:`stop`. The caller opens the reader (so that an NVML init
    failure is reported before any connection) and passes ``connect``, a factory of started
    producers (``lambda: KafkaProducer(config)``)."""

    def __init__(
        self,
        settings: AgentSettings,
        *,
        reader: NvmlReader,
        connect: Callable[[], AbstractAsyncContextManager[KafkaProducer]],
        attribution: PodAttribution | None = None,
        mig: MigWatch | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.stats = AgentStats()
        self._reader, self._connect, self._attribution = reader, connect, attribution
        self._mig = mig
        self._nvml_lock = asyncio.Lock()
        self._clock, self._wall = clock, wall
        self._bucket = TokenBucket(settings.max_rate, settings.bucket_size, clock=clock)
        self._decoder = EventDecoder()
        self._stop = asyncio.Event()
        self._delay = settings.backoff_s[0]
        self._resume_at = 0.0
        self._failing: set[str] = set()
        self._limited = False

    def stop(self) -> None:
        """Finish the current round, flush, close; safe from a signal handler."""
        self._stop.set()

    async def run(self) -> AgentStats:
        log.info("agent started", node=self.settings.node, interval_s=self.settings.interval_s)
        followers: list[asyncio.Task[None]] = []
        if self._mig is not None:
            followers = [
                asyncio.create_task(self._mig.run(), name="agent: watch node"),
                asyncio.create_task(self._follow_mig(self._mig), name="agent: follow MIG state"),
            ]
        try:
            while not self._stop.is_set():
                try:
                    async with self._connect() as producer:
                        self._delay = self.settings.backoff_s[0]
                        await self._rounds(producer)
                except ConnectionError as exc:
                    self.stats.connect_failures += 1
                    log.warning("broker unreachable", error=str(exc), retry_in_s=self._delay)
                    await self._sleep(self._delay)
                    self._delay = min(self._delay * 2, self.settings.backoff_s[1])
        finally:
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
            if self._attribution is not None:
                await self._attribution.close()
        log.info("agent stopped", **self._summary())
        return self.stats

    def _summary(self) -> dict[str, int]:
        s = self.stats
        return {
            "rounds": s.rounds,
            "published": s.published,
            "device_failures": s.device_failures,
            "rate_limited": s.rate_limited,
            "dropped": s.dropped,
            "invalid": s.invalid,
        }

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once on :meth:`stop`."""
        if seconds > 0 and not self._stop.is_set():
            with suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._stop.wait()

    async def _rounds(self, producer: KafkaProducer) -> None:
        interval = self.settings.interval_s
        next_at = self._clock()
        while not self._stop.is_set():
            await self.round(producer)
            next_at += interval
            now = self._clock()
            if next_at < now:  # overran: skip the missed ticks, no catch-up burst
                next_at = now + interval
            await self._sleep(next_at - now)

    async def _follow_mig(self, mig: MigWatch) -> None:
        """Release or re-initialise NVML as soon as the node's MIG state changes."""
        while True:
            await mig.changed()
            async with self._nvml_lock:
                await self._sync_nvml()

    async def _sync_nvml(self) -> bool:
        """Bring NVML in line with the node's MIG state; True when it may be read now."""
        release = self._mig is not None and self._mig.release
        state = self._mig.state if self._mig is not None else None
        if release and self._reader.is_open:
            await asyncio.to_thread(self._reader.close)
            self.stats.nvml_releases += 1
            log.info("NVML released: the MIG manager is reconfiguring this node", state=state)
        elif not release and not self._reader.is_open:
            try:
                await asyncio.to_thread(self._reader.open)
            except NvmlUnavailable as exc:
                log.warning("NVML not available again yet", state=state, error=str(exc))
            else:
                log.info("NVML initialised again", state=state)
        self.stats.nvml_held = self._reader.is_open
        return self._reader.is_open

    async def round(self, producer: KafkaProducer) -> None:
        """Sample, build and publish once (public for tests that drive rounds by hand)."""
        self.stats.rounds += 1
        async with self._nvml_lock:
            if self._mig is not None and not await self._sync_nvml():
                self.stats.released_rounds += 1
                return
            sample = await asyncio.to_thread(self._reader.read)
        self._note_failures(sample)
        owners = await self._attribution.owners() if self._attribution is not None else {}
        outgoing, no_util = to_events(
            sample,
            node=self.settings.node,
            ts=self._wall(),
            owners=owners,
            mig_util=self.settings.mig_util,
        )
        self.stats.mig_util_unavailable += no_util
        messages = self._encode(outgoing)
        if not messages:
            return
        if self._clock() < self._resume_at:
            self.stats.dropped += len(messages)
            return
        shift = self.stats.rounds % len(messages)  # fairness under a tight rate limit
        messages = messages[shift:] + messages[:shift]
        granted = self._bucket.take(len(messages))
        limited = granted < len(messages)
        if limited:
            self.stats.rate_limited += len(messages) - granted
            messages = messages[:granted]
        if limited != self._limited:  # log transitions, not every round
            self._limited = limited
            if limited:
                log.warning(
                    "rate limit reached; dropping the excess (raise --max-rate or --interval)",
                    offered=len(outgoing),
                    max_rate=self.settings.max_rate,
                )
            else:
                log.info("rate limit no longer reached")
        if messages:
            await self._publish(producer, messages)

    def _note_failures(self, sample: Sample) -> None:
        failing: set[str] = set()
        for failure in sample.failures:
            where = str(failure.index)
            if failure.mig_index is not None:
                where += f"/mig{failure.mig_index}"
            failing.add(where)
            self.stats.device_failures += 1
            self.stats.failures_by_device[where] += 1
            if where not in self._failing:  # log transitions, not every round
                log.warning("device unreadable; skipped", device=where, error=failure.reason)
        for where in self._failing - failing:
            log.info("device readable again", device=where)
        self._failing = failing

    def _encode(self, outgoing: Sequence[Outgoing]) -> list[tuple[bytes, bytes]]:
        """``(value, util source)`` for each event the controller would accept."""
        messages: list[tuple[bytes, bytes]] = []
        for item in outgoing:
            raw = encode_event(item.event)
            checked = self._decoder.decode(raw, now=self._wall())
            if isinstance(checked, Rejection):
                self.stats.invalid += 1
                log.error("invalid event not sent", reason=str(checked), gpu=str(item.event.gpu))
                continue
            messages.append((raw, item.util_source.encode()))
        return messages

    async def _publish(self, producer: KafkaProducer, messages: list[tuple[bytes, bytes]]) -> None:
        settings = self.settings
        key = settings.node.encode()
        timeout = settings.publish_timeout_s or max(1.0, min(settings.interval_s, 10.0))
        sends = [
            producer.send_and_wait(
                settings.topic, value, key=key, headers=[(UTIL_SOURCE_HEADER, source)]
            )
            for value, source in messages
        ]
        try:
            async with asyncio.timeout(timeout):
                results = await asyncio.gather(*sends, return_exceptions=True)
        except TimeoutError:
            results = [TimeoutError(f"no acknowledgement within {timeout:g}s")] * len(messages)
        errors = [r for r in results if isinstance(r, BaseException)]
        self.stats.published += len(messages) - len(errors)
        if not errors:
            if self._resume_at:
                log.info("broker available again")
            self._delay, self._resume_at = settings.backoff_s[0], 0.0
            return
        self.stats.publish_errors += 1
        self.stats.dropped += len(errors)
        self._resume_at = self._clock() + self._delay
        log.warning(
            "publishing failed; backing off",
            failed=len(errors),
            error=repr(errors[0]),
            retry_in_s=self._delay,
        )
        self._delay = min(self._delay * 2, settings.backoff_s[1])

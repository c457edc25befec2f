"""The scrape loop: every interval, read each inference server's ``/metrics`` over HTTP and
publish what changed as events.

One **round** per interval (rounds never overlap; an overrun skips the missed ticks): ask the
target source which servers there are (the pods of this node, or a fixed list), scrape them all
at once — at most ``concurrency`` in flight, each within ``timeout_s`` and ``max_bytes`` — turn
each scrape into events (:mod:`controller.agent.signals`), check every event with the
controller's own decoder, and send the round's events in one batch.

A server that times out, refuses the connection, answers an HTTP error, sends more than
``max_bytes`` or an exposition that does not parse is **counted by reason and skipped**: its
previous scrape is kept, so its next good scrape publishes the whole delta since the last good
one. Nothing a server sends can stop the loop. A broker that cannot take a round's events drops
them (counted): the next round's deltas cover the gap only for histograms and counters whose
baseline moved on, so counts are lost, not duplicated.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass, field

import aiohttp
import structlog

from controller.agent.exposition import BadExposition, parse_exposition
from controller.agent.servers.dcgm import gpu_events
from controller.agent.signals import PROCESS_START, SignalTracker, Target
from streams.events import (
    DEFAULT_TOPICS,
    GPU_UTILIZATION,
    INFERENCE_LATENCY,
    INFERENCE_LOAD,
    LOAD_TOPIC,
    AnyEvent,
    EventDecoder,
    GpuUtilization,
    InferenceLoad,
    Rejection,
    encode_event,
    event_key,
    event_type,
)
from streams.producer import KafkaProducer

__all__ = ["EventSender", "ScrapeSettings", "ScrapeStats", "Scraper", "SendStats", "TargetSource"]

log = structlog.get_logger("ebbtide.agent.scrape")

TargetSource = Callable[[], Awaitable[Sequence[Target]]]
"""Where the targets of a round come from (discovery, or a fixed list)."""


@dataclass(frozen=True, slots=True)
class ScrapeSettings:
    interval_s: float = 1.0
    timeout_s: float = 0.8
    """Per scrape; a slower server is counted as ``timeout`` and skipped this round."""
    max_bytes: int = 4 * 1024 * 1024
    """Larger answers are cut off and counted as ``too_large`` (vLLM's is ~30 KiB)."""
    max_samples: int = 100_000
    concurrency: int = 32
    topics: dict[str, str] = field(
        default_factory=lambda: {
            INFERENCE_LATENCY: DEFAULT_TOPICS[INFERENCE_LATENCY],
            INFERENCE_LOAD: LOAD_TOPIC,
            GPU_UTILIZATION: DEFAULT_TOPICS[GPU_UTILIZATION],
        }
    )
    publish_timeout_s: float = 5.0
    report_every_s: float = 60.0
    """How often a summary of the counts is logged."""


@dataclass(slots=True)
class SendStats:
    published: int = 0
    dropped: int = 0
    """Events not delivered (the broker did not acknowledge them)."""
    invalid: int = 0
    """Events the controller's decoder would refuse (not sent; a bug or a wild value)."""
    latency_events: int = 0
    load_events: int = 0
    gpu_events: int = 0


@dataclass(slots=True)
class ScrapeStats(SendStats):
    rounds: int = 0
    scrapes: int = 0
    """Scrapes that returned a usable exposition."""
    failures: Counter[str] = field(default_factory=Counter)
    """Scrapes that did not, by reason: timeout, unreachable, http_<status>, too_large,
    malformed, discovery."""


class EventSender:
    """Checks events with the controller's own decoder (so nothing goes out that it would
    dead-letter) and sends them, one batch at a time, to their topics."""

    def __init__(
        self,
        topics: dict[str, str],
        stats: SendStats,
        *,
        timeout_s: float = 5.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.stats = stats
        self._topics, self._timeout_s, self._wall = topics, timeout_s, wall
        self._decoder = EventDecoder(load=True)

    async def send(self, producer: KafkaProducer, events: Iterable[AnyEvent]) -> None:
        messages: list[tuple[str, bytes, bytes]] = []
        for event in events:
            raw = encode_event(event)
            checked = self._decoder.decode_any(raw, now=self._wall())
            if isinstance(checked, Rejection):
                self.stats.invalid += 1
                log.error("invalid event not sent", reason=str(checked), key=event.key)
                continue
            if isinstance(event, InferenceLoad):
                self.stats.load_events += 1
            elif isinstance(event, GpuUtilization):
                self.stats.gpu_events += 1
            else:
                self.stats.latency_events += 1
            messages.append((self._topics[event_type(event)], event_key(event), raw))
        if not messages:
            return
        sends = [producer.send_and_wait(topic, raw, key=key) for topic, key, raw in messages]
        try:
            async with asyncio.timeout(self._timeout_s):
                results = await asyncio.gather(*sends, return_exceptions=True)
        except TimeoutError:
            results = [TimeoutError("no acknowledgement")] * len(messages)
        errors = [r for r in results if isinstance(r, BaseException)]
        self.stats.published += len(messages) - len(errors)
        if errors:
            self.stats.dropped += len(errors)
            log.warning("publishing events failed", failed=len(errors), error=repr(errors[0]))


class Scraper:
    """Scrape the targets of ``targets`` every interval and publish through ``producer``."""

    def __init__(
        self,
        settings: ScrapeSettings,
        targets: TargetSource,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.stats = ScrapeStats()
        self.tracker = SignalTracker()
        self._targets = targets
        self._clock, self._wall = clock, wall
        self._sender = EventSender(
            settings.topics, self.stats, timeout_s=settings.publish_timeout_s, wall=wall
        )
        self._stop = asyncio.Event()
        self._failing: dict[str, str] = {}
        self._reported_at = clock()

    def stop(self) -> None:
        self._stop.set()

    async def serve(
        self, connect: Callable[[], AbstractAsyncContextManager[KafkaProducer]]
    ) -> ScrapeStats:
        """Rounds until :meth:`stop`, connecting to the broker with ``connect`` and retrying
        with backoff (1 s doubling to 30 s) while it cannot be reached."""
        delay = 1.0
        while not self._stop.is_set():
            try:
                async with connect() as producer:
                    delay = 1.0
                    await self.run(producer)
            except ConnectionError as exc:
                log.warning("broker unreachable", error=str(exc), retry_in_s=delay)
                with suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._stop.wait()
                delay = min(delay * 2, 30.0)
        return self.stats

    async def run(self, producer: KafkaProducer) -> ScrapeStats:
        """Rounds until :meth:`stop`."""
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.settings.concurrency)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            interval = self.settings.interval_s
            next_at = self._clock()
            while not self._stop.is_set():
                await self.round(session, producer)
                next_at += interval
                now = self._clock()
                if next_at < now:
                    next_at = now + interval
                with suppress(TimeoutError):
                    async with asyncio.timeout(next_at - now):
                        await self._stop.wait()
        return self.stats

    async def round(self, session: aiohttp.ClientSession, producer: KafkaProducer) -> None:
        """Scrape every target once and publish (public for tests that drive rounds)."""
        self.stats.rounds += 1
        try:
            targets = list(await self._targets())
        except Exception as exc:  # discovery failing must not stop scraping for good
            self.stats.failures["discovery"] += 1
            log.warning("listing scrape targets failed; retrying next round", error=str(exc))
            return
        urls = {t.url for t in targets}
        self.tracker.forget(urls)
        self._failing = {url: why for url, why in self._failing.items() if url in urls}
        gate = asyncio.Semaphore(self.settings.concurrency)
        results = await asyncio.gather(*(self._scrape(session, t, gate) for t in targets))
        await self._sender.send(producer, (event for events in results for event in events))
        if self._clock() - self._reported_at >= self.settings.report_every_s:
            self._report(len(targets))

    def _report(self, targets: int) -> None:
        """One line with the running counts, so that what was skipped and why is visible
        without a metrics endpoint (failures are otherwise logged only when they change)."""
        self._reported_at = self._clock()
        s, t = self.stats, self.tracker.stats
        log.info(
            "scrape summary",
            targets=targets,
            rounds=s.rounds,
            scrapes=s.scrapes,
            failures=dict(s.failures),
            published=s.published,
            dropped=s.dropped,
            invalid=s.invalid,
            resets=t.resets,
            bounds_changed=t.bounds_changed,
            histogram_problems=sum(t.problems.values()),
        )

    async def _scrape(
        self, session: aiohttp.ClientSession, target: Target, gate: asyncio.Semaphore
    ) -> Sequence[AnyEvent]:
        async with gate:
            text = await self._fetch(session, target)
        if text is None:
            return []
        kind = target.kind
        expo = parse_exposition(
            text,
            histograms=kind.histogram_names(),
            values=kind.value_names() | {PROCESS_START},
            max_samples=self.settings.max_samples,
        )
        if isinstance(expo, BadExposition):
            self._fail(target, "malformed", expo.reason)
            return []
        for problem in expo.problems:
            self.tracker.stats.note(problem)
        self.stats.scrapes += 1
        if self._failing.pop(target.url, None) is not None:
            log.info("scrape target answering again", url=target.url, service=target.service)
        if kind.role == "gpu":
            readings, unreadable = gpu_events(expo, node=target.node, ts=self._wall())
            if unreadable:
                self.tracker.stats.note(f"{kind.name}: series without gpu or node", unreadable)
            return readings
        return self.tracker.events(target, expo, ts=self._wall(), now=self._clock())

    async def _fetch(self, session: aiohttp.ClientSession, target: Target) -> str | None:
        limit = self.settings.max_bytes
        try:
            async with session.get(target.url, headers={"Accept": "text/plain"}) as resp:
                if resp.status != 200:
                    self._fail(target, f"http_{resp.status}", resp.reason or "")
                    return None
                if resp.content_length is not None and resp.content_length > limit:
                    self._fail(target, "too_large", f"{resp.content_length} bytes announced")
                    return None
                # One read returns what has arrived, not the whole answer: read to the end,
                # stopping as soon as the answer passes the cap.
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    size += len(chunk)
                    if size > limit:
                        break
                    chunks.append(chunk)
                body = b"".join(chunks)
        except TimeoutError:
            self._fail(target, "timeout", f"no answer within {self.settings.timeout_s:g}s")
            return None
        except (aiohttp.ClientError, OSError) as exc:
            self._fail(target, "unreachable", str(exc) or type(exc).__name__)
            return None
        if size > limit:
            self._fail(target, "too_large", f"more than {limit} bytes")
            return None
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            self._fail(target, "malformed", f"not UTF-8 at byte {exc.start}")
            return None

    def _fail(self, target: Target, reason: str, detail: str) -> None:
        self.stats.failures[reason] += 1
        if self._failing.get(target.url) != reason:  # log transitions, not every round
            self._failing[target.url] = reason
            log.warning(
                "scrape failed; skipped",
                url=target.url,
                service=f"{target.namespace}/{target.service}",
                reason=reason,
                detail=detail,
            )

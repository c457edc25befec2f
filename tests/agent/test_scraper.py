"""The scrape loop over real HTTP: a vLLM exposition (prometheus_client, vLLM's declarations)
served by a real web server, beside servers that answer garbage, hang, fail or are gone; the
events go through the embedded broker and are read back with the controller's decoder."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from aiokafka import AIOKafkaConsumer
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from agent.expositions import Vllm, vllm
from controller.agent.scraper import Scraper, ScrapeSettings
from controller.agent.servers import BUILTIN
from controller.agent.signals import Target
from streams.broker import free_port
from streams.connection import KafkaConfig, ensure_topics
from streams.events import (
    INFERENCE_LATENCY,
    INFERENCE_LOAD,
    EventDecoder,
    InferenceLatency,
    InferenceLoad,
)
from streams.producer import KafkaProducer


@dataclass
class Servers:
    base: str
    server: Vllm
    release: asyncio.Event


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    v = vllm()
    release = asyncio.Event()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(v.registry), content_type="text/plain")

    async def garbage(_: web.Request) -> web.Response:
        return web.Response(text="<html><body>502 Bad Gateway</body></html>")

    async def hang(_: web.Request) -> web.Response:
        await release.wait()  # never answers while the test runs
        return web.Response(text="")

    async def huge(_: web.Request) -> web.Response:
        return web.Response(text="# " + "x" * 40_000 + "\n")

    async def missing(_: web.Request) -> web.Response:
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/garbage", garbage)
    app.router.add_get("/hang", hang)
    app.router.add_get("/huge", huge)
    app.router.add_get("/missing", missing)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield Servers(f"http://127.0.0.1:{port}", v, release)
    finally:
        release.set()
        await runner.cleanup()


async def read_events(config: KafkaConfig, topics: dict[str, str], expect: int) -> list[object]:
    decoder = EventDecoder(load=True)
    consumer = AIOKafkaConsumer(
        *topics.values(), **config.client_kwargs(), auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    out: list[object] = []
    try:
        async with asyncio.timeout(30):
            while len(out) < expect:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for record in records:
                        out.append(decoder.decode_any(record.value, now=1e12, topic=record.topic))
    finally:
        await consumer.stop()
    return out


async def test_scrape_rounds_publish_deltas_and_skip_bad_servers(
    servers: Servers, kafka_config: KafkaConfig
) -> None:
    suffix = uuid.uuid4().hex[:8]
    topics = {INFERENCE_LATENCY: f"lat-{suffix}", INFERENCE_LOAD: f"load-{suffix}"}
    await ensure_topics(kafka_config, list(topics.values()), partitions=1)
    kind = BUILTIN["vllm"]

    def target(path: str, service: str) -> Target:
        return Target(url=servers.base + path, kind=kind, service=service, namespace="prod")

    targets = [
        target("/metrics", "chat"),
        target("/garbage", "g"),
        target("/hang", "h"),
        target("/huge", "big"),
        target("/missing", "m"),
        Target(url=f"http://127.0.0.1:{free_port()}/metrics", kind=kind, service="gone"),
    ]

    async def source() -> list[Target]:
        return targets

    settings = ScrapeSettings(interval_s=1.0, timeout_s=0.5, max_bytes=32_768, topics=topics)
    scraper = Scraper(settings, source)
    async with (
        KafkaProducer(kafka_config) as producer,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=settings.timeout_s)) as session,
    ):
        await scraper.round(session, producer)  # baseline: load gauges only
        for _ in range(3):
            servers.server.serve(e2e_s=0.9, ttft_s=0.05, tpot_s=0.03, tokens=20)
        servers.server.waiting.labels("tiny-llama", "0").set(6)
        await scraper.round(session, producer)

    stats = scraper.stats
    assert stats.rounds == 2
    assert stats.scrapes == 2
    assert stats.failures == {
        "malformed": 2, "timeout": 2, "too_large": 2, "http_404": 2, "unreachable": 2
    }  # fmt: skip
    assert stats.invalid == 0
    assert stats.dropped == 0
    assert (stats.latency_events, stats.load_events) == (3, 2)

    events = await read_events(kafka_config, topics, expect=5)
    latency = [e for e in events if isinstance(e, InferenceLatency)]
    assert sorted(e.objective for e in latency) == ["e2e", "tpot", "ttft"]
    e2e = next(e for e in latency if e.objective == "e2e")
    assert e2e.key == "prod/chat"
    assert e2e.histogram is not None
    assert e2e.histogram.counts[e2e.histogram.bounds_ms.index(1000.0)] == 3  # 0.9 s: (0.8, 1]
    loads = [e for e in events if isinstance(e, InferenceLoad)]
    assert [e.waiting for e in loads] == [0.0, 6.0]


async def test_a_large_exposition_is_read_whole(kafka_config: KafkaConfig) -> None:
    """An answer larger than one network read (streamed in chunks, ~600 KiB) is read to its
    end: every series is there (a single read returned only its first chunk)."""
    lines = ["# TYPE vllm:num_requests_waiting gauge"]
    lines += [
        f'vllm:num_requests_waiting{{model_name="m{i:05d}",engine="0"}} 1' for i in range(12_000)
    ]
    body = ("\n".join(lines) + "\n").encode()

    async def metrics(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        for i in range(0, len(body), 8192):
            await resp.write(body[i : i + 8192])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    target = Target(url=f"http://127.0.0.1:{port}/metrics", kind=BUILTIN["vllm"], service="chat")

    async def source() -> list[Target]:
        return [target]

    suffix = uuid.uuid4().hex[:8]
    topics = {INFERENCE_LATENCY: f"lat-{suffix}", INFERENCE_LOAD: f"load-{suffix}"}
    await ensure_topics(kafka_config, list(topics.values()), partitions=1)
    scraper = Scraper(ScrapeSettings(timeout_s=10, topics=topics), source)
    try:
        async with KafkaProducer(kafka_config) as producer, aiohttp.ClientSession() as session:
            await scraper.round(session, producer)
    finally:
        await runner.cleanup()
    assert scraper.stats.failures == {}
    (event,) = await read_events(kafka_config, topics, expect=1)
    assert isinstance(event, InferenceLoad)
    assert event.waiting == 12_000.0


async def test_the_scraper_logs_its_counts_every_report_interval() -> None:
    """Failures are logged when they change; the counts by reason come in a summary line once
    per report interval (no metrics endpoint needed to see what is skipped)."""
    now = [0.0]
    target = Target(
        url=f"http://127.0.0.1:{free_port()}/metrics", kind=BUILTIN["vllm"], service="s"
    )

    async def source() -> list[Target]:
        return [target]

    scraper = Scraper(
        ScrapeSettings(timeout_s=1.0, report_every_s=60.0), source, clock=lambda: now[0]
    )
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            await scraper.round(session, None)  # type: ignore[arg-type]  # nothing to publish
            now[0] = 61.0
            await scraper.round(session, None)  # type: ignore[arg-type]
    summaries = [entry for entry in logs if entry["event"] == "scrape summary"]
    assert len(summaries) == 1
    assert summaries[0]["failures"] == {"unreachable": 2}
    assert [e["event"] for e in logs].count("scrape failed; skipped") == 1  # one transition

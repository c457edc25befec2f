"""The scraper and the OTLP bridge (issue 25), each beside a peer measured in the same run.

``scrape``: 8 vLLM expositions (prometheus_client, vLLM's declarations, 2 engines each, fresh
observations on every request) served by a separate process, so this process's CPU is the
scraper's alone. Rounds alternate between
  (a) fetch only: GET the 8 ``/metrics`` concurrently and read the bodies (the HTTP floor);
  (b) the scraper's round: fetch, parse, deltas, validate, publish to the embedded broker and
      wait for the acknowledgements.
Per round: wall time from the start of the scrape to the last event acknowledged (the
scrape-to-event latency) and CPU time of this process; at one round per second the CPU time
per round is the fraction of a core the agent needs. Memory: RSS of this process.

``otlp``: M OTLP messages built by the OpenTelemetry SDK's own encoder (vLLM metrics of 50
pods) in one topic, read alternately by
  (a) a raw aiokafka consumer that does nothing with them (the ceiling);
  (b) the bridge path: consume, decode (``streams.otlp``), translate to events
      (``controller.agent.otlpbridge``); the events are counted, not produced.

Medians are printed with their ratios. Usage:
``python benchmarks/scraping.py scrape --rounds 60`` and
``python benchmarks/scraping.py otlp --messages 20000 --runs 3``.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
from aiokafka import AIOKafkaConsumer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


from controller.agent.otlpbridge import OtlpTranslator  # noqa: E402
from controller.agent.scraper import Scraper, ScrapeSettings  # noqa: E402
from controller.agent.servers import BUILTIN  # noqa: E402
from controller.agent.signals import Target  # noqa: E402
from streams.broker import EmbeddedBroker, free_port  # noqa: E402
from streams.connection import KafkaConfig, ensure_topics  # noqa: E402
from streams.events import INFERENCE_LATENCY, INFERENCE_LOAD  # noqa: E402
from streams.otlp import OtlpBatch, decode_otlp  # noqa: E402
from streams.producer import KafkaProducer  # noqa: E402

SERVERS = 8

SERVE = """
import random, sys
from aiohttp import web
from prometheus_client import generate_latest
sys.path.insert(0, sys.argv[1])
from agent.expositions import vllm
ports = [int(p) for p in sys.argv[2:]]
async def main():
    runners = []
    for port in ports:
        v = vllm(engines=2)
        async def metrics(_, v=v):
            for _ in range(20):
                e = str(random.randint(0, 1))
                u = random.uniform
                v.serve(u(0.2, 4), u(0.01, 0.5), u(0.01, 0.1), 40, engine=e)
            v.waiting.labels("tiny-llama", "0").set(random.randint(0, 9))
            return web.Response(body=generate_latest(v.registry), content_type="text/plain")
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    print("ready", flush=True)
    import asyncio
    await asyncio.Event().wait()
import asyncio
asyncio.run(main())
"""


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_scrape(rounds: int) -> None:
    ports = [free_port() for _ in range(SERVERS)]
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(ROOT / "tests"), *map(str, ports)],
        stdout=subprocess.PIPE,
    )
    assert server.stdout is not None
    assert server.stdout.readline().strip() == b"ready"
    try:
        asyncio.run(scrape_rounds(ports, rounds))
    finally:
        server.terminate()
        server.wait()


async def scrape_rounds(ports: list[int], rounds: int) -> None:
    rss_before = rss_mib()
    with EmbeddedBroker() as broker:
        config = KafkaConfig(bootstrap=broker.bootstrap)
        topics = {INFERENCE_LATENCY: "bench.lat", INFERENCE_LOAD: "bench.load"}
        await ensure_topics(config, list(topics.values()), partitions=1)
        targets = [
            Target(url=f"http://127.0.0.1:{p}/metrics", kind=BUILTIN["vllm"], service=f"s{i}")
            for i, p in enumerate(ports)
        ]

        async def source() -> list[Target]:
            return targets

        scraper = Scraper(ScrapeSettings(topics=topics), source)
        fetch_wall, fetch_cpu, scrape_wall, scrape_cpu = [], [], [], []
        async with (
            KafkaProducer(config, linger_ms=20) as producer,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        ):
            await scraper.round(session, producer)  # baselines

            async def fetch(url: str) -> int:
                async with session.get(url) as resp:
                    return len(await resp.read())

            for _ in range(rounds):
                c0, w0 = time.process_time(), time.perf_counter()
                await asyncio.gather(*(fetch(t.url) for t in targets))
                fetch_wall.append(time.perf_counter() - w0)
                fetch_cpu.append(time.process_time() - c0)
                c0, w0 = time.process_time(), time.perf_counter()
                await scraper.round(session, producer)
                scrape_wall.append(time.perf_counter() - w0)
                scrape_cpu.append(time.process_time() - c0)
        stats = scraper.stats
    fw, fc = statistics.median(fetch_wall), statistics.median(fetch_cpu)
    sw, sc = statistics.median(scrape_wall), statistics.median(scrape_cpu)
    print(f"{SERVERS} vLLM servers, {rounds} rounds each; medians per round")
    print(f"  (a) fetch only:       wall {fw * 1000:7.1f} ms   cpu {fc * 1000:6.1f} ms")
    print(f"  (b) scrape→events:    wall {sw * 1000:7.1f} ms   cpu {sc * 1000:6.1f} ms"
          f"   ({stats.latency_events + stats.load_events} events, {stats.dropped} dropped, "
          f"{sum(stats.failures.values())} failed scrapes)")  # fmt: skip
    print(f"  ratio b/a:            wall {sw / fw:7.2f}x     cpu {sc / fc:6.2f}x")
    print(
        f"  at 1 s per round: {sc * 100:.1f} % of one core; RSS {rss_mib():.0f} MiB "
        f"(before the scraper {rss_before:.0f} MiB)"
    )


def otlp_messages(count: int) -> list[bytes]:
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource

    from agent.expositions import otel_views

    pods = []
    for i in range(50):
        reader = InMemoryMetricReader()
        views = otel_views()
        resource_ = Resource.create({"service.name": f"svc-{i % 10}", "k8s.pod.name": f"p{i}"})
        provider = MeterProvider(resource=resource_, metric_readers=[reader], views=views)
        meter = provider.get_meter("bench")
        pods.append((reader, meter.create_histogram("e2e"), meter.create_histogram("ttft"),
                     meter.create_counter("tokens")))  # fmt: skip
    out = []
    for n in range(count):
        reader, e2e, ttft, tokens = pods[n % len(pods)]
        for k in range(5):
            e2e.record(0.3 + k * 0.7)
            ttft.record(0.02 + k * 0.05)
            tokens.add(40)
        data = reader.get_metrics_data()
        assert data is not None
        out.append(encode_metrics(data).SerializeToString())
    return out


async def bench_otlp(count: int, runs: int) -> None:
    messages = otlp_messages(count)
    topic = f"bench.otlp.{uuid.uuid4().hex[:6]}"
    with EmbeddedBroker() as broker:
        config = KafkaConfig(bootstrap=broker.bootstrap)
        await ensure_topics(config, [topic], partitions=1)
        async with KafkaProducer(config, linger_ms=20) as producer:
            for raw in messages:
                await producer.send(topic, raw)
            await producer.flush()

        async def read(path: bool) -> tuple[float, int]:
            consumer = AIOKafkaConsumer(
                **config.client_kwargs(), enable_auto_commit=False,
                max_partition_fetch_bytes=4 << 20,
            )  # fmt: skip
            await consumer.start()
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            translator = OtlpTranslator(BUILTIN)
            seen = events = 0
            started = time.perf_counter()
            while seen < count:
                for records in (await consumer.getmany(timeout_ms=200, max_records=2000)).values():
                    seen += len(records)
                    if path:
                        for record in records:
                            batch = decode_otlp(record.value, "otlp_proto")
                            assert isinstance(batch, OtlpBatch)
                            events += len(translator.events(batch))
            elapsed = time.perf_counter() - started
            await consumer.stop()
            return count / elapsed, events

        raw_rates, path_rates, event_rates = [], [], []
        for _ in range(runs):
            rate, _ = await read(False)
            raw_rates.append(rate)
            rate, events = await read(True)
            path_rates.append(rate)
            event_rates.append(rate * events / count)
    r, p, e = (statistics.median(x) for x in (raw_rates, path_rates, event_rates))
    print(f"{count} OTLP messages (SDK-encoded, vLLM metrics of 50 pods), {runs} runs; medians")
    print(f"  (a) raw consumption:  {r:9.0f} msg/s")
    print(f"  (b) bridge path:      {p:9.0f} msg/s   {e:9.0f} events/s")
    print(f"  ratio b/a:            {p / r:9.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("scrape")
    s.add_argument("--rounds", type=int, default=60)
    o = sub.add_parser("otlp")
    o.add_argument("--messages", type=int, default=20_000)
    o.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.what == "scrape":
        bench_scrape(args.rounds)
    else:
        asyncio.run(bench_otlp(args.messages, args.runs))


if __name__ == "__main__":
    main()

"""Commands for streams: ``broker``, ``record``, ``publish``, ``events schema`` and ``demo``."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from pathlib import Path

import click

from controller.cli.runner import run_async
from streams.broker import EmbeddedBroker
from streams.capture import publish as publish_recording
from streams.capture import record as record_topics
from streams.connection import KafkaConfig, ensure_topics
from streams.consumer import Batch, ConsumerSettings, EventConsumer
from streams.events import DEFAULT_TOPICS, InferenceLatency, event_schema
from streams.producer import DEAD_LETTER_TOPIC, DeadLetter, KafkaProducer

__all__ = ["COMMANDS"]

ALL_TOPICS = (*DEFAULT_TOPICS.values(), DEAD_LETTER_TOPIC)
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-events.jsonl"

bootstrap_option = click.option(
    "--bootstrap",
    envvar="EBBTIDE_KAFKA_BOOTSTRAP",
    required=True,
    metavar="HOST:PORT",
    help="Kafka bootstrap servers (comma-separated).",
)


@click.command()
@click.option("--port", type=int, default=9092, help="Port on 127.0.0.1 (0: any free port).")
@click.option("--partitions", type=int, default=4, help="Partitions of each Ebbtide topic.")
def broker(port: int, partitions: int) -> None:
    """Run the embedded Kafka-protocol broker (tansu) with Ebbtide's topics until Ctrl-C."""

    async def serve() -> None:
        with EmbeddedBroker(port=port) as b:
            await ensure_topics(KafkaConfig(b.bootstrap), list(ALL_TOPICS), partitions=partitions)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            click.echo(b.bootstrap)
            await stop.wait()

    run_async(serve())


@click.command()
@bootstrap_option
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--topics", default=",".join(ALL_TOPICS), help="Comma-separated topics.")
@click.option("--max-events", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option("--duration", type=click.FloatRange(min=0), help="Stop after this many seconds.")
@click.option("--idle", type=click.FloatRange(min=0), help="Stop once quiet for this long (s).")
@click.option("--from-beginning/--from-end", default=True, help="Start at the oldest message.")
def record(
    bootstrap: str,
    out: Path,
    topics: str,
    max_events: int | None,
    duration: float | None,
    idle: float | None,
    from_beginning: bool,
) -> None:
    """Capture Kafka topics to a recording (JSON Lines; gzip if OUT ends in .gz)."""
    count = run_async(
        record_topics(
            KafkaConfig(bootstrap),
            out,
            topics=[t for t in topics.split(",") if t],
            max_events=max_events,
            duration_s=duration,
            idle_s=idle,
            from_beginning=from_beginning,
        )
    )
    click.echo(f"recorded {count} messages to {out}")


@click.command()
@click.argument("recording", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@bootstrap_option
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=1.0,
              help="Scale inter-arrival times: 10 plays ten times faster.")  # fmt: skip
@click.option("--as-fast-as-possible", is_flag=True, help="Ignore the recorded timing.")
def publish(recording: Path, bootstrap: str, speed: float, as_fast_as_possible: bool) -> None:
    """Play a recording back into Kafka, in per-key order, with its timing scaled."""
    config = KafkaConfig(bootstrap)
    result = run_async(
        publish_recording(config, recording, speed=None if as_fast_as_possible else speed)
    )
    click.echo(
        f"published {result.sent} messages in {result.seconds:.1f}s"
        + (f"; skipped {result.bad_lines} lines that are not records" if result.bad_lines else "")
    )


@click.command()
@click.option("--recording", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=SAMPLE, help="What to publish.")  # fmt: skip
def demo(recording: Path) -> None:
    """Start the embedded broker, publish a sample stream, consume and validate it."""

    async def run() -> None:
        with EmbeddedBroker(port=0) as b:
            config = KafkaConfig(b.bootstrap)
            await ensure_topics(config, list(ALL_TOPICS), partitions=2)
            click.echo(f"embedded broker at {b.bootstrap}")
            published = await publish_recording(config, recording, speed=None)
            click.echo(f"published {published.sent} messages from {recording}")
            services: Counter[str] = Counter()

            async def count(batch: Batch) -> None:
                for event in batch.events:
                    if isinstance(event, InferenceLatency):
                        services[event.key] += 1

            async with KafkaProducer(config) as producer:
                consumer = EventConsumer(
                    config,
                    count,
                    settings=ConsumerSettings(
                        group_id="ebbtide-demo", session_timeout_ms=2000, heartbeat_interval_ms=500
                    ),
                    dead_letter=DeadLetter(producer),
                )
                task = asyncio.create_task(consumer.run())
                deadline = time.monotonic() + 30
                while sum(consumer.stats.consumed.values()) < published.sent:
                    if time.monotonic() > deadline or task.done():
                        break
                    await asyncio.sleep(0.05)
                consumer.stop()
                await task
            stats = consumer.stats
            click.echo(
                f"consumed {sum(stats.consumed.values())}: "
                f"accepted {sum(stats.accepted.values())}, "
                f"rejected {sum(stats.rejected.values())} (sent to {DEAD_LETTER_TOPIC})"
            )
            for (topic, code), n in sorted(stats.rejected.items()):
                click.echo(f"  rejected {n} on {topic}: {code}")
            for key, n in sorted(services.items()):
                click.echo(f"  {key}: {n} latency events")

    run_async(run())


@click.group()
def events() -> None:
    """The event wire format."""


@events.command("schema")
def events_schema() -> None:
    """Print the JSON Schema of wire format v1, for producers to validate against."""
    click.echo(json.dumps(event_schema(), indent=2, sort_keys=True))


COMMANDS = [broker, record, publish, demo, events]

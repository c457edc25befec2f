"""Commands for streams: ``broker``, ``record``, ``publish``, ``events schema`` and ``demo``."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import click

from controller.cli.asyncrun import run_async, stop_on_signals
from controller.cli.options import bootstrap_option, kafka_settings, progress, stderr_is_terminal
from streams import prometheus as prom
from streams.broker import EmbeddedBroker
from streams.capture import PublishResult
from streams.capture import publish as publish_recording
from streams.capture import record as record_topics
from streams.connection import KafkaConfig, ensure_topics
from streams.consumer import Batch, ConsumerSettings, EventConsumer
from streams.events import DEFAULT_TOPICS, InferenceLatency, event_schema
from streams.producer import DEAD_LETTER_TOPIC, DeadLetter, KafkaProducer
from streams.recording import BadLine, read_recording
from streams.stream_errors import RecordingError

__all__ = ["COMMANDS"]

ALL_TOPICS = (*DEFAULT_TOPICS.values(), DEAD_LETTER_TOPIC)
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-events.jsonl"


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=9092,
              help="Port on 127.0.0.1 (0: any free port).")  # fmt: skip
@click.option("--partitions", type=int, default=4, help="Partitions of each Ebbtide topic.")
def broker(port: int, partitions: int) -> None:
    """Run the embedded Kafka-protocol broker (tansu) with Ebbtide's topics until Ctrl-C."""

    async def serve() -> None:
        with EmbeddedBroker(port=port) as b:
            await ensure_topics(KafkaConfig(b.bootstrap), list(ALL_TOPICS), partitions=partitions)
            stop = stop_on_signals()
            click.echo(b.bootstrap)
            await stop.wait()

    run_async(serve())


@click.command()
@bootstrap_option(required=False)
@click.option("--from-prometheus", "prometheus", metavar="URL",
              help="Record from Prometheus history instead of Kafka.")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--topics", default=",".join(ALL_TOPICS), help="Kafka: comma-separated topics.")
@click.option("--max-events", type=click.IntRange(min=1), help="Kafka: stop after N messages.")
@click.option("--duration", type=click.FloatRange(min=0), help="Kafka: stop after S seconds.")
@click.option("--idle", type=click.FloatRange(min=0), help="Kafka: stop once quiet for S s.")
@click.option("--from-beginning/--from-end", default=True,
              help="Kafka: start at the oldest message.")  # fmt: skip
@click.option("--query", "queries", multiple=True, metavar="KIND=PROMQL",
              help="Prometheus: latency=…, latency[ms]=… or gpu=… (repeatable). For latency "
              "histograms: sum by (le, service, namespace) (increase(x_bucket[1m])).")  # fmt: skip
@click.option("--start", default="now-1h", help="Prometheus: RFC 3339, epoch or now-1h.")
@click.option("--end", default="now", help="Prometheus: RFC 3339, epoch or now.")
@click.option("--step", default="15s", help="Prometheus: resolution of the range query.")
def record(
    bootstrap: str | None,
    prometheus: str | None,
    out: Path,
    topics: str,
    max_events: int | None,
    duration: float | None,
    idle: float | None,
    from_beginning: bool,
    queries: tuple[str, ...],
    start: str,
    end: str,
    step: str,
) -> None:
    """Capture Kafka topics, or Prometheus history, to a recording (gzip if OUT ends in .gz).

    Ctrl-C or SIGTERM stops a Kafka capture cleanly: the file is closed valid and complete."""
    if (bootstrap is None) == (prometheus is None):
        raise click.UsageError("give exactly one of --bootstrap and --from-prometheus")
    if prometheus is not None:
        count = _record_prometheus(prometheus, out, queries, start=start, end=end, step=step)
    else:
        assert bootstrap is not None

        def started(partitions: int) -> None:
            click.echo(f"recording {partitions} partitions to {out}; Ctrl-C to stop", err=True)

        async def capture() -> int:
            return await record_topics(
                kafka_settings(bootstrap, client_id="ebbtide-record").connection(),
                out,
                topics=[t for t in topics.split(",") if t],
                max_events=max_events,
                duration_s=duration,
                idle_s=idle,
                from_beginning=from_beginning,
                on_started=started,
                stop=stop_on_signals(),
            )

        count = run_async(capture())
    click.echo(f"recorded {count} messages to {out}")


def _record_prometheus(
    url: str, out: Path, queries: tuple[str, ...], *, start: str, end: str, step: str
) -> int:
    if not queries:
        raise click.UsageError("--from-prometheus needs at least one --query")
    try:
        parsed = [prom.parse_query_option(q) for q in queries]
        now = datetime.now(UTC)
        begin, finish = prom.parse_time(start, now=now), prom.parse_time(end, now=now)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    result = run_async(prom.fetch_events(url, parsed, start=begin, end=finish, step=step))
    for reason, n in sorted(result.skipped.items()):
        click.echo(f"skipped {n} {reason}", err=True)
    return prom.write_events(result.events, out, prometheus=url, queries=list(queries))


@click.command()
@click.argument("recording", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@bootstrap_option(required=True)
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=1.0,
              help="Scale inter-arrival times: 10 plays ten times faster.")  # fmt: skip
@click.option("--as-fast-as-possible", is_flag=True, help="Ignore the recorded timing.")
@click.option("--retime", is_flag=True,
              help="Move event times to now (scaled by --speed), for live runs.")  # fmt: skip
def publish(
    recording: Path, bootstrap: str, speed: float, as_fast_as_possible: bool, retime: bool
) -> None:
    """Play a recording back into Kafka, in per-key order, with its timing scaled.

    Event times stay as recorded unless --retime; with --retime and a --speed above 1 a live
    controller, whose windows and cooldowns run on its own clock, sees the incident compressed
    and decides differently from `ebbtide replay` (see the README). On a terminal a progress
    bar shows the rate and the ETA."""
    config = kafka_settings(bootstrap, client_id="ebbtide-publish").connection()
    total = _count_records(recording) if stderr_is_terminal() else 0
    with progress(total, "publishing", "msg") as on_progress:

        async def play() -> PublishResult:
            return await publish_recording(
                config,
                recording,
                speed=None if as_fast_as_possible else speed,
                retime=retime,
                on_progress=on_progress,
                stop=stop_on_signals(),
            )

        result = run_async(play())
    click.echo(
        ("stopped: " if result.stopped else "")
        + f"published {result.sent} messages in {result.seconds:.1f}s"
        + (f"; skipped {result.bad_lines} lines that are not records" if result.bad_lines else "")
    )


def _count_records(recording: Path) -> int:
    """The records to publish, for the progress bar (a pass over the file: a damaged one is
    refused before anything is sent)."""
    try:
        return sum(1 for m in read_recording(recording) if not isinstance(m, BadLine))
    except RecordingError as exc:
        raise click.ClickException(f"{exc}; published nothing") from exc


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

"""``ebbtide scrape`` and ``ebbtide otlp-bridge``.

``ebbtide scrape``: the scraper on its own, for servers outside the node agent's reach (a
fixed list of URLs) or as a sidecar; the agent runs the same loop with ``--scrape-pods``.

Events go to the latency topic (``EBBTIDE_KAFKA__LATENCY_TOPIC``) and ``--load-topic``, with
the same Kafka security variables as ``ebbtide run``. SIGTERM and SIGINT finish the round in
progress and exit 0.

``ebbtide otlp-bridge``: the same events from OTLP metrics the OpenTelemetry Collector's Kafka
exporter writes (:mod:`streams.otlp`, :mod:`controller.agent.otlpbridge`).
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Sequence
from pathlib import Path

import click

from controller.agent.discovery import parse_match
from controller.agent.otlpbridge import OtlpTranslator
from controller.agent.scraper import (
    EventSender,
    Scraper,
    ScrapeSettings,
    ScrapeStats,
    SendStats,
    TargetSource,
)
from controller.agent.servers import KindsError, ServerKind, known_kinds
from controller.agent.signals import Target
from controller.cli.asyncrun import run_async
from controller.cli.options import bootstrap_option, duration_option, kafka_settings
from controller.process.settings import KafkaSettings
from streams.connection import KafkaConfig
from streams.events import GPU_UTILIZATION, INFERENCE_LATENCY, INFERENCE_LOAD, LOAD_TOPIC
from streams.otlp import Encoding, FollowStats, OtlpBatch, follow_otlp
from streams.producer import KafkaProducer

__all__ = [
    "COMMANDS",
    "bridge",
    "otlp_bridge",
    "parse_target",
    "scrape",
    "scrape_options",
    "serve_scraper",
]


def parse_target(text: str, kinds: dict[str, ServerKind]) -> Target:
    """``KIND:NAMESPACE/SERVICE=URL[#label=value,...]`` -> a :class:`Target`; ``ValueError``
    saying what is wrong."""
    head, sep, url = text.partition("=")
    kind_name, colon, service_key = head.partition(":")
    namespace, slash, service = service_key.partition("/")
    if not (sep and colon and slash and namespace and service and url):
        raise ValueError(f"{text!r}: expected KIND:NAMESPACE/SERVICE=URL")
    if kind_name not in kinds:
        raise ValueError(
            f"{text!r}: unknown server kind {kind_name!r} ({', '.join(sorted(kinds))})"
        )
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{text!r}: the URL must start with http:// or https://")
    url, _, match = url.partition("#")
    return Target(
        url=url,
        kind=kinds[kind_name],
        service=service,
        namespace=namespace,
        match=parse_match(match),
    )


server_kinds_option = click.option(
    "--server-kinds",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML file of more server kinds (docs/servers/custom.md).",
)
load_topic_option = click.option(
    "--load-topic", default=LOAD_TOPIC, show_default=True, help="Topic of inference.load events."
)


def scrape_options(fn: click.decorators.FC) -> click.decorators.FC:
    """The options the agent and ``ebbtide scrape`` share."""
    for option in reversed(
        [
            click.option("--scrape-interval", default="1s", callback=duration_option,
                         metavar="DURATION",
                         help="Time between scrapes of each server."),
            click.option("--scrape-timeout", default="800ms", callback=duration_option,
                         metavar="DURATION",
                         help="Per scrape; a slower server is counted and skipped that round."),
            server_kinds_option,
            load_topic_option,
        ]
    ):  # fmt: skip
        fn = option(fn)
    return fn


def load_kinds_or_fail(path: Path | None) -> dict[str, ServerKind]:
    try:
        return known_kinds(path)
    except KindsError as exc:
        raise click.ClickException(str(exc)) from exc


def scrape_settings(
    interval: float, timeout: float, kafka: KafkaSettings, load_topic: str
) -> ScrapeSettings:
    return ScrapeSettings(
        interval_s=interval,
        timeout_s=min(timeout, interval),
        topics={
            INFERENCE_LATENCY: kafka.latency_topic,
            INFERENCE_LOAD: load_topic,
            GPU_UTILIZATION: kafka.gpu_topic,
        },
    )


@click.command()
@bootstrap_option(required=True)
@click.option("--target", "targets", multiple=True, metavar="KIND:NAMESPACE/SERVICE=URL",
              help="A server to scrape, e.g. vllm:prod/chat=http://10.0.0.7:8000/metrics "
              "(append #model=a to read only some series); repeatable.")  # fmt: skip
@click.option("--discover/--no-discover", default=False,
              help="Also scrape the annotated pods of --node (needs list on pods).")  # fmt: skip
@click.option("--node", envvar="NODE_NAME", default=socket.gethostname,
              show_default="$NODE_NAME or the hostname",
              help="The node whose pods to discover.")  # fmt: skip
@scrape_options
def scrape(
    bootstrap: str,
    targets: tuple[str, ...],
    discover: bool,
    node: str,
    scrape_interval: float,
    scrape_timeout: float,
    server_kinds: Path | None,
    load_topic: str,
) -> None:
    """Scrape inference servers' /metrics and publish inference.latency and inference.load."""
    kinds = load_kinds_or_fail(server_kinds)
    try:
        fixed = [parse_target(t, kinds) for t in targets]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--target") from exc
    if not fixed and not discover:
        raise click.UsageError("nothing to scrape: give --target or --discover")
    kafka = kafka_settings(bootstrap, client_id="ebbtide-scrape")
    settings = scrape_settings(scrape_interval, scrape_timeout, kafka, load_topic)
    stats = run_async(
        serve_scraper(
            settings, kafka.connection(), fixed=fixed, node=node if discover else None, kinds=kinds
        )
    )
    click.echo(
        f"{stats.rounds} rounds, {stats.scrapes} scrapes, {sum(stats.failures.values())} failed; "
        f"published {stats.published} events, {stats.dropped} dropped",
        err=True,
    )


async def serve_scraper(
    settings: ScrapeSettings,
    config: KafkaConfig,
    *,
    fixed: Sequence[Target],
    node: str | None,
    kinds: dict[str, ServerKind],
    handle_signals: bool = True,
) -> ScrapeStats:
    """Scrape ``fixed`` and, with ``node``, that node's annotated pods until SIGTERM/SIGINT."""
    api = None
    source: TargetSource
    if node is not None:  # loads the Kubernetes client: only when asked to
        from controller.agent.discovery import PodDiscovery
        from controller.kube.client import connect

        api = await connect(pool_size=2)
        pods = PodDiscovery(api, node, kinds)

        async def source() -> list[Target]:
            return [*fixed, *await pods()]

    else:

        async def source() -> list[Target]:
            return list(fixed)

    scraper = Scraper(settings, source)
    loop = asyncio.get_running_loop()
    if handle_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, scraper.stop)
    try:
        return await scraper.serve(lambda: KafkaProducer(config, linger_ms=20))
    finally:
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        if api is not None:
            await api.close()


@click.command("otlp-bridge")
@bootstrap_option(required=True)
@click.option("--topic", "topics", multiple=True, required=True,
              help="Topic the Collector's Kafka exporter writes metrics to (its default: "
              "otlp_metrics); repeatable.")  # fmt: skip
@click.option("--encoding", type=click.Choice(["otlp_proto", "otlp_json"]), default="otlp_proto",
              show_default=True, help="The exporter's encoding.")  # fmt: skip
@click.option("--group", default="ebbtide-otlp", show_default=True,
              help="Consumer group: bridges in one group share the partitions.")  # fmt: skip
@server_kinds_option
@load_topic_option
def otlp_bridge(
    bootstrap: str,
    topics: tuple[str, ...],
    encoding: Encoding,
    group: str,
    server_kinds: Path | None,
    load_topic: str,
) -> None:
    """Read OTLP metrics from Kafka; publish inference.latency and inference.load events.

    Messages that are not OTLP metrics go to the dead-letter topic with their reason."""
    kinds = load_kinds_or_fail(server_kinds)
    kafka = kafka_settings(bootstrap, client_id="ebbtide-otlp-bridge")
    out_topics = {INFERENCE_LATENCY: kafka.latency_topic, INFERENCE_LOAD: load_topic}
    stats = run_async(
        bridge(kafka.connection(), topics, encoding=encoding, group=group, kinds=kinds,
               out_topics=out_topics, dead_letter_topic=kafka.deadletter_topic)
    )  # fmt: skip
    click.echo(
        f"{stats.messages} messages, {stats.points} points, "
        f"{sum(stats.rejected.values())} dead-lettered",
        err=True,
    )


async def bridge(
    config: KafkaConfig,
    topics: Sequence[str],
    *,
    encoding: Encoding,
    group: str,
    kinds: dict[str, ServerKind],
    out_topics: dict[str, str],
    dead_letter_topic: str,
) -> FollowStats:
    """Follow ``topics`` until SIGTERM/SIGINT, publishing what the points say."""
    translator = OtlpTranslator(kinds)
    sender = EventSender(out_topics, SendStats())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with KafkaProducer(config, linger_ms=20) as producer:

            async def handle(batch: OtlpBatch) -> None:
                await sender.send(producer, translator.events(batch))

            return await follow_otlp(
                config, topics, encoding=encoding, handle=handle, stop=stop, group=group,
                dead_letter_topic=dead_letter_topic,
            )  # fmt: skip
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


COMMANDS = [scrape, otlp_bridge]

"""``ebbtide agent``: the node telemetry agent (see :mod:`controller.agent`).

Kafka security settings come from the same environment variables as ``ebbtide run``
(``EBBTIDE_KAFKA__SECURITY_PROTOCOL``, ``EBBTIDE_KAFKA__SASL_PASSWORD_FILE``, …; the topic from
``EBBTIDE_KAFKA__GPU_TOPIC``), so one Secret serves the controller and the agents. NVML is
initialised before anything else: without a driver the command fails at once with one line.
SIGTERM and SIGINT finish the current round, flush and exit 0.

``--scrape-pods`` also scrapes the inference servers on this node that ask for it
(annotations ``ebbtide.io/scrape`` and friends, :mod:`controller.agent.discovery`) and
publishes ``inference.latency`` and ``inference.load`` events (:mod:`controller.agent.scraper`);
it lists the node's pods through the Kubernetes API.

``--release-during-mig`` watches this node through the Kubernetes API (in-cluster credentials,
else ``$KUBECONFIG``) and holds no NVML handle while the MIG manager reconfigures it
(:mod:`controller.agent.migwatch`).
"""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path

import click

from controller.agent.nvml import NvmlReader, NvmlUnavailable
from controller.agent.pods import DEFAULT_SOCKET, PodAttribution, PodResourcesClient
from controller.agent.publisher import Agent, AgentSettings, AgentStats, MigUtil
from controller.agent.scraper import ScrapeSettings
from controller.agent.servers import ServerKind
from controller.cli.asyncrun import run_async
from controller.cli.options import bootstrap_option, duration_option, kafka_settings
from controller.cli.scrape_command import (
    load_kinds_or_fail,
    scrape_options,
    scrape_settings,
    serve_scraper,
)
from streams.connection import KafkaConfig
from streams.producer import KafkaProducer

__all__ = ["COMMANDS", "agent"]


@click.command()
@bootstrap_option(required=True)
@click.option("--node", envvar="NODE_NAME", default=socket.gethostname,
              show_default="$NODE_NAME or the hostname",
              help="Node name: the events' key.")  # fmt: skip
@click.option("--interval", default="5s", callback=duration_option, metavar="DURATION",
              help="Time between samples, e.g. 500ms, 5s, 1m.")  # fmt: skip
@click.option("--max-rate", type=click.FloatRange(min=0, min_open=True), default=20.0,
              help="Most events per second, sustained.")  # fmt: skip
@click.option("--burst", type=click.IntRange(min=1),
              help="Most events at once [default: max-rate x interval].")  # fmt: skip
@click.option("--mig-util", type=click.Choice(["memory", "skip"]), default="memory",
              help="For MIG instances without NVML utilization: publish memory occupancy "
              "(header ebbtide-util-source: memory) or skip them.")  # fmt: skip
@click.option("--pod-attribution/--no-pod-attribution", default=True,
              help="Name the pod using each device (kubelet pod-resources API).")  # fmt: skip
@click.option("--pod-resources-socket", default=DEFAULT_SOCKET, metavar="PATH",
              help="The kubelet pod-resources socket.")  # fmt: skip
@click.option("--release-during-mig/--no-release-during-mig", default=False,
              help="Shut NVML down while this node's nvidia.com/mig.config.state is pending or "
              "rebooting, so the MIG manager's GPU reset succeeds (watches the Node: needs "
              "get/list/watch on nodes).")  # fmt: skip
@click.option("--scrape-pods/--no-scrape-pods", default=False,
              help="Also scrape the inference servers on this node annotated ebbtide.io/scrape "
              "(needs list on pods).")  # fmt: skip
@scrape_options
def agent(
    bootstrap: str,
    node: str,
    interval: float,
    max_rate: float,
    burst: int | None,
    mig_util: MigUtil,
    pod_attribution: bool,
    pod_resources_socket: str,
    release_during_mig: bool,
    scrape_pods: bool,
    scrape_interval: float,
    scrape_timeout: float,
    server_kinds: Path | None,
    load_topic: str,
) -> None:
    """Publish GPU and MIG-instance utilization of this node as gpu.utilization events."""
    kinds = load_kinds_or_fail(server_kinds) if scrape_pods else {}
    kafka = kafka_settings(bootstrap, client_id="ebbtide-agent")
    scraping = (
        scrape_settings(scrape_interval, scrape_timeout, kafka, load_topic) if scrape_pods else None
    )
    config, topic = kafka.connection(), kafka.gpu_topic
    settings = AgentSettings(
        node=node,
        interval_s=interval,
        max_rate=max_rate,
        burst=burst,
        mig_util=mig_util,
        topic=topic,
    )
    reader = NvmlReader()
    try:
        reader.open()
    except NvmlUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        stats = run_async(
            serve(
                settings,
                config,
                reader=reader,
                pod_attribution=pod_attribution,
                socket_path=pod_resources_socket,
                release_during_mig=release_during_mig,
                scraping=scraping,
                kinds=kinds,
            )
        )
    except NvmlUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        reader.close()
    click.echo(
        f"published {stats.published} events in {stats.rounds} rounds; "
        f"{stats.device_failures} device failures, {stats.rate_limited} rate-limited, "
        f"{stats.dropped} dropped",
        err=True,
    )


async def serve(
    settings: AgentSettings,
    config: KafkaConfig,
    *,
    reader: NvmlReader,
    pod_attribution: bool,
    socket_path: str,
    release_during_mig: bool = False,
    scraping: ScrapeSettings | None = None,
    kinds: dict[str, ServerKind] | None = None,
) -> AgentStats:
    """Run the agent (and, with ``scraping``, the pod scraper beside it) until SIGTERM or
    SIGINT."""
    attribution = PodAttribution(PodResourcesClient(socket_path)) if pod_attribution else None
    api, mig = None, None
    if release_during_mig:  # loads the Kubernetes client: only when asked to
        from controller.agent.migwatch import MigWatch
        from controller.kube.client import connect

        api = await connect(pool_size=4)
        mig = MigWatch(api, settings.node)
    runner = Agent(
        settings,
        reader=reader,
        connect=lambda: KafkaProducer(config, linger_ms=20),
        attribution=attribution,
        mig=mig,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runner.stop)
    scraper_task = None
    if scraping is not None:
        scraper_task = asyncio.create_task(
            serve_scraper(
                scraping,
                config,
                fixed=(),
                node=settings.node,
                kinds=kinds or {},
                handle_signals=False,
            ),
            name="agent: scrape pods",
        )
    try:
        return await runner.run()
    finally:
        if scraper_task is not None:
            scraper_task.cancel()
            await asyncio.gather(scraper_task, return_exceptions=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if api is not None:
            await api.close()


COMMANDS = [agent]

"""``ebbtide agent --scrape-pods`` as deployed: NVML readings and, beside them, the inference
server on its node (found through the Kubernetes API test server, scraped over HTTP), both
published to the embedded broker; SIGTERM stops both."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiokafka import AIOKafkaConsumer
from click.testing import CliRunner
from prometheus_client import generate_latest

from agent.expositions import vllm
from agent.fake_nvml import h100_node
from controller.agent import nvml as nvml_module
from controller.agent.nvml import NvmlReader
from controller.agent.publisher import AgentSettings
from controller.agent.scraper import ScrapeSettings
from controller.agent.servers import BUILTIN
from controller.cli.agent_command import agent, serve
from streams.broker import free_port
from streams.connection import KafkaConfig, ensure_topics
from streams.events import INFERENCE_LATENCY, INFERENCE_LOAD, EventDecoder, InferenceLatency
from support.kubeapi_objects import make_pod


def test_bad_server_kinds_file_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(nvml_module, "load_pynvml", lambda: h100_node())
    kinds = tmp_path / "kinds.yaml"
    kinds.write_text("kinds: [{name: x}]\n")
    result = CliRunner().invoke(
        agent, ["--bootstrap", "127.0.0.1:1", "--scrape-pods", "--server-kinds", str(kinds)]
    )
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"Error: {kinds}: kinds.0.port: Field required"]


@pytest.mark.slow
@pytest.mark.kube_rbac(None)
async def test_agent_scrapes_its_nodes_server_beside_nvml(
    kafka_config: KafkaConfig, kubeapi: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = vllm()
    app = web.Application()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(server.registry), content_type="text/plain")

    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()

    pod = make_pod("chat-0", namespace="prod", node="gpu-1", labels={"app": "chat"})
    pod["metadata"]["annotations"] = {
        "ebbtide.io/scrape": "true", "ebbtide.io/server": "vllm", "ebbtide.io/port": str(port)
    }  # fmt: skip
    pod["status"]["podIP"] = "127.0.0.1"
    await kubeapi.create(pod)
    monkeypatch.setenv("KUBECONFIG", str(kubeapi.write_kubeconfig(tmp_path / "kubeconfig")))

    suffix = uuid.uuid4().hex[:8]
    gpu, lat, load = f"gpu-{suffix}", f"lat-{suffix}", f"load-{suffix}"
    await ensure_topics(kafka_config, [gpu, lat, load])
    settings = AgentSettings(node="gpu-1", interval_s=0.2, topic=gpu, max_rate=1000.0)
    scraping = ScrapeSettings(interval_s=0.2, timeout_s=0.2,
                              topics={INFERENCE_LATENCY: lat, INFERENCE_LOAD: load})  # fmt: skip
    decoder = EventDecoder(load=True)
    consumer = AIOKafkaConsumer(lat, **kafka_config.client_kwargs(), auto_offset_reset="earliest")
    await consumer.start()
    try:
        with NvmlReader(h100_node()) as reader:
            task = asyncio.create_task(
                serve(settings, kafka_config, reader=reader, pod_attribution=False,
                      socket_path="/none", scraping=scraping, kinds=BUILTIN)
            )  # fmt: skip
            found: list[InferenceLatency] = []
            deadline = time.monotonic() + 30
            while not found:
                assert not task.done(), task
                assert time.monotonic() < deadline, "no latency event from the scraped server"
                server.serve(e2e_s=0.9, ttft_s=0.05, tpot_s=0.03, tokens=20)
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    for record in records:
                        event = decoder.decode_any(record.value, now=time.time() + 60)
                        if isinstance(event, InferenceLatency):
                            found.append(event)
            os.kill(os.getpid(), signal.SIGTERM)
            stats = await asyncio.wait_for(task, 15)
    finally:
        await consumer.stop()
        await runner.cleanup()
    assert stats.published > 0  # the NVML side ran too
    assert found[0].key == "prod/chat"
    assert found[0].pod == "chat-0"

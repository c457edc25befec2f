"""Start and stop of the controller process: warm start from a real Prometheus server, and
what a crashed root task does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

from controller.process.app import Controller, load_policy_files
from controller.process.settings import load_settings
from controller.simcluster.sim_runtime import SimRuntime
from streams.broker import EmbeddedBroker, free_port
from support.e2e import HERE
from support.prom_server import PrometheusServer

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def exporter() -> Iterator[tuple[str, Any]]:
    """A latency histogram for serving/chat and DCGM utilization gauges for two nodes."""
    registry = CollectorRegistry()
    latency = Histogram(
        "inference_latency_seconds", "latency", ["service", "namespace"],
        buckets=[0.05, 0.1, 0.2, 0.4, 0.8, 1.6], registry=registry,
    )  # fmt: skip
    util = Gauge("DCGM_FI_DEV_GPU_UTIL", "util", ["Hostname", "gpu"], registry=registry)
    for gpu in range(4):
        util.labels("gpu-0", str(gpu)).set(10)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield f"127.0.0.1:{port}", latency.labels("chat", "serving")
    server.shutdown()
    server.server_close()
    thread.join(5)


async def test_warm_start_fills_windows_from_prometheus(
    exporter: tuple[str, Any], tmp_path: Path
) -> None:
    """After Prometheus has scraped slow chat traffic, a new controller's engine starts with a
    windowed P99 in the slow bucket and GPU readings, before consuming any Kafka event."""
    target, chat = exporter
    with PrometheusServer(tmp_path, [target]) as prometheus:
        deadline = time.time() + 30
        while prometheus.samples("inference_latency_seconds_count", "4s") < 4:
            assert time.time() < deadline, "Prometheus did not scrape the exporter"
            for _ in range(10):
                for _ in range(95):
                    chat.observe(0.08)
                for _ in range(5):
                    chat.observe(0.7)
                await asyncio.sleep(0.1)
        settings = load_settings(
            policies=[HERE / "policy.yaml"],
            cluster=f"sim:{EXAMPLES / 'scenario-small.yaml'}",
            http={"address": "127.0.0.1:0"},
            warm_start={
                "url": prometheus.url,
                "latency_query": "sum by (le, service, namespace) "
                "(increase(inference_latency_seconds_bucket[2s]))",
                "gpu_query": "DCGM_FI_DEV_GPU_UTIL",
                "lookback_s": 4,
                "step": "1s",
            },
        )
        policy = load_policy_files(settings)
        runtime = SimRuntime.from_file(
            EXAMPLES / "scenario-small.yaml", policy, dry_run=settings.dry_run_for(policy)
        )
        controller = Controller(settings, runtime, policy)
        cold = {s.key: s.samples for s in controller.engine.service_status(time.time())}
        assert cold["serving/chat"] == 0
        await controller.warm_start()
    (chat_status,) = [
        s for s in controller.engine.service_status(time.time()) if s.key == "serving/chat"
    ]
    assert chat_status.samples > 100
    assert chat_status.quantile_ms is not None
    assert 400 <= chat_status.quantile_ms <= 800 * 1.02  # the (0.4 s, 0.8 s] bucket's bound
    assert controller.engine.observed > 0


async def test_a_crashed_root_task_stops_the_process_and_says_so(
    kafka_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """When a root task crashes, the controller shuts down in order and reports the crash, so
    `ebbtide run` exits non-zero instead of 0 (and /healthz meanwhile answers 503)."""
    settings = load_settings(
        policies=[HERE / "policy.yaml"],
        cluster=f"sim:{EXAMPLES / 'scenario-small.yaml'}",
        kafka={"bootstrap": kafka_broker.bootstrap},
        http={"address": "127.0.0.1:0"},
    )
    policy = load_policy_files(settings)

    class Failing(SimRuntime):
        async def run(self) -> None:
            await asyncio.sleep(0.5)
            raise RuntimeError("the cluster watch broke")

    base = SimRuntime.from_file(
        EXAMPLES / "scenario-small.yaml", policy, dry_run=settings.dry_run_for(policy)
    )
    runtime = Failing(base.cluster.sim, base.gate)  # type: ignore[attr-defined]
    controller = Controller(settings, runtime, policy)
    await asyncio.wait_for(controller.run(), 60)
    assert controller.crashed == ["task cluster crashed"]

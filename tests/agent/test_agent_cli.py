"""``ebbtide agent`` as a user runs it: one-line errors, environment settings, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from agent.fake_nvml import DRIVER_NOT_LOADED, FakeNvml, h100_node
from controller.agent import nvml as nvml_module
from controller.agent.nvml import NvmlReader
from controller.agent.publisher import AgentSettings
from controller.cli.agent_command import agent, serve
from controller.cli.options import kafka_settings
from streams.connection import KafkaConfig, ensure_topics


def test_nvml_init_failure_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """No usable driver: exit 1 with one line naming NVML's reason, before any Kafka work."""
    monkeypatch.setattr(
        nvml_module, "load_pynvml", lambda: FakeNvml([], init_error=DRIVER_NOT_LOADED)
    )
    result = CliRunner().invoke(agent, ["--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == ["Error: cannot initialise NVML: Driver Not Loaded"]


def _nvml_present() -> bool:
    try:
        reader = NvmlReader()
        reader.open()
    except nvml_module.NvmlUnavailable:
        return False
    reader.close()
    return True


@pytest.mark.skipif(_nvml_present(), reason="this machine has an NVIDIA driver")
def test_real_process_without_a_driver_fails_in_one_line() -> None:
    """On a machine without the NVIDIA driver the real pynvml fails init: one line, exit 1."""
    code = "from controller.cli.agent_command import agent; agent(prog_name='ebbtide agent')"
    result = subprocess.run(
        [sys.executable, "-c", code, "--bootstrap", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: cannot initialise NVML: NVML Shared Library Not Found"
    ]


def test_bad_interval_is_a_usage_error() -> None:
    """A duration without a unit is refused by click with exit 2."""
    result = CliRunner().invoke(agent, ["--bootstrap", "127.0.0.1:1", "--interval", "5"])
    assert result.exit_code == 2
    assert "invalid duration '5'" in result.stderr


def test_kafka_settings_come_from_the_controllers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same EBBTIDE_KAFKA__* variables as `ebbtide run`; --bootstrap wins."""
    monkeypatch.setenv("EBBTIDE_KAFKA__BOOTSTRAP", "ignored:9092")
    monkeypatch.setenv("EBBTIDE_KAFKA__GPU_TOPIC", "gpu.custom")
    monkeypatch.setenv("EBBTIDE_KAFKA__SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("EBBTIDE_KAFKA__SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("EBBTIDE_KAFKA__SASL_USERNAME", "agent")
    monkeypatch.setenv("EBBTIDE_KAFKA__SASL_PASSWORD", "s3cret")
    kafka = kafka_settings("kafka:9092", client_id="ebbtide-agent")
    config, topic = kafka.connection(), kafka.gpu_topic
    assert topic == "gpu.custom"
    assert config.bootstrap == "kafka:9092"
    assert config.client_id == "ebbtide-agent"
    assert config.client_kwargs()["sasl_plain_password"] == "s3cret"
    assert "s3cret" not in repr(config)


def test_bad_kafka_environment_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong EBBTIDE_KAFKA__ value is one line naming the field."""
    monkeypatch.setattr(nvml_module, "load_pynvml", lambda: h100_node())
    monkeypatch.setenv("EBBTIDE_KAFKA__SECURITY_PROTOCOL", "TLS")
    result = CliRunner().invoke(agent, ["--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: invalid Kafka settings: kafka.security_protocol:")
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.slow
async def test_sigterm_stops_after_a_clean_flush(kafka_config: KafkaConfig) -> None:
    """SIGTERM ends serve(): the round in progress is flushed, stats come back, no task leaks."""
    topic = f"agent-sigterm-{os.getpid()}-{time.monotonic_ns()}"
    await ensure_topics(kafka_config, [topic])
    settings = AgentSettings(
        node="n1", interval_s=0.05, topic=topic, max_rate=1000.0, publish_timeout_s=10.0
    )
    nvml = h100_node()
    with NvmlReader(nvml) as reader:
        task = asyncio.create_task(
            serve(settings, kafka_config, reader=reader, pod_attribution=False, socket_path="/none")
        )
        # A second reading of the GPUs: the first round is published (acknowledged), and the
        # SIGTERM handler, installed before the first round, is in place (without it pytest
        # would die).
        deadline = time.monotonic() + 15
        while nvml.calls.count("nvmlDeviceGetCount") < 2:
            assert not task.done(), task
            assert time.monotonic() < deadline, "the agent did not start its second round"
            await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        stats = await asyncio.wait_for(task, 15)
    assert stats.rounds >= 2
    assert stats.published == 6 * stats.rounds
    assert stats.dropped == stats.rate_limited == stats.device_failures == 0

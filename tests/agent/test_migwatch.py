"""The agent lets go of NVML while the MIG manager reconfigures its node: it watches its own
Node on the Kubernetes API test server (real HTTP), publishes to the embedded broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner
from kubernetes_asyncio.client import ApiClient

from agent.fake_nvml import h100_node
from agent.test_publisher import running, topic, wait_until
from controller.agent import nvml as nvml_module
from controller.agent.migwatch import MigWatch
from controller.agent.nvml import NvmlReader
from controller.agent.publisher import Agent, AgentSettings
from controller.cli.agent_command import agent as agent_command
from controller.kube.migannotation import STATE_LABEL
from streams.connection import KafkaConfig
from streams.producer import KafkaProducer
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_node

__all__ = ["topic"]  # the fixture, imported for its use here

NODE = "gpu-h100-3"


async def set_state(server: KubeAPIServer, state: str) -> None:
    await server.patch("nodes", None, NODE, {"metadata": {"labels": {STATE_LABEL: state}}})


async def test_nvml_released_while_pending_or_rebooting_and_resumed_after_success(
    kubeapi: KubeAPIServer, kube_client: ApiClient, kafka_config: KafkaConfig, topic: str
) -> None:
    """pending → nvmlShutdown, no NVML call and no event until the state moves on (rebooting
    keeps it released); success → nvmlInit again and publishing resumes."""
    await kubeapi.create(make_node(NODE, gpus=4, labels={STATE_LABEL: "success"}))
    nvml = h100_node()
    settings = AgentSettings(node=NODE, interval_s=0.1, topic=topic, max_rate=1000.0)
    with NvmlReader(nvml) as reader:
        agent = Agent(
            settings,
            reader=reader,
            connect=lambda: KafkaProducer(kafka_config),
            mig=MigWatch(kube_client, NODE),
        )
        async with running(agent):
            await wait_until(lambda: agent.stats.published > 0)
            await set_state(kubeapi, "pending")
            await wait_until(lambda: not reader.is_open, within=2.0)
            assert nvml.calls[-1] == "nvmlShutdown"
            assert agent.stats.nvml_held is False
            calls, published = len(nvml.calls), agent.stats.published
            await set_state(kubeapi, "rebooting")
            await asyncio.sleep(0.5)  # five intervals
            assert (len(nvml.calls), agent.stats.published) == (calls, published)
            assert agent.stats.released_rounds >= 3
            await set_state(kubeapi, "success")
            await wait_until(lambda: reader.is_open and agent.stats.published > published)
            assert nvml.calls[calls] == "nvmlInit"
    assert agent.stats.nvml_releases == 1
    assert agent.stats.nvml_held is True


def test_release_during_mig_without_kubernetes_credentials_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Asked to watch its node with no cluster to talk to, the agent says so in one line."""
    monkeypatch.setattr(nvml_module, "load_pynvml", h100_node)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    result = CliRunner().invoke(
        agent_command, ["--bootstrap", "127.0.0.1:1", "--release-during-mig"]
    )
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: no Kubernetes configuration:")

"""Fixtures of the fault-injection suite: the end-to-end world on a memory or a durable broker.

``world`` is the end-to-end world of tests/e2e (broker, Kubernetes-API test server with the GPU
cluster, fake MIG manager; ``full_cluster`` marks a cluster with no free GPU); ``durable_world``
runs the same on a tansu broker whose log lives in a local S3 emulator, so a broker killed with
SIGKILL comes back with its messages and committed offsets, as a real Kafka cluster does.
Controllers started through either are killed at teardown; every API request they make is
authorized as the chart's RBAC would (``kubeapi``), and a refused one fails the test. Helpers
the tests share (a steady event stream, readers of decisions and API writes) are in
``fault_support``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from streams.broker import EmbeddedBroker
from support.e2e import World, build_cluster
from support.kubeapi import KubeAPIServer
from support.mig_manager import A100_80GB_PROFILES, MigManager


@asynccontextmanager
async def _world(
    kubeapi: KubeAPIServer, tmp_path: Path, broker: EmbeddedBroker, *, full: bool
) -> AsyncIterator[World]:
    await build_cluster(kubeapi, full=full)
    async with MigManager(kubeapi, profiles=A100_80GB_PROFILES, delay=0.3) as mig:
        w = World(broker, kubeapi, mig, kubeapi.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)
        try:
            yield w
        finally:
            for p in w.processes:
                if p.process.poll() is None:
                    p.process.kill()
                    p.process.wait(10)


def _full(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("full_cluster") is not None


@pytest.fixture
async def world(
    kubeapi: KubeAPIServer, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[World]:
    """The end-to-end world on an in-memory broker (``full_cluster``: no GPU free)."""
    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as broker:
        async with _world(kubeapi, tmp_path, broker, full=_full(request)) as w:
            yield w


@pytest.fixture
async def durable_world(
    kubeapi: KubeAPIServer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    make_broker: Callable[..., EmbeddedBroker],
) -> AsyncIterator[World]:
    """The end-to-end world on a broker whose log and offsets survive SIGKILL and restart."""
    broker = make_broker(persistent=True)
    async with _world(kubeapi, tmp_path, broker, full=_full(request)) as w:
        yield w

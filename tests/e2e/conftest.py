"""The ``world`` fixture: broker, Kubernetes-API test server with a GPU cluster, MIG manager."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from policies.miglayout import MigStrategy
from streams.broker import EmbeddedBroker
from support.e2e import World, build_cluster
from support.kubeapi import KubeAPIServer
from support.mig_manager import A100_80GB_PROFILES, MigManager


@pytest.fixture
async def world(
    kubeapi: KubeAPIServer, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[World]:
    """A fresh broker, the test cluster and the MIG manager; controllers are stopped after.
    Tests marked ``full_cluster`` get no free GPU (training on every node); tests marked
    ``mig_single`` a cluster whose device plugin and GFD run ``mig.strategy=single``."""
    strategy: MigStrategy = "single" if request.node.get_closest_marker("mig_single") else "mixed"
    full = request.node.get_closest_marker("full_cluster") is not None
    await build_cluster(kubeapi, full=full, strategy=strategy)
    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as broker:
        async with MigManager(
            kubeapi, profiles=A100_80GB_PROFILES, delay=0.3, strategy=strategy
        ) as mig:
            w = World(broker, kubeapi, mig, kubeapi.write_kubeconfig(tmp_path / "kubeconfig"),
                      tmp_path)  # fmt: skip
            yield w
            for p in w.processes:
                if p.process.poll() is None:
                    p.process.kill()
                    p.process.wait(10)

"""Fixtures for tests that talk to the Kubernetes API test server over real HTTP.

``kubeapi`` is a running ``KubeAPIServer`` on 127.0.0.1 (a free port) per test; ``kube_client``
is a ``kubernetes_asyncio`` ``ApiClient`` pointed at it; ``mig_manager`` is a fake MIG manager
attached to the server with the A100-80GB profile table. Each fixture closes what it opened, in
reverse order, so open watches and delayed requests end before the server stops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from support.kubeapi import KubeAPIServer
from support.mig_manager import A100_80GB_PROFILES, MigManager


@pytest.fixture
async def kubeapi() -> AsyncIterator[KubeAPIServer]:
    """A running Kubernetes API test server, empty, on 127.0.0.1 and a free port."""
    async with KubeAPIServer() as server:
        yield server
    assert server.errors == [], "the test API server failed unexpectedly"


@pytest.fixture
async def kube_client(kubeapi: KubeAPIServer) -> AsyncIterator[ApiClient]:
    """A kubernetes_asyncio ApiClient configured for ``kubeapi``."""
    async with ApiClient(Configuration(host=kubeapi.url)) as client:
        yield client


@pytest.fixture
async def mig_manager(kubeapi: KubeAPIServer) -> AsyncIterator[MigManager]:
    """A fake MIG manager on ``kubeapi``: A100-80GB profiles, 50 ms reconfiguration."""
    async with MigManager(kubeapi, profiles=A100_80GB_PROFILES, delay=0.05) as manager:
        yield manager

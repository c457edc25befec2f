"""Fixtures for tests that talk to the Kubernetes API test server over real HTTP.

``kubeapi`` is a running ``KubeAPIServer`` on 127.0.0.1 (a free port) per test, authorizing every
request against the roles the chart renders for the settings under test (the chart's defaults,
or what the test's ``kube_rbac`` marker says; ``kube_rbac(None)`` for tests of the server itself),
and failing the test when any request was forbidden; ``kube_client``
is a ``kubernetes_asyncio`` ``ApiClient`` pointed at it; ``mig_manager`` is a fake MIG manager
attached to the server with the A100-80GB profile table. Each fixture closes what it opened, in
reverse order, so open watches and delayed requests end before the server stops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from support.kubeapi import KubeAPIServer
from support.kubeapi_rbac import Authorizer, RbacSettings, chart_authorizer
from support.mig_manager import A100_80GB_PROFILES, MigManager


def authorizer_for(request: pytest.FixtureRequest) -> Authorizer | None:
    """The authorizer for the test's ``kube_rbac`` marker: ``kube_rbac(kinds=…, kueue=…,
    objectives=…, namespace=…)`` (:class:`RbacSettings`), ``kube_rbac(None)`` for none; the
    chart's defaults without a marker."""
    marker = request.node.get_closest_marker("kube_rbac")
    if marker is not None and marker.args == (None,):
        return None
    values = dict(marker.kwargs) if marker is not None else {}
    for key in ("kinds", "objectives"):
        if key in values:
            values[key] = tuple(values[key])
    return chart_authorizer(RbacSettings(**values))


@pytest.fixture
def kube_authorizer(request: pytest.FixtureRequest) -> Authorizer | None:
    """The authorizer for the settings under test (:func:`authorizer_for`), for a test that
    builds its own server."""
    return authorizer_for(request)


@pytest.fixture
async def kubeapi(kube_authorizer: Authorizer | None) -> AsyncIterator[KubeAPIServer]:
    """A running Kubernetes API test server, empty, on 127.0.0.1 and a free port, authorizing as
    the chart's RBAC does for the settings under test."""
    async with KubeAPIServer(authorizer=kube_authorizer) as server:
        yield server
    assert server.errors == [], "the test API server failed unexpectedly"
    assert server.forbidden == [], "the chart's RBAC forbids requests the controller made"


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

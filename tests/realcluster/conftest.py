"""The real-cluster suite: runs only when ``EBBTIDE_TEST_KUBECONFIG`` names a kubeconfig (kind,
or any cluster you may create namespaces in). Without it every test here is reported as not run,
and the session summary says so in one line — it is never silently counted as passing."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from controller.kube.client import connect

ENV = "EBBTIDE_TEST_KUBECONFIG"
NOT_RUN = f"real-cluster suite NOT RUN: set {ENV} to a kubeconfig (kind, or a test cluster)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get(ENV):
        return
    for item in items:
        if "realcluster" in str(item.path):
            item.add_marker(pytest.mark.skip(reason=NOT_RUN))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not os.environ.get(ENV):
        terminalreporter.write_line(NOT_RUN, yellow=True, bold=True)


@pytest.fixture
async def real_api() -> AsyncIterator[client.ApiClient]:
    api = await connect(Path(os.environ[ENV]))
    async with api:
        yield api


@pytest.fixture
async def scratch(real_api: client.ApiClient) -> AsyncIterator[str]:
    """A namespace of the test's own, deleted afterwards."""
    name = f"ebbtide-test-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(real_api)
    await core.create_namespace({"metadata": {"name": name}})
    yield name
    await core.delete_namespace(name)

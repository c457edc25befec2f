"""Suite-wide fixtures: every test must leave no asyncio task behind (kopf does the same), and
no logging configuration behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import structlog

# Fixtures shared across test directories: the Kubernetes-API test server and friends.
pytest_plugins = ["support.kube_fixtures"]


@pytest.fixture(autouse=True)
async def _no_pending_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves tasks running: they would leak work into the next test."""
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)
    leftover = {
        t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()
    }
    for task in leftover:
        task.cancel()
    assert not leftover, f"tasks left running: {[t.get_name() for t in leftover]}"


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """A command run in-process configures structlog for the process, caching each logger on
    its first use; undo it, or module loggers first used by a later test would be cached with
    that configuration and ``structlog.testing.capture_logs`` would no longer see them."""
    yield
    if structlog.is_configured():
        structlog.reset_defaults()

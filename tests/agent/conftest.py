"""Fixtures of the agent tests."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def socket_path() -> Iterator[Path]:
    # unix socket paths are capped at 107 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="ebt-") as tmp:
        yield Path(tmp) / "kubelet.sock"

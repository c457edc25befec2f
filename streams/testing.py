"""Pytest fixtures for code that talks to Kafka: a real embedded broker, started by the fixture.

Installed as a pytest plugin (entry point ``ebbtide``), so projects that test against Ebbtide's
streams get the same fixtures:

* ``kafka_broker`` — one broker for the whole session (tests keep apart by topic and group names);
* ``make_broker`` — a factory for a broker of the test's own, for tests that stop or restart it;
  ``make_broker(persistent=True)`` stores its log in a local S3 emulator (moto), so messages
  and committed offsets survive a restart as they would on a real cluster;
* ``kafka_config`` — a :class:`~streams.connection.KafkaConfig` for ``kafka_broker``.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streams.broker import EmbeddedBroker, free_port
from streams.connection import KafkaConfig

__all__ = ["S3Emulator", "kafka_broker", "kafka_config", "make_broker"]


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A tansu broker on 127.0.0.1, shared by the session."""
    log = tmp_path_factory.mktemp("kafka") / "tansu.log"
    with EmbeddedBroker(log_path=log) as broker:
        yield broker


@pytest.fixture
def kafka_config(kafka_broker: EmbeddedBroker) -> KafkaConfig:
    return KafkaConfig(bootstrap=kafka_broker.bootstrap, client_id="ebbtide-test")


class S3Emulator:
    """A moto S3 server on 127.0.0.1 with one bucket, as durable storage for tansu."""

    def __init__(self, bucket: str = "tansu") -> None:
        self.port = free_port()
        self.bucket = bucket
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{url}/{bucket}", method="PUT"))
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.1)
        self.env = {
            "AWS_ENDPOINT": url,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., EmbeddedBroker]]:
    """Start brokers that belong to this test; all are stopped when it ends."""
    brokers: list[EmbeddedBroker] = []
    emulators: list[S3Emulator] = []

    def make(*, persistent: bool = False, port: int = 0) -> EmbeddedBroker:
        options: dict[str, Any] = {}
        if persistent:
            emulators.append(s3 := S3Emulator())
            options = {"storage": f"s3://{s3.bucket}/", "env": s3.env}
        broker = EmbeddedBroker(
            port=port, log_path=tmp_path / f"tansu-{len(brokers)}.log", **options
        )
        brokers.append(broker)
        broker.start()
        return broker

    yield make
    for broker in brokers:
        broker.stop()
    for emulator in emulators:
        emulator.stop()

"""Pytest fixtures for code that talks to Kafka: a real embedded broker, started by the fixture.

Installed as a pytest plugin (entry point ``ebbtide``), so projects that test against Ebbtide's
streams get the same fixtures:

* ``kafka_broker`` — one broker for the whole session (tests keep apart by topic and group names);
* ``make_broker`` — a factory for a broker of the test's own, for tests that stop or restart it;
* ``kafka_config`` — a :class:`~streams.connection.KafkaConfig` for ``kafka_broker``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streams.broker import EmbeddedBroker
from streams.connection import KafkaConfig

__all__ = ["kafka_broker", "kafka_config", "make_broker"]


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A tansu broker on 127.0.0.1, shared by the session."""
    log = tmp_path_factory.mktemp("kafka") / "tansu.log"
    with EmbeddedBroker(log_path=log) as broker:
        yield broker


@pytest.fixture
def kafka_config(kafka_broker: EmbeddedBroker) -> KafkaConfig:
    return KafkaConfig(bootstrap=kafka_broker.bootstrap, client_id="ebbtide-test")


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., EmbeddedBroker]]:
    """Start brokers that belong to this test; all are stopped when it ends."""
    brokers: list[EmbeddedBroker] = []

    def make(**kwargs: object) -> EmbeddedBroker:
        broker = EmbeddedBroker(log_path=tmp_path / f"tansu-{len(brokers)}.log", **kwargs)  # type: ignore[arg-type]
        brokers.append(broker)
        broker.start()
        return broker

    yield make
    for broker in brokers:
        broker.stop()

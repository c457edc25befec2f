"""The wire's errors: one base, :class:`StreamsError`, causes chained, builtins kept.

``except ConnectionError`` / ``except ValueError`` callers (the agent's publisher, warm start,
the CLI's one-line user errors) must keep catching what they caught before the tree existed.
"""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka.errors import KafkaError

import streams
import streams.stream_errors as errors
from streams.broker import free_port
from streams.connection import KafkaConfig, ensure_topics
from streams.producer import KafkaProducer
from streams.prometheus import PromQuery, fetch_events
from streams.recording import read_header

#: Builtins a wire module must not raise bare: each failure of the wire is a StreamsError.
_AD_HOC = {"ConnectionError", "RuntimeError", "OSError", "Exception"}


def _unreachable() -> KafkaConfig:
    return KafkaConfig(bootstrap=f"127.0.0.1:{free_port()}")


def test_every_wire_error_derives_from_the_one_base() -> None:
    """Each exception streams.stream_errors exports is a StreamsError."""
    exported = [getattr(errors, name) for name in errors.__all__]
    assert all(issubclass(e, errors.StreamsError) for e in exported)


@pytest.mark.parametrize(
    ("leaf", "builtin"),
    [
        (errors.KafkaUnavailable, ConnectionError),
        (errors.ProduceError, ConnectionError),
        (errors.PrometheusUnavailable, ConnectionError),
        (errors.PrometheusRejected, ValueError),
        (errors.RecordingError, ValueError),
        (errors.BrokerError, RuntimeError),
        (errors.IncompleteRead, RuntimeError),
    ],
    ids=lambda c: c.__name__,
)
def test_each_leaf_is_still_the_builtin_it_was(leaf: type[Exception], builtin: type) -> None:
    """Callers catching the builtin a leaf used to be still catch it."""
    assert issubclass(leaf, builtin)


def test_no_wire_module_raises_a_bare_builtin_for_a_failure() -> None:
    """No module of streams/ raises ConnectionError/RuntimeError/OSError directly."""
    bare = []
    for path in sorted(Path(streams.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                if isinstance(func, ast.Name) and func.id in _AD_HOC:
                    bare.append(f"{path.name}:{node.lineno}: {func.id}")
    assert bare == []


async def test_unreachable_kafka_is_kafka_unavailable_with_its_cause() -> None:
    """A producer that cannot reach Kafka raises KafkaUnavailable chained to aiokafka's error."""
    with pytest.raises(errors.KafkaUnavailable, match=r"^cannot reach Kafka: ") as caught:
        async with KafkaProducer(_unreachable()):
            pass
    assert isinstance(caught.value, ConnectionError)
    assert isinstance(caught.value.__cause__, KafkaError)


async def test_topics_on_unreachable_kafka_are_kafka_unavailable() -> None:
    """ensure_topics on an unreachable broker raises KafkaUnavailable naming it, cause kept."""
    config = _unreachable()
    with pytest.raises(
        errors.KafkaUnavailable, match=re.escape(f"at {config.bootstrap} ")
    ) as caught:
        await ensure_topics(config, ["t"], partitions=1)
    assert caught.value.__cause__ is not None


async def test_unreachable_prometheus_is_prometheus_unavailable() -> None:
    """fetch_events with nothing listening raises PrometheusUnavailable chained to the OSError."""
    url = f"http://127.0.0.1:{free_port()}"
    now = datetime.now(UTC)
    with pytest.raises(
        errors.PrometheusUnavailable, match="^" + re.escape(f"cannot reach Prometheus at {url}")
    ):
        await fetch_events(url, [PromQuery("gpu", "up")], start=now, end=now, step="15s")


def test_a_damaged_recording_is_a_streams_error(tmp_path: Path) -> None:
    """A .gz that is not gzip raises RecordingError, a StreamsError and a ValueError."""
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(b"not gzip\n")
    with pytest.raises(errors.StreamsError) as caught:
        read_header(path)
    assert isinstance(caught.value, errors.RecordingError)
    assert isinstance(caught.value, ValueError)
    assert caught.value.__cause__ is not None

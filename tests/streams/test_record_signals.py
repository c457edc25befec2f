"""``ebbtide record`` stopped as ``timeout``, systemd and containers stop it: a valid file."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from streams.broker import EmbeddedBroker
from streams.connection import KafkaConfig, ensure_topics
from streams.producer import KafkaProducer
from streams.recording import RecordedMessage, read_recording


async def _send(bootstrap: str, topic: str, values: list[bytes]) -> None:
    async with KafkaProducer(KafkaConfig(bootstrap)) as producer:
        for value in values:
            await producer.send(topic, value, key=b"k")
        await producer.flush()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["r.jsonl", "r.jsonl.gz"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_record_stopped_by_a_signal_closes_the_file_validly(
    kafka_broker: EmbeddedBroker, tmp_path: Path, name: str, sig: signal.Signals
) -> None:
    """A `record --from-end` process signalled after new messages arrived exits 0, prints
    "recorded N messages", and its file holds exactly the new messages (none of the old)."""
    boot, topic = kafka_broker.bootstrap, f"rec.{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topics(KafkaConfig(boot), [topic], partitions=2))
    asyncio.run(_send(boot, topic, [b'{"old": %d}' % i for i in range(50)]))
    out = tmp_path / name
    process = subprocess.Popen(
        [sys.executable, "-m", "controller", "record", "--bootstrap", boot,
         "--topics", topic, "--from-end", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"EBBTIDE_LOG_FORMAT": "json"},
    )  # fmt: skip
    try:
        assert process.stderr is not None
        assert process.stderr.readline().startswith("recording ")  # ready: positions are set
        asyncio.run(_send(boot, topic, [b'{"new": %d}' % i for i in range(30)]))
        time.sleep(1.5)  # time to fetch them
        process.send_signal(sig)
        stdout, stderr = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert "Aborted" not in stderr
    assert stdout.strip() == f"recorded 30 messages to {out}"
    values = [m.value for m in read_recording(out) if isinstance(m, RecordedMessage)]
    assert sorted(values) == sorted(b'{"new": %d}' % i for i in range(30))


@pytest.mark.slow
def test_publish_stopped_by_a_signal_says_how_many_it_sent(
    kafka_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """`publish` interrupted between two messages a minute apart flushes what it sent, exits 0
    and says "stopped: published 1 messages" (no `Aborted!`, no traceback)."""
    from aiokafka import AIOKafkaConsumer

    from streams.producer import RawMessage
    from streams.recording import RecordingWriter

    topic = f"pub.{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topics(KafkaConfig(kafka_broker.bootstrap), [topic]))
    recording = tmp_path / "slow.jsonl"
    writer = RecordingWriter(recording)
    for i in range(3):
        writer.write(
            RawMessage(topic, 0, i, b"k", b'{"n": %d}' % i, (), 1_700_000_000_000 + i * 60_000)
        )
    writer.close()
    process = subprocess.Popen(
        [sys.executable, "-m", "controller", "publish", str(recording),
         "--bootstrap", kafka_broker.bootstrap],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"EBBTIDE_LOG_FORMAT": "json"},
    )  # fmt: skip

    async def first_message() -> None:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_broker.bootstrap,
                                    auto_offset_reset="earliest")  # fmt: skip
        await consumer.start()
        try:
            await asyncio.wait_for(consumer.getone(), 20)
        finally:
            await consumer.stop()

    try:
        asyncio.run(first_message())
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert "Aborted" not in stderr
    assert stdout.startswith("stopped: published 1 messages in ")

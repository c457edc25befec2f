"""Recordings: the file format, and record → publish → record through a real broker."""

from __future__ import annotations

import base64
import gzip
import json
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from streams.capture import publish, record
from streams.connection import KafkaConfig, ensure_topics
from streams.events import InferenceLatency, Rejection
from streams.producer import RawMessage
from streams.recording import (
    BadLine,
    RecordedMessage,
    RecordingWriter,
    read_events,
    read_header,
    read_recording,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-events.jsonl"


def message(offset: int, value: bytes | None, key: bytes | None = b"prod/chat") -> RawMessage:
    return RawMessage("t", 0, offset, key, value, (("h", b"v"),), 1_700_000_000_000 + offset)


@pytest.mark.parametrize("name", ["r.jsonl", "r.jsonl.gz"])
def test_writer_and_reader_keep_every_kind_of_value(tmp_path: Path, name: str) -> None:
    """JSON, pretty-printed JSON, text, binary and empty values come back byte-for-byte or, for
    JSON, as equal JSON; gzip is chosen by the file name."""
    values: list[bytes | None] = [
        b'{"type":"inference.latency","ts":1,"service":"a","latency_ms":1}',
        b'{\n  "pretty": [1, 2]\n}',
        b"latency=12ms",
        b"\xff\xfe\x00binary",
        b'"a json string"',
        None,
    ]
    path = tmp_path / name
    with RecordingWriter(path, note="test") as writer:
        for i, value in enumerate(values):
            writer.write(message(i, value))
    if name.endswith(".gz"):
        with gzip.open(path) as stream:
            assert stream.read(1) == b"{"
    header = read_header(path)
    assert header is not None
    assert header["note"] == "test"
    got = list(read_recording(path))
    assert all(isinstance(m, RecordedMessage) for m in got)
    messages = [m for m in got if isinstance(m, RecordedMessage)]
    assert json.loads(messages[1].value) == {"pretty": [1, 2]}
    assert [m.value for i, m in enumerate(messages) if i != 1] == [
        v or b"" for i, v in enumerate(values) if i != 1
    ]
    assert messages[0].key == b"prod/chat"
    assert messages[0].headers == (("h", b"v"),)
    assert messages[3].ts_ms == 1_700_000_000_003


def test_bad_lines_are_yielded_not_raised(tmp_path: Path) -> None:
    """Garbage lines in a recording come back as BadLine with their line number."""
    path = tmp_path / "r.jsonl"
    good = {"topic": "t", "value": {"type": "gpu.utilization"}}
    path.write_text(
        "\n".join(
            [
                json.dumps(good),
                "not json at all",
                json.dumps({"value": 1}),  # no topic
                json.dumps({"topic": "t", "value": "x", "raw": "base64"}),  # bad base64
                "",
                json.dumps(good),
            ]
        )
    )
    got = list(read_recording(path))
    assert [type(m).__name__ for m in got] == [
        "RecordedMessage",
        "BadLine",
        "BadLine",
        "BadLine",
        "RecordedMessage",
    ]
    bad = [m for m in got if isinstance(m, BadLine)]
    assert [b.line for b in bad] == [2, 3, 4]
    assert bad[1].reason.startswith("line 3: not a recording record")
    assert read_header(path) is None


def test_raw_base64_values_round_trip(tmp_path: Path) -> None:
    """A value recorded as base64 is published as its original bytes."""
    path = tmp_path / "r.jsonl"
    blob = b"\x00\x01\x02"
    line = {"topic": "t", "value": base64.b64encode(blob).decode(), "raw": "base64"}
    path.write_text(json.dumps(line) + "\n")
    (only,) = read_recording(path)
    assert isinstance(only, RecordedMessage)
    assert only.value == blob


def test_example_recording_replays_through_the_decoder() -> None:
    """The shipped sample decodes offline: mostly valid events, the planted bad ones rejected."""
    results = [result for _, result in read_events(EXAMPLE)]
    rejected = [r for r in results if isinstance(r, Rejection)]
    assert [r.code for r in rejected] == ["invalid"] * 4 + ["malformed"]
    assert sum(isinstance(r, InferenceLatency) for r in results) == 240
    assert len(results) == 437


def test_read_events_judges_time_by_the_message_clock(tmp_path: Path) -> None:
    """Offline, "future" means ahead of the message's Kafka time; bad lines are malformed."""
    path = tmp_path / "r.jsonl"
    event = {"type": "gpu.utilization", "ts": 2000.0, "node": "n", "gpu": 0, "util_pct": 5}
    path.write_text(
        json.dumps({"topic": "t", "ts_ms": 1_000_000, "value": event})
        + "\nnot a record\n"
        + json.dumps({"topic": "t", "ts_ms": 1_999_000, "value": event})
        + "\n"
    )
    codes = [getattr(result, "code", "ok") for _, result in read_events(path)]
    assert codes == ["future_timestamp", "malformed", "ok"]


@pytest.mark.slow
async def test_record_publish_record_gives_the_same_events_in_key_order(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """Capturing topics, publishing the capture to fresh topics and capturing again gives the
    same messages with the same per-key order."""
    tag = uuid.uuid4().hex[:6]
    first_topics = {f"lat-{tag}": f"lat2-{tag}", f"gpu-{tag}": f"gpu2-{tag}"}
    await ensure_topics(kafka_config, [*first_topics, *first_topics.values()], partitions=3)
    source = tmp_path / "source.jsonl"
    with RecordingWriter(source) as writer:
        for i in range(300):
            topic = list(first_topics)[i % 2]
            key = f"key-{i % 5}".encode()
            value = json.dumps({"seq": i, "key": key.decode()}).encode()
            writer.write(RawMessage(topic, 0, i, key, value, (), 1_700_000_000_000 + i))
    await publish(kafka_config, source, speed=None)

    one = tmp_path / "one.jsonl.gz"
    assert await record(kafka_config, one, topics=list(first_topics), idle_s=1.0) == 300
    result = await publish(kafka_config, one, speed=None, topic_map=first_topics)
    assert result.sent == 300
    two = tmp_path / "two.jsonl"
    assert await record(kafka_config, two, topics=list(first_topics.values()), idle_s=1.0) == 300

    def per_key(path: Path) -> dict[tuple[str, bytes | None], list[int]]:
        out: dict[tuple[str, bytes | None], list[int]] = defaultdict(list)
        for m in read_recording(path):
            assert isinstance(m, RecordedMessage)
            out[m.topic.split("-")[0].rstrip("2"), m.key].append(json.loads(m.value)["seq"])
        return dict(out)

    assert per_key(one) == per_key(two) == per_key(source)


@pytest.mark.slow
async def test_publish_honours_speed(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """Two seconds of recorded time played 4 times faster take about half a second."""
    topic = f"speed-{uuid.uuid4().hex[:6]}"
    await ensure_topics(kafka_config, [topic])
    path = tmp_path / "r.jsonl"
    with RecordingWriter(path) as writer:
        for i in range(5):
            writer.write(RawMessage(topic, 0, i, None, b"{}", (), 1_700_000_000_000 + i * 500))
    result = await publish(kafka_config, path, speed=4.0)
    assert 0.45 <= result.seconds < 1.5


@pytest.mark.slow
async def test_retime_moves_event_times_to_now_at_the_played_pace(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """--retime: the first event is stamped now and the rest follow at recorded pace / speed;
    values without a usable ts pass untouched."""
    topic = f"retime-{uuid.uuid4().hex[:6]}"
    await ensure_topics(kafka_config, [topic])
    source = tmp_path / "r.jsonl"
    with RecordingWriter(source) as writer:
        for i, ts in enumerate(["2025-01-01T00:00:00Z", 1735689610.0]):
            event = {"type": "gpu.utilization", "ts": ts, "node": "n", "gpu": 0, "util_pct": 1}
            writer.write(RawMessage(topic, 0, i, b"n", json.dumps(event).encode(), (), i))
        writer.write(RawMessage(topic, 0, 2, b"n", b"not json", (), 2))
    before = time.time()
    await publish(kafka_config, source, speed=10.0, retime=True)
    out = tmp_path / "out.jsonl"
    await record(kafka_config, out, topics=[topic], idle_s=1.0)
    values = [m.value for m in read_recording(out) if isinstance(m, RecordedMessage)]
    first, second = (json.loads(v)["ts"] for v in values[:2])
    assert before <= first <= time.time()
    assert second - first == pytest.approx(1.0)
    assert values[2] == b"not json"

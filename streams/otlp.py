"""OTLP metrics as the OpenTelemetry Collector's Kafka exporter writes them, decoded to points.

The exporter (``exporter/kafkaexporter`` in opentelemetry-collector-contrib) puts one
``ExportMetricsServiceRequest`` per message: protobuf with ``encoding: otlp_proto`` (its
default), the protobuf JSON mapping with ``otlp_json``. Both are read here with the message
classes of ``opentelemetry-proto`` (the OpenTelemetry project's own generated code), into flat
:class:`Point` values that name no server: which metric means what is the agent's business
(:mod:`controller.agent.otlpbridge`).

Kept: explicit-bucket histograms, gauges and sums, with their temporality (delta or
cumulative). Exponential histograms and summaries are counted as ``unsupported`` and skipped.
A message that does not decode is a :class:`~streams.events.Rejection` (``malformed``), so it
can be dead-lettered like any other bad input; nothing raises.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from streams.connection import KafkaConfig
from streams.events import Rejection
from streams.producer import DEAD_LETTER_TOPIC, DeadLetter, KafkaProducer, RawMessage
from streams.stream_errors import KafkaUnavailable

__all__ = ["Encoding", "FollowStats", "OtlpBatch", "Point", "decode_otlp", "follow_otlp"]

Encoding = Literal["otlp_proto", "otlp_json"]

_CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


@dataclass(frozen=True, slots=True)
class Point:
    """One data point. ``resource`` and ``attributes`` are sorted ``(key, text)`` pairs."""

    metric: str
    kind: Literal["histogram", "gauge", "sum"]
    resource: tuple[tuple[str, str], ...]
    attributes: tuple[tuple[str, str], ...]
    time_s: float
    start_s: float
    cumulative: bool
    value: float = 0.0
    """A gauge's or a sum's value."""
    bounds: tuple[float, ...] = ()
    counts: tuple[int, ...] = ()
    """A histogram's count per bucket (not cumulative), ``len(bounds) + 1`` of them."""
    total: float = 0.0
    """A histogram's sum of observations."""


@dataclass(slots=True)
class OtlpBatch:
    points: list[Point] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    """Data points not kept, by reason (``unsupported``, ``bad_histogram``)."""


def decode_otlp(
    raw: bytes, encoding: Encoding, *, max_points: int = 200_000
) -> OtlpBatch | Rejection:
    """The points of one Kafka message, or why it cannot be read."""
    request = ExportMetricsServiceRequest()
    try:
        if encoding == "otlp_proto":
            request.ParseFromString(raw)
        else:
            json_format.Parse(raw, request, ignore_unknown_fields=True)
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, ValueError) as exc:
        return Rejection("malformed", f"not an OTLP {encoding} metrics message: {exc}")
    out = OtlpBatch()
    for rm in request.resource_metrics:
        resource = _attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                which = metric.WhichOneof("data")
                if which == "histogram":
                    cumulative = metric.histogram.aggregation_temporality == _CUMULATIVE
                    for hp in metric.histogram.data_points:
                        bounds = tuple(hp.explicit_bounds)
                        counts = tuple(hp.bucket_counts)
                        if len(counts) != len(bounds) + 1 or any(
                            b <= a for a, b in itertools.pairwise(bounds)
                        ):
                            out.skipped["bad_histogram"] += 1
                            continue
                        out.points.append(
                            Point(metric.name, "histogram", resource, _attrs(hp.attributes),
                                  hp.time_unix_nano / 1e9, hp.start_time_unix_nano / 1e9,
                                  cumulative, bounds=bounds, counts=counts, total=hp.sum)
                        )  # fmt: skip
                elif which in ("gauge", "sum"):
                    data = metric.gauge if which == "gauge" else metric.sum
                    cumulative = (
                        which == "gauge" or metric.sum.aggregation_temporality == _CUMULATIVE
                    )
                    for np in data.data_points:
                        value = np.as_double if np.HasField("as_double") else float(np.as_int)
                        if not math.isfinite(value):
                            continue
                        out.points.append(
                            Point(metric.name, which, resource, _attrs(np.attributes),
                                  np.time_unix_nano / 1e9, np.start_time_unix_nano / 1e9,
                                  cumulative, value=value)
                        )  # fmt: skip
                else:
                    out.skipped["unsupported"] += 1
                if len(out.points) > max_points:
                    return Rejection(
                        "batch_too_large", f"more than {max_points} data points in one message"
                    )
    return out


def _attrs(kvs: Iterable[KeyValue]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((kv.key, _text(kv.value)) for kv in kvs))


def _text(value: AnyValue) -> str:
    which = value.WhichOneof("value")
    if which is None:
        return ""
    got = getattr(value, which)
    return got if isinstance(got, str) else str(got)


@dataclass(slots=True)
class FollowStats:
    messages: int = 0
    points: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    """Messages dead-lettered, by reason code."""
    skipped: Counter[str] = field(default_factory=Counter)


async def follow_otlp(
    config: KafkaConfig,
    topics: Sequence[str],
    *,
    encoding: Encoding,
    handle: Callable[[OtlpBatch], Awaitable[None]],
    stop: asyncio.Event,
    group: str = "ebbtide-otlp",
    dead_letter_topic: str = DEAD_LETTER_TOPIC,
    stats: FollowStats | None = None,
    consumer_options: Mapping[str, Any] | None = None,
) -> FollowStats:
    """Consume OTLP metrics messages in consumer group ``group`` until ``stop`` is set: each
    decoded message goes to ``handle``; one that does not decode goes, byte for byte, to the
    dead-letter topic with the usual ``ebbtide-reason`` headers. Offsets are committed after a
    fetched batch was handled and its rejects were dead-lettered (at least once)."""
    stats = stats or FollowStats()
    options: dict[str, Any] = {
        **config.client_kwargs(),
        "group_id": group,
        "enable_auto_commit": False,
        "auto_offset_reset": "latest",  # a new group starts now: old metrics are stale
        **(consumer_options or {}),
    }
    consumer = AIOKafkaConsumer(*topics, **options)
    try:
        await consumer.start()
    except KafkaError as exc:
        await consumer.stop()
        raise KafkaUnavailable(f"cannot consume {', '.join(topics)}: {exc}") from exc
    try:
        async with KafkaProducer(config) as producer:
            dead = DeadLetter(producer, topic=dead_letter_topic)
            while not stop.is_set():
                fetched = await consumer.getmany(timeout_ms=200, max_records=500)
                for tp, records in fetched.items():
                    for record in records:
                        stats.messages += 1
                        got = decode_otlp(record.value or b"", encoding)
                        if isinstance(got, Rejection):
                            stats.rejected[got.code] += 1
                            raw = RawMessage(tp.topic, tp.partition, record.offset, record.key,
                                             record.value, list(record.headers or ()),
                                             record.timestamp)  # fmt: skip
                            await dead.send(raw, got)
                            continue
                        stats.points += len(got.points)
                        stats.skipped.update(got.skipped)
                        await handle(got)
                if fetched:
                    await dead.flush()
                    await consumer.commit()
    finally:
        await consumer.stop()
    return stats

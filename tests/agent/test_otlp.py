"""OTLP metrics from Kafka: messages built by the OpenTelemetry Python SDK's own OTLP encoder
(the bytes the Collector's Kafka exporter writes), decoded and turned into the same events a
scrape gives; what does not decode is dead-lettered."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from agent.expositions import otel_views
from controller.agent.otlpbridge import OtlpTranslator
from controller.agent.servers import BUILTIN
from streams.connection import KafkaConfig, ensure_topics
from streams.events import InferenceLatency, InferenceLoad, Rejection
from streams.otlp import OtlpBatch, decode_otlp, follow_otlp
from streams.producer import KafkaProducer

RESOURCE = Resource.create(
    {"service.name": "chat", "k8s.namespace.name": "prod", "k8s.pod.name": "chat-1"}
)


class Vllm:
    """vLLM-named instruments in an SDK meter; ``collect()`` gives one OTLP message."""

    def __init__(self, temporality: AggregationTemporality) -> None:
        self.waiting = 0
        preferred = {Histogram: temporality, Counter: temporality}
        self.reader = InMemoryMetricReader(preferred_temporality=preferred)
        views = otel_views()
        self.provider = MeterProvider(resource=RESOURCE, metric_readers=[self.reader], views=views)
        meter = self.provider.get_meter("vllm")
        self.e2e = meter.create_histogram("e2e", unit="s")
        self.ttft = meter.create_histogram("ttft", unit="s")
        self.tokens = meter.create_counter("tokens")
        meter.create_observable_gauge("waiting", callbacks=[lambda _: [self._observation()]])

    def _observation(self) -> object:
        from opentelemetry.metrics import Observation

        return Observation(self.waiting, {"model_name": "m", "engine": "0"})

    def serve(self, e2e_s: float, ttft_s: float, tokens: int) -> None:
        attrs = {"model_name": "m", "engine": "0"}
        self.e2e.record(e2e_s, attrs)
        self.ttft.record(ttft_s, attrs)
        self.tokens.add(tokens, attrs)

    def message(self, encoding: str = "otlp_proto") -> bytes:
        data = self.reader.get_metrics_data()
        assert data is not None
        request = encode_metrics(data)
        if encoding == "otlp_proto":
            return request.SerializeToString()
        return json_format.MessageToJson(request).encode()


@pytest.fixture
def sdk_cumulative() -> Iterator[Vllm]:
    v = Vllm(AggregationTemporality.CUMULATIVE)
    yield v
    v.provider.shutdown()


def batch_of(raw: bytes, encoding: str = "otlp_proto") -> OtlpBatch:
    got = decode_otlp(raw, encoding)  # type: ignore[arg-type]
    assert isinstance(got, OtlpBatch), got
    return got


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
def test_sdk_messages_give_the_scrapers_events(sdk_cumulative: Vllm, encoding: str) -> None:
    v = sdk_cumulative
    translator = OtlpTranslator(BUILTIN)
    v.serve(0.4, 0.02, 10)
    first = translator.events(batch_of(v.message(encoding), encoding))
    assert [type(e) for e in first] == [InferenceLoad]  # a baseline, as for a first scrape
    v.serve(1.2, 0.05, 30)
    v.serve(2.2, 0.07, 30)
    v.waiting = 4
    events = translator.events(batch_of(v.message(encoding), encoding))
    latency = {e.objective: e for e in events if isinstance(e, InferenceLatency)}
    assert set(latency) == {"e2e", "ttft"}
    e2e = latency["e2e"]
    assert (e2e.key, e2e.pod) == ("prod/chat", "chat-1")
    assert e2e.histogram is not None
    assert sum(e2e.histogram.counts) == 2
    assert e2e.histogram.counts[e2e.histogram.bounds_ms.index(1500.0)] == 1
    assert e2e.histogram.counts[e2e.histogram.bounds_ms.index(2500.0)] == 1
    (load,) = [e for e in events if isinstance(e, InferenceLoad)]
    assert load.waiting == 4.0
    assert load.tokens_per_s is not None
    assert load.tokens_per_s > 0  # the SDK's own timestamps span the two collections


def test_delta_temporality_is_added_up_per_series() -> None:
    v = Vllm(AggregationTemporality.DELTA)
    try:
        translator = OtlpTranslator(BUILTIN)
        v.serve(0.4, 0.02, 10)
        translator.events(batch_of(v.message()))
        v.serve(1.2, 0.05, 30)
        events = translator.events(batch_of(v.message()))
        (e2e,) = [e for e in events if isinstance(e, InferenceLatency) and e.objective == "e2e"]
        assert e2e.histogram is not None
        assert sum(e2e.histogram.counts) == 1
        assert e2e.histogram.counts[e2e.histogram.bounds_ms.index(1500.0)] == 1
    finally:
        v.provider.shutdown()


@pytest.mark.parametrize(
    ("raw", "encoding"),
    [
        pytest.param(b"\xff\xfe not protobuf", "otlp_proto", id="proto-garbage"),
        pytest.param(b'{"resourceMetrics": 7}', "otlp_json", id="json-wrong-shape"),
        pytest.param(b"\xff", "otlp_json", id="json-not-utf8"),
    ],
)
def test_undecodable_messages_are_rejections(raw: bytes, encoding: str) -> None:
    got = decode_otlp(raw, encoding)  # type: ignore[arg-type]
    assert isinstance(got, Rejection)
    assert got.code == "malformed"
    assert encoding in got.detail


async def test_kafka_topic_to_events_and_dead_letters(
    sdk_cumulative: Vllm, kafka_config: KafkaConfig
) -> None:
    """Through the embedded broker: two SDK messages and one garbage message in; events out,
    the garbage on the dead-letter topic with its reason."""
    suffix = uuid.uuid4().hex[:8]
    topic, dead = f"otlp-{suffix}", f"dead-{suffix}"
    await ensure_topics(kafka_config, [topic, dead], partitions=1)
    v = sdk_cumulative
    v.serve(0.4, 0.02, 10)
    first = v.message()
    v.serve(1.2, 0.05, 30)
    async with KafkaProducer(kafka_config) as producer:
        await producer.send_and_wait(topic, first)
        await producer.send_and_wait(topic, b"not OTLP at all")
        await producer.send_and_wait(topic, v.message())

    translator = OtlpTranslator(BUILTIN)
    events: list[object] = []
    stop = asyncio.Event()

    async def handle(batch: OtlpBatch) -> None:
        events.extend(translator.events(batch))
        if any(isinstance(e, InferenceLatency) for e in events):
            stop.set()

    async with asyncio.timeout(60):
        stats = await follow_otlp(
            kafka_config, [topic], encoding="otlp_proto", handle=handle, stop=stop,
            group=f"g-{suffix}", dead_letter_topic=dead,
            consumer_options={"auto_offset_reset": "earliest", "session_timeout_ms": 6000,
                              "heartbeat_interval_ms": 500},
        )  # fmt: skip
    assert stats.messages == 3
    assert stats.rejected == {"malformed": 1}
    assert {e.objective for e in events if isinstance(e, InferenceLatency)} == {"e2e", "ttft"}

    consumer = AIOKafkaConsumer(
        dead, **kafka_config.client_kwargs(), auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    try:
        async with asyncio.timeout(30):
            while not (got := await consumer.getmany(timeout_ms=500)):
                pass
    finally:
        await consumer.stop()
    (record,) = [r for records in got.values() for r in records]
    assert record.value == b"not OTLP at all"
    headers = dict(record.headers)
    assert headers["ebbtide-reason-code"] == b"malformed"
    assert headers["ebbtide-source-topic"] == topic.encode()


def test_pods_that_stop_sending_are_forgotten() -> None:
    """The bridge's state per pod is dropped once the pod sent nothing for forget_after_s: a
    pod name seen again later starts from a new baseline, and memory does not grow with churn."""
    from streams.otlp import Point

    def point(pod: str, t: float, count: int) -> Point:
        resource = (("k8s.pod.name", pod), ("service.name", "chat"))
        return Point("vllm:e2e_request_latency_seconds", "histogram", resource, (), t, 0.0, True,
                     bounds=(0.5, 1.0), counts=(count, 0, 0), total=0.1 * count)  # fmt: skip

    translator = OtlpTranslator(BUILTIN, forget_after_s=60.0)
    translator.events(OtlpBatch([point("a", 0.0, 1)]))
    assert len(translator.events(OtlpBatch([point("a", 10.0, 3)]))) == 1  # a delta of 2
    for t in range(20, 200, 10):
        translator.events(OtlpBatch([point("b", float(t), t)]))
    assert translator.events(OtlpBatch([point("a", 200.0, 9)])) == []  # a new baseline


def test_collector_json_with_enum_numbers_and_string_int64s() -> None:
    """The Collector's otlp_json writes enums as numbers and 64-bit integers as strings (pdata's
    JSON marshaler); both are read."""
    raw = b"""{"resourceMetrics":[{"resource":{"attributes":[
        {"key":"service.name","value":{"stringValue":"chat"}}]},
      "scopeMetrics":[{"metrics":[{"name":"vllm:num_requests_waiting",
        "gauge":{"dataPoints":[{"timeUnixNano":"1764691200000000000","asInt":"7"}]}},
       {"name":"vllm:e2e_request_latency_seconds","histogram":{"aggregationTemporality":1,
        "dataPoints":[{"timeUnixNano":"1764691200000000000","count":"3","sum":2.5,
          "bucketCounts":["1","2","0"],"explicitBounds":[0.5,1.0]}]}}]}]}]}"""
    got = decode_otlp(raw, "otlp_json")
    assert isinstance(got, OtlpBatch)
    gauge, histogram = got.points
    assert (gauge.metric, gauge.value, gauge.time_s) == (
        "vllm:num_requests_waiting",
        7.0,
        1764691200.0,
    )
    assert histogram.cumulative is False  # 1 = AGGREGATION_TEMPORALITY_DELTA
    assert (histogram.bounds, histogram.counts, histogram.total) == ((0.5, 1.0), (1, 2, 0), 2.5)

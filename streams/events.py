"""Wire format v1: the two event types Ebbtide consumes, and their strict decoder.

Events are JSON objects tagged by ``type``. Decoding is the hot path of ingest (every message of
every topic passes through it), so the structural checks (types, ranges, required fields, the
``type`` tag) are declared on :mod:`msgspec` structs and run in C; the few rules that span fields
(exactly one latency form, a well-formed histogram) run in ``__post_init__``; and the rules that
depend on configuration or the clock (size caps, timestamps from the future) run in
:class:`EventDecoder`. Every failure becomes a :class:`Rejection` carrying a short ``code`` (a
metrics label) and a precise ``detail`` (for the dead-letter header): the decoder never raises.

Unknown fields are ignored, so producers can add fields ahead of consumers; a misspelt latency
field is still caught because exactly one latency form is required.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Final, Literal, cast

import msgspec

__all__ = [
    "GPU_UTILIZATION",
    "INFERENCE_LATENCY",
    "INFERENCE_LOAD",
    "LOAD_SIGNALS",
    "LOAD_TOPIC",
    "MAX_LATENCY_MS",
    "OBJECTIVES",
    "AnyEvent",
    "Event",
    "EventDecoder",
    "GpuUtilization",
    "InferenceLatency",
    "InferenceLoad",
    "LatencyHistogram",
    "Limits",
    "Objective",
    "Rejection",
    "encode_event",
    "event_key",
    "event_schema",
    "event_type",
]

INFERENCE_LATENCY: Final = "inference.latency"
GPU_UTILIZATION: Final = "gpu.utilization"
INFERENCE_LOAD: Final = "inference.load"

#: What a latency measures: the whole request (``e2e``), the time to its first token (``ttft``)
#: or the time per output token after the first (``tpot``, also called inter-token latency).
Objective = Literal["e2e", "ttft", "tpot"]
OBJECTIVES: Final[tuple[Objective, ...]] = ("e2e", "ttft", "tpot")

#: One hour. A latency above this is a unit error (µs sent as ms), not an observation.
MAX_LATENCY_MS: Final = 3_600_000.0

_INF: Final = math.inf

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
_LatencyMs = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_LATENCY_MS)]
_Timestamp = float | Annotated[datetime, msgspec.Meta(tz=True)]
_MiB = Annotated[float, msgspec.Meta(ge=0.0, le=1e9)]


class LatencyHistogram(msgspec.Struct, frozen=True, omit_defaults=True):
    """Request counts per latency bucket: ``counts[i]`` requests fell at or below
    ``bounds_ms[i]`` (and above the previous bound); the last count is the overflow bucket."""

    bounds_ms: Annotated[list[_LatencyMs], msgspec.Meta(min_length=1)]
    counts: list[Annotated[int, msgspec.Meta(ge=0)]]

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.bounds_ms) + 1:
            raise ValueError(
                f"histogram.counts has {len(self.counts)} entries; "
                f"expected len(bounds_ms)+1 = {len(self.bounds_ms) + 1}"
            )
        bounds = self.bounds_ms
        for i in range(1, len(bounds)):
            if bounds[i] <= bounds[i - 1]:
                raise ValueError(
                    f"histogram.bounds_ms must be strictly increasing; "
                    f"bounds_ms[{i}]={bounds[i]} <= bounds_ms[{i - 1}]={bounds[i - 1]}"
                )


def _epoch(ts: float | datetime) -> float:
    seconds = ts.timestamp() if isinstance(ts, datetime) else ts
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"ts must be a finite, non-negative epoch time; got {seconds}")
    return float(seconds)


def _forms_given(*forms: object) -> str:
    given = sum(form is not None for form in forms)
    return "none" if given == 0 else str(given)


class InferenceLatency(msgspec.Struct, tag=INFERENCE_LATENCY, tag_field="type", omit_defaults=True):
    """Latency of one request, a batch of requests, or a histogram of requests, for one
    inference service. Key on Kafka: ``namespace/service``."""

    ts: _Timestamp
    service: _Name
    namespace: _Name = "default"
    latency_ms: _LatencyMs | None = None
    samples_ms: Annotated[list[_LatencyMs], msgspec.Meta(min_length=1)] | None = None
    histogram: LatencyHistogram | None = None
    pod: _Name | None = None
    model: _Name | None = None
    objective: Objective = "e2e"
    """What the latency measures; absent on the wire means ``e2e`` (every event before it)."""

    def __post_init__(self) -> None:
        # Runs for every decoded event, the hot path: the common case, an epoch float and one
        # form, is two comparisons; the general rules (datetimes, the messages) only on a miss.
        ts = self.ts
        if type(ts) is not float or not 0.0 <= ts < _INF:
            self.ts = _epoch(ts)
        if (self.latency_ms is None) + (self.samples_ms is None) + (self.histogram is None) != 2:
            raise ValueError(
                "exactly one of latency_ms, samples_ms or histogram is required; got "
                + _forms_given(self.latency_ms, self.samples_ms, self.histogram)
            )

    @property
    def time(self) -> float:
        """Event time in epoch seconds (``ts`` is normalised at decode time)."""
        return cast(float, self.ts)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.service}"

    @property
    def size(self) -> int:
        """How many values this event carries, for the batch-size cap."""
        if self.samples_ms is not None:
            return len(self.samples_ms)
        if self.histogram is not None:
            return len(self.histogram.counts)
        return 1


class GpuUtilization(msgspec.Struct, tag=GPU_UTILIZATION, tag_field="type", omit_defaults=True):
    """Utilization of one GPU, or of one MIG instance on it. Key on Kafka: the node name."""

    ts: _Timestamp
    node: _Name
    gpu: Annotated[int, msgspec.Meta(ge=0, le=1024)] | _Name
    util_pct: Annotated[float, msgspec.Meta(ge=0.0, le=100.0)]
    mig_profile: Annotated[str, msgspec.Meta(pattern=r"^[1-9]g\.[0-9]+gb(\+me)?$")] | None = None
    mig_instance: Annotated[int, msgspec.Meta(ge=0, le=1024)] | None = None
    mem_used_mib: _MiB | None = None
    mem_total_mib: _MiB | None = None
    pod: Annotated[str, msgspec.Meta(pattern=r"^[^/\s]+/[^/\s]+$")] | None = None

    def __post_init__(self) -> None:
        ts = self.ts  # as InferenceLatency's: the common case is two comparisons
        if type(ts) is not float or not 0.0 <= ts < _INF:
            self.ts = _epoch(ts)
        if (
            self.mem_used_mib is not None
            and self.mem_total_mib is not None
            and self.mem_used_mib > self.mem_total_mib
        ):
            raise ValueError(
                f"mem_used_mib={self.mem_used_mib} exceeds mem_total_mib={self.mem_total_mib}"
            )
        if self.mig_instance is not None and self.mig_profile is None:
            raise ValueError("mig_instance needs mig_profile")

    @property
    def time(self) -> float:
        """Event time in epoch seconds (``ts`` is normalised at decode time)."""
        return cast(float, self.ts)

    @property
    def key(self) -> str:
        return self.node

    @property
    def size(self) -> int:
        return 1


_Count = Annotated[float, msgspec.Meta(ge=0.0, le=1e9)]
_Rate = Annotated[float, msgspec.Meta(ge=0.0, le=1e12)]


class InferenceLoad(msgspec.Struct, tag=INFERENCE_LOAD, tag_field="type", omit_defaults=True):
    """What one replica (pod) of an inference service is doing now: the load signals an
    inference server exposes as gauges and counters. Key on Kafka: ``namespace/service``.

    ``version`` is required so that a consumer of version 1 refuses (dead-letters) a message of
    a later, incompatible version instead of misreading it; fields added within version 1 are
    optional and ignored by older consumers, like every event's unknown fields."""

    ts: _Timestamp
    service: _Name
    version: Literal[1]
    namespace: _Name = "default"
    pod: _Name | None = None
    model: _Name | None = None
    server: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")] | None = None
    waiting: _Count | None = None
    """Requests queued, not yet scheduled (queue depth)."""
    running: _Count | None = None
    """Requests being served (concurrency)."""
    kv_cache_pct: Annotated[float, msgspec.Meta(ge=0.0, le=100.0)] | None = None
    """KV-cache blocks in use, percent."""
    request_rate: _Rate | None = None
    """Requests finished per second over the last interval."""
    tokens_per_s: _Rate | None = None
    """Output (generated) tokens per second over the last interval."""
    prompt_tokens_per_s: _Rate | None = None
    """Prompt (prefill) tokens per second over the last interval."""
    interval_s: Annotated[float, msgspec.Meta(gt=0.0, le=86_400.0)] | None = None
    """The span the rates were measured over."""

    def __post_init__(self) -> None:
        self.ts = _epoch(self.ts)
        if all(getattr(self, name) is None for name in LOAD_SIGNALS):
            raise ValueError(
                f"an inference.load event needs at least one of {', '.join(LOAD_SIGNALS)}"
            )

    @property
    def time(self) -> float:
        """Event time in epoch seconds (``ts`` is normalised at decode time)."""
        return cast(float, self.ts)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.service}"

    @property
    def size(self) -> int:
        return 1


#: The signal fields of :class:`InferenceLoad`, in the order documented.
LOAD_SIGNALS: Final = (
    "waiting",
    "running",
    "kv_cache_pct",
    "request_rate",
    "tokens_per_s",
    "prompt_tokens_per_s",
)

Event = InferenceLatency | GpuUtilization
"""What the controller consumes today."""

AnyEvent = InferenceLatency | GpuUtilization | InferenceLoad
"""Every event type of wire format v1, ``inference.load`` included (``EventDecoder(load=True)``)."""

#: Where ``inference.load`` events go by default (not in :data:`DEFAULT_TOPICS`: ``ebbtide run``
#: does not consume them yet).
LOAD_TOPIC: Final = "ebbtide.inference.load"

_CLASS_OF: Final[dict[str, type[AnyEvent]]] = {
    INFERENCE_LATENCY: InferenceLatency,
    GPU_UTILIZATION: GpuUtilization,
    INFERENCE_LOAD: InferenceLoad,
}
_TIME: Final = operator.attrgetter("ts")

#: The Kafka topic each event type belongs on by default.
DEFAULT_TOPICS: Final[dict[str, str]] = {
    INFERENCE_LATENCY: "ebbtide.inference.latency",
    GPU_UTILIZATION: "ebbtide.gpu.utilization",
}

RejectCode = Literal[
    "malformed", "invalid", "too_large", "batch_too_large", "future_timestamp", "wrong_topic"
]


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why an input was refused. ``code`` is a small closed set for metrics labels;
    ``detail`` says where and why, for humans and the dead-letter ``ebbtide-reason`` header."""

    code: RejectCode
    detail: str

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps that protect the controller from one bad producer."""

    max_message_bytes: int = 1_048_576
    """Larger messages are rejected before parsing."""
    max_batch: int = 10_000
    """Most samples in ``samples_ms`` or buckets in a histogram."""
    max_future_skew_s: float = 300.0
    """How far ahead of the controller's clock an event time may be."""


class EventDecoder:
    """Bytes in, an :data:`Event` or a :class:`Rejection` out; never raises.

    ``topics`` maps an event type to the topic it must arrive on; ``None`` (recordings read
    offline, tests) accepts any type on any topic. ``load=True`` also decodes
    ``inference.load`` events (they must then arrive on ``topics[INFERENCE_LOAD]``, when given).
    """

    __slots__ = ("_decoder", "_kinds_on", "_limits", "_topic_of")

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        topics: dict[str, str] | None = None,
        load: bool = False,
    ) -> None:
        self._decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(
            AnyEvent if load else Event
        )
        self._limits = limits or Limits()
        self._topic_of = topics
        self._kinds_on: dict[str, frozenset[type[AnyEvent]]] = {
            topic: frozenset(_CLASS_OF[k] for k, on in (topics or {}).items() if on == topic)
            for topic in set((topics or {}).values())
        }
        """Per topic, the event types that belong on it (:meth:`decode_many` checks a batch's
        types against it in one C-level pass). Not a decoder of those types alone: a tagged
        struct decoded on its own takes a message without its ``type`` tag, which
        :meth:`decode` refuses."""

    @property
    def limits(self) -> Limits:
        return self._limits

    def decode(
        self, raw: bytes | str, *, now: float, topic: str | None = None
    ) -> Event | Rejection:
        """Decode one message of the types the controller consumes (build the decoder with
        ``load=False``, the default; use :meth:`decode_any` with ``load=True``)."""
        return cast("Event | Rejection", self.decode_any(raw, now=now, topic=topic))

    def decode_any(
        self, raw: bytes | str, *, now: float, topic: str | None = None
    ) -> AnyEvent | Rejection:
        """Decode one message of any type this decoder was built for."""
        limits = self._limits
        if len(raw) > limits.max_message_bytes:
            return Rejection(
                "too_large", f"message is {len(raw)} bytes; the cap is {limits.max_message_bytes}"
            )
        try:
            event: AnyEvent = self._decoder.decode(raw)
        except msgspec.ValidationError as exc:
            return Rejection("invalid", str(exc))
        except msgspec.DecodeError as exc:
            return Rejection("malformed", str(exc))
        except UnicodeDecodeError as exc:  # msgspec 0.22 raises it for bad UTF-8 in strings
            return Rejection("malformed", f"invalid UTF-8 at byte {exc.start}: {exc.reason}")
        if event.size > limits.max_batch:
            return Rejection(
                "batch_too_large",
                f"event carries {event.size} values; the cap is {limits.max_batch}",
            )
        if event.time > now + limits.max_future_skew_s:
            return Rejection(
                "future_timestamp",
                f"ts is {event.time - now:.0f}s ahead of the controller's clock; "
                f"at most {limits.max_future_skew_s:.0f}s is allowed",
            )
        if topic is not None and self._topic_of is not None:
            expected = self._topic_of.get(event_type(event))
            if expected is not None and topic != expected:
                return Rejection(
                    "wrong_topic", f"a {event_type(event)} event belongs on {expected}, not {topic}"
                )
        return event

    def decode_many(
        self, values: Sequence[bytes | None], *, now: float, topic: str | None = None
    ) -> tuple[list[Event], dict[int, Rejection]]:
        """:meth:`decode` of each value (``None``, a tombstone, is refused) in one pass: the
        accepted events in order, and the rejections by their index in ``values``.

        Per-message Python work was a large part of the cost of ingest. Here a batch is one
        C-level ``map`` of the topic's decoder over the values, then the limits are checked
        over all the events at once; only a batch in which something is refused is decoded
        again one by one, for the reason of each refusal. (Decoding the values joined into
        one JSON array would be no faster, and a crafted pair of messages can straddle the
        commas between them, so an array's elements need not be the messages.)"""
        limits = self._limits
        kinds: frozenset[type[AnyEvent]] | None = None
        if topic is not None and self._topic_of is not None:
            kinds = self._kinds_on.get(topic, frozenset())
        if kinds != frozenset() and values:
            try:
                fits = max(map(len, values)) <= limits.max_message_bytes  # type: ignore[arg-type]
                events = list(map(self._decoder.decode, values)) if fits else None  # type: ignore[arg-type]
            except (msgspec.DecodeError, UnicodeDecodeError, TypeError):  # TypeError: a None
                events = None
            if (
                events is not None
                and (kinds is None or kinds.issuperset(map(type, events)))
                and self._within_limits(events, now)  # type: ignore[arg-type]
            ):
                return events, {}  # type: ignore[return-value]
        accepted: list[Event] = []
        refused: dict[int, Rejection] = {}
        for i, value in enumerate(values):
            result = (
                self.decode(value, now=now, topic=topic)
                if value is not None
                else Rejection("malformed", "message has no value (a tombstone)")
            )
            if isinstance(result, Rejection):
                refused[i] = result
            else:
                accepted.append(result)
        return accepted, refused

    def _within_limits(self, events: list[Event], now: float) -> bool:
        """Whether :meth:`decode`'s size and clock rules pass every one of ``events``."""
        limits = self._limits
        if max(map(_TIME, events)) > now + limits.max_future_skew_s:
            return False
        cap = limits.max_batch
        return cap >= 1 and not any(
            e.size > cap for e in events if type(e) is InferenceLatency and e.latency_ms is None
        )


def event_type(event: AnyEvent) -> str:
    """The ``type`` tag of ``event``."""
    if isinstance(event, InferenceLatency):
        return INFERENCE_LATENCY
    return INFERENCE_LOAD if isinstance(event, InferenceLoad) else GPU_UTILIZATION


_encoder = msgspec.json.Encoder()


def encode_event(event: AnyEvent) -> bytes:
    """The wire bytes of ``event`` (``type`` included, unset optional fields omitted)."""
    return _encoder.encode(event)


def event_key(event: AnyEvent) -> bytes:
    """The Kafka key that keeps one service's (or one node's) events in order."""
    return event.key.encode()


def event_schema() -> dict[str, object]:
    """JSON Schema (2020-12) of wire format v1, for producers to validate against."""
    schema: dict[str, object] = msgspec.json.schema(AnyEvent)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://ebbtide.io/schemas/events.v1.json"
    schema["title"] = "Ebbtide event, wire format v1"
    return schema

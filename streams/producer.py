"""Producing to Kafka: events on their topics, rejected messages on the dead-letter topic.

Both wrap one ``AIOKafkaProducer`` with ``acks=all`` so that a message acknowledged to Ebbtide
survives the loss of a broker. Events are keyed (``namespace/service`` or node name) so that one
key's events stay on one partition and therefore in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from streams.connection import KafkaConfig
from streams.events import DEFAULT_TOPICS, Event, Rejection, encode_event, event_key, event_type
from streams.stream_errors import KafkaUnavailable, ProduceError

__all__ = [
    "DEAD_LETTER_TOPIC",
    "DeadLetter",
    "EventProducer",
    "KafkaProducer",
    "RawMessage",
]

DEAD_LETTER_TOPIC = "ebbtide.deadletter"

Headers = Sequence[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class RawMessage:
    """One message as it was on the wire, with where it came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int


class KafkaProducer:
    """A started ``AIOKafkaProducer``; ``async with`` starts and flushes/stops it."""

    def __init__(self, config: KafkaConfig, *, linger_ms: int = 5) -> None:
        self._producer = AIOKafkaProducer(
            **config.client_kwargs(), acks="all", linger_ms=linger_ms, enable_idempotence=False
        )

    async def __aenter__(self) -> Self:
        try:
            await self._producer.start()
        except KafkaError as exc:
            await self._producer.stop()
            raise KafkaUnavailable(f"cannot reach Kafka: {exc}") from exc
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._producer.stop()

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
        timestamp_ms: int | None = None,
    ) -> None:
        """Queue one message; raises only if it cannot even be queued. :meth:`flush` waits."""
        await self._producer.send(
            topic, value, key=key, headers=list(headers), timestamp_ms=timestamp_ms
        )

    async def send_and_wait(
        self, topic: str, value: bytes | None, *, key: bytes | None = None, headers: Headers = ()
    ) -> None:
        """Send one message and wait for the broker's acknowledgement; :class:`ProduceError`
        when it did not come (broker unreachable, timed out, refused)."""
        try:
            await self._producer.send_and_wait(topic, value, key=key, headers=list(headers))
        except KafkaError as exc:
            raise ProduceError(f"{topic}: not acknowledged: {exc!r}") from exc

    async def flush(self) -> None:
        await self._producer.flush()


class EventProducer(KafkaProducer):
    """Publishes typed events to their default topics, keyed for per-key order."""

    def __init__(
        self, config: KafkaConfig, *, topics: dict[str, str] | None = None, linger_ms: int = 5
    ) -> None:
        super().__init__(config, linger_ms=linger_ms)
        self._topics = topics or DEFAULT_TOPICS

    async def publish(self, event: Event) -> None:
        await self.send(
            self._topics[event_type(event)],
            encode_event(event),
            key=event_key(event),
        )


class DeadLetter:
    """Sends rejected messages, untouched, to the dead-letter topic with the reason in headers.

    Headers added: ``ebbtide-reason`` (where and why), ``ebbtide-reason-code`` (the metrics
    label), and the source ``ebbtide-source-topic``/``-partition``/``-offset``; the original
    headers are kept after them.
    """

    def __init__(self, producer: KafkaProducer, *, topic: str = DEAD_LETTER_TOPIC) -> None:
        self._producer = producer
        self.topic = topic

    async def send(self, message: RawMessage, rejection: Rejection) -> None:
        headers: list[tuple[str, bytes]] = [
            ("ebbtide-reason", rejection.detail.encode()),
            ("ebbtide-reason-code", rejection.code.encode()),
            ("ebbtide-source-topic", message.topic.encode()),
            ("ebbtide-source-partition", str(message.partition).encode()),
            ("ebbtide-source-offset", str(message.offset).encode()),
            *message.headers,
        ]
        await self._producer.send(self.topic, message.value, key=message.key, headers=headers)

    async def flush(self) -> None:
        await self._producer.flush()

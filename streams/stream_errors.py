"""What the wire raises: one base, :class:`StreamsError`, and a small tree under it.

A caller that only cares that the wire failed catches :class:`StreamsError`; one that cares
why catches a leaf. Each leaf also derives from the builtin it has always been (as kopf's
``APIError`` subclasses and structlog's exceptions do), so ``except ConnectionError`` around
a Kafka or Prometheus call, or ``except ValueError`` around reading a recording, keeps
working. Every raise chains its cause (``raise … from exc``) where there is one.

Arguments a caller got wrong (a bad event field, an unreadable time, an empty topic list)
stay plain ``ValueError``: they are mistakes in the call, not failures of the wire.
"""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "IncompleteRead",
    "KafkaUnavailable",
    "ProduceError",
    "PrometheusRejected",
    "PrometheusUnavailable",
    "RecordingError",
    "StreamsError",
]


class StreamsError(Exception):
    """Something on the wire failed: Kafka, Prometheus, a recording, the embedded broker."""


class KafkaUnavailable(StreamsError, ConnectionError):
    """Kafka could not be reached, or refused what was asked of it (a topic it lacks or
    would not create)."""


class ProduceError(KafkaUnavailable):
    """A message the broker did not acknowledge."""


class IncompleteRead(StreamsError, RuntimeError):
    """:meth:`~streams.capture.TopicReader.since` could not read up to the end offsets seen
    at its start in time.

    Callers that restore state from the read (budgets, cooldowns) must not act on part of it.
    """

    def __init__(
        self, topic: str, *, progress: dict[int, tuple[int, int | None]], timeout_s: float
    ) -> None:
        self.topic = topic
        self.progress = progress
        """Per unfinished partition: (position reached, end offset seen at start or ``None``
        when the broker never reported one)."""
        where = ", ".join(
            f"partition {p} at {pos}/{'?' if end is None else end}"
            for p, (pos, end) in sorted(progress.items())
        )
        super().__init__(f"read of {topic!r} incomplete after {timeout_s:g}s: {where}")


class PrometheusUnavailable(StreamsError, ConnectionError):
    """Prometheus could not be reached."""


class PrometheusRejected(StreamsError, ValueError):
    """Prometheus answered, but refused the query."""


class RecordingError(StreamsError, ValueError):
    """The file is not a readable recording: truncated, corrupt, or not a recording at all."""


class BrokerError(StreamsError, RuntimeError):
    """The embedded broker could not be found, started, or did not become ready."""

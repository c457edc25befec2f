"""Reading a recording for replay: :func:`streams.recording.read_events`, in batches, faster.

Design:

* The meaning is exactly :func:`~streams.recording.read_events`'s: the same lines skipped (a
  header on line 1, blank lines), the same :class:`~streams.events.Event` values, the same
  :class:`~streams.events.Rejection` codes and details. ``tests/replay`` checks the two agree
  message for message on recordings with every kind of bad line.
* Speed comes from parsing each line *once*. ``read_events`` parses the line into a record with
  ``value`` kept as raw bytes, copies them, and then parses them again as an event. Here the
  line is decoded straight into :class:`_FastLine`, whose ``value`` is typed as the event union
  itself, so msgspec validates the record and the event in one C pass. The record fields keep
  ``_Line``'s types so a line the slow path refuses is refused here too.
* Only the common case takes the fast path: a line no longer than the size cap (so its value is
  not either), not ``raw``. Anything that fails to decode, or fails a check, is handed to the
  slow path (:func:`streams.recording.parse_line` + :class:`~streams.events.EventDecoder`)
  which produces the exact rejection; rare lines pay twice, common ones once.
* Lines are read ``BATCH_BYTES`` at a time and yielded as lists, so the replay loop pays one
  generator step per batch, not per event. Memory is one batch, whatever the file's length.
* The file is opened and read by :class:`~streams.recording.RecordingReader`, as every reader
  of a recording is: a damaged file or one that is not a recording raises
  :class:`~streams.stream_errors.RecordingError` with the same words everywhere; the
  first :data:`MAX_LISTED` rejected lines are kept in :class:`SourceStats` with their numbers,
  so a report can say *where* the recording is bad, not only how often.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from streams.events import AnyEvent, EventDecoder, Rejection
from streams.recording import BadLine, RecordingReader, parse_line

__all__ = ["BATCH_BYTES", "MAX_LISTED", "SourceStats", "read_event_batches"]

#: Bytes of the file read (and decoded) per batch.
BATCH_BYTES = 1 << 20
#: Rejected lines listed (with number and reason) in :class:`SourceStats`.
MAX_LISTED = 20


@dataclass(slots=True)
class SourceStats:
    """What reading found besides events: records read and the first rejected lines."""

    records: int = 0
    rejected_lines: list[tuple[int, str]] = field(default_factory=list)
    """``(line number, "code: detail")`` of the first :data:`MAX_LISTED` rejections."""


class _FastLine(msgspec.Struct):
    """``streams.recording._Line`` with ``value`` decoded as an event in the same pass."""

    topic: str
    value: AnyEvent
    partition: int = 0
    offset: int = -1
    ts_ms: int | None = None
    key: str | None = None
    headers: list[tuple[str, str]] = []
    raw: bool | str = False


_fast = msgspec.json.Decoder(_FastLine)


def _slow(
    number: int, line: bytes, decoder: EventDecoder, stats: SourceStats
) -> AnyEvent | Rejection:
    """What ``read_events`` yields for this line, accounted in ``stats``."""
    message = parse_line(number, line)
    if isinstance(message, BadLine):
        result: AnyEvent | Rejection = Rejection("malformed", message.reason)
    else:
        stats.records += 1
        now = message.ts_ms / 1000 if message.ts_ms is not None else math.inf
        result = decoder.decode_any(message.value, now=now)
    if type(result) is Rejection and len(stats.rejected_lines) < MAX_LISTED:
        stats.rejected_lines.append((number, f"{result.code}: {result.detail}"))
    return result


def read_event_batches(
    path: Path,
    decoder: EventDecoder | None = None,
    *,
    batch_bytes: int = BATCH_BYTES,
    progress: Callable[[int], None] | None = None,
    stats: SourceStats | None = None,
) -> Iterator[list[AnyEvent | Rejection]]:
    """Yield the recording's decoded events and rejections, in file order, a batch at a time.

    Each item is what :func:`streams.recording.read_events` yields as the second element for
    the same line. ``progress`` is called after each batch with the bytes of the file (as
    stored: compressed for ``.gz``) read so far; ``stats`` collects :class:`SourceStats`.
    Raises :class:`~streams.stream_errors.RecordingError` when the file cannot be opened, is
    damaged or is not a recording (:class:`~streams.recording.RecordingReader`'s words).
    """
    decoder = decoder or EventDecoder(load=True)
    stats = stats if stats is not None else SourceStats()
    reader = RecordingReader(path)
    limits = decoder.limits
    cap, max_batch, skew = limits.max_message_bytes, limits.max_batch, limits.max_future_skew_s
    decode = _fast.decode
    for start, lines in reader.batches(batch_bytes, progress=progress):
        out: list[AnyEvent | Rejection] = []
        append = out.append
        slow = 0
        for number, line in enumerate(lines, start):
            if len(line) <= cap:
                try:
                    record = decode(line)
                except (msgspec.DecodeError, ValueError):
                    record = None
                if record is not None and not record.raw:
                    event = record.value
                    ts_ms = record.ts_ms
                    if event.size <= max_batch and (
                        ts_ms is None or event.ts <= ts_ms / 1000 + skew  # type: ignore[operator]
                    ):
                        append(event)
                        continue
            if not line.strip():
                continue
            if reader.first is None:
                reader.first = (number, line)
            slow += 1
            append(_slow(number, line, decoder, stats))
        stats.records += len(out) - slow  # each fast-path event is one record
        reader.records = stats.records  # what the reader says damage came after
        yield out

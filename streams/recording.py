"""Recordings: Kafka messages as JSON Lines, gzip-compressed when the file name ends in ``.gz``.

Format (version 1)::

    {"ebbtide_recording": 1, "created": "2026-12-02T16:00:00Z", "source": "kafka", ...}
    {"topic": "ebbtide.inference.latency", "partition": 0, "offset": 41, "ts_ms": 1764691200000,
     "key": "prod/chat", "headers": [["trace", "abc"]], "value": {"type": "inference.latency", ...}}

The header line is optional. ``value`` is the message's JSON as it was; a message that was not
valid JSON is kept as text in ``value`` with ``"raw": true`` (or base64 with ``"raw": "base64"``
when it was not UTF-8), so a replay dead-letters exactly what the live controller did. A line of
the file that is itself not a record is yielded as :class:`BadLine`, never raised.

A file that cannot be read to its end (a gzip stream cut short by a killed writer, a ``.gz``
that is not gzip) or that has neither a header nor a single record (an empty file, some other
text) raises :class:`RecordingError`, saying which file and after how many records: commands
turn it into one line and a non-zero exit instead of silently replaying nothing.

Reading is on the replay hot path: each line is parsed once by msgspec, with ``value`` kept as
raw JSON bytes (``msgspec.Raw``) that go straight to the event decoder.
"""

from __future__ import annotations

import base64
import gzip
import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import msgspec

from streams.events import Event, EventDecoder, Rejection
from streams.producer import RawMessage
from streams.stream_errors import RecordingError

__all__ = [
    "DAMAGE",
    "BadLine",
    "RecordedMessage",
    "RecordingReader",
    "RecordingWriter",
    "damaged",
    "not_a_recording",
    "parse_line",
    "read_events",
    "read_header",
    "read_recording",
]

FORMAT_VERSION = 1


class _Line(msgspec.Struct):
    topic: str
    value: msgspec.Raw
    partition: int = 0
    offset: int = -1
    ts_ms: int | None = None
    key: str | None = None
    headers: list[tuple[str, str]] = []
    raw: bool | str = False


@dataclass(frozen=True, slots=True)
class RecordedMessage:
    """One message of a recording, with ``value`` as the bytes that were on the wire."""

    line: int
    topic: str
    partition: int
    offset: int
    ts_ms: int | None
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    value: bytes


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line of the file that is not a record: where, why, and its text."""

    line: int
    reason: str
    text: bytes


#: What reading a damaged file raises: a gzip stream cut short (``EOFError``), a ``.gz`` that
#: is not gzip (``gzip.BadGzipFile``, an ``OSError``), a corrupt deflate block (``zlib.error``).
DAMAGE = (EOFError, OSError, zlib.error)


def damaged(path: Path, exc: BaseException, *, line: int, records: int) -> RecordingError:
    """The error for ``exc`` (one of :data:`DAMAGE`) raised after ``line`` lines were read."""
    if line == 0 and isinstance(exc, gzip.BadGzipFile):
        return RecordingError(f"{path}: not a gzip file, though its name ends in .gz")
    what = "truncated" if isinstance(exc, EOFError) else "corrupt"
    return RecordingError(f"{path}: {what} after {records} records (line {line}): {exc}")


def not_a_recording(path: Path, first: tuple[int, bytes] | None) -> RecordingError:
    """The error for a file with neither a header nor a record; ``first`` is its first
    non-blank line and that line's number."""
    found = "it is empty" if first is None else f"line {first[0]} is {first[1][:60]!r}"
    return RecordingError(f"{path}: not an Ebbtide recording (no header, no record): {found}")


def _create(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return gzip.open(path, "wb")  # type: ignore[return-value]
    return open(path, "wb")


_line_decoder = msgspec.json.Decoder(_Line)
_header_decoder = msgspec.json.Decoder(dict[str, Any])
_string_decoder = msgspec.json.Decoder(str)


class RecordingReader:
    """The one way a recording is opened and read, so every command that reads one (replay
    and its header read, the inferred cluster's scan, ``--model fit``, publish) says the same
    one line for the same damage: a path that cannot be opened, a ``.gz`` that is not gzip, a
    stream cut short, a file with neither a header nor a record.

    :meth:`batches` yields the file's lines a batch at a time, the header line left out (it is
    kept in :attr:`header`). The caller parses them and counts, in :attr:`records` and
    :attr:`first`, what it found, so the damage message says after how many records it came
    and an empty or foreign file is named as such when the lines run out.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header: bytes | None = None
        """Line 1 when it is a header."""
        self.records = 0
        """Records the caller has parsed so far."""
        self.first: tuple[int, bytes] | None = None
        """The first non-blank line that was not a record, and its number (set by the caller)."""
        self.lines = 0
        """Lines read so far, the header included."""

    def batches(
        self, batch_bytes: int, *, progress: Callable[[int], None] | None = None
    ) -> Iterator[tuple[int, list[bytes]]]:
        """``(number of the batch's first line, its lines)``, ``batch_bytes`` of the
        decompressed file at a time (at least one line). ``progress`` gets the bytes of the file
        as stored read so far after each batch. Raises :class:`RecordingError`."""
        try:
            raw = open(self.path, "rb")  # noqa: SIM115 -- closed by the with below
        except OSError as exc:
            raise RecordingError(f"{self.path}: cannot read it: {exc.strerror or exc}") from exc
        gz = self.path.suffix == ".gz"
        with raw, gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw as stream:
            while True:
                try:
                    lines = stream.readlines(batch_bytes)
                except DAMAGE as exc:
                    raise damaged(self.path, exc, line=self.lines, records=self.records) from exc
                if progress is not None:
                    progress(raw.tell())
                if not lines:
                    break
                start = self.lines + 1
                self.lines += len(lines)
                if start == 1 and b'"ebbtide_recording"' in lines[0]:
                    self.header, lines, start = lines[0], lines[1:], 2
                yield start, lines
        if self.header is None and not self.records:
            raise not_a_recording(self.path, self.first)


def read_header(path: Path) -> dict[str, Any] | None:
    """The recording's header object, or ``None`` when the first line is a record. Raises
    :class:`RecordingError` when the file cannot be read as far as its first line."""
    reader = RecordingReader(path)
    for _ in reader.batches(1):
        break
    if reader.header is None:
        return None
    try:
        return _header_decoder.decode(reader.header)
    except msgspec.DecodeError:
        return None


def read_recording(path: Path) -> Iterator[RecordedMessage | BadLine]:
    """Yield every message of the recording in file order; bad lines as :class:`BadLine`.
    Raises :class:`RecordingError` for a damaged file, after yielding what it could read
    (a line at a time, so ``publish`` sends everything before the damage)."""
    reader = RecordingReader(path)
    for start, lines in reader.batches(1):
        for number, line in enumerate(lines, start):
            if not line.strip():
                continue
            message = parse_line(number, line)
            if isinstance(message, RecordedMessage):
                reader.records += 1
            elif reader.first is None:
                reader.first = (number, line)
            yield message


def parse_line(number: int, line: bytes) -> RecordedMessage | BadLine:
    """One line of a recording (``number`` counts from 1) as its message, or as a
    :class:`BadLine` saying why it is not one; never raises for bad input."""
    try:
        record = _line_decoder.decode(line)
        value = bytes(record.value)
        if record.raw:
            text = _string_decoder.decode(value)
            value = base64.b64decode(text) if record.raw == "base64" else text.encode()
        headers = tuple((name, text.encode()) for name, text in record.headers)
    except (msgspec.DecodeError, ValueError) as exc:
        return BadLine(number, f"line {number}: not a recording record: {exc}", line.rstrip())
    return RecordedMessage(
        line=number,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        ts_ms=record.ts_ms,
        key=record.key.encode() if record.key is not None else None,
        headers=headers,
        value=value,
    )


def read_events(
    path: Path, decoder: EventDecoder | None = None
) -> Iterator[tuple[RecordedMessage | BadLine, Event | Rejection]]:
    """Yield each message of the recording with its decoded event or its rejection.

    This is the offline twin of the Kafka ingest path: the same decoder, the same reasons. The
    future-timestamp rule is applied against the message's own Kafka time (``ts_ms``), the
    clock the live controller would have had; a bad line is a ``malformed`` rejection.
    """
    decoder = decoder or EventDecoder()
    for message in read_recording(path):
        if isinstance(message, BadLine):
            yield message, Rejection("malformed", message.reason)
            continue
        now = message.ts_ms / 1000 if message.ts_ms is not None else math.inf
        yield message, decoder.decode(message.value, now=now)


class RecordingWriter:
    """Appends messages to a new recording, header first."""

    def __init__(self, path: Path, *, source: str = "kafka", **header: Any) -> None:
        self.path = path
        self.count = 0
        self._stream = _create(path)
        self._encoder = msgspec.json.Encoder()
        created = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        self._write_object(
            {"ebbtide_recording": FORMAT_VERSION, "created": created, "source": source, **header}
        )

    def _write_object(self, obj: dict[str, Any]) -> None:
        self._stream.write(self._encoder.encode(obj) + b"\n")

    def write(self, message: RawMessage) -> None:
        record: dict[str, Any] = {
            "topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "ts_ms": message.timestamp_ms,
            "key": message.key.decode(errors="replace") if message.key is not None else None,
            "headers": [[k, v.decode(errors="replace")] for k, v in message.headers],
        }
        value = message.value or b""
        try:
            parsed = msgspec.json.decode(value)
            # Pretty-printed JSON would break the one-record-per-line framing.
            has_newline = b"\n" in value or b"\r" in value
            record["value"] = msgspec.Raw(msgspec.json.encode(parsed) if has_newline else value)
        except msgspec.DecodeError:
            try:
                record["value"], record["raw"] = value.decode(), True
            except UnicodeDecodeError:
                record["value"], record["raw"] = base64.b64encode(value).decode(), "base64"
        self._write_object(record)
        self.count += 1

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

"""Damaged inputs as a new user meets them: one clear line, a non-zero exit, no traceback."""

from __future__ import annotations

import contextlib
import gzip
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import options, stream_commands
from controller.cli.replay_command import replay_command
from controller.cli.stream_commands import publish
from controller.offline.replay.inferred import scan_recording
from controller.offline.replay.source import read_event_batches
from streams.broker import EmbeddedBroker
from streams.producer import RawMessage
from streams.recording import RecordingWriter, read_header, read_recording
from streams.stream_errors import RecordingError

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample-events.jsonl"
BALANCED = ROOT / "policies" / "library" / "balanced.yaml"


def _truncated(tmp_path: Path) -> Path:
    """The sample as gzip, cut in the middle of its compressed stream."""
    whole = gzip.compress(SAMPLE.read_bytes())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    return path


def _not_gzip(tmp_path: Path) -> Path:
    path = tmp_path / "plain.jsonl.gz"
    path.write_bytes(SAMPLE.read_bytes())
    return path


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    return path


def _text(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("shopping list\neggs\n")
    return path


DAMAGED: dict[str, tuple[Callable[[Path], Path], str]] = {
    "truncated gzip": (_truncated, "truncated after "),
    "not gzip": (_not_gzip, "not a gzip file"),
    "empty": (_empty, "not an Ebbtide recording (no header, no record): it is empty"),
    "text": (_text, "not an Ebbtide recording (no header, no record): line 1 is"),
}


@pytest.mark.parametrize("case", DAMAGED, ids=list(DAMAGED))
def test_replay_of_a_damaged_recording_is_one_line_and_leaves_no_report(
    tmp_path: Path, case: str
) -> None:
    """replay of a damaged or foreign file: exit 1, one line naming the file and the damage,
    and an earlier run's report in --out is gone rather than passing for this run's."""
    make, words = DAMAGED[case]
    path = make(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    for stale in ("summary.json", "report.html", "decisions.jsonl"):
        (out / stale).write_text("from an earlier run")
    result = CliRunner().invoke(
        replay_command, [str(path), "--policy", str(BALANCED), "--out", str(out)]
    )
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {path}: ")
    assert words in line
    assert list(out.iterdir()) == []


def test_truncation_says_after_how_many_records(tmp_path: Path) -> None:
    """Both readers stop at the same place and say how many records came before it."""
    path = _truncated(tmp_path)
    with pytest.raises(RecordingError) as slow:
        list(read_recording(path))
    with pytest.raises(RecordingError) as fast:
        list(read_event_batches(path, batch_bytes=4096))
    assert "truncated after " in str(slow.value)
    records = int(str(slow.value).split("truncated after ")[1].split()[0])
    assert 0 < records < 437
    assert str(fast.value).startswith(f"{path}: truncated after ")


def test_header_only_recording_is_still_a_recording(tmp_path: Path) -> None:
    """`record` that captured nothing wrote a valid (empty) recording: not an error."""
    path = tmp_path / "none.jsonl.gz"
    RecordingWriter(path).close()
    assert list(read_recording(path)) == []
    assert [e for batch in read_event_batches(path) for e in batch] == []


def test_rejected_lines_are_listed_with_numbers(tmp_path: Path) -> None:
    """Lines a replay rejects are named by line number in the output and in summary.json."""
    path = tmp_path / "r.jsonl"
    with RecordingWriter(path) as writer:
        for i in range(3):
            writer.write(RawMessage("t", 0, i, None, b"garbage", (), 1_700_000_000_000))
    good = SAMPLE.read_text().splitlines()[1:]
    with path.open("a") as f:
        f.write("this line is not json\n" + "\n".join(good) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        replay_command, [str(path), "--policy", str(BALANCED), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "rejected line 2: malformed" in result.output
    assert "rejected line 5: malformed: line 5: not a recording record" in result.output
    listed = json.loads((out / "summary.json").read_text())["events"]["rejected_lines"]
    assert [e["line"] for e in listed[:4]] == [2, 3, 4, 5]
    assert len(listed) == 4 + 5  # the sample's own five rejections follow


def _topic_copy(tmp_path: Path, name: str) -> Path:
    """The sample on a topic of this test's own, so publishing it disturbs no other test."""
    topic = f"damaged.{uuid.uuid4().hex[:8]}"
    lines = SAMPLE.read_text().splitlines()[1:]
    path = tmp_path / name
    text = "\n".join(json.dumps(json.loads(ln) | {"topic": topic}) for ln in lines) + "\n"
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    return path


@pytest.mark.slow
def test_publish_of_a_truncated_recording_says_how_many_it_sent(
    kafka_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """publish of a cut-off .gz: exit 1, one line naming the file, the damage and the count
    of messages that did go out before it."""
    whole = _topic_copy(tmp_path, "whole.jsonl.gz")
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    result = CliRunner().invoke(
        publish, [str(cut), "--bootstrap", kafka_broker.bootstrap, "--as-fast-as-possible"]
    )
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {cut}: truncated after ")
    sent = int(line.split("; published ")[1].split()[0])
    assert 0 < sent < 437


@pytest.mark.slow
def test_publish_on_a_terminal_shows_progress_and_refuses_damage_up_front(
    kafka_broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a terminal publish counts the records first (a bar with rate and ETA needs the
    total), so a damaged file is refused before a single message is sent."""
    for module in (options, stream_commands):
        monkeypatch.setattr(module, "stderr_is_terminal", lambda: True)
    calls: list[int] = []
    real = options.progress

    @contextlib.contextmanager
    def spy(length: int, label: str, unit: str) -> Iterator[Callable[[int], None] | None]:
        calls.append(length)
        with real(length, label, unit) as update:
            yield update

    monkeypatch.setattr(stream_commands, "progress", spy)
    ok = _topic_copy(tmp_path, "ok.jsonl")
    boot = kafka_broker.bootstrap
    result = CliRunner().invoke(publish, [str(ok), "--bootstrap", boot, "--speed", "1000"])
    assert result.exit_code == 0, result.output
    assert calls == [437]  # every record of the sample
    assert "publishing" in result.output
    result = CliRunner().invoke(publish, [str(_text(tmp_path)), "--bootstrap", boot])
    assert result.exit_code == 1
    assert result.output.strip().endswith("; published nothing")


SCENARIO = ROOT / "examples" / "scenario-small.yaml"

#: Every way `ebbtide replay` opens a recording: the inferred cluster's scan, the scenario's
#: header read (--cluster), and the two passes of --model fit.
REPLAY_PATHS: dict[str, list[str]] = {
    "inferred cluster": [],
    "--cluster": ["--cluster", str(SCENARIO)],
    "--model fit": ["--model", "fit"],
    "--cluster --model fit": ["--cluster", str(SCENARIO), "--model", "fit"],
}


@pytest.mark.parametrize("path_of", REPLAY_PATHS, ids=list(REPLAY_PATHS))
@pytest.mark.parametrize("case", DAMAGED, ids=list(DAMAGED))
def test_every_replay_path_reports_damage_in_one_line(
    tmp_path: Path, case: str, path_of: str
) -> None:
    """Whichever way replay opens the recording first, a damaged one is `Error: FILE: why`,
    exit 1, no traceback (--cluster read the header with a reader of its own and crashed)."""
    make, words = DAMAGED[case]
    path = make(tmp_path)
    args = [str(path), "--policy", str(BALANCED), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(replay_command, args + REPLAY_PATHS[path_of])
    assert result.exit_code == 1, result.output
    assert not isinstance(result.exception, RecordingError | OSError | EOFError)
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {path}: ")
    assert words in line


READERS: dict[str, Callable[[Path], object]] = {
    "read_header": read_header,
    "read_recording": lambda p: list(read_recording(p)),
    "read_event_batches": lambda p: list(read_event_batches(p)),
    "scan_recording": scan_recording,
}


READ_CASES = [
    (case, reader)
    for case in ("truncated gzip", "not gzip", "empty")
    for reader in READERS
    if (case, reader) != ("truncated gzip", "read_header")  # it reads line 1 only: intact
]


@pytest.mark.parametrize(("case", "reader"), READ_CASES, ids=[f"{c}-{r}" for c, r in READ_CASES])
def test_every_reader_raises_the_same_recording_error(
    tmp_path: Path, case: str, reader: str
) -> None:
    """Each function that opens a recording raises RecordingError `FILE: why` with the same
    words (not BadGzipFile, EOFError or a silent None)."""
    make, words = DAMAGED[case]
    path = make(tmp_path)
    with pytest.raises(RecordingError) as caught:
        READERS[reader](path)
    assert str(caught.value).startswith(f"{path}: ")
    assert words in str(caught.value)


def test_an_unreadable_path_is_a_recording_error(tmp_path: Path) -> None:
    """A path that cannot be opened (here a directory) is one RecordingError naming it."""
    for reader in READERS.values():
        with pytest.raises(RecordingError, match=f"^{tmp_path}: cannot read it: "):
            reader(tmp_path)

"""The stream commands as a user runs them: real processes, one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from streams.broker import EmbeddedBroker, free_port
from streams.recording import RecordedMessage, read_recording

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-events.jsonl"


def ebbtide(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | {"EBBTIDE_LOG_FORMAT": "json"},
    )


@pytest.mark.slow
def test_demo_publishes_and_validates_the_sample() -> None:
    """`ebbtide demo` runs end to end on the embedded broker and reports the dead-letters."""
    result = ebbtide("demo")
    assert result.returncode == 0, result.stderr
    assert "published 437 messages" in result.stdout
    assert "consumed 437: accepted 432, rejected 5" in result.stdout
    assert "serving/chat: 120 latency events" in result.stdout


@pytest.mark.slow
def test_broker_command_prints_bootstrap_and_stops_on_sigterm() -> None:
    """`ebbtide broker` serves on the given port until SIGTERM, then exits 0."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "controller", "broker", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == f"127.0.0.1:{port}"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        process.kill()


@pytest.mark.slow
def test_publish_then_record_via_the_cli(kafka_broker: EmbeddedBroker, tmp_path: Path) -> None:
    """`publish` then `record` through the CLI gives back every message of the sample."""
    out = tmp_path / "out.jsonl"
    boot = kafka_broker.bootstrap
    lat = f"ebbtide.inference.latency.{uuid.uuid4().hex[:6]}"
    sample = tmp_path / "sample.jsonl"
    lines = EXAMPLE.read_text().splitlines()
    sample.write_text(
        "\n".join(json.dumps(json.loads(ln) | {"topic": lat}) for ln in lines[1:]) + "\n"
    )
    published = ebbtide("publish", str(sample), "--bootstrap", boot, "--as-fast-as-possible")
    assert published.returncode == 0, published.stderr
    assert "published 437 messages" in published.stdout
    recorded = ebbtide(
        "record", "--bootstrap", boot, "--out", str(out), "--topics", lat, "--idle", "1"
    )
    assert recorded.returncode == 0, recorded.stderr
    assert f"recorded 437 messages to {out}" in recorded.stdout
    assert sum(isinstance(m, RecordedMessage) for m in read_recording(out)) == 437


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["publish", str(EXAMPLE), "--bootstrap", f"127.0.0.1:{free_port()}"],
            "Error: cannot reach Kafka",
            id="unreachable-broker",
        ),
        pytest.param(
            ["publish", "/nonexistent.jsonl", "--bootstrap", "127.0.0.1:9"],
            "does not exist",
            id="missing-recording",
        ),
        pytest.param(["publish", str(EXAMPLE)], "Missing option '--bootstrap'", id="no-bootstrap"),
    ],
)
def test_cli_errors_are_one_clear_line(args: list[str], message: str) -> None:
    """User errors print one line on stderr and exit non-zero, with no traceback."""
    result = ebbtide(*args)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr

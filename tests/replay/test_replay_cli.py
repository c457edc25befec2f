"""``ebbtide replay`` end to end, and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from controller.cli.replay import replay_command

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample-events.jsonl"
BALANCED = ROOT / "policies" / "library" / "balanced.yaml"


def test_replay_of_the_sample_writes_every_output(tmp_path: Path) -> None:
    """The sample recording under balanced.yaml exits 0, writes the three files and prints a
    short summary ending with the report's path."""
    out = tmp_path / "out"
    result = CliRunner().invoke(
        replay_command, [str(SAMPLE), "--policy", str(BALANCED), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {"summary.json", "decisions.jsonl", "report.html"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"]["total"] == 437
    assert summary["events"]["rejected"] == 5
    assert summary["policy"]["name"] == "balanced"
    assert len(summary["policy"]["sha256"]) == 64
    assert "serving/chat" in result.output
    assert result.output.rstrip().endswith(f"report: {out / 'report.html'}")
    # Open loop: the attainment is the recording's, and every output says so.
    assert summary["latency"].startswith("as recorded: replay is open loop")
    assert "latency as recorded" in result.output
    assert "Latency as recorded" in (out / "report.html").read_text()


def test_missing_recording_is_a_one_line_error(tmp_path: Path) -> None:
    """A recording that does not exist: exit 1 and one line naming it."""
    result = CliRunner().invoke(
        replay_command, ["nope.jsonl", "--policy", str(BALANCED), "--out", str(tmp_path)]
    )
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["Error: recording not found: nope.jsonl"]


def test_invalid_policy_is_a_one_line_error(tmp_path: Path) -> None:
    """A policy with problems: exit 1 and one line with the first FILE:LINE:COL problem."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(BALANCED.read_text().replace("objectiveMs: 300", "objectiveMs: -1")
                   .replace("pool: whole", "pool: nowhere"))  # fmt: skip
    result = CliRunner().invoke(
        replay_command, [str(SAMPLE), "--policy", str(bad), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: invalid policy: {bad}:")
    assert "more; see ebbtide policy validate" in line
    missing = CliRunner().invoke(
        replay_command, [str(SAMPLE), "--policy", "none.yaml", "--out", str(tmp_path / "o")]
    )
    assert missing.exit_code == 1
    assert len(missing.output.strip().splitlines()) == 1

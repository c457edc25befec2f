"""A replay that replayed nothing is an error, not an empty report: every event rejected, or
no latency event for a service the policy names (a namespace typo, the wrong recording)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from replay_builders import POLICY, chat_events, write_recording

from controller.cli.replay_command import replay_command
from streams.events import InferenceLatency

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
MODES = {"recorded": [], "fit": ["--model", "fit"], "scenario": ["--cluster", str(SCENARIO)]}


def _replay(tmp_path: Path, recording: Path, extra: list[str]) -> tuple[int, str, Path]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    out = tmp_path / "out"
    args = [str(recording), "--policy", str(policy), "--out", str(out), *extra]
    result = CliRunner().invoke(replay_command, args)
    return result.exit_code, result.output, out


@pytest.mark.parametrize("mode", MODES, ids=list(MODES))
def test_every_event_rejected_is_one_line_naming_the_reasons(tmp_path: Path, mode: str) -> None:
    """All lines rejected: exit 1, one line with the count by reason and the first rejected
    line, and no report that would pass for a replay."""
    bad = ["not json"] * 3 + [json.dumps({"topic": "t", "value": {"type": "nope", "ts": 1}})]
    path = write_recording(tmp_path / "r.jsonl", [], extra=bad)
    code, output, out = _replay(tmp_path, path, MODES[mode])
    assert code == 1, output
    (line,) = output.strip().splitlines()
    assert line.startswith(f"Error: {path}: nothing replayed: all 4 events were rejected (")
    assert "malformed 3" in line
    assert "invalid 1" in line
    assert "first: line 2: malformed" in line
    assert line.endswith("; no report written")
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("mode", MODES, ids=list(MODES))
def test_no_event_for_a_policy_service_names_both_sides(tmp_path: Path, mode: str) -> None:
    """Latency events only for services the policy does not name: exit 1, one line naming the
    services seen (with their counts) and the policy's own."""
    events = [
        msgspec.structs.replace(e, namespace="staging") if isinstance(e, InferenceLatency) else e
        for e in chat_events(60, burst=(0, 0))
    ]
    path = write_recording(tmp_path / "r.jsonl", events)
    code, output, out = _replay(tmp_path, path, MODES[mode])
    assert code == 1, output
    (line,) = output.strip().splitlines()
    assert line.startswith(f"Error: {path}: nothing replayed: ")
    assert "no latency event is for a service of the policy" in line
    assert "the recording has staging/chat (60 events)" in line
    assert "the policy names serving/chat" in line
    assert not out.exists() or list(out.iterdir()) == []


def test_some_events_for_the_policy_is_a_replay(tmp_path: Path) -> None:
    """One matching service among strangers replays as before (exit 0, report written), and
    summary.json counts the strangers' events by service."""
    ours = chat_events(60, burst=(0, 0))
    theirs = [
        msgspec.structs.replace(e, service="other") for e in ours if isinstance(e, InferenceLatency)
    ]
    path = write_recording(tmp_path / "r.jsonl", ours + theirs)
    code, output, out = _replay(tmp_path, path, [])
    assert code == 0, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"]["services_not_in_policy"] == {"serving/other": 60}

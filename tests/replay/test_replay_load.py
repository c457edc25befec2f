"""Load events in a recording: ``ebbtide simulate --record`` writes the GenAI day's
``inference.load`` events beside its latencies, and replaying the recording under the same
policy and scenario feeds them to the engine again: the same decisions, load signals and
work-bound check included. (Events on time and pods starting as the scenario says: replay
models neither a producer's lag nor the LLM server's start-up.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from controller.cli.replay_command import replay_command
from controller.cli.simulate_command import simulate
from streams.events import EventDecoder, InferenceLoad, Rejection
from streams.recording import read_events

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples/scenario-genai.yaml"
POLICY = ROOT / "examples/policy-genai.yaml"


def decisions(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for d in lines:
        d.pop("controller", None)
    return lines


def test_replay_feeds_recorded_load_events_to_the_engine(tmp_path: Path) -> None:
    record = tmp_path / "genai.jsonl.gz"
    sim = CliRunner().invoke(
        simulate,
        [str(SCENARIO), "--policy", str(POLICY), "--duration", "1h", "--start", "00:00",
         "--burst", "none", "--latency-model", "llm", "--slo-metric", "e2e",
         "--mean-tokens", "64:256", "--out", str(tmp_path / "sim"), "--record", str(record),
         "--lag-flush", "0s", "--lag-transport", "0s", "--serving-startup", "60s"],
    )  # fmt: skip
    assert sim.exit_code == 0, sim.output
    events = [e for _, e in read_events(record, EventDecoder(load=True))]
    assert not [e for e in events if isinstance(e, Rejection)]
    assert any(isinstance(e, InferenceLoad) for e in events)
    replayed = CliRunner().invoke(
        replay_command,
        [str(record), "--policy", str(POLICY), "--cluster", str(SCENARIO),
         "--out", str(tmp_path / "replay")],
    )  # fmt: skip
    assert replayed.exit_code == 0, replayed.output
    sim_decisions = decisions(tmp_path / "sim/decisions.jsonl")
    assert "signal-scale-up" in {d["rule"] for d in sim_decisions}
    assert sim_decisions == decisions(tmp_path / "replay/decisions.jsonl")

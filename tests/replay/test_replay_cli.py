"""``ebbtide replay`` end to end, and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from replay_builders import POLICY, burst_rate, queue_chat_events, write_recording

from controller.cli.replay_command import replay_command

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


def _fit_inputs(tmp_path: Path) -> list[str]:
    """A recording chat's two replicas served through a burst, and the policies: the one it
    was made under (two replicas, fixed) and one that may scale to 8."""
    recording = write_recording(tmp_path / "burst.jsonl", queue_chat_events(40, rate=burst_rate))
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(POLICY.replace("replicas: {min: 1, max: 8}", "replicas: {min: 2, max: 2}"))
    scaling = tmp_path / "scaling.yaml"
    scaling.write_text(POLICY.replace("replicas: {min: 1, max: 8}", "replicas: {min: 2, max: 8}"))
    return [str(recording), "--policy", str(scaling), "--recorded-policy", str(fixed)]


def test_model_fit_prints_and_writes_the_fit_and_its_validation(tmp_path: Path) -> None:
    """--model fit (cluster inferred): summary.json says the latency is modelled and has the
    fit per service with goodness and held-back error; the CLI prints them in one line and
    the report lists it."""
    out = tmp_path / "out"
    args = [*_fit_inputs(tmp_path), "--model", "fit", "--out", str(out)]
    result = CliRunner().invoke(replay_command, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["latency"].startswith("modelled (fit)")
    fit = summary["fit"]["serving/chat"]
    assert fit["modelled"] is True
    assert set(fit) == {
        "modelled", "reason", "model", "percentile", "p0_ms", "capacity_rps_per_replica",
        "jitter", "r2", "rmse_ms", "points", "load_range_rps_per_replica", "validation",
        "replicas_from",
    }  # fmt: skip
    assert fit["points"] == 40
    assert set(fit["validation"]) == {
        "fit_points", "held_points", "held_from_s", "mape_pct", "rmse_ms"
    }  # fmt: skip
    line = next(x for x in result.output.splitlines() if "fit serving/chat:" in x)
    assert f"r2 {fit['r2']:.2f}" in line
    assert f"MAPE {fit['validation']['mape_pct']:.1f}%" in line
    assert "; modelled; replicas replayed under replay-test " in line
    assert "latency modelled (fit)" in result.output
    report = (out / "report.html").read_text()
    assert "Latency model" in report
    assert f"held-back {fit['validation']['held_points']} min" in report


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param([], "--recorded-policy only applies with --model fit", id="no --model fit"),
        pytest.param(["--model", "fit", "--speed", "2"], "--speed paces one replay", id="speed"),
        pytest.param(["--model", "guess"], "'guess' is not one of 'recorded', 'fit'", id="model"),
    ],
)
def test_bad_flag_combinations_are_usage_errors(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    """Flags that do not go together exit 2 with a message naming them, and write nothing."""
    out = tmp_path / "out"
    result = CliRunner().invoke(replay_command, [*_fit_inputs(tmp_path), *extra, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not out.exists()

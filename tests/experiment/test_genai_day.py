"""The GenAI day in a closed loop (examples/scenario-genai.yaml): a pipeline whose latency is
set by the work ratchets to replicas.max on latency alone and holds it all night; with load
signals and the work-bound check (examples/policy-genai.yaml) it gives the GPUs back."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controller.offline.experiment import Bench, Diurnal, SimulateSettings, run_controller
from controller.offline.models.llmserving import DEFAULT_SERVING_STARTUP_S, LlmServing, mix_of
from controller.simcluster import EPOCH, load_scenario
from policies.loader import load_policy_text

ROOT = Path(__file__).resolve().parents[2]


def night(policy_file: str, out: Path) -> list[dict[str, Any]]:
    """00:00-05:00 of the GenAI day under ``policy_file``: the applied decisions."""
    scenario = load_scenario(ROOT / "examples/scenario-genai.yaml")
    policy = load_policy_text((ROOT / "examples" / policy_file).read_text(), policy_file)
    bench = Bench.of(
        scenario,
        policy,
        lambda s: Diurnal(start=s),
        SimulateSettings(duration_s=5 * 3600.0, seed=0, start_of_day_s=0.0),
        llm=LlmServing(mix_of((), (64, 256)), metric="e2e"),
    )
    bench = replace(
        bench, scenario=scenario.with_startup(bench.workloads, DEFAULT_SERVING_STARTUP_S)
    )
    run_controller(bench, "ebbtide", out)
    rows = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    return [d for d in rows if d["outcome"] == "applied"]


def imagegen(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in rows if d["target"] == "serving/imagegen" and d["action"] == "scale"]


@pytest.mark.slow
def test_load_signals_give_capacity_back_at_night(tmp_path: Path) -> None:
    before = imagegen(night("policy-genai-latency-only.yaml", tmp_path / "before"))
    assert before[-1]["to"] == 16  # replicas.max, within minutes...
    assert all(d["to"] > d["from"] for d in before)  # ...and never a step back
    rows = night("policy-genai.yaml", tmp_path / "after")
    after = imagegen(rows)
    last_hours = [d for d in after if d["ts"] >= EPOCH + 3600]
    assert max(d["to"] for d in last_hours) <= 4
    downs = [d for d in after if d["rule"] == "slo-scale-down"]
    assert downs
    assert "latency set by the work" in downs[0]["reason"]
    # the breach wants no GPUs once work-bound: training grows into what imagegen gave back
    grown = [d for d in rows if d["rule"] == "grow-training" and d["ts"] > downs[0]["ts"]]
    assert grown

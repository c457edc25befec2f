"""The tide in a short closed loop: a flash crowd at dawn is met by shrinking training, then the
replicas are given back one by one and training grows back into them (issue 12's day story,
in simulated minutes rather than a day)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.sim import load_scenario
from controller.simulate import Bench, Burst, Diurnal, SimulateSettings, run_controller
from policies.loader import load_policy_text

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_breach_shrinks_training_then_scale_down_gives_it_back(tmp_path: Path) -> None:
    """04:50, a x6 burst from 05:00 for 15 minutes, 70 minutes in all: chat is scaled up with
    GPUs freed by shrinking training, then scaled down after the burst, and training grows back
    into what it gave back, in that order."""
    policy = load_policy_text((ROOT / "policies/library/balanced.yaml").read_text())
    bench = Bench.of(
        load_scenario(ROOT / "examples/scenario-small.yaml"),
        policy,
        lambda s: Diurnal(start=s, bursts=(Burst(600.0, 900.0, 6.0),)),
        SimulateSettings(duration_s=4200.0, seed=1, start_of_day_s=4 * 3600.0 + 50 * 60.0),
    )
    run_controller(bench, "ebbtide", tmp_path)
    lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    rules = [(d["rule"], d["target"]) for d in map(json.loads, lines)]
    up = rules.index(("slo-breach-scale-up", "serving/chat"))
    shrink = next(i for i, r in enumerate(rules) if r[0] == "free-gpus-shrink-training")
    down = rules.index(("slo-scale-down", "serving/chat"))
    grow = next(i for i, r in enumerate(rules) if r[0] == "grow-training" and i > down)
    assert shrink < up < down < grow
    assert rules.count(("slo-scale-down", "serving/chat")) >= 3

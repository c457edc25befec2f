"""The tide in a short closed loop: a flash crowd at dawn is met by shrinking training, then the
replicas are given back one by one and training grows back into them (issue 12's day story,
in simulated minutes rather than a day)."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from controller.offline.experiment import Bench, Burst, Diurnal, SimulateSettings, run_controller
from controller.simcluster import load_scenario
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


@dataclass(frozen=True)
class DayNight:
    """A day in 100 simulated minutes: peak load, then a night of 10% from ``dusk_s``, then
    the peak again from ``dawn_s``."""

    start: float
    dusk_s: float = 600.0
    dawn_s: float = 3900.0

    def factor(self, t: float) -> float:
        return 0.1 if self.dusk_s <= t - self.start < self.dawn_s else 1.0

    def describe(self) -> str:
        return "day-night step"


def _quick(text: str) -> str:
    """examples/policy-day.yaml with its waits shortened so a night fits in minutes."""
    yaml = YAML()
    data = yaml.load(text)
    spec = data["spec"]
    chat = spec["services"]["chat"]
    chat["scale"]["down"].update(stabilization="1m", maxStep="50%", cooldown="30s")
    spec["training"]["elastic"]["growAfter"] = "1m"
    spec["mig"].update(convertAfter="5m", revertAfter="1m")
    spec["cooldowns"]["trainingGrow"] = "1m"
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


@pytest.mark.slow
def test_the_tide_scale_down_mig_at_night_and_back_in_the_morning(tmp_path: Path) -> None:
    """examples/scenario-day.yaml under a step day: at night chat is scaled down, training
    grows to its maximum, the node left idle is converted to MIG; at dawn chat takes GPUs from
    training, and the MIG node is reverted for training to grow back into — in that order, once
    each, visible in the report's markers and GPUs by use."""
    policy = load_policy_text(_quick((ROOT / "examples/policy-day.yaml").read_text()))
    bench = Bench.of(
        load_scenario(ROOT / "examples/scenario-day.yaml"),
        policy,
        lambda s: DayNight(start=s),
        SimulateSettings(duration_s=6000.0, seed=1, start_of_day_s=12 * 3600.0),
    )
    result = run_controller(bench, "ebbtide", tmp_path).result
    lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    rules = [(d["ts"] - bench.start, d["rule"], d["target"]) for d in map(json.loads, lines)]

    def first(rule: str, after: float = 0.0) -> float:
        return float(next(t for t, r, _ in rules if r == rule and t >= after))

    down = first("slo-scale-down", 600.0)
    convert = first("mig-convert")
    revert = first("mig-revert")
    regrow = first("grow-training", revert)
    assert 600.0 < down < convert < 3900.0 < revert < regrow
    assert [r for _, r, _ in rules].count("mig-convert") == 1
    assert [r for _, r, _ in rules].count("mig-revert") == 1
    marked = [m["action"] for m in result.markers]
    assert "mig_convert" in marked
    assert "mig_revert" in marked
    for flow in (m for m in result.markers if m["action"] in ("mig_convert", "mig_revert")):
        # the flow's final outcome, once it ended on its node, not its in_progress start
        assert flow["outcome"] == "applied", flow
        assert float(str(flow["finished"])) > float(str(flow["ts"]))
    assert result.summary.pools["mig"].use_sum["mig"] > 0  # the converted node's cards, by use

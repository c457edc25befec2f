"""GPUs held by pods but idle (an over-provisioned inference replica's) show as reclaimable in
``ebbtide simulate``'s outputs: a series per pool in report.html, GPU-hours in summary.json and
compare.json; sampled once per report bucket, not every tick."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from controller.offline.accounting.report import FIGURES_ID, write_outputs
from controller.offline.experiment import Bench, SimulateSettings, run_controller
from controller.simcluster import load_scenario
from policies.engine import Engine
from policies.loader import load_policy_text

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
BALANCED = ROOT / "policies" / "library" / "balanced.yaml"


class Quiet:
    """Almost no requests: chat's replicas sit idle (under 1% busy) all run long."""

    def factor(self, t: float) -> float:
        return 0.002

    def describe(self) -> str:
        return "quiet: 0.2% of peak"


@pytest.mark.slow
def test_idle_inference_replicas_are_reported_reclaimable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[float] = []
    reclaimable = Engine.reclaimable

    def counted(self: Engine, now: float) -> object:
        calls.append(now)
        return reclaimable(self, now)

    monkeypatch.setattr(Engine, "reclaimable", counted)
    settings = SimulateSettings(duration_s=2700.0, seed=1, points=90)
    bench = Bench.of(
        load_scenario(SCENARIO), load_policy_text(BALANCED.read_text()), lambda s: Quiet(), settings
    )
    run = run_controller(bench, "ebbtide", tmp_path / "out")
    result, figures = run.result, run.figures
    write_outputs(result, tmp_path / "out")
    # once per bucket of the report's timeline, not every tick: 90 points while the stride
    # doubles from 1 to 32 ticks over the 2700 ticks, up to 90 samples at each stride
    assert 0 < len(calls) <= settings.points * (1 + math.ceil(math.log2(2700 / 90)))
    pools = json.loads((tmp_path / "out" / "summary.json").read_text())["pools"]
    # chat keeps its 4 replicas (too few requests for a verdict: no scale-down), each on a whole
    # GPU known idle once readings have shown none above the threshold for the 30m utilization
    # window: 4 GPUs from 30m (give or take one 30 s report bucket) to the end at 45m
    whole = pools["whole"]["reclaimable_gpu_hours"]
    bucket = 2700 / settings.points
    assert 4 * (2700 - 1800 - bucket) / 3600 <= whole <= 4 * (2700 - 1800 + bucket) / 3600
    assert pools["mig"]["reclaimable_gpu_hours"] == 0.0
    assert figures.to_dict()["reclaimable_gpu_hours"] == pytest.approx(whole, abs=1e-3)
    page = (tmp_path / "out" / "report.html").read_text()
    start = page.index(f'id="{FIGURES_ID}">') + len(f'id="{FIGURES_ID}">')
    figs = json.loads(page[start : page.index("</script>", start)])
    [use] = [f for f in figs if f["kind"] == "gpus-by-use" and f["pool"] == "whole"]
    [line] = [t for t in use["data"] if t["name"].startswith("reclaimable")]
    assert "stackgroup" not in line
    assert max(v for v in line["y"] if v is not None) == 4.0
    assert line["y"][0] == 0.0  # nothing is known idle before a whole window was observed
    assert "reclaimable GPU-h" in page

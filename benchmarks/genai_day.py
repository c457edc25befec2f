"""The GenAI day (examples/scenario-genai.yaml): serving/imagegen's replicas over a simulated
day on latency alone (examples/policy-genai-latency-only.yaml) and with load signals and the
work-bound check (examples/policy-genai.yaml), side by side in one run.

The pipeline's P95 is set by the work (the LLM serving model with 64-token prompts and
256-token outputs: ~5.7 s at any load against a 4 s objective), so latency alone ratchets the
service to ``replicas.max``; the load signals size it to the load. Prints the replicas at each
hour of both runs, the GPU-hours each held, and their ratio (signals / latency only), overall
and over the night (00:00-06:00).

    python benchmarks/genai_day.py [--seed N] [--hours H]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from controller.offline.experiment import Bench, Diurnal, SimulateSettings, run_controller
from controller.offline.models.llmserving import DEFAULT_SERVING_STARTUP_S, LlmServing, mix_of
from controller.simcluster import EPOCH, load_scenario
from policies.loader import load_policy_text

ROOT = Path(__file__).resolve().parents[1]
SERVICE = "serving/imagegen"
POLICIES = {"latency only": "policy-genai-latency-only.yaml", "signals": "policy-genai.yaml"}


def replicas_by_minute(decisions: Path, start: float, minutes: int, initial: int) -> list[int]:
    """The service's replicas at each simulated minute, from the applied scale decisions."""
    changes = []
    for line in decisions.read_text().splitlines():
        d = json.loads(line)
        if d["target"] == SERVICE and d.get("outcome") == "applied" and d["action"] == "scale":
            changes.append((d["ts"], d["to"]))
    out, replicas, i = [], initial, 0
    for m in range(minutes):
        while i < len(changes) and changes[i][0] <= start + 60 * m:
            replicas = changes[i][1]
            i += 1
        out.append(replicas)
    return out


def run(seed: int, hours: int) -> tuple[dict[str, list[int]], dict[str, dict[str, float]]]:
    """Each policy's replicas by minute, and its pool's mean GPUs by use."""
    scenario = load_scenario(ROOT / "examples/scenario-genai.yaml")
    llm = LlmServing(mix_of((), (64, 256)), metric="e2e")
    settings = SimulateSettings(duration_s=hours * 3600.0, seed=seed, start_of_day_s=0.0)
    out: dict[str, list[int]] = {}
    use: dict[str, dict[str, float]] = {}
    for name, file in POLICIES.items():
        policy = load_policy_text((ROOT / "examples" / file).read_text(), file)
        bench = Bench.of(scenario, policy, lambda s: Diurnal(start=s), settings, llm=llm)
        startup = scenario.with_startup(bench.workloads, DEFAULT_SERVING_STARTUP_S)
        bench = replace(bench, scenario=startup)
        with tempfile.TemporaryDirectory() as tmp:
            done = run_controller(bench, "ebbtide", Path(tmp))
            out[name] = replicas_by_minute(Path(tmp) / "decisions.jsonl", EPOCH, hours * 60, 2)
        use[name] = done.result.summary.to_dict()["pools"]["whole"]["mean_gpus"]
    return out, use


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hours", type=int, default=24)
    args = parser.parse_args()
    runs, use = run(args.seed, args.hours)
    names = list(runs)
    print(f"{SERVICE} replicas at each hour (seed {args.seed})")
    print("hour  " + "  ".join(f"{n:>13}" for n in names))
    for h in range(args.hours):
        print(f"{h:02d}:00 " + "  ".join(f"{runs[n][h * 60]:>13}" for n in names))
    before, after = runs["latency only"], runs["signals"]
    night = slice(0, min(len(after), 6 * 60))
    gpu_h = {n: sum(r) / 60 for n, r in runs.items()}
    print(
        f"GPU-hours held: latency only {gpu_h['latency only']:.1f}, signals "
        f"{gpu_h['signals']:.1f}; ratio signals / latency only "
        f"{gpu_h['signals'] / gpu_h['latency only']:.3f}"
    )
    for n in names:
        gpus = ", ".join(f"{k} {v:.2f}" for k, v in use[n].items() if k != "reconfiguring")
        print(f"mean GPUs by use, {n}: {gpus}")
    print(
        f"night (00:00-06:00) mean replicas: latency only {sum(before[night]) / 360:.2f}, "
        f"signals {sum(after[night]) / 360:.2f}; ratio "
        f"{sum(after[night]) / max(1, sum(before[night])):.3f}"
    )


if __name__ == "__main__":
    main()

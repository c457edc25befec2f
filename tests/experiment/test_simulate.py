"""``ebbtide simulate`` end to end: the comparison, the outputs, the recording, determinism."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from controller.cli.replay_command import replay_command
from controller.cli.simulate_command import simulate
from controller.offline.accounting.report import FIGURES_ID
from controller.offline.experiment import (
    CONTROLLERS,
    Bench,
    Burst,
    Diurnal,
    EventLag,
    SimulateSettings,
    run_controller,
)
from controller.simcluster import load_scenario
from policies.loader import load_policy_text
from streams.events import GpuUtilization, InferenceLatency, Rejection
from streams.recording import read_events, read_header

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
BALANCED = ROOT / "policies" / "library" / "balanced.yaml"
EXAMPLE = ROOT / "examples" / "incident.jsonl.gz"
ARGS = ["--duration", "1h", "--burst", "30m:15m:6", "--seed", "1"]
#: Ebbtide on time, so that a replay of the recording reproduces the run (replay sees every
#: event at its stamp); the default lag is tested on its own.
ON_TIME = ["--lag-flush", "0s", "--lag-transport", "0s"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Result]]:
    out = tmp_path_factory.mktemp("sim") / "out"
    record = out.parent / "run.jsonl.gz"
    args = [str(SCENARIO), "--policy", str(BALANCED), *ARGS, *ON_TIME, "--out", str(out)]
    result = CliRunner().invoke(simulate, [*args, "--compare", "--record", str(record)])
    assert result.exit_code == 0, result.output
    return out, result


def test_compare_ebbtide_beats_polling_on_slo_and_static_on_utilization(
    compared: tuple[Path, Result],
) -> None:
    """On the small scenario with a x6 burst: Ebbtide's SLO attainment is above the polling
    strawman's (no preemption), and its mean GPU utilization above the peak-sized static
    oracle's. (Against the fair peers it does not win here: see BENCHMARKS.md.)"""
    out, result = compared
    print(result.output)
    runs = {r["controller"]: r for r in json.loads((out / "compare.json").read_text())["runs"]}
    ebb, polling, static = runs["ebbtide"], runs["polling"], runs["static-peak"]
    for name, r in runs.items():
        print(
            f"{name}: attainment {r['slo_attainment']:.4f}, util {r['mean_gpu_util_pct']:.2f}%, "
            f"training {r['training_gpu_hours']:.2f} GPU-h, evictions {r['evictions']}, "
            f"MIG conversions {r['mig_conversions']}"
        )
    assert ebb["slo_attainment"] > polling["slo_attainment"]
    assert ebb["mean_gpu_util_pct"] > static["mean_gpu_util_pct"]
    assert static["scale_actions"] == 0
    assert "SLO attainment" in result.output
    assert "static partitioning" in result.output
    assert "oracle" in result.output
    assert "strawman" in result.output


RUN_FIELDS = {
    "controller",
    "label",
    "policy",
    "preemption",
    "slo_attainment",
    "breach_minutes",
    "p99_worst_5min_ms",
    "training_gpu_hours",
    "training_goodput_gpu_hours",
    "training_lost_gpu_hours",
    "reclaimable_gpu_hours",
    "mean_gpu_util_pct",
    "actions",
    "evictions",
    "preemptions",
    "scale_actions",
    "services",
    "settings",
    "training_goodput_gpu_hours_optimistic",
    "disruptions",
    "fair",
    "pareto",
    "dominates",
    "dominated_by",
}


def test_compare_json_has_a_run_per_peer_with_every_field(compared: tuple[Path, Result]) -> None:
    """compare.json's runs[] holds ebbtide and every peer, each with the issue's fields, the
    same scheduler (preemption) for all but polling, and goodput never above GPU-hours."""
    out, result = compared
    doc = json.loads((out / "compare.json").read_text())
    runs = {r["controller"]: r for r in doc["runs"]}
    assert list(runs) == list(CONTROLLERS)
    assert doc["inference_outranks_training"] is True
    for name, r in runs.items():
        assert set(r) >= RUN_FIELDS, name
        assert r["preemption"] is (name != "polling")
        assert r["training_goodput_gpu_hours"] <= r["training_gpu_hours"]
        assert set(r["services"]) == set(doc["services"])
        assert r["label"] in result.output or name in result.output
    assert "no preemption" in runs["polling"]["label"]
    for name in ("hpa-rate", "hpa-latency", "keda", "kpa"):
        assert runs[name]["preemptions"] > 0, name  # scale-ups displaced backfilled training
        assert runs[name]["fair"] is True
    assert (
        runs["polling"]["fair"] is runs["static-peak"]["fair"] is runs["ebbtide"]["fair"] is False
    )
    assert runs["polling"]["preemptions"] == 0
    for name in ("static-p95", "static-peak"):
        assert runs[name]["scale_actions"] == 0  # inference never moves during the run
    assert runs["keda"]["settings"]["cached"] is False  # KEDA's default
    assert runs["hpa-rate"]["settings"]["down_window_s"] == 600.0
    assert runs["ebbtide"]["settings"] == {"lag_flush_s": 0.0, "lag_transport_s": 0.0}
    assert doc["pareto"]["front"] == [r["id"] for r in doc["runs"] if r["pareto"] == "front"]
    fair = {r["id"] for r in doc["runs"] if r["fair"] or r["controller"] == "ebbtide"}
    assert set(doc["pareto"]["fair_front"]) <= fair


def test_one_comparison_report_puts_every_run_on_one_time_axis(
    compared: tuple[Path, Result],
) -> None:
    """compare.html holds one figure of kind comparison: every run's traces in every panel, all
    on the single x axis with the same bucket times."""
    out, _ = compared
    page = (out / "compare.html").read_text()
    start = page.index(f'id="{FIGURES_ID}">') + len(f'id="{FIGURES_ID}">')
    figures = json.loads(page[start : page.index("</script>", start)])
    [fig] = [f for f in figures if f["kind"] == "comparison"]
    assert fig["runs"] == list(CONTROLLERS)
    traces = [t for t in fig["data"] if t.get("legendgroup")]
    assert {t["legendgroup"] for t in traces} == set(CONTROLLERS)
    assert {t["xaxis"] for t in fig["data"]} == {"x"}
    assert len(traces) == len(CONTROLLERS) * len(fig["panels"])
    assert len({tuple(t["x"]) for t in traces}) == 1
    assert [k for k in fig["layout"] if k.startswith("xaxis")] == ["xaxis"]


def _keys(value: Any, prefix: str = "") -> set[str]:
    if isinstance(value, dict):
        keys = set()
        for k, v in value.items():
            if prefix.endswith(("rejected_by_code", "by_outcome", "by_type_and_outcome")):
                continue
            keys |= {f"{prefix}.{k}"} | _keys(v, f"{prefix}.{k}")
        return keys
    return set()


def test_outputs_are_replays_and_parse(compared: tuple[Path, Result], tmp_path: Path) -> None:
    """summary.json has replay's keys and figures, every decisions.jsonl line parses with the
    explained-decision fields, and each report.html embeds every figure kind."""
    out, _ = compared
    replayed = tmp_path / "replayed"
    record = out.parent / "run.jsonl.gz"
    rr = CliRunner().invoke(
        replay_command,
        [
            str(record),
            "--policy",
            str(BALANCED),
            "--cluster",
            str(SCENARIO),
            "--out",
            str(replayed),
        ],
    )
    assert rr.exit_code == 0, rr.output
    mine = json.loads((out / "summary.json").read_text())
    theirs = json.loads((replayed / "summary.json").read_text())
    assert _keys(mine) == _keys(theirs)
    peers = [out / f"baseline-{c}" for c in CONTROLLERS if c != "ebbtide"]
    for where in (out, *peers):
        assert {"summary.json", "decisions.jsonl"} <= {p.name for p in where.iterdir()}
        assert (where == out) == (where / "report.html").exists()  # one report per run: no
        for line in (where / "decisions.jsonl").read_text().splitlines():
            d = json.loads(line)
            assert {"ts", "action", "target", "rule", "reason", "inputs", "applied"} <= set(d)
    page = (out / "report.html").read_text()
    assert f'id="{FIGURES_ID}"' in page
    for kind in ("latency", "utilization", "gpus-by-use", "actions"):
        assert f'"kind": "{kind}"' in page or f'"kind":"{kind}"' in page
    assert mine["slo"]["serving/chat"]["breaches_total"] >= 1
    assert mine["actions"]["by_type"]["scale"] >= 2


def test_replay_of_the_recording_reproduces_the_simulation(
    compared: tuple[Path, Result], tmp_path: Path
) -> None:
    """The --record file round-trips through read_events with no rejection, and replaying it
    under the same policy and scenario gives the same decisions and the same SLO and pool
    figures as the closed-loop run."""
    out, _ = compared
    record = out.parent / "run.jsonl.gz"
    header = read_header(record)
    assert header is not None
    assert header["source"] == "ebbtide simulate"
    decoded = [event for _, event in read_events(record)]
    assert not [e for e in decoded if isinstance(e, Rejection)]
    assert {type(e) for e in decoded} == {InferenceLatency, GpuUtilization}
    summary = json.loads((out / "summary.json").read_text())
    assert len(decoded) == summary["events"]["total"]
    replayed = tmp_path / "replayed"
    rr = CliRunner().invoke(
        replay_command,
        [
            str(record),
            "--policy",
            str(BALANCED),
            "--cluster",
            str(SCENARIO),
            "--out",
            str(replayed),
        ],
    )
    assert rr.exit_code == 0, rr.output
    theirs = json.loads((replayed / "summary.json").read_text())
    for key in ("slo", "actions", "pools", "time"):
        assert summary[key] == theirs[key], key

    def strip(path: Path) -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        for d in lines:
            d.pop("controller", None)
        return lines

    assert strip(out / "decisions.jsonl") == strip(replayed / "decisions.jsonl")


def test_a_seed_gives_the_same_run(tmp_path: Path) -> None:
    """Two runs with the same seed write identical decisions and summaries; another seed
    changes the requests."""
    policy = load_policy_text(BALANCED.read_text())
    scenario = load_scenario(SCENARIO)

    def run(seed: int, where: str) -> tuple[str, dict[str, Any]]:
        settings = SimulateSettings(duration_s=1200.0, seed=seed)
        bench = Bench.of(
            scenario,
            policy,
            lambda s: Diurnal(start=s, bursts=(Burst(600.0, 300.0, 6.0),)),
            settings,
        )
        result = run_controller(bench, "ebbtide", tmp_path / where).result
        return (tmp_path / where / "decisions.jsonl").read_text(), result.summary.to_dict()

    first, again, other = run(4, "a"), run(4, "b"), run(5, "c")
    assert first == again
    assert first[1]["slo"] != other[1]["slo"]


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="examples/incident.jsonl.gz not generated")
def test_the_shipped_example_shows_the_burst_breach_and_the_night_growth(tmp_path: Path) -> None:
    """The README's command on examples/incident.jsonl.gz: a few MB, no rejections, one SLO
    breach of serving/chat answered by scaling it up and shrinking training, and training grown
    into idle GPUs in the night before it."""
    assert EXAMPLE.stat().st_size < 3_000_000
    out = tmp_path / "out"
    result = CliRunner().invoke(
        replay_command,
        [str(EXAMPLE), "--policy", str(BALANCED), "--cluster", str(SCENARIO), "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    print(result.output)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"]["rejected"] == 0
    assert summary["slo"]["serving/chat"]["breaches_total"] == 1
    rules = [json.loads(x)["rule"] for x in (out / "decisions.jsonl").read_text().splitlines()]
    assert rules.index("grow-training") < rules.index("slo-breach-scale-up")
    assert "free-gpus-shrink-training" in rules


def test_sweep_runs_each_controllers_grid_and_marks_the_fronts(tmp_path: Path) -> None:
    """--compare --sweep: every chosen controller at its defaults, then over its grid; each
    run's settings in compare.json, the front and the dominated runs marked consistently, the
    best value of each column with its direction, and the trade-off figure in compare.html."""
    out = tmp_path / "out"
    args = [str(SCENARIO), "--policy", str(BALANCED), "--duration", "20m", "--seed", "2"]
    args += ["--out", str(out), "--compare", "--sweep", "--peers", "hpa-rate,static-p95"]
    args += ["--set", "hpa-rate.guard=0.7"]
    result = CliRunner().invoke(simulate, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "compare.json").read_text())
    runs = doc["runs"]
    count = {
        c: sum(r["controller"] == c for r in runs) for c in ("ebbtide", "hpa-rate", "static-p95")
    }
    assert count == {"ebbtide": 5, "hpa-rate": 5, "static-p95": 4}
    assert all(r["settings"]["guard"] == 0.7 for r in runs if r["controller"] == "hpa-rate")
    assert {r["settings"]["headroom"] for r in runs if r["controller"] == "static-p95"} == {
        0.0, 0.2, 0.5, 1.0
    }  # fmt: skip
    assert [r["default"] for r in runs] == [True] * 3 + [False] * (len(runs) - 3)
    by_id = {r["id"]: r for r in runs}
    for r in runs:
        for other in r["dominated_by"]:
            o = by_id[other]
            assert o["slo_attainment"] >= r["slo_attainment"]
            assert o["training_goodput_gpu_hours"] >= r["training_goodput_gpu_hours"]
        assert (r["pareto"] == "front") == (not r["dominated_by"])
    best = doc["pareto"]["best"]
    assert best["slo_attainment"]["direction"] == "max"
    assert best["disruptions"]["direction"] == "min"
    assert best["slo_attainment"]["value"] == max(r["slo_attainment"] for r in runs)
    page = (out / "compare.html").read_text()
    assert '"kind": "pareto"' in page or '"kind":"pareto"' in page
    assert "<th>settings changed</th>" in page
    assert "<td>headroom=0.5</td>" in page
    assert "dominated by #" in page or all(r["pareto"] == "front" for r in runs)
    assert len(list((out / "sweep").iterdir())) == len(runs) - 3


def test_a_bad_setting_is_one_line_naming_the_known_ones(tmp_path: Path) -> None:
    args = [str(SCENARIO), "--policy", str(BALANCED), "--duration", "5m", "--out", str(tmp_path)]
    result = CliRunner().invoke(simulate, [*args, "--compare", "--set", "kpa.window=9"])
    assert result.exit_code == 2
    assert "kpa has no setting window" in result.output
    assert "stable_window_s" in result.output


def test_ebbtide_decides_on_late_events_while_the_meter_sees_them_on_time(tmp_path: Path) -> None:
    """With a 30 s flush, Ebbtide's first scale-up for the burst comes later than on time; the
    independent meter sees the same requests either way (same events counted)."""
    policy = load_policy_text(BALANCED.read_text())
    scenario = load_scenario(SCENARIO)

    def first_scale_up(lag: EventLag, where: str) -> tuple[float, int]:
        bench = Bench.of(
            scenario,
            policy,
            lambda s: Diurnal(start=s, bursts=(Burst(600.0, 600.0, 6.0),)),
            SimulateSettings(duration_s=1200.0, seed=3),
            lag=lag,
        )
        run = run_controller(bench, "ebbtide", tmp_path / where)
        lines = [
            json.loads(x) for x in (tmp_path / where / "decisions.jsonl").read_text().splitlines()
        ]
        ups = [d["ts"] for d in lines if d["role"] == "inference" and d["to"] > d["from"]]
        return min(ups), run.figures.events

    on_time, n_on_time = first_scale_up(EventLag(0.0, 0.0), "a")
    late, n_late = first_scale_up(EventLag(30.0, 0.0), "b")
    assert late > on_time
    assert n_late == n_on_time


def test_peers_act_through_the_same_gate(tmp_path: Path) -> None:
    """A peer's scale of a workload in a protected namespace is refused by the gate, as
    Ebbtide's would be; nothing changes in the cluster."""
    text = BALANCED.read_text().replace(
        "protectedNamespaces: [kube-system, gpu-operator]",
        "protectedNamespaces: [kube-system, gpu-operator, serving]",
    )
    policy = load_policy_text(text)
    bench = Bench.of(
        load_scenario(SCENARIO),
        policy,
        lambda s: Diurnal(start=s, bursts=(Burst(60.0, 480.0, 6.0),)),
        SimulateSettings(duration_s=600.0, seed=1),
    )
    run = run_controller(bench, "hpa-rate", tmp_path / "out")
    lines = [json.loads(x) for x in (tmp_path / "out" / "decisions.jsonl").read_text().splitlines()]
    chat = [d for d in lines if d["target"] == "serving/chat"]
    assert chat
    assert {d["outcome"] for d in chat} == {"refused"}
    assert run.figures.scale_actions == sum(
        1 for d in lines if d["outcome"] == "applied" and d["role"] == "training"
    )

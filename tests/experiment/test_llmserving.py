"""The LLM serving model: continuous batching from tokens, queueing once full, TTFT/TPOT/e2e;
traces keep their rate and tokens; LLM servers start in minutes."""

from __future__ import annotations

import asyncio
import json
import math
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli.simulate_command import simulate
from controller.offline.experiment import AzureTrace, Bench, SimulateSettings
from controller.offline.models.llmserving import (
    DEFAULT_MEAN_TOKENS,
    METRICS,
    Iteration,
    LlmServing,
    ServerProfile,
    TokenMix,
    capacity_rps,
    mix_of,
)
from controller.simcluster import EPOCH, SimCluster, SimDelays, load_scenario
from controller.simcluster.values import PodTemplate
from policies.decisions import Explanation, Scale
from policies.loader import load_policy_text
from policies.snapshot import SnapshotBuilder

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
BALANCED = ROOT / "policies" / "library" / "balanced.yaml"
PROFILE = ServerProfile()
MEAN = LlmServing()  # the calibration's 1024:128 for every request


def test_capacity_is_bound_by_the_token_budget_or_the_kv_cache() -> None:
    """Short outputs and long prompts fill the 2048-token budget first; long outputs fill the
    KV cache (380k tokens / 8000 per request = 47.5 requests) first."""
    t0, t1, p = 0.0133, 0.0004, 0.000086
    a = 128 * t1 + 1024 * p
    budget = 2048 / ((1024 + 128) * t0 + 2048 * a)
    assert capacity_rps(PROFILE, 1024, 128) == pytest.approx(budget)
    long = 4000 * t1 + 4000 * p
    kv = 47.5 / (4000 * t0 + 47.5 * long)
    assert capacity_rps(PROFILE, 4000, 4000) == pytest.approx(kv)
    assert capacity_rps(PROFILE, 4000, 4000) < capacity_rps(
        ServerProfile(kv_cache_tokens=10**9), 4000, 4000
    )


def test_an_idle_server_answers_in_its_own_prefill_and_one_token() -> None:
    """At zero load: TTFT = prompt x p + one iteration per 2048-token chunk; TPOT = t0."""
    ttft, tpot, e2e = Iteration.at(MEAN, 0.0).latency(3000, 10, 0.0)
    assert ttft == pytest.approx(3000 * 0.086 + 2 * 13.3)
    assert tpot == pytest.approx(13.3)
    assert e2e == pytest.approx(ttft + 9 * 13.3)


def test_throughput_grows_with_the_batch_and_time_per_token_with_load() -> None:
    """More load: a bigger batch, longer iterations (TPOT), but more tokens per second; TPOT
    near capacity is many times the idle one."""
    mu = capacity_rps(PROFILE, 1024, 128)
    loads = [0.0, 0.25 * mu, 0.5 * mu, 0.9 * mu, mu]
    its = [Iteration.at(MEAN, lam) for lam in loads]
    steps = [it.step_ms for it in its]
    assert steps == sorted(steps)
    assert steps[-1] > 10 * steps[0]
    tokens_per_s = [it.batch / (it.step_ms / 1000.0) for it in its[1:]]
    assert tokens_per_s == sorted(tokens_per_s)


def _run(serving: LlmServing, offered: float, replicas: int, ticks: int) -> list[float]:
    model = serving.model("serving/chat", initial_replicas=replicas)
    server = serving.server(model, random.Random(3))
    ttft: list[float] = []
    for _ in range(ticks):
        server.step(offered_rps=offered, replicas=replicas, arrivals=10, dt=1.0)
        ttft += server.ttft
    return ttft


def test_requests_queue_only_once_the_server_is_full() -> None:
    """Below capacity the TTFT stays that of the prompt; past it a backlog builds up and every
    tick's first tokens come later than the last's."""
    mu = capacity_rps(PROFILE, 1024, 128)
    below = _run(MEAN, 0.8 * 2 * mu, 2, 60)
    assert max(below) < 2000
    over = _run(MEAN, 1.5 * 2 * mu, 2, 60)
    per_tick = [over[i] for i in range(0, len(over), 10)]
    assert per_tick == sorted(per_tick)
    assert per_tick[-1] > 20_000


def test_no_replica_times_out_every_request() -> None:
    model = MEAN.model("serving/chat", initial_replicas=1)
    server = MEAN.server(model, random.Random(1))
    got = server.step(offered_rps=5.0, replicas=0, arrivals=4, dt=1.0)
    assert got == [PROFILE.timeout_ms] * 4
    assert math.isinf(server.rho)


def test_a_trace_supplies_the_tokens_a_load_without_them_the_mean() -> None:
    mix = mix_of([(100, 5), (3000, 50)], DEFAULT_MEAN_TOKENS)
    assert {mix.draw(random.Random(s), 1)[0] for s in range(20)} == {(100, 5), (3000, 50)}
    assert mix_of([], (700, 70)) == TokenMix(((700, 70),))
    with pytest.raises(ValueError, match="at least one"):
        TokenMix(())


def test_the_metric_the_controllers_see_is_a_setting() -> None:
    """step returns the chosen metric; the three stay available for the figures."""
    for i, metric in enumerate(METRICS):
        serving = LlmServing(metric=metric)
        model = serving.model("s/a", initial_replicas=1)
        server = serving.server(model, random.Random(7))
        got = server.step(offered_rps=1.0, replicas=1, arrivals=3, dt=1.0)
        assert got == server.latest(metric)
        idle = Iteration.at(serving, 0).latency(1024, 128, 0)
        assert model.base_ms == pytest.approx(idle[i])


TRACE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:00:00.0000000,100,10
2023-11-16 18:00:10.0000000,200,20
2023-11-16 18:00:30.0000000,300,30
2023-11-16 18:01:05.0000000,400,40
"""


def test_a_trace_keeps_its_rate_and_its_tokens(tmp_path: Path) -> None:
    """Buckets 3 and 1 smoothed over neighbours: 2 and 2 per minute, so 2/60 req/s at peak."""
    path = tmp_path / "trace.csv"
    path.write_text(TRACE, encoding="utf-8")
    trace = AzureTrace.from_csv(path, start=0.0)
    assert trace.peak_rps == pytest.approx(2 / 60)
    assert trace.tokens == ((100, 10), (200, 20), (300, 30), (400, 40))
    assert trace.at(EPOCH).start == EPOCH
    assert trace.at(EPOCH).tokens == trace.tokens
    path.write_text("TIMESTAMP\n2023-11-16 18:00:00.0000000\n", encoding="utf-8")
    assert AzureTrace.from_csv(path, start=0.0).tokens == ()
    path.write_text(TRACE.replace(",300,", ",many,"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"trace.csv:4: bad ContextTokens/GeneratedTokens"):
        AzureTrace.from_csv(path, start=0.0)


def test_bench_gives_the_llm_capacity_and_scales_the_load() -> None:
    """Each service's capacity is mu at its mean tokens; a trace's rate is offered as is, times
    --load-scale; without a rate, the peak is 1.25 x the starting replicas' capacity."""
    scenario = load_scenario(SCENARIO)
    policy = load_policy_text(BALANCED.read_text(encoding="utf-8"), str(BALANCED))
    settings = SimulateSettings(duration_s=60.0)

    def shape(start: float) -> AzureTrace:
        return AzureTrace(start, (1.0,), peak_rps=3.0)

    traced = LlmServing(trace_rps=3.0)
    bench = Bench.of(scenario, policy, shape, settings, llm=traced, load_scale=2.0)
    mu = capacity_rps(PROFILE, 1024, 128)
    assert bench.serving is traced
    for model in bench.models.values():
        assert model.per_replica_rps == pytest.approx(mu)
        assert model.peak_rps == pytest.approx(6.0)
    relative = Bench.of(scenario, policy, shape, settings, llm=MEAN)
    replicas = {w.key: w.replicas for w in scenario.to_snapshot().workloads}
    for wl, key in relative.workloads.items():
        want = 1.25 * mu * replicas[wl]
        assert relative.models[key].peak_rps == pytest.approx(want)


def test_a_workload_can_start_slower_than_the_cluster_default() -> None:
    """An LLM server's pods take their own start-up (3 minutes), the others podStartup."""
    b = SnapshotBuilder().node("n0", gpus=8)
    b.workload("serving", "llm", replicas=0).workload("serving", "web", replicas=0)
    sim = SimCluster(
        b.build(),
        delays=SimDelays(pod_startup_s=10, scale_up_create_s=0),
        start=EPOCH,
        templates={"serving/llm": PodTemplate(startup_s=180.0)},
    )
    why = Explanation.of("test", "scale")
    scale = [
        Scale(EPOCH, "serving/llm", "Deployment", 0, 1, "inference", why),
        Scale(EPOCH, "serving/web", "Deployment", 0, 1, "inference", why),
    ]
    asyncio.run(sim.apply(scale))
    sim.advance(EPOCH + 179)
    running = {e.target.rsplit("-", 1)[0] for e in sim.effects if e.kind == "running"}
    assert running == {"serving/web"}
    sim.advance(EPOCH + 181)
    running = {e.target.rsplit("-", 1)[0] for e in sim.effects if e.kind == "running"}
    assert running == {"serving/web", "serving/llm"}


def test_with_startup_only_fills_in_workloads_without_their_own() -> None:
    scenario = load_scenario(SCENARIO)
    keys = [f"{w.namespace}/{w.name}" for w in scenario.spec.workloads]
    first = scenario.with_startup(keys[:1], 240.0)
    assert first.spec.workloads[0].startup == 240.0
    assert all(w.startup is None for w in first.spec.workloads[1:])
    assert first.with_startup(keys[:1], 30.0).spec.workloads[0].startup == 240.0


def _simulate(tmp_path: Path, *extra: str) -> tuple[int, str]:
    args = [str(SCENARIO), "--policy", str(BALANCED), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(simulate, [*args, "--duration", "3m", *extra])
    return result.exit_code, result.output


def test_bad_mean_tokens_are_one_line(tmp_path: Path) -> None:
    code, output = _simulate(tmp_path, "--latency-model", "llm", "--mean-tokens", "ten")
    assert code == 2
    assert "--mean-tokens" in output
    assert "PROMPT:OUTPUT tokens, e.g. 1024:128" in output


@pytest.mark.parametrize(
    ("extra", "kind"),
    [
        pytest.param((), "queue", id="diurnal-defaults-to-the-queue"),
        pytest.param(("--latency-model", "llm", "--slo-metric", "ttft"), "llm", id="llm-asked"),
    ],
)
def test_compare_json_says_which_latency_model_ran(
    tmp_path: Path, extra: tuple[str, ...], kind: str
) -> None:
    code, output = _simulate(tmp_path, "--compare", "--burst", "none", *extra)
    assert code == 0, output
    data = json.loads((tmp_path / "out" / "compare.json").read_text(encoding="utf-8"))
    model = data["latency_model"]
    assert model["kind"] == kind
    runs = data["runs"]
    for run in runs:
        assert run["training_goodput_gpu_hours"] <= run["training_gpu_hours"]
    services = runs[0]["services"]
    if kind == "llm":
        assert model["serving_startup_s"] == 180.0
        assert model["slo_metric"] == "ttft"
        for figures in services.values():
            assert figures["p99_worst_5min_ms"] == figures["ttft_p99_worst_5min_ms"]
    else:
        assert model["serving_startup_s"] is None
        assert all("ttft_p99_worst_5min_ms" not in f for f in services.values())

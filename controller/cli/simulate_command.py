"""``ebbtide simulate``: what would this policy do to a cluster under this load? (closed loop)

The command wires :mod:`controller.offline.experiment` together: load and check the policy and
scenario,
build the load shape (``--load diurnal`` or ``--load azure:PATH``, with ``--burst`` flash crowds
on top), run Ebbtide's engine in the closed loop, write ``summary.json``, ``decisions.jsonl``
and ``report.html`` into ``--out`` (the files ``ebbtide replay`` writes) and print a short
summary. ``--record FILE`` also writes every generated event as a recording that ``ebbtide
replay`` and ``ebbtide publish`` accept. ``--compare`` runs the peers (``hpa-priority``,
``keda-priority``, ``static``, ``polling``: :mod:`controller.offline.experiment.peers`) on the
identical
load and seed in the same process, writes each one's ``summary.json`` and ``decisions.jsonl``
under ``--out/baseline-NAME/``, ``compare.json`` (``runs[]``, one per controller) and ONE
comparison report ``compare.html`` (every run on one time axis), and prints one table. Errors a
user can fix are one line and exit 1.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click

from controller.cli.options import duration_option, load_policy_files, one_line, progress
from controller.offline.accounting.report import COMPARISON_FILE, render_comparison, write_outputs
from controller.offline.experiment.closedloop import (
    CONTROLLERS,
    Bench,
    Controller,
    SimulateSettings,
    run_controller,
)
from controller.offline.experiment.figures import RunFigures
from controller.offline.experiment.load import (
    AZURE_ATTRIBUTION,
    AzureTrace,
    Burst,
    Diurnal,
    LoadShape,
    parse_burst,
)
from controller.offline.models.llmserving import (
    DEFAULT_MEAN_TOKENS,
    DEFAULT_SERVING_STARTUP_S,
    METRICS,
    LlmServing,
    Metric,
    mix_of,
)
from controller.simcluster import load_scenario
from policies.model import format_duration, parse_duration

__all__ = ["COMMANDS", "format_compare", "simulate"]

COMPARE_FILE = "compare.json"
#: How the overall and the per-pool utilization figures weigh GPUs (they differ with MIG).
UTIL_WEIGHTING = (
    "mean GPU util weighs each physical GPU the same (a MIG GPU as the mean of its instances); "
    "a pool's weighs each of its devices, MIG instances included"
)


def _time_of_day(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    try:
        if ":" in value:
            hours, minutes = value.split(":", 1)
            seconds = int(hours) * 3600.0 + int(minutes) * 60.0
        else:
            seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(f"HH:MM or a duration after midnight; got {value!r}") from exc
    if not 0 <= seconds < 86_400:
        raise click.BadParameter("must be within the day (00:00 to 23:59)")
    return seconds


def default_bursts(duration: float) -> tuple[Burst, ...]:
    """One flash crowd of x6 at half the run, for a quarter of it (at most 15 minutes)."""
    return (Burst(duration / 2.0, min(900.0, duration / 4.0), 6.0),)


def _shape_maker(load: str, bursts: tuple[Burst, ...]) -> tuple[Callable[[float], LoadShape], str]:
    """The load shape (given the start) and the attribution it needs, if any."""
    if load == "diurnal":
        return (lambda start: Diurnal(start=start, bursts=bursts)), ""
    if load.startswith("azure:"):
        path = Path(load.split(":", 1)[1])
        if not path.is_file():
            raise click.ClickException(f"load trace not found: {path}")
        try:
            probe = AzureTrace.from_csv(path, start=0.0, bursts=bursts)
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"cannot read load trace: {exc}") from exc
        return probe.at, AZURE_ATTRIBUTION
    raise click.BadParameter(f"diurnal or azure:PATH; got {load!r}", param_hint="--load")


def _optional_duration(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> float | None:
    return None if value is None else duration_option(ctx, param, value)


def _serving(
    latency_model: str, make_shape: Callable[[float], LoadShape], metric: Metric, mean: str
) -> LlmServing | None:
    """The LLM serving model's settings, or ``None`` for the queueing model."""
    shape = make_shape(0.0)
    trace = shape if isinstance(shape, AzureTrace) else None
    if latency_model == "queue" or (latency_model == "auto" and trace is None):
        return None
    try:
        prompt, output = (int(v) for v in mean.split(":"))
        if prompt < 0 or output < 1:
            raise ValueError
    except ValueError:
        raise click.BadParameter(
            f"PROMPT:OUTPUT tokens, e.g. 1024:128 (output at least 1); got {mean!r}",
            param_hint="--mean-tokens",
        ) from None
    tokens = mix_of(trace.tokens if trace else (), (prompt, output))
    return LlmServing(tokens, metric=metric, trace_rps=trace.peak_rps if trace else None)


def _describe_model(llm: LlmServing | None, startup: float | None) -> dict[str, Any]:
    """What compare.json says of the latency model."""
    start = {"serving_startup_s": startup}
    if llm is None:
        return {"kind": "queue", **start}
    mix = llm.tokens
    return {
        "kind": "llm",
        "slo_metric": llm.metric,
        "mean_prompt_tokens": round(mix.mean_prompt, 1),
        "mean_output_tokens": round(mix.mean_output, 1),
        "trace_peak_rps": llm.trace_rps,
        "server": asdict(llm.profile),
        **start,
    }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def format_compare(rows: Sequence[RunFigures]) -> str:
    """The ``--compare`` table."""
    head = ["controller", "preempts", "SLO attainment", "breach min", "worst 5m P99",
            "mean GPU util", "training GPU-h", "goodput GPU-h", "actions",
            "preemptions"]  # fmt: skip
    body = [
        [
            r.controller,
            "yes" if r.preemption else "no",
            _pct(r.slo_attainment),
            f"{r.breach_minutes:.1f}",
            "-" if r.p99_worst_5min_ms is None else f"{r.p99_worst_5min_ms:.0f}ms",
            "-" if r.mean_gpu_util_pct is None else f"{r.mean_gpu_util_pct:.1f}%",
            f"{r.training_gpu_hours:.2f}",
            f"{r.training_goodput_gpu_hours:.2f}",
            str(r.actions),
            str(r.preemptions),
        ]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = []
    for row in [head, *body]:
        cells = [
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _print_summary(summary: dict[str, Any], fig: RunFigures, span: float, report: Path) -> None:
    click.echo(
        f"simulated {format_duration(span)} ({fig.events} events) in {fig.wall_s:.1f}s; "
        f"policy {summary['policy']['name']} {summary['policy']['digest']}"
    )
    util = "-" if fig.mean_gpu_util_pct is None else f"{fig.mean_gpu_util_pct:.1f}%"
    click.echo(f"  all GPUs: mean utilization {util} (each physical GPU weighs the same)")
    for key, v in summary["slo"].items():
        click.echo(
            f"  {key}: P{v['percentile']:g} <= {v['objective_ms']:g}ms attained "
            f"{_pct(v['attainment'])}; {v['breaches_total']} breaches, "
            f"{format_duration(v['breach_seconds'])} in breach"
        )
    acts = summary["actions"]["by_type"]
    click.echo("  actions: " + ", ".join(f"{a} {n}" for a, n in acts.items()))
    for name, p in summary["pools"].items():
        util = "-" if p["mean_util_pct"] is None else f"{p['mean_util_pct']:.1f}%"
        click.echo(
            f"  pool {name}: mean utilization {util} (per device), "
            f"{p['idle_gpu_seconds']:g} idle GPU-s"
        )
    click.echo(f"report: {report}")


@click.command("simulate")
@click.argument("scenario", type=click.Path(path_type=Path))
@click.option("--policy", "policies", type=click.Path(path_type=Path), multiple=True,
              required=True, help="Policy file (repeatable: the files merge).")  # fmt: skip
@click.option("--duration", required=True, callback=duration_option, metavar="DURATION",
              help="Simulated time to run, e.g. 2h.")  # fmt: skip
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for summary.json, decisions.jsonl and report.html.")  # fmt: skip
@click.option("--load", default="diurnal", metavar="diurnal|azure:PATH",
              help="Load shape: a diurnal day, or the Azure LLM trace's arrivals.")  # fmt: skip
@click.option("--burst", "bursts", multiple=True, metavar="OFFSET:DURATION:FACTOR",
              help="A flash crowd, e.g. 40m:15m:6 (repeatable; 'none' for none; default: "
                   "x6 at half the run for a quarter of it, at most 15m).")  # fmt: skip
@click.option("--start", "start_of_day", default="02:00", callback=_time_of_day,
              metavar="HH:MM", help="Time of day (UTC) the run starts.")  # fmt: skip
@click.option("--seed", type=int, default=0, help="Seeds arrivals, latencies and telemetry.")
@click.option("--compare", is_flag=True,
              help="Also run the peers (hpa-priority, keda-priority, static, polling) on the "
                   "same load; write compare.json and compare.html; print a table.")  # fmt: skip
@click.option("--record", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the generated events as a recording (.jsonl or .jsonl.gz).")  # fmt: skip
@click.option("--latency-model", type=click.Choice(["auto", "queue", "llm"]), default="auto",
              help="Service latency: the LLM serving model (continuous batching, tokens) "
                   "or the queueing model; auto: llm for azure: traces, queue for "
                   "diurnal.")  # fmt: skip
@click.option("--slo-metric", type=click.Choice(METRICS), default="tpot",
              help="LLM model: the latency the controllers see and the SLO applies to "
                   "(time to first token, per output token, end to end).")  # fmt: skip
@click.option("--load-scale", type=click.FloatRange(min=0, min_open=True), default=1.0,
              help="Multiplies the offered rate: a trace's own rate (LLM model), else the "
                   "peak of 1.25x the starting replicas' capacity.")  # fmt: skip
@click.option("--mean-tokens", default="{}:{}".format(*DEFAULT_MEAN_TOKENS),
              metavar="PROMPT:OUTPUT",
              help="LLM model: a request's tokens when the load has none.")  # fmt: skip
@click.option("--serving-startup", callback=_optional_duration, metavar="DURATION",
              help="Pod start-up of the services' workloads without their own 'startup' "
                   "(default with the LLM model: 3m; else the scenario's podStartup).")  # fmt: skip
def simulate(
    scenario: Path,
    policies: tuple[Path, ...],
    duration: float,
    out: Path,
    load: str,
    bursts: tuple[str, ...],
    start_of_day: float,
    seed: int,
    compare: bool,
    record: Path | None,
    latency_model: str,
    slo_metric: Metric,
    load_scale: float,
    mean_tokens: str,
    serving_startup: float | None,
) -> None:
    """Simulate SCENARIO under generated load with the policy in the loop; write a report."""
    if not scenario.is_file():
        raise click.ClickException(f"scenario not found: {scenario}")
    policy = load_policy_files(policies)
    try:
        loaded = load_scenario(scenario)
    except ValueError as exc:
        raise one_line("invalid scenario", list(getattr(exc, "errors", ())) or [exc]) from exc
    if bursts == ("none",):
        parsed: tuple[Burst, ...] = ()
    elif bursts:
        try:
            parsed = tuple(parse_burst(b) for b in bursts)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--burst") from exc
    else:
        parsed = default_bursts(duration)
    for b in parsed:
        if b.start_s + b.duration_s > duration:
            raise click.BadParameter(
                f"{format_duration(b.start_s)}:{format_duration(b.duration_s)}:{b.factor:g} "
                f"ends at {format_duration(b.start_s + b.duration_s)}, after the run's "
                f"--duration {format_duration(duration)}",
                param_hint="--burst",
            )
    make_shape, attribution = _shape_maker(load, parsed)
    settings = SimulateSettings(duration_s=duration, seed=seed, start_of_day_s=start_of_day)
    llm = _serving(latency_model, make_shape, slo_metric, mean_tokens)
    bench = Bench.of(loaded, policy, make_shape, settings, llm=llm, load_scale=load_scale)
    startup = serving_startup
    if startup is None and llm is not None:
        startup = DEFAULT_SERVING_STARTUP_S
    if startup is not None:
        bench = replace(bench, scenario=loaded.with_startup(bench.workloads, startup))
    if not bench.models:
        raise click.ClickException(
            f"no service of the policy has a workload in {scenario}: nothing to offer load to"
        )
    command = ["ebbtide", "simulate", str(scenario)]
    command += [a for p in policies for a in ("--policy", str(p))]
    command += ["--duration", format_duration(duration), "--load", load, "--seed", str(seed)]
    command += ["--start", f"{int(start_of_day // 3600):02d}:{int(start_of_day % 3600 // 60):02d}"]
    command += [a for b in bursts for a in ("--burst", b)]
    command += ["--latency-model", latency_model, "--load-scale", f"{load_scale:g}"]
    if llm is not None:
        command += ["--slo-metric", slo_metric, "--mean-tokens", mean_tokens]
    if serving_startup is not None:
        command += ["--serving-startup", format_duration(serving_startup)]
    header: dict[str, Any] = {
        "generated_by": shlex.join(command),
        "scenario": str(scenario),
        "policy": policy.metadata.name,
        "seed": seed,
        "load": bench.shape.describe(),
        "scheduler_preemption": bench.preemption,
        "topics": ["ebbtide.inference.latency", "ebbtide.gpu.utilization"],
    }
    if attribution:
        header["attribution"] = attribution
    with progress(int(duration), "simulating", "sim-s") as on_progress:
        result, fig = run_controller(
            bench, "ebbtide", out, record=record, record_header=header, progress=on_progress
        )
    _, report = write_outputs(result, out)
    _print_summary(result.summary.to_dict(), fig, duration, report)
    if attribution:
        click.echo(f"  {attribution}")
    if record is not None:
        click.echo(f"recording: {record}")
    if not compare:
        return
    rows = [fig]
    results = [result]
    controllers: tuple[Controller, ...] = tuple(c for c in CONTROLLERS if c != "ebbtide")
    for controller in controllers:
        where = out / f"baseline-{controller}"
        res, row = run_controller(bench, controller, where)
        (where / "summary.json").write_text(
            json.dumps(res.summary.to_dict(), indent=2) + "\n", encoding="utf-8"
        )
        rows.append(row)
        results.append(res)
    (out / COMPARE_FILE).write_text(
        json.dumps(
            {
                "load": bench.shape.describe(),
                "seed": seed,
                "duration_s": duration,
                "start": bench.start,
                "services": {k: asdict(m) for k, m in bench.models.items()},
                "latency_model": _describe_model(llm, startup),
                "inference_outranks_training": bench.inference_outranks_training,
                "runs": [r.to_dict() for r in rows],
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    context = (
        f"{shlex.join(command)} --compare: the same cluster ({scenario.name}), policy "
        f"{policy.metadata.name}, load ({bench.shape.describe()}) and seed {seed} for every run. "
        "The scheduler preempts lower PriorityClasses in every run but polling."
    )
    page = render_comparison(
        [(r.to_dict(), res) for r, res in zip(rows, results, strict=True)],
        title=f"Ebbtide vs peers: {loaded.metadata.name}, {format_duration(duration)}",
        context=context,
    )
    (out / COMPARISON_FILE).write_text(page, encoding="utf-8")
    click.echo(f"compared on the same load ({bench.shape.describe()}, seed {seed}):")
    click.echo(format_compare(rows))
    click.echo(f"({UTIL_WEIGHTING})")
    for r in rows:
        click.echo(f"  {r.controller}: {r.label}")
    click.echo(f"comparison: {out / COMPARE_FILE}, report: {out / COMPARISON_FILE}")


COMMANDS = [simulate]

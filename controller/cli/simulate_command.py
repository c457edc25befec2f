"""``ebbtide simulate``: what would this policy do to a cluster under this load? (closed loop)

The command wires :mod:`controller.offline.experiment` together: load and check the policy and
scenario, build the load shape (``--load diurnal`` or ``--load azure:PATH``, with ``--burst``
flash crowds on top), run Ebbtide's engine in the closed loop (seeing events ``--lag-flush`` and
``--lag-transport`` late), write ``summary.json``, ``decisions.jsonl`` and ``report.html`` into
``--out`` (the files ``ebbtide replay`` writes) and print a short summary. ``--record FILE``
also writes every generated event as a recording that ``ebbtide replay`` and ``ebbtide
publish`` accept (a replay reproduces the run's decisions at ``--lag-flush 0s
--lag-transport 0s``). ``--compare`` runs the peers (:mod:`controller.offline.experiment.peers`
and ``.baselines``; ``--peers`` picks some, ``--set CONTROLLER.SETTING=VALUE`` changes their
defaults) on the identical load and seed in the same process, writes each one's
``summary.json`` and ``decisions.jsonl`` under ``--out/baseline-NAME/``; ``--sweep`` adds
each controller over a small grid of its own settings (``closedloop.SWEEP``, under
``--out/sweep/``). Then ``compare.json`` (``runs[]``, one per run, with the Pareto marks of
:mod:`controller.offline.experiment.pareto`), ONE comparison report ``compare.html``, and one
printed table. Errors a user can fix are one line and exit 1.
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
    FAIR,
    SWEEP,
    Bench,
    EventLag,
    Run,
    RunSpec,
    SimulateSettings,
    ebbtide_variant,
    peer_settings,
    run_controller,
)
from controller.offline.experiment.load import (
    AZURE_ATTRIBUTION,
    AzureTrace,
    Burst,
    Diurnal,
    LoadShape,
    parse_burst,
)
from controller.offline.experiment.pareto import DIRECTIONS, mark
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


def _lag_option(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    return seconds


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def parse_sets(values: Sequence[str]) -> dict[str, dict[str, float]]:
    """``--set CONTROLLER.SETTING=VALUE`` (repeatable) -> per controller, its overrides; a value
    is a number, a duration with a unit (seconds) or true/false."""
    out: dict[str, dict[str, float]] = {}
    for text in values:
        name, eq, raw = text.partition("=")
        controller, dot, setting = name.partition(".")
        if not eq or not dot or not setting:
            raise click.BadParameter(f"CONTROLLER.SETTING=VALUE; got {text!r}", param_hint="--set")
        if controller not in CONTROLLERS:
            raise click.BadParameter(
                f"{text!r}: unknown controller {controller!r} (one of {', '.join(CONTROLLERS)})",
                param_hint="--set",
            )
        word = raw.strip().lower()
        try:
            value = {"true": 1.0, "false": 0.0}.get(word)
            if value is None:
                value = parse_duration(raw) if word[-1:].isalpha() else float(raw)
        except ValueError as exc:
            raise click.BadParameter(f"{text!r}: {exc}", param_hint="--set") from exc
        out.setdefault(controller, {})[setting] = value
    return out


def _arrow(key: str) -> str:
    d = DIRECTIONS.get(key)
    return "" if d is None else (" ↑" if d == "max" else " ↓")


def format_compare(rows: Sequence[dict[str, Any]], best: dict[str, Any] | None = None) -> str:
    """The ``--compare`` table: one line per ``compare.json`` row; ``*`` marks the best value of
    a column (its direction after the header: ↑ higher is better, ↓ lower)."""
    best = best or {}
    cols = [("slo_attainment", "SLO attainment"), ("breach_minutes", "breach min"),
            ("p99_worst_5min_ms", "worst 5m P99"), ("mean_gpu_util_pct", "mean GPU util"),
            ("training_goodput_gpu_hours", "goodput GPU-h"),
            ("training_goodput_gpu_hours_optimistic", "optimistic GPU-h"),
            ("disruptions", "disruptions"), ("preemptions", "preemptions")]  # fmt: skip

    def cell(r: dict[str, Any], key: str) -> str:
        v = r.get(key)
        if v is None:
            text = "-"
        elif key == "slo_attainment":
            text = _pct(v)
        elif key == "p99_worst_5min_ms":
            text = f"{v:.0f}ms"
        elif key == "mean_gpu_util_pct":
            text = f"{v:.1f}%"
        elif isinstance(v, float):
            text = f"{v:.2f}"
        else:
            text = str(v)
        star = key in best and r.get("id") in best[key]["runs"]
        return text + ("*" if star else "")

    head = ["run", "controller", "settings", *(h + _arrow(k) for k, h in cols), "pareto"]
    body = [
        [
            str(r.get("id", i)),
            r["controller"] + ("" if r.get("fair") or r["controller"] == "ebbtide" else " (!)"),
            ",".join(f"{k}={v:g}" for k, v in r.get("sweep", {}).items()) or "defaults",
            *(cell(r, k) for k, _ in cols),
            str(r.get("pareto", "-")),
        ]
        for i, r in enumerate(rows)
    ]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = []
    for row in [head, *body]:
        cells = [
            c.ljust(w) if 0 < i < 3 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _print_summary(summary: dict[str, Any], run: Run, span: float, report: Path) -> None:
    fig = run.figures
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
              help="Also run the peers (hpa-rate, hpa-latency, keda, kpa, static-p95; "
                   "static-peak, an oracle; polling, a strawman) on the same load; write "
                   "compare.json and compare.html; print a table.")  # fmt: skip
@click.option("--peers", default=",".join(CONTROLLERS[1:]), metavar="NAME,...",
              help="The peers --compare runs (default: all).")  # fmt: skip
@click.option("--sweep", is_flag=True,
              help="With --compare: also run every controller over a small grid of its own "
                   "settings; compare.json and compare.html mark the Pareto fronts.")  # fmt: skip
@click.option("--set", "sets", multiple=True, metavar="CONTROLLER.SETTING=VALUE",
              help="Change a controller's default, e.g. hpa-rate.down_window_s=20m, "
                   "keda.cached=true, ebbtide.breach_after_s=15s (repeatable).")  # fmt: skip
@click.option("--lag-flush", default="5s", callback=_lag_option, metavar="DURATION",
              help="Ebbtide sees events when their producer's flush interval ends...")  # fmt: skip
@click.option("--lag-transport", default="76ms", callback=_lag_option, metavar="DURATION",
              help="...plus this broker-to-decision delay (0s and 0s: on time).")  # fmt: skip
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
    peers: str,
    sweep: bool,
    sets: tuple[str, ...],
    lag_flush: float,
    lag_transport: float,
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
    overrides = parse_sets(sets)
    chosen = [p.strip() for p in peers.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in CONTROLLERS[1:]]
    if unknown:
        raise click.BadParameter(
            f"unknown peer {', '.join(unknown)} (one of {', '.join(CONTROLLERS[1:])})",
            param_hint="--peers",
        )
    if sweep and not compare:
        raise click.BadParameter("needs --compare", param_hint="--sweep")
    specs = [RunSpec(c, overrides.get(c, {})) for c in ["ebbtide", *chosen]]
    if sweep:
        specs += [
            RunSpec(s.controller, {**s.settings, **point})
            for s in specs
            for point in SWEEP.get(s.controller, ())
        ]
    try:
        for spec in specs:
            if spec.controller == "ebbtide":
                ebbtide_variant(policy, spec.settings)
            else:
                peer_settings(spec.controller, spec.settings)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--set") from exc
    make_shape, attribution = _shape_maker(load, parsed)
    settings = SimulateSettings(duration_s=duration, seed=seed, start_of_day_s=start_of_day)
    llm = _serving(latency_model, make_shape, slo_metric, mean_tokens)
    lag = EventLag(flush_s=lag_flush, transport_s=lag_transport)
    bench = Bench.of(loaded, policy, make_shape, settings, llm=llm, load_scale=load_scale, lag=lag)
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
    command += ["--lag-flush", f"{lag_flush:g}s", "--lag-transport", f"{lag_transport:g}s"]
    command += [a for x in sets for a in ("--set", x)]
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
        first = run_controller(
            bench, specs[0], out, record=record, record_header=header, progress=on_progress
        )
    _, report = write_outputs(first.result, out)
    _print_summary(first.result.summary.to_dict(), first, duration, report)
    if attribution:
        click.echo(f"  {attribution}")
    if record is not None:
        click.echo(f"recording: {record}")
    if not compare:
        return
    runs = [first]
    defaults = len(chosen) + 1
    for i, spec in enumerate(specs[1:], start=1):
        where = out / (
            f"baseline-{spec.controller}" if i < defaults else f"sweep/{i:02d}-{spec.controller}"
        )
        run = run_controller(bench, spec, where)
        (where / "summary.json").write_text(
            json.dumps(run.result.summary.to_dict(), indent=2) + "\n", encoding="utf-8"
        )
        runs.append(run)
    rows = []
    for i, run in enumerate(runs):
        row = run.row()
        row["sweep"] = dict(run.spec.settings)
        row["default"] = i < defaults
        rows.append(row)
    pareto = mark(rows)
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
                "fair_peers": sorted(FAIR),
                "lag": asdict(lag),
                "pareto": pareto,
                "runs": rows,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    context = (
        f"{shlex.join(command)} --compare{' --sweep' if sweep else ''}: the same cluster "
        f"({scenario.name}), policy {policy.metadata.name}, load ({bench.shape.describe()}) and "
        f"seed {seed} for every run. The scheduler preempts lower PriorityClasses in every run "
        "but polling; every peer but polling lends idle GPUs to training (priority backfill). "
        f"Ebbtide sees events {lag_flush:g}s flush + {lag_transport * 1000:g}ms late; "
        "attainment is measured by an independent meter. Fair peers: "
        f"{', '.join(sorted(FAIR))}; static-peak is an oracle, polling a strawman."
    )
    page = render_comparison(
        [(row, run.result) for row, run in zip(rows, runs, strict=True)],
        title=f"Ebbtide vs peers: {loaded.metadata.name}, {format_duration(duration)}",
        context=context,
        pareto=pareto,
    )
    (out / COMPARISON_FILE).write_text(page, encoding="utf-8")
    click.echo(f"compared on the same load ({bench.shape.describe()}, seed {seed}):")
    click.echo(format_compare(rows, pareto["best"]))
    click.echo(f"({UTIL_WEIGHTING}; * best of a column; (!) not a fair peer)")
    for row in rows[:defaults]:
        click.echo(f"  {row['controller']}: {row['label']}")
    click.echo(f"comparison: {out / COMPARE_FILE}, report: {out / COMPARISON_FILE}")


COMMANDS = [simulate]

"""``ebbtide replay``: what would this policy have done on this recording?

The command wires :mod:`controller.offline.replay` together: load and check the policy, build the
simulated cluster (from ``--cluster SCENARIO``, or inferred from the recording and the policy,
see :mod:`controller.offline.replay.inferred`), replay, write ``summary.json``, ``decisions.jsonl``
and
``report.html`` into ``--out``, and print a short summary. A progress bar (bytes of the file
read, rate, ETA) goes to stderr when it is a terminal. Errors a user can fix (a missing, damaged or
foreign recording, an invalid policy or scenario) are one line and exit 1, and leave no
report behind.

``--model fit`` replays counterfactually (:mod:`controller.offline.replay.counterfactual`):
latencies
come from a model fitted to the recording and the replicas this policy runs, and the fit, its
goodness and its validation on held-back minutes are printed and written to ``summary.json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import click

from controller.cli.options import duration_option, load_policy_files, one_line, progress
from controller.offline.accounting.outputs import RunResult, clear_outputs
from controller.offline.accounting.report import write_outputs
from controller.offline.models.fit import fit_line
from controller.offline.replay.counterfactual import counterfactual_replay
from controller.offline.replay.inferred import infer_cluster
from controller.offline.replay.replayer import (
    ReplaySettings,
    replay,
)
from controller.simcluster import SimCluster, load_scenario
from policies.model import Policy, format_duration
from streams.recording import read_header
from streams.stream_errors import RecordingError

__all__ = ["COMMANDS", "replay_command"]

#: Rejected lines printed after the summary (``summary.json`` lists more).
PRINTED_REJECTIONS = 5


def _print_summary(result: RunResult, report: Path) -> None:
    s = result.summary.to_dict()
    ev, t = s["events"], s["time"]
    span = (t["end"] - t["start"]) if t["start"] is not None else 0.0
    rate = ev["total"] / result.wall_s if result.wall_s > 0 else 0.0
    click.echo(
        f"replayed {ev['total']} events ({ev['accepted']} accepted, {ev['rejected']} rejected) "
        f"covering {format_duration(span)} of event time in {result.wall_s:.1f}s "
        f"({rate:,.0f} events/s); policy {s['policy']['name']} {s['policy']['digest']}"
    )
    for key, v in s["slo"].items():
        att = "no data" if v["attainment"] is None else f"{100 * v['attainment']:.2f}%"
        click.echo(
            f"  {key}: P{v['percentile']:g} <= {v['objective_ms']:g}ms attained {att}; "
            f"{v['breaches_total']} breaches, {format_duration(v['breach_seconds'])} in breach"
        )
    click.echo(f"  latency {s['latency']}")
    for key, f in s.get("fit", {}).items():
        click.echo("  " + fit_line(key, f))
    listed = ev["rejected_lines"]
    for entry in listed[:PRINTED_REJECTIONS]:
        click.echo(f"  rejected line {entry['line']}: {entry['reason'][:160]}")
    if ev["rejected"] > PRINTED_REJECTIONS:
        click.echo(
            f"  ... and {ev['rejected'] - PRINTED_REJECTIONS} more rejected lines "
            f"(the first {len(listed)} are listed in summary.json)"
        )
    acts = s["actions"]["by_type"]
    click.echo("  actions: " + ", ".join(f"{a} {n}" for a, n in acts.items()))
    for name, p in s["pools"].items():
        util = "-" if p["mean_util_pct"] is None else f"{p['mean_util_pct']:.1f}%"
        click.echo(f"  pool {name}: mean utilization {util}, {p['idle_gpu_seconds']:g} idle GPU-s")
    if strangers := s["events"]["services_not_in_policy"]:
        named = ", ".join(f"{key} ({n})" for key, n in list(strangers.items())[:5])
        click.echo(
            f"  note: {sum(strangers.values())} latency events were for services the policy "
            f"does not name: {named}" + (", ..." if len(strangers) > 5 else "")
        )
    dropped = {k: n for k, n in s["events"]["engine"].items() if k.startswith("gpu_dropped_")}
    if dropped:
        why = ", ".join(f"{n} {k.removeprefix('gpu_dropped_')}" for k, n in dropped.items())
        click.echo(f"  note: GPU readings dropped ({why}); see docs/events.md")
    click.echo(f"report: {report}")


@click.command("replay")
@click.argument("recording", type=click.Path(path_type=Path))
@click.option("--policy", "policies", type=click.Path(path_type=Path), multiple=True,
              required=True, help="Policy file (repeatable: the files merge).")  # fmt: skip
@click.option("--cluster", "scenario", type=click.Path(path_type=Path), metavar="SCENARIO",
              help="Scenario file of the starting cluster (default: inferred).")  # fmt: skip
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for summary.json, decisions.jsonl and report.html.")  # fmt: skip
@click.option("--speed", type=click.FloatRange(min=0, min_open=True),
              help="Pace event time at X times the wall clock (default: no pacing).")  # fmt: skip
@click.option("--evaluate-every", default="1s", callback=duration_option, metavar="DURATION",
              help="Evaluate the policy every DURATION of event time.")  # fmt: skip
@click.option("--points", type=click.IntRange(min=2), default=600,
              help="Most points per time series in the report.")  # fmt: skip
@click.option("--model", type=click.Choice(["recorded", "fit"]), default="recorded",
              show_default=True,
              help="Latencies as recorded (open loop), or from a model fitted to the recording "
              "and the replicas this policy runs (counterfactual, closed loop).")  # fmt: skip
@click.option("--recorded-policy", "recorded", type=click.Path(path_type=Path), multiple=True,
              help="With --model fit: the policy the recording was made under (repeatable); "
              "its open-loop replay gives the replicas to fit to (default: --policy).")  # fmt: skip
def replay_command(
    recording: Path,
    policies: tuple[Path, ...],
    scenario: Path | None,
    out: Path,
    speed: float | None,
    evaluate_every: float,
    points: int,
    model: str,
    recorded: tuple[Path, ...],
) -> None:
    """Replay RECORDING through the policy against a simulated cluster; write a report."""
    if recorded and model != "fit":
        raise click.UsageError("--recorded-policy only applies with --model fit")
    if speed is not None and model == "fit":
        raise click.UsageError(
            "--speed paces one replay; --model fit runs two (the fit, then the counterfactual)"
        )
    if not recording.is_file():
        raise click.ClickException(f"recording not found: {recording}")
    settings = ReplaySettings(evaluate_every=evaluate_every, speed=speed, points=points)
    policy = load_policy_files(policies)
    fit_under = (load_policy_files(recorded) if recorded else policy) if model == "fit" else None
    try:
        result = _replay(
            recording, policy, scenario=scenario, out=out, settings=settings, fit_under=fit_under
        )
    except RecordingError as exc:
        _no_report(out)
        raise click.ClickException(f"{exc}; no report written") from exc
    empty = result.summary.nothing_replayed()
    if empty is not None:
        _no_report(out)
        raise click.ClickException(f"{recording}: nothing replayed: {empty}; no report written")
    _, report = write_outputs(result, out)
    _print_summary(result, report)


def _no_report(out: Path) -> None:
    """A failed replay leaves no output that could pass for its report."""
    if out.is_dir():
        clear_outputs(out)


def _replay(
    recording: Path,
    policy: Policy,
    *,
    scenario: Path | None,
    out: Path,
    settings: ReplaySettings,
    fit_under: Policy | None = None,
) -> RunResult:
    """Replay (open loop), or with ``fit_under`` (the recording's policy) counterfactually."""
    clusters = _clusters(recording, scenario)
    notes, make, span = clusters(policy)
    size = recording.stat().st_size
    started = time.perf_counter()
    with progress(size, "replaying", "B") as on_progress:
        if fit_under is None:
            result = replay(recording, policy=policy, cluster=make, out_dir=out,
                            settings=settings, progress=on_progress, notes=notes,
                            span=span)  # fmt: skip
        else:
            result, _ = counterfactual_replay(
                recording, policy=policy, recorded_policy=fit_under,
                cluster=lambda p: clusters(p)[1], out_dir=out, settings=settings,
                progress=on_progress, notes=notes, span=span,
            )  # fmt: skip
    result.wall_s = time.perf_counter() - started
    return result


#: The inventory notes, the maker of the simulated starting cluster and the recording's event
#: time span where a pass over it measured it (see ``replay``).
_Start = tuple[tuple[str, ...], Callable[[float], SimCluster], tuple[float, float] | None]


def _clusters(recording: Path, scenario: Path | None) -> Callable[[Policy], _Start]:
    """Per policy: the inventory notes, the maker of the simulated starting cluster (from the
    scenario, else inferred from the recording and that policy) and, when inferred (its pass
    over the recording measured it), the recording's span."""
    if scenario is None:

        def inferred(policy: Policy) -> _Start:
            found = infer_cluster(recording, policy)
            return found.notes, found.simulate, found.span

        return inferred
    try:
        loaded = load_scenario(scenario)
    except ValueError as exc:
        errors = list(getattr(exc, "errors", ())) or [exc]
        raise one_line("invalid scenario", errors) from exc

    # a simulate recording says whether its scheduler preempted: the same one places the same
    preempting = bool((read_header(recording) or {}).get("scheduler_preemption"))

    def from_scenario(policy: Policy) -> _Start:
        def make(start: float) -> SimCluster:
            sim = SimCluster.from_scenario(loaded, start=start, policy=policy)
            sim.preemption = preempting
            return sim

        return (), make, None  # no pass over the recording: its replay's buckets merge

    return from_scenario


COMMANDS = [replay_command]

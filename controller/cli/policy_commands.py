"""``ebbtide policy``: commands for policy authors (validate, explain, schema, test).

The shell around :mod:`policies`: files are read here (:func:`policies.loader.read_sources`),
everything else is the pure core. Problems a user can fix end with exit status 1 and one
``FILE:LINE:COL: path: message`` line each, on stderr.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import NoReturn

import click

from policies.casetest import load_cases, run_cases
from policies.loader import PolicyError, PolicyLoadError, Source, load_policy, read_sources
from policies.model import Policy, format_duration, policy_json_schema

__all__ = ["COMMANDS", "explain_policy", "policy", "unresolved_objectives"]

_files = click.argument(
    "files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path)
)


def _load(files: tuple[Path, ...]) -> Policy:
    try:
        return load_policy(read_sources(files))
    except PolicyLoadError as exc:
        _fail(exc.errors)


def _fail(errors: tuple[PolicyError, ...] | list[PolicyError]) -> NoReturn:
    for error in errors:
        click.echo(str(error), err=True)
    raise SystemExit(1)


@click.group()
def policy() -> None:
    """Validate, explain and test policies."""


def _bounds(_ctx: click.Context, _param: click.Parameter, text: str | None) -> list[float]:
    if text is None:
        return []
    try:
        bounds = [float(b) for b in text.split(",")]
    except ValueError as exc:
        raise click.BadParameter(f"comma-separated milliseconds, e.g. 50,100,250: {exc}") from exc
    if any(b <= a for a, b in pairwise(bounds)):
        raise click.BadParameter("bounds must be strictly increasing")
    return bounds


@policy.command()
@_files
@click.option(
    "--histogram-bounds",
    callback=_bounds,
    metavar="MS,MS,...",
    help="The latency histogram bucket bounds (ms) your producers send: warn for each service "
    "whose objective lies above the last bound (the policy alone does not know them; the "
    "controller warns at run time too).",
)
def validate(files: tuple[Path, ...], histogram_bounds: list[float]) -> None:
    """Check policy FILES (merged); print every problem as FILE:LINE:COL and exit 1."""
    loaded = _load(files)
    for warning in unresolved_objectives(loaded, histogram_bounds):
        click.echo(f"warning: {warning}", err=True)
    names = ", ".join(str(f) for f in files)
    click.echo(f"ok: policy {loaded.metadata.name!r} ({names})")


def unresolved_objectives(p: Policy, bounds: list[float]) -> list[str]:
    """One line per service whose objective histograms with ``bounds`` cannot resolve: above
    the last bound, where the overflow bucket counts every request as over the objective."""
    if not bounds:
        return []
    return [
        f"{svc.namespace}/{name}: objective {svc.slo.objective_ms:g}ms is above the histogram's "
        f"last bound {bounds[-1]:g}ms: every request over {bounds[-1]:g}ms counts as over the "
        "objective; add a bucket bound at the objective"
        for name, svc in sorted(p.spec.services.items())
        if svc.slo.objective_ms > bounds[-1]
    ]


@policy.command()
@_files
def explain(files: tuple[Path, ...]) -> None:
    """Print a readable summary of what the policy in FILES will do."""
    click.echo(explain_policy(_load(files)))


@policy.command()
def schema() -> None:
    """Print the policy JSON Schema (shipped as docs/policy.schema.json, for editors)."""
    click.echo(json.dumps(policy_json_schema(), indent=2, sort_keys=True))


@policy.command(name="test")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("cases", type=click.Path(dir_okay=False, path_type=Path))
def test_cmd(file: Path, cases: Path) -> None:
    """Run the table-driven CASES (YAML) against the policy FILE; exit 1 on any failure."""
    loaded = _load((file,))
    try:
        (source,) = read_sources([cases])
    except PolicyLoadError as exc:
        _fail(exc.errors)
    case_file, errors = load_cases(Source(source.name, source.text))
    if errors or case_file is None:
        _fail(errors)
        return
    results = run_cases(loaded, case_file)
    failed = [r for r in results if not r.passed]
    for r in results:
        click.echo(f"{'PASS' if r.passed else 'FAIL'}  {r.name}")
        for failure in r.failures:
            click.echo("      " + failure.replace("\n", "\n      "))
    click.echo(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if failed:
        raise SystemExit(1)


def explain_policy(p: Policy) -> str:
    """A plain-language summary of a policy."""
    s = p.spec
    d = format_duration
    out = [
        f"Policy {p.metadata.name!r}"
        + (f": {p.metadata.description}" if p.metadata.description else "")
    ]
    if s.kill_switch:
        out.append("KILL SWITCH ON: no decisions are made.")
    if s.dry_run:
        out.append("DRY RUN: decisions are explained but never carried out.")
    out.append("")
    out.append("Pools:")
    for name, pool in sorted(s.pools.items()):
        sel = ", ".join(f"{k}={v}" for k, v in sorted(pool.node_selector.items()))
        out.append(f"  {name}: {pool.kind} GPUs on nodes labelled {sel}")
    out.append("")
    out.append("Services:")
    if not s.services:
        out.append("  (none)")
    for name, svc in sorted(s.services.items()):
        slo = svc.slo
        out.append(
            f"  {svc.namespace}/{name} in pool {svc.pool}: P{slo.percentile:g} over "
            f"{d(slo.window)} must stay <= {slo.objective_ms:g}ms."
        )
        out.append(
            f"    Breach after {d(slo.breach_after)} above; recover after {d(slo.recover_after)} "
            f"below {slo.recover_below:.0%} of the objective "
            f"({slo.objective_ms * slo.recover_below:g}ms)."
        )
        if svc.scale is not None and svc.replicas is not None:
            out.append(
                f"    On breach: scale {svc.scale.kind} {svc.workload or name} to "
                f"ceil(replicas x P/objective) (tolerance {svc.scale.tolerance:.0%}), within "
                f"{svc.replicas.min}..{svc.replicas.max} replicas, "
                f"{svc.gpus_per_replica} GPU(s) each."
            )
        else:
            out.append(
                "    On breach: free GPUs for its pending pods (another autoscaler scales it)."
            )
        cooldown = svc.cooldown if svc.cooldown is not None else s.cooldowns.service
        out.append(f"    Then wait {d(cooldown)} before acting for it again.")
    out.append("")
    if s.training is None:
        out.append("Training: none selected; nothing is ever shrunk or evicted.")
    else:
        t = s.training
        sel = ", ".join(f"{k}={v}" for k, v in sorted(t.selector.items()))
        where = ", ".join(t.pools) if t.pools else "every pool"
        out.append(f"Training: workloads labelled {sel}, in {where}.")
        out.append(
            "  To free GPUs: shrink elastic ones first (down to "
            f"{t.elastic.min_replicas_annotation} and {t.gang_minimum_annotation}), then evict "
            f"pods in order {' > '.join(t.victim_order)} with {d(t.grace_period)} grace."
        )
        out.append(
            f"  Grows back by {t.elastic.grow_step} replica(s) up to "
            f"{t.elastic.max_replicas_annotation} after GPUs stay idle "
            f"{d(t.elastic.grow_after)} with no service breaching."
        )
    protected = ", ".join(s.protected_namespaces) or "none"
    out.append(
        f"  Never touched: namespaces {protected}, anything annotated "
        "ebbtide.io/do-not-disrupt, inference pods."
    )
    out.append("")
    if s.mig is None or not s.mig.enabled:
        out.append("MIG: off.")
    else:
        m = s.mig
        profiles = ", ".join(f"{k} -> {' | '.join(m.layouts_for(k))}" for k in sorted(m.profiles))
        out.append(
            f"MIG: convert {m.from_pool} nodes when the pool stays below {m.convert_below:.0%} "
            f"for {d(m.convert_after)} and the node's GPUs stay at or below "
            f"{m.node_idle_below:.0%} that whole time ({profiles}); at most "
            f"{m.max_concurrent} at once, keeping {m.min_whole_nodes} whole node(s)."
        )
        out.append(
            f"  Revert {m.to_pool} nodes when pods wait {d(m.revert_after)} for more whole GPUs "
            "than are free."
        )
    out.append("")
    b = s.budgets
    out.append(
        f"Budgets: {b.evictions.max} evictions per {d(b.evictions.per)}, {b.scale_steps.max} scale "
        f"steps per {d(b.scale_steps.per)}, {b.mig_conversions.max} MIG changes per "
        f"{d(b.mig_conversions.per)}; training grows at most every {d(s.cooldowns.training_grow)}."
    )
    return "\n".join(out)


COMMANDS = [policy]

"""``ebbtide policy``: commands for policy authors (validate, explain, schema, test).

The shell around :mod:`policies`: files are read here (:func:`policies.loader.read_sources`),
everything else is the pure core. Problems a user can fix end with exit status 1 and one
``FILE:LINE:COL: path: message`` line each, on stderr (with ``-o json``, in the JSON on stdout).

Policies come from policy files or, with ``--values VALUES.yaml``, from the Helm chart's values
(the documents under ``policies``/``defaultPolicies``, chosen as the chart chooses them), so the
commands the chart README gives work on the file passed to ``helm install -f``.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from itertools import pairwise
from pathlib import Path
from typing import Any, NoReturn

import click
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from controller.kube.objective_crd import KIND as OBJECTIVE_KIND
from controller.kube.objective_crd import objective_crd, with_objectives
from policies.casetest import load_cases, run_cases
from policies.explain import explain as explain_policy
from policies.loader import (
    PolicyError,
    PolicyLoadError,
    Source,
    check_policy,
    check_values,
    read_sources,
)
from policies.model import Policy, policy_json_schema

__all__ = ["COMMANDS", "policy", "unresolved_objectives"]

_PATH = click.Path(dir_okay=False, path_type=Path)
_files = click.argument("files", nargs=-1, type=_PATH)
_values = click.option(
    "--values",
    "-f",
    "values",
    multiple=True,
    type=_PATH,
    metavar="VALUES.yaml",
    help="Read the policies from Helm values files (as given to helm install -f), chosen as "
    "the chart chooses them: `policies`, or `defaultPolicies` when it is empty or "
    "mergeDefaultPolicies is true. Repeatable.",
)
_output = click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)


def _check(
    files: tuple[Path, ...], values: tuple[Path, ...]
) -> tuple[Policy | None, list[PolicyError]]:
    """The policy from ``files`` or ``values`` (exactly one of them given), with every problem."""
    if bool(files) == bool(values):
        raise click.UsageError("give policy FILES or --values VALUES.yaml (not both)")
    try:
        sources = read_sources(values or files)
    except PolicyLoadError as exc:
        return None, list(exc.errors)
    return check_values(sources) if values else check_policy(sources)


def _load(files: tuple[Path, ...], values: tuple[Path, ...] = ()) -> Policy:
    loaded, errors = _check(files, values)
    if errors or loaded is None:
        _fail(errors)
    return loaded


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
@_values
@click.option(
    "--objectives",
    multiple=True,
    type=_PATH,
    metavar="OBJECTS.yaml",
    help="ServiceObjective manifests (helm/ebbtide/crds/): check each joins the policy as the "
    "controller would admit it (its pool exists, its name is free). Repeatable.",
)
@_output
def validate(
    files: tuple[Path, ...],
    histogram_bounds: list[float],
    values: tuple[Path, ...],
    objectives: tuple[Path, ...],
    output: str,
) -> None:
    """Check policy FILES (merged) or --values; print every problem as FILE:LINE:COL and exit 1."""
    loaded, errors = _check(files, values)
    joined: list[str] = []
    if loaded is not None and objectives:
        before = set(loaded.spec.services)
        loaded, errors = _admit(loaded, objectives)
        if loaded is not None:
            joined = sorted(loaded.service_key(n) for n in set(loaded.spec.services) - before)
    warnings = unresolved_objectives(loaded, histogram_bounds) if loaded is not None else []
    names = ", ".join(str(f) for f in values or files)
    if output == "json":
        click.echo(
            json.dumps(
                {
                    "ok": loaded is not None,
                    "files": [str(f) for f in values or files],
                    "policy": loaded.metadata.name if loaded is not None else None,
                    "digest": loaded.digest() if loaded is not None else None,
                    "errors": [asdict(e) for e in errors],
                    "warnings": warnings,
                },
                indent=2,
            )
        )
        if loaded is None:
            raise SystemExit(1)
        return
    if loaded is None:
        _fail(errors)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"ok: policy {loaded.metadata.name!r} ({names})")
    if joined:
        click.echo(f"ok: {OBJECTIVE_KIND} {', '.join(joined)} join it")


def _admit(loaded: Policy, paths: tuple[Path, ...]) -> tuple[Policy | None, list[PolicyError]]:
    """``loaded`` with the ServiceObjectives in ``paths`` (:func:`with_objectives`), and one
    error per object refused or file unreadable (placed at the object's document)."""
    objects: list[dict[str, Any]] = []
    where: dict[str, tuple[str, int]] = {}
    errors: list[PolicyError] = []
    for path in paths:
        try:
            docs = list(YAML(typ="rt").load_all(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, YAMLError) as exc:
            errors.append(PolicyError(str(path), 1, 1, "", f"cannot read: {exc}"))
            continue
        for doc in docs:
            if not isinstance(doc, dict) or doc.get("kind") != OBJECTIVE_KIND:
                continue
            meta = doc.get("metadata") or {}
            key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            where[key] = (str(path), doc.lc.line + 1 if hasattr(doc, "lc") else 1)
            objects.append(json.loads(json.dumps(doc)))
    if not objects and not errors:
        names = ", ".join(str(p) for p in paths)
        errors.append(PolicyError(names, 1, 1, "", f"no {OBJECTIVE_KIND} in these files"))
    merged, verdicts = with_objectives(loaded, objects, None)
    for v in verdicts:
        if not v.accepted:
            file, line = where[v.key]
            errors.append(
                PolicyError(file, line, 1, "", f"{OBJECTIVE_KIND} {v.key}: {v.reason}: {v.message}")
            )
    return (None if errors else merged), errors


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
@_values
@_output
def explain(files: tuple[Path, ...], values: tuple[Path, ...], output: str) -> None:
    """Describe every setting of the policy in FILES (or --values) and what it will do."""
    explanation = explain_policy(_load(files, values))
    if output == "json":
        click.echo(json.dumps(explanation.as_json(), indent=2))
    else:
        click.echo(explanation.text())


@policy.command()
def schema() -> None:
    """Print the policy JSON Schema (shipped as docs/policy.schema.json, for editors)."""
    click.echo(json.dumps(policy_json_schema(), indent=2, sort_keys=True))


@policy.command()
def crd() -> None:
    """Print the ServiceObjective CustomResourceDefinition (shipped as
    helm/ebbtide/crds/serviceobjectives.yaml): its schema and CEL rules come from the policy
    model, so a team's object is checked at admission as a policy file is by validate."""
    buffer = io.StringIO()
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 4096
    yaml.dump(objective_crd(), buffer)
    click.echo(buffer.getvalue(), nl=False)


@policy.command(name="test")
@click.argument("paths", nargs=-1, required=True, type=_PATH, metavar="[FILE]... CASES")
@_values
def test_cmd(paths: tuple[Path, ...], values: tuple[Path, ...]) -> None:
    """Run the table-driven CASES (YAML, the last argument) against the policy FILEs (merged)
    or --values; exit 1 on any failure. Each decision in a diff shows its time (# at 35s)."""
    *files, cases = paths
    loaded = _load(tuple(files), values)
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


COMMANDS = [policy]

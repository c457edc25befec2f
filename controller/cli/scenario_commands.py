"""``ebbtide scenario``: build and check the scenario files simulations start from.

``from-openb`` turns the Alibaba OpenB trace into a scenario (see
:mod:`controller.simcluster.openb` for
the mapping); ``validate`` checks scenario files and prints every problem as
``FILE:LINE:COL: path: message``.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from controller.simcluster.openb import At, OpenbError, from_openb
from controller.simcluster.scenario import ScenarioLoadError, load_scenario

__all__ = ["COMMANDS", "scenario"]


def _parse_at(value: str) -> At:
    if value in ("peak", "all"):
        return "peak" if value == "peak" else "all"
    try:
        t = int(value)
    except ValueError:
        raise click.BadParameter("seconds (an integer), 'peak' or 'all'") from None
    if t < 0:
        raise click.BadParameter("must not be negative")
    return t


@click.group()
def scenario() -> None:
    """Build and check simulation scenarios."""


@scenario.command("from-openb")
@click.argument("nodes_csv", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("pods_csv", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="Write here (default: stdout)."
)
@click.option(
    "--max-nodes", type=click.IntRange(min=1), help="Keep this many nodes, evenly spaced."
)
@click.option(
    "--at",
    "at_text",
    default="peak",
    help="Pods alive at this trace second; 'peak': most GPUs held; 'all': every scheduled pod.",
)
@click.option("--name", default="openb", help="metadata.name of the scenario.")
def from_openb_command(
    nodes_csv: Path,
    pods_csv: Path,
    out: Path | None,
    max_nodes: int | None,
    at_text: str,
    name: str,
) -> None:
    """Build a scenario from the Alibaba OpenB trace (NODES.csv, PODS.csv)."""
    at = _parse_at(at_text)
    command = shlex.join(["ebbtide", "scenario", "from-openb", *sys.argv[3:]])
    try:
        text, summary = from_openb(
            nodes_csv, pods_csv, at=at, max_nodes=max_nodes, name=name, command=command
        )
    except OpenbError as exc:
        raise click.ClickException(str(exc)) from exc
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")
    click.echo(str(summary), err=True)


@scenario.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
def validate_command(files: tuple[Path, ...]) -> None:
    """Check scenario files; print every problem as FILE:LINE:COL: path: message."""
    failed = False
    for path in files:
        try:
            sc = load_scenario(path)
        except ScenarioLoadError as exc:
            failed = True
            for error in exc.errors:
                click.echo(str(error), err=True)
            continue
        nodes = sum(n.count or 1 for n in sc.spec.nodes)
        click.echo(f"{path}: ok ({nodes} nodes, {len(sc.spec.workloads)} workloads)")
    if failed:
        raise SystemExit(1)


COMMANDS = [scenario]

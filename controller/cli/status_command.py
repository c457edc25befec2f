"""``ebbtide status``: what the running controller sees and what blocks it, as a table.

Reads a replica's ``/status`` (:mod:`controller.process.status`), leader or follower, e.g.
through ``kubectl -n ebbtide-system port-forward svc/ebbtide 9108``. ``WHAT`` narrows it:
``services``, ``pools``, one service (``serving/chat``) or one pool (``pool/whole``); ``-o json``
or ``-o yaml`` print the same data for scripts. With ServiceObjectives watched, a table lists each
one and whether it joined the policy (``Ready``), and a service paused on its object says so.
"""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from datetime import datetime
from typing import Any

import click
from ruamel.yaml import YAML

from policies.model import format_duration

__all__ = ["COMMANDS", "render_table", "select", "status"]


def select(data: dict[str, Any], what: str | None) -> dict[str, Any]:
    """``data`` narrowed to ``what``; ``click.UsageError`` when nothing matches."""
    if what in (None, "all"):
        return data
    if what == "services":
        return {k: v for k, v in data.items() if k != "pools"}
    if what == "pools":
        return {k: v for k, v in data.items() if k not in ("services", "objectives")}
    if what.startswith("pool/"):
        found = [p for p in data["pools"] if p["name"] == what.removeprefix("pool/")]
        key, names = "pools", [f"pool/{p['name']}" for p in data["pools"]]
    else:
        found = [s for s in data["services"] if s["service"] == what]
        key, names = "services", [s["service"] for s in data["services"]]
    if not found:
        raise click.UsageError(
            f"no {what!r} in the status; known: {', '.join(names) or 'none'} (or services, pools)"
        )
    rest = {k: v for k, v in data.items() if k not in ("services", "pools", "objectives")}
    return rest | {key: found}


def _ago(ts: object, now: float) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return f"{format_duration(max(0.0, round(now - ts)))} ago"


def _last(d: dict[str, Any] | None, now: float) -> str:
    if not d:
        return "-"
    change = f" {d['from']}→{d['to']}" if "from" in d and "to" in d else ""
    return f"{d.get('action')}{change} {d.get('outcome', 'decided')} {_ago(d.get('ts'), now)}"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _num(value: object, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def render_table(data: dict[str, Any]) -> str:
    """The status as a person reads it: a header, then services and pools as tables."""
    now = datetime.fromisoformat(data["at"]).timestamp()
    policy = data["policy"]
    out = [
        f"replica {data['replica']} ({data['role']}), policy {policy['name']} "
        f"({policy['digest']}), at {data['at']}"
    ]
    out += [f"blocked: {why}" for why in data["blockedBy"]]
    budgets = ", ".join(
        f"{b['name']} {b['remaining']}/{b['max']} per {format_duration(b['perSeconds'])}"
        for b in data["budgets"]
    )
    out.append(f"budgets left: {budgets}")
    if "services" in data:
        rows = [["SERVICE", "STATE", "P/OBJECTIVE", "REPLICAS", "LAST DECISION", "BLOCKED BY"]]
        for s in data["services"]:
            objective = ", ".join(
                f"P{o['percentile']:g} {_num(o['currentMs'], 'ms')}/{o['objectiveMs']:g}ms"
                for o in s["objectives"]
            )
            r = s["replicas"]
            replicas = "/".join(_num(r[k]) for k in ("current", "desired", "min", "max"))
            rows.append(
                [
                    s["service"],
                    s["state"],
                    objective,
                    replicas,
                    _last(s["lastDecision"], now),
                    "; ".join(s["blockedBy"]) or "-",
                ]
            )
        out += ["", *_table(rows), "(replicas: current/desired/min/max)"]
    if objectives := data.get("objectives"):
        rows = [["SERVICEOBJECTIVE", "READY", "REASON", "MESSAGE"]]
        for o in objectives:
            ready = "True" if o["accepted"] else "False"
            rows.append([o["object"], ready, o["reason"], o["message"]])
        out += ["", *_table(rows)]
    if "pools" in data:
        rows = [["POOL", "KIND", "NODES", "GPUS", "FREE", "RECLAIMABLE", "UTIL", "MIG FLOWS"]]
        for p in data["pools"]:
            flows = ", ".join(
                f"{f['node']} {f.get('direction', '?')} {f.get('phase', f.get('error', '?'))}"
                for f in p["migFlows"]
            )
            rows.append(
                [
                    p["name"] or "(no pool)",
                    p.get("kind") or "-",
                    _num(p.get("nodes")),
                    _num(p.get("capacityGpus")),
                    _num(p.get("freeGpus")),
                    _num(p.get("reclaimableGpus")),
                    _num(p.get("utilizationPct"), "%"),
                    flows or "-",
                ]
            )
        out += ["", *_table(rows)]
    return "\n".join(out)


def _fetch(url: str, timeout: float) -> dict[str, Any]:
    target = url.rstrip("/") + "/status"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            data = json.load(response)
    except urllib.error.HTTPError as exc:
        raise click.ClickException(f"{target} answered {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise click.ClickException(
            f"cannot reach {target}: {reason} (is `kubectl -n ebbtide-system port-forward "
            "svc/ebbtide 9108` running?)"
        ) from exc
    except ValueError as exc:
        raise click.ClickException(f"{target} did not answer JSON: {exc}") from exc
    if not isinstance(data, dict) or "services" not in data:
        raise click.ClickException(f"{target} did not answer an Ebbtide status")
    return data


@click.command()
@click.argument("what", required=False, metavar="[services|pools|NAMESPACE/SERVICE|pool/NAME]")
@click.option(
    "--url",
    default="http://127.0.0.1:9108",
    envvar="EBBTIDE_STATUS_URL",
    show_default=True,
    help="A controller replica's HTTP endpoint (leader or follower).",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json", "yaml"]),
    default="table",
    show_default=True,
)
@click.option("--timeout", type=float, default=5.0, show_default=True, help="Seconds.")
def status(what: str | None, url: str, output: str, timeout: float) -> None:
    """Per service and pool: state, percentile against objective, replicas, the last decision,
    and what blocks action right now."""
    data = select(_fetch(url, timeout), what)
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    elif output == "yaml":
        buffer = io.StringIO()
        yaml = YAML()
        yaml.default_flow_style = False
        yaml.dump(data, buffer)
        click.echo(buffer.getvalue(), nl=False)
    else:
        click.echo(render_table(data))


COMMANDS = [status]

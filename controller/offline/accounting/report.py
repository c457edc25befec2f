"""The replay's outputs: ``summary.json`` and a self-contained ``report.html``.

Plotting approach: **plotly.js, inlined**. The page embeds ``plotly.min.js`` from the pinned
``plotly`` Python package (read as a file with :mod:`importlib.resources`; the Python plotting
API is never imported, so building a report costs milliseconds) and one JSON block,
``<script type="application/json" id="ebbtide-figures">``, holding every figure as plotly's
``{data, layout}``. A few lines of script hand each to ``Plotly.newPlot``. Why:

* it opens offline, from a file, with no CDN (the library is in the page);
* the figures are interactive: a day-long replay needs zoom and hover, which a static image
  (matplotlib SVG) cannot give, and every figure shares the time axis, so zooming one to an
  incident and reading the others at the same times is direct;
* the figure data *is* the JSON block, so tests (and users) check exactly what is drawn by
  parsing it, with no second copy to drift; plotly.js is widely used and maintained.

Figures (each ``{id, kind, title, data, layout}``; ``kind`` is what tests look for):

* ``latency`` — per service (the worst :data:`MAX_SERVICE_PLOTS` by attainment): the windowed
  percentile (per timeline bucket, its maximum), the objective, and breach bands (layout shapes);
  buttons switch the y axis between linear and log, and it starts on log when the peak is more
  than :data:`LOG_SCALE_RATIO` times the objective (a 21 s peak would flatten a 300 ms line);
* ``utilization`` — per pool, mean GPU utilization;
* ``gpus-by-use`` — per pool, stacked GPUs that are inference / training / idle / MIG /
  reconfiguring, and (a dashed line, not stacked) the GPUs held by pods but idle for the whole
  utilization window: reclaimable by scaling in (sampled once per bucket);
* ``actions`` — actions per bucket, stacked by type, on the same time axis;
* ``decisions`` — each decision as a marker (one row per action type), its target, outcome and
  reason on hover; the page also lists them in a table.

``ebbtide simulate --compare`` writes **one** comparison page instead of a report per run
(:func:`render_comparison`, ``compare.html``): the figures table of every run, then one figure
(``kind: comparison``) whose panels — per service latency, training GPUs, inference GPUs, mean
utilization, actions, scheduler preemptions — are stacked on a single shared time axis, each
run a colour.
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, Final

from controller.offline.accounting.outputs import REPORT_FILE, SUMMARY_FILE, RunResult
from controller.offline.accounting.summary import ACTIONS, USES
from controller.offline.models.fit import fit_line

__all__ = [
    "COMPARISON_FILE",
    "FIGURES_ID",
    "LOG_SCALE_RATIO",
    "MAX_SERVICE_PLOTS",
    "comparison_figure",
    "render_comparison",
    "render_report",
    "write_outputs",
]

FIGURES_ID: Final = "ebbtide-figures"
MAX_SERVICE_PLOTS: Final = 24
#: A latency plot starts with a log y axis when its peak exceeds the objective this many times.
LOG_SCALE_RATIO: Final = 10.0
_AXIS_BUTTONS: Final = [
    {
        "type": "buttons",
        "direction": "left",
        "x": 1.0,
        "xanchor": "right",
        "y": 1.18,
        "buttons": [
            {"label": scale, "method": "relayout", "args": [{"yaxis.type": scale}]}
            for scale in ("linear", "log")
        ],
    }
]
_COLORS: Final = {
    "inference": "#1f77b4",
    "training": "#2ca02c",
    "idle": "#c7c7c7",
    "reclaimable": "#e377c2",
    "mig": "#9467bd",
    "reconfiguring": "#ff7f0e",
    "evict": "#d62728",
    "scale": "#1f77b4",
    "mig_convert": "#9467bd",
    "mig_revert": "#8c564b",
}


def _plotly_js() -> str:
    return (resources.files("plotly") / "package_data" / "plotly.min.js").read_text("utf-8")


def _ms(times: list[float]) -> list[float]:
    """Epoch seconds to the epoch milliseconds a plotly date axis reads."""
    return [t * 1000.0 for t in times]


def _layout(title: str, y: str, x_range: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "height": 320,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
        "xaxis": {"type": "date", "range": x_range, "title": {"text": "event time (UTC)"}},
        "yaxis": {"title": {"text": y}, "rangemode": "tozero"},
        "legend": {"orientation": "h"},
        **extra,
    }


def build_figures(result: RunResult) -> list[dict[str, Any]]:
    """Every figure of the report as plotly ``data``/``layout`` (see the module docstring)."""
    tl = result.timeline
    summary = result.summary.to_dict()
    series = tl.series()
    x = _ms(tl.times())
    start, end = summary["time"]["start"], summary["time"]["end"]
    x_range = [start * 1000.0, end * 1000.0] if start is not None else []
    figures: list[dict[str, Any]] = []

    slo = summary["slo"]
    worst = sorted(slo, key=lambda k: (slo[k]["attainment"] is None, slo[k]["attainment"], k))
    for i, key in enumerate(worst[:MAX_SERVICE_PLOTS]):
        s = slo[key]
        bands = [
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": b["start"] * 1000.0,
                "x1": b["end"] * 1000.0,
                "y0": 0,
                "y1": 1,
                "fillcolor": "#d62728",
                "opacity": 0.15,
                "line": {"width": 0},
                "layer": "below",
            }
            for b in s["breaches"]
        ]
        pct = f"P{s['percentile']:g}"
        ys = [v for v in series.get(f"p:{key}", []) if v is not None]
        log_axis = bool(ys) and max(ys) > LOG_SCALE_RATIO * s["objective_ms"]
        layout = _layout(f"{key}: windowed {pct} vs objective", "ms", x_range, shapes=bands)
        layout["updatemenus"] = _AXIS_BUTTONS
        if log_axis:
            layout["yaxis"] = {"title": {"text": "ms (log)"}, "type": "log"}
        figures.append(
            {
                "id": f"latency-{i}",
                "kind": "latency",
                "service": key,
                "title": f"{key}: windowed {pct} vs objective",
                "data": [
                    {
                        "type": "scatter",
                        "mode": "lines",
                        "name": f"windowed {pct}",
                        "x": x,
                        "y": series.get(f"p:{key}", []),
                        "connectgaps": False,
                    },
                    {
                        "type": "scatter",
                        "mode": "lines",
                        "name": "objective",
                        "x": x_range,
                        "y": [s["objective_ms"]] * len(x_range),
                        "line": {"dash": "dash", "color": "#d62728"},
                    },
                ],
                "layout": layout,
            }
        )
    pools = sorted(summary["pools"])
    figures.append(
        {
            "id": "utilization",
            "kind": "utilization",
            "title": "GPU utilization per pool",
            "data": [
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": p,
                    "x": x,
                    "y": series.get(f"util:{p}", []),
                }
                for p in pools
            ],
            "layout": _layout("GPU utilization per pool", "%", x_range),
        }
    )
    for p in pools:
        figures.append(
            {
                "id": f"gpus-by-use-{p}",
                "kind": "gpus-by-use",
                "pool": p,
                "title": f"GPUs by use: pool {p}",
                "data": [
                    {
                        "type": "scatter",
                        "mode": "lines",
                        "stackgroup": "use",
                        "name": u,
                        "x": x,
                        "y": series.get(f"use:{p}:{u}", []),
                        "line": {"color": _COLORS[u]},
                    }
                    for u in USES
                ]
                + [
                    {
                        "type": "scatter",
                        "mode": "lines",
                        "name": "reclaimable (held, idle)",
                        "x": x,
                        "y": series.get(f"reclaim:{p}", []),
                        "line": {"color": _COLORS["reclaimable"], "dash": "dash"},
                    }
                ],
                "layout": _layout(f"GPUs by use: pool {p}", "GPUs", x_range),
            }
        )
    figures.append(
        {
            "id": "actions",
            "kind": "actions",
            "title": "Actions",
            "data": [
                {
                    "type": "bar",
                    "name": a,
                    "x": x,
                    "marker": {"color": _COLORS[a]},
                    "y": series.get(f"actions:{a}", [0.0] * len(x)),
                }
                for a in ACTIONS
            ],
            "layout": _layout("Actions per interval", "actions", x_range, barmode="stack"),
        }
    )
    figures.append(_decisions_figure(result.markers, x_range))
    return figures


def _decision_rows(markers: list[dict[str, Any]]) -> list[list[str]]:
    """The decision list's table rows, HTML-escaped."""
    keys = ("action", "target", "outcome", "reason")
    return [[_iso(m["ts"]), *(html.escape(str(m[k])) for k in keys)] for m in markers]


def _decisions_figure(markers: list[dict[str, Any]], x_range: list[float]) -> dict[str, Any]:
    """Each decision as a marker on its action's row; hover shows target, outcome, reason."""
    data = []
    for action in ACTIONS:
        mine = [m for m in markers if m["action"] == action]
        if not mine:
            continue
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": action,
                "x": [m["ts"] * 1000.0 for m in mine],
                "y": [action] * len(mine),
                "text": [
                    f"{m['target']} ({m['outcome']})<br>{html.escape(str(m['reason']))}"
                    for m in mine
                ],
                "hovertemplate": "%{x}<br>%{text}<extra>%{fullData.name}</extra>",
                "marker": {"color": _COLORS[action], "size": 9, "symbol": "diamond"},
            }
        )
    layout = _layout("Decisions (hover for target and reason)", "action", x_range)
    layout["yaxis"] = {"type": "category", "categoryorder": "array", "categoryarray": ACTIONS}
    return {"id": "decisions", "kind": "decisions", "title": "Decisions", "data": data,
            "layout": layout}  # fmt: skip


def _iso(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _json_script(element_id: str, value: Any) -> str:
    text = json.dumps(value, separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def _plots(figures: list[dict[str, Any]]) -> str:
    """The figures as JSON and the script that draws each into its element (plotly inlined)."""
    return (
        _json_script(FIGURES_ID, figures)
        + f"""
<script>
for (const f of JSON.parse(document.getElementById("{FIGURES_ID}").textContent)) {{
  Plotly.newPlot(f.id, f.data, f.layout, {{responsive: true, displaylogo: false}});
}}
</script>"""
    )


def render_report(result: RunResult) -> str:
    """The whole page: summary tables, every figure, plotly.js inlined."""
    s = result.summary.to_dict()
    figures = build_figures(result)
    e = html.escape
    slo_rows = [
        [
            e(key),
            f"P{v['percentile']:g} ≤ {v['objective_ms']:g} ms",
            "-" if v["attainment"] is None else f"{100 * v['attainment']:.2f}%",
            f"{v['breach_seconds']:g}",
            str(v["breaches_total"]),
        ]
        for key, v in s["slo"].items()
    ]
    pool_rows = [
        [
            e(name),
            e(v["kind"]),
            "-" if v["mean_util_pct"] is None else f"{v['mean_util_pct']:.1f}%",
            f"{v['idle_gpu_seconds']:g}",
            f"{v['reclaimable_gpu_hours']:g}",
        ]
        for name, v in s["pools"].items()
    ]
    acts = s["actions"]
    action_rows = [
        [
            e(a),
            str(n),
            e(", ".join(f"{o}: {k}" for o, k in acts["by_type_and_outcome"].get(a, {}).items())),
        ]
        for a, n in acts["by_type"].items()
    ]
    ev = s["events"]
    rejected = ", ".join(f"{c}: {n}" for c, n in ev["rejected_by_code"].items()) or "none"
    divs = "\n".join(
        f'<h3>{e(f["title"])}</h3><div id="{f["id"]}" class="fig"></div>' for f in figures
    )
    notes = "".join(f"<li>{e(n)}</li>" for n in s["inventory"])
    fitted = "".join(f"<li>{e(fit_line(key, f))}</li>" for key, f in s.get("fit", {}).items())
    fits = f"<p>Latency model (docs/replay.md):</p><ul>{fitted}</ul>" if fitted else ""
    decision_rows = _decision_rows(result.markers)
    decisions = (
        _table(["time", "action", "target", "outcome", "reason"], decision_rows)
        if decision_rows
        else "<p>none</p>"
    )
    listed = len(result.markers)
    more = (
        f"<p>The first {listed} of {acts['total']}; all are in decisions.jsonl.</p>"
        if acts["total"] > listed
        else ""
    )
    what = e(result.command)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Ebbtide {what}: {e(s["policy"]["name"])}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.8em; text-align: left; }}
.fig {{ width: 100%; min-height: 320px; }}
</style>
<script>{_plotly_js()}</script>
</head>
<body>
<h1>Ebbtide {what}</h1>
<p>Policy <b>{e(s["policy"]["name"])}</b> (sha256 <code>{e(s["policy"]["sha256"])}</code>),
{_iso(s["time"]["start"])} to {_iso(s["time"]["end"])}, evaluated every
{s["time"]["evaluate_every_s"]:g}s ({s["time"]["ticks"]} ticks).
Events: {ev["total"]} total, {ev["accepted"]} accepted, {ev["rejected"]} rejected ({e(rejected)}).
</p>
<h2>SLOs</h2>
<p>Latency {e(s["latency"])}.</p>
{fits}{_table(["service", "objective", "attainment", "breach seconds", "breaches"], slo_rows)}
<h2>Actions</h2>
{_table(["action", "count", "outcomes"], action_rows)}
<h2>Pools</h2>
{_table(["pool", "kind", "mean utilization", "idle GPU-seconds", "reclaimable GPU-h"], pool_rows)}
<h2>Inventory</h2>
<ul>{notes or "<li>from the scenario</li>"}</ul>
<h2>Over time</h2>
{divs}
<h2>Decisions</h2>
{decisions}
{more}
{_plots(figures)}
</body>
</html>
"""


def write_outputs(result: RunResult, out_dir: Path) -> tuple[Path, Path]:
    """Write ``summary.json`` and ``report.html`` into ``out_dir``; return their paths."""
    summary = out_dir / SUMMARY_FILE
    summary.write_text(json.dumps(result.summary.to_dict(), indent=2) + "\n", encoding="utf-8")
    report = out_dir / REPORT_FILE
    report.write_text(render_report(result), encoding="utf-8")
    return summary, report


# -- the comparison report (``ebbtide simulate --compare``) ---------------------------------

COMPARISON_FILE: Final = "compare.html"
_RUN_COLORS: Final = ("#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#7f7f7f", "#9467bd", "#8c564b")
_COLUMNS: Final = (
    ("id", "#"),
    ("label", "run"),
    ("sweep", "settings changed"),
    ("slo_attainment", "SLO attainment"),
    ("breach_minutes", "breach min"),
    ("p99_worst_5min_ms", "worst 5-min P99 (ms)"),
    ("training_gpu_hours", "training GPU-h"),
    ("training_goodput_gpu_hours", "training goodput GPU-h"),
    ("training_goodput_gpu_hours_optimistic", "optimistic goodput GPU-h"),
    ("disruptions", "training disruptions"),
    ("mean_gpu_util_pct", "mean GPU util"),
    ("reclaimable_gpu_hours", "reclaimable GPU-h"),
    ("actions", "actions"),
    ("preemptions", "preemptions"),
    ("pareto", "Pareto"),
)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("settings", "sweep"):
        return html.escape(", ".join(f"{k}={v:g}" for k, v in value.items()) or "defaults")
    if key == "slo_attainment":
        return f"{100 * value:.2f}%"
    if key == "mean_gpu_util_pct":
        return f"{value:.1f}%"
    if isinstance(value, float):
        return f"{value:.2f}"
    return html.escape(str(value))


def _summed(series: dict[str, list[float | None]], keys: list[str], n: int) -> list[float | None]:
    out: list[float | None] = [None] * n
    for key in keys:
        for i, v in enumerate(series.get(key, [])):
            if v is not None:
                out[i] = (out[i] or 0.0) + v
    return out


def comparison_figure(runs: list[tuple[dict[str, Any], RunResult]]) -> dict[str, Any]:
    """One plotly figure, panels stacked on **one shared time axis** (zoom one, all follow):
    per service the windowed percentile of every run (log scale) and the objective; training GPUs;
    inference GPUs; mean GPU utilization over pools; actions per interval; pods the scheduler
    preempted per interval. Trace names are the runs' labels; every trace is on ``xaxis:
    "x"``."""
    first = runs[0][1].summary.to_dict()
    slo = first["slo"]
    services = sorted(slo)
    panels = [f"{k}: windowed P{slo[k]['percentile']:g} (ms)" for k in services]
    panels += ["training GPUs", "inference GPUs", "mean GPU utilization (%)", "actions"]
    panels += ["pods preempted by the scheduler"]
    start, end = first["time"]["start"], first["time"]["end"]
    x_range = [start * 1000.0, end * 1000.0] if start is not None else []
    data: list[dict[str, Any]] = []
    for r, (row, result) in enumerate(runs):
        color = _RUN_COLORS[r % len(_RUN_COLORS)]
        series = result.timeline.series()
        x = _ms(result.timeline.times())
        n = len(x)
        pools = sorted(result.summary.to_dict()["pools"])
        ys: list[list[float | None]] = [series.get(f"p:{k}", [None] * n) for k in services]
        ys.append(_summed(series, [f"use:{p}:training" for p in pools], n))
        ys.append(_summed(series, [f"use:{p}:inference" for p in pools], n))
        util = _summed(series, [f"util:{p}" for p in pools], n)
        ys.append([None if v is None else v / max(1, len(pools)) for v in util])
        ys.append(_summed(series, [f"actions:{a}" for a in ACTIONS], n))
        ys.append(series.get("preempted", [None] * n))
        for i, y in enumerate(ys):
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": row["label"],
                    "legendgroup": row["controller"],
                    "showlegend": i == 0,
                    "line": {"color": color, "shape": "hv" if i >= len(ys) - 2 else "linear"},
                    "x": x,
                    "y": y,
                    "xaxis": "x",
                    "yaxis": "y" if i == 0 else f"y{i + 1}",
                    "connectgaps": False,
                }
            )
    for i, k in enumerate(services):
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "objective",
                "showlegend": i == 0,
                "line": {"dash": "dash", "color": "#000000", "width": 1},
                "x": x_range,
                "y": [slo[k]["objective_ms"]] * len(x_range),
                "xaxis": "x",
                "yaxis": "y" if i == 0 else f"y{i + 1}",
            }
        )
    rows = len(panels)
    gap = 0.03
    height = (1.0 - gap * (rows - 1)) / rows
    layout: dict[str, Any] = {
        "title": {"text": "All runs on one time axis"},
        "height": 230 * rows,
        "margin": {"l": 70, "r": 20, "t": 60, "b": 40},
        "legend": {"orientation": "h", "y": 1.0 + 40 / (230 * rows), "yanchor": "bottom"},
        "xaxis": {"type": "date", "range": x_range, "title": {"text": "time (UTC)"}},
        "hovermode": "x unified",
    }
    for i, title in enumerate(panels):
        top = 1.0 - i * (height + gap)
        axis: dict[str, Any] = {
            "domain": [max(0.0, top - height), top],
            "title": {"text": title, "font": {"size": 11}},
            "anchor": "x",
        }
        # latencies span 100 ms to a 30 s timeout: log scale; the rest from zero
        axis.update({"type": "log"} if i < len(services) else {"rangemode": "tozero"})
        layout["yaxis" if i == 0 else f"yaxis{i + 1}"] = axis
    return {
        "id": "comparison",
        "kind": "comparison",
        "title": "All runs on one time axis",
        "panels": panels,
        "runs": [row["controller"] for row, _ in runs],
        "data": data,
        "layout": layout,
    }


_PARETO_TITLE: Final = (
    "SLO attainment vs training goodput (both higher is better); ringed: on the overall "
    "front; dotted: each controller's own front"
)


def pareto_figure(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """SLO attainment against training goodput, one marker per run, each controller's own
    front as a line (its settings' trade-off curve); the overall front's runs are ringed."""
    data: list[dict[str, Any]] = []
    controllers = list(dict.fromkeys(r["controller"] for r in rows))
    for c, name in enumerate(controllers):
        mine = [r for r in rows if r["controller"] == name and r.get("slo_attainment") is not None]
        color = _RUN_COLORS[c % len(_RUN_COLORS)]
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": name,
                "legendgroup": name,
                "marker": {
                    "color": color,
                    "size": 10,
                    "line": {
                        "width": [3 if r.get("pareto") == "front" else 0 for r in mine],
                        "color": "#000000",
                    },
                },
                "x": [r["training_goodput_gpu_hours"] for r in mine],
                "y": [100.0 * r["slo_attainment"] for r in mine],
                "text": [f"#{r['id']} {_cell('sweep', r.get('sweep', {}))}" for r in mine],
            }
        )
        front = sorted(
            (r for r in mine if r.get("own_front")), key=lambda r: r["training_goodput_gpu_hours"]
        )
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"{name} front",
                "legendgroup": name,
                "showlegend": False,
                "line": {"color": color, "dash": "dot"},
                "x": [r["training_goodput_gpu_hours"] for r in front],
                "y": [100.0 * r["slo_attainment"] for r in front],
            }
        )
    return {
        "id": "pareto",
        "kind": "pareto",
        "title": "Trade-off: SLO attainment against training goodput",
        "data": data,
        "layout": {
            "title": {"text": _PARETO_TITLE},
            "height": 520,
            "xaxis": {"title": {"text": "training goodput (GPU-h)"}},
            "yaxis": {"title": {"text": "SLO attainment (%)"}},
        },
    }


def render_comparison(
    runs: list[tuple[dict[str, Any], RunResult]],
    *,
    title: str,
    context: str,
    pareto: dict[str, Any] | None = None,
) -> str:
    """One page comparing every run (``runs``: ``compare.json``'s row and the run's result):
    the figures table (with ``pareto``, ``compare.json``'s: the best value of each column in
    bold with its direction, and each run's place on the front), the trade-off figure, then
    :func:`comparison_figure` of the runs at their defaults (``row["default"]``, all when no
    row says)."""
    e = html.escape
    best = (pareto or {}).get("best", {})
    head = [
        h + {"max": " ↑", "min": " ↓"}.get(best.get(k, {}).get("direction"), "")
        for k, h in _COLUMNS
    ]
    rows = [row for row, _ in runs]
    body = []
    for row in rows:
        cells = []
        for k, _ in _COLUMNS:
            text = _cell(k, row.get(k))
            if k in best and row.get("id") in best[k]["runs"]:
                text = f"<b>{text}</b>"
            elif k == "pareto" and row.get("dominated_by"):
                text += " by " + ", ".join(f"#{i}" for i in row["dominated_by"][:5])
            cells.append(text)
        body.append(cells)
    figures = [pareto_figure(rows)] if pareto is not None else []
    figures.append(comparison_figure([(r, res) for r, res in runs if r.get("default", True)]))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{e(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.8em; text-align: left; }}
.fig {{ width: 100%; }}
</style>
<script>{_plotly_js()}</script>
</head>
<body>
<h1>{e(title)}</h1>
<p>{e(context)}</p>
{_table(head, body)}
<p>Bold: the best value of a column (↑ higher is better, ↓ lower). Pareto: on the front of
SLO attainment and training goodput, or dominated (by the runs listed). Definitions:
<code>controller/offline/experiment/figures.py</code>; goodput model:
<code>controller/offline/experiment/goodput.py</code>; fronts:
<code>controller/offline/experiment/pareto.py</code>.</p>
{"".join(f'<div id="{f["id"]}" class="fig"></div>' for f in figures)}
{_plots(figures)}
</body>
</html>
"""

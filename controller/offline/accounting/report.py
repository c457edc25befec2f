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
  a percentile at the latency model's timeout (:data:`TIMEOUT_MS`) is a cap, not a measurement,
  and a dotted line labelled so marks it; the decisions about the service (its scaling) sit on
  the chart as labelled markers (:func:`decision_markers`: kind and target);
* ``utilization`` — per pool, mean GPU utilization;
* ``gpus-by-use`` — per pool, stacked GPUs that are inference / training / idle / MIG /
  reconfiguring, and (a dashed line, not stacked) the GPUs held by pods but idle for the whole
  utilization window: reclaimable by scaling in (sampled once per bucket); every decision on
  it as a labelled marker (the report cannot tell a target's pool);
* ``actions`` — actions per bucket, stacked by type, on the same time axis;
* ``decisions`` — each decision as a marker (one row per action type), its target, outcome and
  reason on hover; the page also lists them in a table. A MIG conversion or reversion shows its
  flow's final outcome (``applied`` or ``failed`` at the time the flow ended on its node, or
  ``unfinished`` when the run ended first), not the ``in_progress`` it had when decided
  (:func:`~controller.offline.accounting.outputs.settle_flows`).

Every time chart shares zoom with the others (the page's script applies one's x range to all);
no figure has a title inside the plot (the heading above it names it) and legends and the
axis buttons sit under the x axis, so nothing overlaps; every axis title carries its unit. A
browser test (``tests/replay/test_report_browser.py``, Debian's headless chromium) checks the
drawn boxes for overlaps, the units, the shared zoom and the console.

``ebbtide simulate --compare`` writes **one** comparison page instead of a report per run
(:func:`render_comparison`, ``compare.html``): the figures table of every run, then one figure
(``kind: comparison``) whose panels — per service latency, training GPUs, inference GPUs, mean
utilization, actions, scheduler preemptions — are stacked on a single shared time axis, each
run a colour. Its table ends with a row giving each ranked column's best value and direction,
and a verdict line above it (:func:`verdict`) names who won among the fair runs.
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
from controller.offline.models.queueing import ServiceModel

__all__ = [
    "COMPARISON_FILE",
    "FIGURES_ID",
    "LOG_SCALE_RATIO",
    "MAX_LABELLED",
    "MAX_SERVICE_PLOTS",
    "TIMEOUT_MS",
    "comparison_figure",
    "decision_markers",
    "render_comparison",
    "render_report",
    "write_outputs",
]

FIGURES_ID: Final = "ebbtide-figures"
MAX_SERVICE_PLOTS: Final = 24
#: A latency plot starts with a log y axis when its peak exceeds the objective this many times.
LOG_SCALE_RATIO: Final = 10.0
#: Decisions on one chart up to which each marker carries its text (kind and target).
MAX_LABELLED: Final = 40
_MARKER_TIERS: Final = 3
#: The latency models' timeout (:class:`controller.offline.models.queueing.ServiceModel`): no
#: modelled request takes longer, so a percentile at it is the cap, drawn as such.
TIMEOUT_MS: Final = ServiceModel(key="", peak_rps=0.0, per_replica_rps=0.0, base_ms=0.0).timeout_ms
_AXIS_BUTTONS: Final = [
    {
        "type": "buttons",
        "direction": "left",
        "x": 1.0,
        "xanchor": "right",
        "y": -0.45,
        "yanchor": "top",
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


def _layout(y: str, x_range: list[float], **extra: Any) -> dict[str, Any]:
    """A time-axis figure's layout. No title inside the plot (the page's heading above each
    figure names it), and the legend sits under the x axis title, so neither can overlap the
    axis-scale buttons at the top right or the axis titles; ``y`` carries its unit."""
    return {
        "height": 360,
        # one left margin for all, wide enough for the decisions chart's kind names, so the
        # time axes of the charts stacked on the page line up
        "margin": {"l": 110, "r": 20, "t": 40, "b": 100},
        # the standoff keeps the first time label off the y axis' "0"
        "xaxis": {
            "type": "date",
            "range": x_range,
            "title": {"text": "event time (UTC)"},
            "ticklabelstandoff": 6,
        },
        "yaxis": {"title": {"text": y}, "rangemode": "tozero"},
        "legend": {"orientation": "h", "x": 0, "y": -0.45, "yanchor": "top"},
        **extra,
    }


def _timeout_cap(timeout_ms: float, x_range: list[float]) -> dict[str, Any]:
    """The line at the latency model's timeout: a percentile drawn on it is the cap (every
    request past it gave up), not a measured latency, so the line says so."""
    return {
        "type": "scatter",
        "mode": "lines",
        "name": f"timeout cap {timeout_ms / 1000:g} s (requests give up; capped, not measured)",
        "x": x_range,
        "y": [timeout_ms] * len(x_range),
        "line": {"dash": "dot", "color": "#7f7f7f", "width": 1},
        "hoverinfo": "name",
    }


def _marker_label(m: dict[str, Any]) -> str:
    return f"{m['action']} {m['target']}"


def decision_markers(markers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decisions as labelled markers along the top edge of a time chart: plotly
    annotations at each decision's time (``xref: x``, so they follow zoom), an arrow down to
    the plot, the text its kind and target, hover adding the outcome and reason. Labels step
    through :data:`_MARKER_TIERS` heights so neighbours do not print on each other; past
    :data:`MAX_LABELLED` decisions on one chart the texts would still pile up, so each shows
    as a bare ``▼`` with the same hover."""
    labelled = len(markers) <= MAX_LABELLED
    return [
        {
            "x": m["ts"] * 1000.0,
            "xref": "x",
            "y": 1.0,
            "yref": "paper",
            "text": _marker_label(m) if labelled else "▼",
            "hovertext": f"{_marker_label(m)} ({_outcome(m)})<br>" + html.escape(str(m["reason"])),
            "showarrow": True,
            "arrowhead": 2,
            "arrowcolor": _COLORS[str(m["action"])],
            "ax": 0,
            "ay": -14 - 13 * (i % _MARKER_TIERS),
            "font": {"size": 10, "color": _COLORS[str(m["action"])]},
            "bgcolor": "rgba(255,255,255,0.85)",
            "name": "decision",
        }
        for i, m in enumerate(markers)
    ]


def _with_markers(layout: dict[str, Any], markers: list[Any]) -> None:
    """Put :func:`decision_markers` on a time chart's layout, room for them above the plot."""
    if markers:
        layout["annotations"] = decision_markers(markers)
        layout["margin"] = {**layout["margin"], "t": 30 + 13 * _MARKER_TIERS}


def build_figures(result: RunResult) -> list[dict[str, Any]]:
    """Every figure of the report as plotly ``data``/``layout`` (see the module docstring)."""
    tl = result.timeline
    summary = result.summary.to_dict()
    series = tl.series()
    x = _ms(tl.times())
    start, end = summary["time"]["start"], summary["time"]["end"]
    x_range = [start * 1000.0, end * 1000.0] if start is not None else []
    interval = tl.stride * tl.dt
    figures: list[dict[str, Any]] = []
    markers = result.markers

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
        layout = _layout(f"windowed {pct} (ms)", x_range, shapes=bands)
        layout["updatemenus"] = _AXIS_BUTTONS
        if log_axis:
            layout["yaxis"] = {"title": {"text": f"windowed {pct} (ms, log)"}, "type": "log"}
        data: list[dict[str, Any]] = [
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
        ]
        if ys and max(ys) >= TIMEOUT_MS:
            data.append(_timeout_cap(TIMEOUT_MS, x_range))
        # the decisions about this service (its scaling) on its own chart
        _with_markers(layout, [m for m in markers if m["target"] == key])
        figures.append(
            {
                "id": f"latency-{i}",
                "kind": "latency",
                "service": key,
                "title": f"{key}: windowed {pct} vs objective",
                "data": data,
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
            "layout": _layout("mean GPU utilization (%)", x_range),
        }
    )
    for p in pools:
        data = [
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
        ] + [
            {
                "type": "scatter",
                "mode": "lines",
                "name": "reclaimable (held, idle)",
                "x": x,
                "y": series.get(f"reclaim:{p}", []),
                "line": {"color": _COLORS["reclaimable"], "dash": "dash"},
            }
        ]
        layout = _layout("GPUs (count)", x_range)
        # the report does not know which pool a decision's target is in: every decision
        # shows on every pool's GPU chart
        _with_markers(layout, markers)
        figures.append(
            {
                "id": f"gpus-by-use-{p}",
                "kind": "gpus-by-use",
                "pool": p,
                "title": f"GPUs by use: pool {p}",
                "data": data,
                "layout": layout,
            }
        )
    figures.append(
        {
            "id": "actions",
            "kind": "actions",
            "title": f"Actions per {interval:g} s interval",
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
            "layout": _layout(f"actions (per {interval:g} s)", x_range, barmode="stack"),
        }
    )
    figures.append(_decisions_figure(markers, x_range))
    return figures


def _outcome(marker: dict[str, Any]) -> str:
    """A decision's outcome; a MIG flow's final one with when it ended (``settle_flows``)."""
    finished = marker.get("finished")
    if finished is None:
        return str(marker["outcome"])
    return f"{marker['outcome']} at {_iso(float(finished))}"


def _decision_rows(markers: list[dict[str, Any]]) -> list[list[str]]:
    """The decision list's table rows, HTML-escaped."""
    return [
        [_iso(m["ts"]), *(html.escape(str(m[k])) for k in ("action", "target")),
         html.escape(_outcome(m)), html.escape(str(m["reason"]))]
        for m in markers
    ]  # fmt: skip


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
                    f"{m['target']} ({_outcome(m)})<br>{html.escape(str(m['reason']))}"
                    for m in mine
                ],
                "hovertemplate": "%{x}<br>%{text}<extra>%{fullData.name}</extra>",
                "marker": {"color": _COLORS[action], "size": 9, "symbol": "diamond"},
            }
        )
    layout = _layout("decision kind (category)", x_range)
    layout["yaxis"] = {
        "title": {"text": "decision kind (category)", "standoff": 8},
        "automargin": True,  # the kinds' names are wider than the margin for numbers
        "type": "category",
        "categoryorder": "array",
        "categoryarray": ACTIONS,
        # every kind's row, also one without decisions: a row missing would move the others
        "range": [-0.5, len(ACTIONS) - 0.5],
    }
    title = "Decisions (hover for target and reason)"
    return {"id": "decisions", "kind": "decisions", "title": title, "data": data,
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
    """The figures as JSON and the script that draws each into its element (plotly inlined).
    Zoom is shared: a change of one time chart's x range (zoom, pan, double-click reset) is
    applied to every other time chart, so an incident zoomed on one is read on all. When all
    are drawn, ``<body data-plotted>`` is set (what a browser test waits for)."""
    return (
        _json_script(FIGURES_ID, figures)
        + f"""
<script>
const figs = JSON.parse(document.getElementById("{FIGURES_ID}").textContent);
const timed = figs.filter(f => f.layout.xaxis && f.layout.xaxis.type === "date")
  .map(f => document.getElementById(f.id));
let syncing = false;
function share(gd, ev) {{
  let u = null;
  if ("xaxis.range[0]" in ev) u = {{"xaxis.range": [ev["xaxis.range[0]"], ev["xaxis.range[1]"]]}};
  else if ("xaxis.range" in ev) u = {{"xaxis.range": ev["xaxis.range"]}};
  else if (ev["xaxis.autorange"]) u = {{"xaxis.autorange": true}};
  if (!u || syncing) return;
  syncing = true;
  Promise.all(timed.filter(o => o !== gd).map(o => Plotly.relayout(o, u)))
    .finally(() => {{ syncing = false; }});
}}
Promise.all(figs.map(f => Plotly.newPlot(f.id, f.data, f.layout,
  {{responsive: true, displaylogo: false}}))).then(() => {{
  for (const gd of timed) gd.on("plotly_relayout", ev => share(gd, ev));
  document.body.dataset.plotted = "1";
}});
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
    if key == "p99_worst_5min_ms" and value >= TIMEOUT_MS:
        return f"{value:.0f} (timeout cap)"  # requests gave up: the real value is unknown
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
    panels = [f"{k}: windowed P{slo[k]['percentile']:g}" for k in services]
    panels += ["training GPUs", "inference GPUs", "mean GPU utilization", "actions"]
    panels += ["pods preempted by the scheduler"]
    step = f"per {runs[0][1].timeline.stride * runs[0][1].timeline.dt:g} s"
    units = [f"P{slo[k]['percentile']:g} (ms, log)" for k in services]
    units += [
        "GPUs (count)",
        "GPUs (count)",
        "mean utilization (%)",
        f"actions ({step})",
        f"pods ({step})",
    ]
    peaks = dict.fromkeys(services, 0.0)
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
        for k, y in zip(services, ys, strict=True):
            peaks[k] = max([peaks[k], *(v for v in y if v is not None)])
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
    capped = False
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
        if peaks[k] >= TIMEOUT_MS:
            cap = _timeout_cap(TIMEOUT_MS, x_range)
            axis_id = "y" if i == 0 else f"y{i + 1}"
            data.append({**cap, "xaxis": "x", "yaxis": axis_id, "showlegend": not capped})
            capped = True
    rows = len(panels)
    gap = 0.03
    height = (1.0 - gap * (rows - 1)) / rows
    # no title inside the figure (the page's heading names it); the legend above the first
    # panel's name, each panel named by an annotation in the gap above it, its unit on its axis
    layout: dict[str, Any] = {
        "height": 230 * rows,
        "margin": {"l": 70, "r": 20, "t": 70, "b": 50},
        "legend": {"orientation": "h", "x": 0, "y": 1.0 + 22 / (230 * rows), "yanchor": "bottom"},
        "xaxis": {
            "type": "date",
            "range": x_range,
            "title": {"text": "time (UTC)"},
            "ticklabelstandoff": 6,
            # under the bottom panel (anchored to the first y axis it ran through the panels)
            "anchor": "free",
            "position": 0,
        },
        "hovermode": "x unified",
        "annotations": [],
    }
    for i, (title, unit) in enumerate(zip(panels, units, strict=True)):
        top = 1.0 - i * (height + gap)
        layout["annotations"].append(
            {
                "text": f"<b>{html.escape(title)}</b>",
                "xref": "paper",
                "x": 0,
                "xanchor": "left",
                "yref": "paper",
                "y": top,
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"size": 12},
            }
        )
        axis: dict[str, Any] = {
            "domain": [max(0.0, top - height), top],
            "title": {"text": unit, "font": {"size": 11}},
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
        "title": _PARETO_TITLE,
        "data": data,
        "layout": {
            "height": 520,
            "xaxis": {"title": {"text": "training goodput (GPU-h)"}},
            "yaxis": {"title": {"text": "SLO attainment (%)"}},
        },
    }


_DIRECTION_WORDS: Final = {"max": "↑ higher is better", "min": "↓ lower is better"}


def best_row(best: dict[str, Any]) -> list[str]:
    """The table's last row: per ranked column its best value and which way is better."""
    return [
        "<b>best</b>" if k == "id" else
        f"<b>{_cell(k, best[k]['value'])}</b> ({_DIRECTION_WORDS[best[k]['direction']]})"
        if k in best else ""
        for k, _ in _COLUMNS
    ]  # fmt: skip


def _fair(row: dict[str, Any]) -> bool:
    return bool(row.get("fair")) or row.get("controller") == "ebbtide"


def verdict(rows: list[dict[str, Any]], pareto: dict[str, Any]) -> str:
    """Who won, in one line, among the fair runs (Ebbtide's and the fair peers'; an oracle or
    a strawman is not a contender): the run best in the most ranked columns (ties all named,
    with the columns), and the runs on the fair trade-off front (SLO attainment and training
    goodput)."""
    fair = [r for r in rows if _fair(r)]
    label = {r["id"]: f"#{r['id']} {r['label']}" for r in rows}
    wins: dict[int, list[str]] = {}
    for col, b in pareto.get("best", {}).items():
        values = [r[col] for r in fair if r.get(col) is not None]
        if not values:
            continue
        top = max(values) if b["direction"] == "max" else min(values)
        for r in fair:
            if r.get(col) == top:
                wins.setdefault(r["id"], []).append(col)
    if not wins:
        return "Verdict: no fair run has a ranked value (no request was evaluated)."
    most = max(len(c) for c in wins.values())
    heads = dict(_COLUMNS)
    led = "; ".join(
        f"{label[i]} ({', '.join(heads.get(c, c) for c in cols)})"
        for i, cols in wins.items()
        if len(cols) == most
    )
    front = [label[i] for i in pareto.get("fair_front", []) if i in label]
    return (
        f"Verdict among the fair runs (oracle and strawman aside): best in the most columns "
        f"({most} of {len(pareto['best'])}): {led}. On the fair trade-off front (SLO "
        f"attainment ↑, training goodput ↑): {', '.join(front) or 'no run'}."
    )


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
    if best:
        body.append(best_row(best))
    said = f'<p class="verdict"><b>{e(verdict(rows, pareto))}</b></p>' if pareto else ""
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
{said}
{_table(head, body)}
<p>Bold: the best value of a column (↑ higher is better, ↓ lower). Pareto: on the front of
SLO attainment and training goodput, or dominated (by the runs listed). Definitions:
<code>controller/offline/experiment/figures.py</code>; goodput model:
<code>controller/offline/experiment/goodput.py</code>; fronts:
<code>controller/offline/experiment/pareto.py</code>.</p>
{"".join(f'<h3>{e(f["title"])}</h3><div id="{f["id"]}" class="fig"></div>' for f in figures)}
{_plots(figures)}
</body>
</html>
"""

"""The HTML report: valid, offline, and every plot carries the replay's own data."""

from __future__ import annotations

import html
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from replay_builders import T0, chat_events, one_node_cluster, policy, write_recording

from controller.offline.accounting.report import FIGURES_ID, write_outputs
from controller.offline.replay.replayer import replay

VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr", "source"}


class _Checker(HTMLParser):
    """Collects script blocks and checks that every element is closed in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.ids: set[str] = set()
        self._attrs: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "script":
            self._attrs = a
            self.scripts.append((a, ""))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self.stack and self.stack[-1] == "script":
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)


def test_report_is_valid_offline_html_with_every_plot_and_its_data(tmp_path: Path) -> None:
    """The page parses with balanced tags, loads no external resource, inlines plotly.js, and
    its figure JSON holds the latency (with breach bands), utilization, GPUs-by-use and actions
    plots with exactly the replay's series."""
    path = write_recording(tmp_path / "r.jsonl", chat_events(300, burst=(100, 130)))
    result = replay(path, policy=policy(), cluster=one_node_cluster, out_dir=tmp_path / "out")
    summary_path, report_path = write_outputs(result, tmp_path / "out")
    page = report_path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    checker = _Checker()
    checker.feed(page)
    checker.close()
    assert checker.errors == []
    assert checker.stack == []
    assert all("src" not in attrs for attrs, _ in checker.scripts)
    assert "<link" not in page
    texts = [text for _, text in checker.scripts]
    assert any(len(t) > 1_000_000 and "plotly.js" in t for t in texts)  # the library, inlined
    assert any("Plotly.newPlot" in t and len(t) < 1000 for t in texts)

    (data,) = [text for attrs, text in checker.scripts if attrs.get("id") == FIGURES_ID]
    figures = json.loads(data)
    by_kind: dict[str, list[dict[str, object]]] = {}
    for fig in figures:
        by_kind.setdefault(str(fig["kind"]), []).append(fig)
        assert fig["id"] in checker.ids  # each figure has its <div>
    assert set(by_kind) == {"latency", "utilization", "gpus-by-use", "actions", "decisions"}

    series = result.timeline.series()
    x = [t * 1000 for t in result.timeline.times()]
    (latency,) = by_kind["latency"]
    p99, objective = latency["data"]  # type: ignore[misc]
    assert p99["x"] == x
    assert p99["y"] == series["p:serving/chat"]
    assert max(v for v in p99["y"] if v is not None) > 300
    assert objective["y"] == [100.0, 100.0]
    (band,) = latency["layout"]["shapes"]  # type: ignore[index]
    summary = json.loads(summary_path.read_text())
    (breach,) = summary["slo"]["serving/chat"]["breaches"]
    assert (band["x0"], band["x1"]) == (breach["start"] * 1000, breach["end"] * 1000)

    (util,) = by_kind["utilization"]
    assert {t["name"]: t["y"] for t in util["data"]}["whole"] == series["util:whole"]  # type: ignore[attr-defined]
    (use,) = by_kind["gpus-by-use"]
    stacked = {t["name"]: t["y"] for t in use["data"]}  # type: ignore[attr-defined]
    assert set(stacked) == {
        "inference",
        "training",
        "idle",
        "mig",
        "reconfiguring",
        "reclaimable (held, idle)",
    }
    assert stacked["inference"] == series["use:whole:inference"]
    assert stacked["reclaimable (held, idle)"] == series["reclaim:whole"]  # sampled per bucket
    (actions,) = by_kind["actions"]
    bars = {t["name"]: t["y"] for t in actions["data"]}  # type: ignore[attr-defined]
    assert sum(bars["scale"]) == 1
    assert x[bars["scale"].index(1.0)] <= (T0 + 105) * 1000
    assert latency["layout"]["xaxis"]["range"] == actions["layout"]["xaxis"]["range"]  # type: ignore[index]


def _figures(page: str) -> dict[str, list[dict[str, Any]]]:
    checker = _Checker()
    checker.feed(page)
    (data,) = [text for attrs, text in checker.scripts if attrs.get("id") == FIGURES_ID]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for fig in json.loads(data):
        by_kind.setdefault(str(fig["kind"]), []).append(fig)
    return by_kind


def test_each_decision_is_a_marker_with_its_reason_and_listed(tmp_path: Path) -> None:
    """The scale decision is drawn as a marker whose hover text names its target and reason,
    and the page lists it in the decisions table with its reason."""
    path = write_recording(tmp_path / "r.jsonl", chat_events(300, burst=(100, 130)))
    result = replay(path, policy=policy(), cluster=one_node_cluster, out_dir=tmp_path / "out")
    _, report = write_outputs(result, tmp_path / "out")
    page = report.read_text()
    (marker,) = result.markers
    (figure,) = _figures(page)["decisions"]
    (trace,) = figure["data"]
    assert trace["name"] == "scale"
    assert trace["mode"] == "markers"
    assert trace["x"] == [marker["ts"] * 1000]  # type: ignore[operator]
    assert trace["text"][0].startswith("serving/chat (applied)<br>")
    assert html.escape(str(marker["reason"])) in trace["text"][0]
    assert "<h2>Decisions</h2>" in page
    assert f"<td>{html.escape(str(marker['reason']))}</td>" in page
    assert "<title>Ebbtide replay: " in page


def test_a_peak_far_above_the_objective_starts_on_a_log_axis(tmp_path: Path) -> None:
    """Every latency plot has linear/log buttons; a peak 200x the objective (20 s against
    100 ms) starts on a log axis so the objective line is not flattened to the floor; a
    modest peak starts linear."""
    for high_ms, axis in ((20_000.0, "log"), (390.0, None)):
        out = tmp_path / f"out-{high_ms:g}"
        events = chat_events(300, burst=(100, 130), high_ms=high_ms)
        path = write_recording(tmp_path / f"r-{high_ms:g}.jsonl", events)
        result = replay(path, policy=policy(), cluster=one_node_cluster, out_dir=out)
        _, report = write_outputs(result, out)
        (latency,) = _figures(report.read_text())["latency"]
        layout = latency["layout"]
        assert [b["label"] for b in layout["updatemenus"][0]["buttons"]] == ["linear", "log"]
        assert layout["yaxis"].get("type") == axis

"""What the reports answer without a browser: decisions drawn on the latency and GPU charts
with their kind and target, the timeout cap drawn (and written) as a cap, and the comparison's
verdict naming the winner among the fair runs only."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from replay_builders import chat_events, one_node_cluster, policy, write_recording

from controller.offline.accounting.report import (
    MAX_LABELLED,
    TIMEOUT_MS,
    best_row,
    build_figures,
    decision_markers,
    verdict,
)
from controller.offline.experiment.pareto import mark
from controller.offline.replay.replayer import replay


def _figures(tmp_path: Path, high_ms: float) -> tuple[list[dict[str, Any]], list[Any]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_recording(
        tmp_path / "r.jsonl", chat_events(300, burst=(100, 130), high_ms=high_ms)
    )
    result = replay(path, policy=policy(), cluster=one_node_cluster, out_dir=tmp_path / "out")
    return build_figures(result), result.markers


def test_decisions_are_labelled_markers_on_the_latency_and_gpu_charts(tmp_path: Path) -> None:
    """The scale decision is an annotation at its time on serving/chat's latency chart and on
    the pool's GPU chart: text kind and target, hover adding outcome and reason; the charts
    without decisions for them (utilization) carry none."""
    figures, markers = _figures(tmp_path, 390.0)
    (marker,) = markers
    by_id = {f["id"]: f for f in figures}
    for fig_id in ("latency-0", "gpus-by-use-whole"):
        (note,) = by_id[fig_id]["layout"]["annotations"]
        assert note["text"] == "scale serving/chat"
        assert note["x"] == marker["ts"] * 1000.0
        assert note["xref"] == "x"  # follows zoom
        assert note["hovertext"].startswith("scale serving/chat (applied)<br>")
        assert html.escape(str(marker["reason"])) in note["hovertext"]
    assert "annotations" not in by_id["utilization"]["layout"]


def test_a_percentile_at_the_timeout_is_drawn_as_the_cap(tmp_path: Path) -> None:
    """At 30 s the windowed P99 is the model's timeout (requests gave up), and the chart
    draws the cap as a labelled line; at 20 s there is no cap to show."""
    for high_ms, capped in ((TIMEOUT_MS, True), (20_000.0, False)):
        figures, _ = _figures(tmp_path / f"{high_ms:g}", high_ms)
        (latency,) = [f for f in figures if f["kind"] == "latency"]
        names = [t["name"] for t in latency["data"]]
        caps = [n for n in names if n.startswith("timeout cap 30 s")]
        assert len(caps) == (1 if capped else 0), names


def _row(controller: str, fair: bool, attainment: float, goodput: float) -> dict[str, Any]:
    return {
        "controller": controller,
        "label": controller,
        "fair": fair,
        "slo_attainment": attainment,
        "training_goodput_gpu_hours": goodput,
        "breach_minutes": 10.0 * (1.0 - attainment),
    }


def test_the_verdict_names_the_best_fair_run_not_the_oracle() -> None:
    """The oracle is best everywhere, yet the verdict is among the fair runs: Ebbtide best in
    both ranked columns it leads, hpa-rate on the fair front beside it; the oracle unnamed."""
    rows = [
        _row("ebbtide", False, 0.95, 4.0),
        _row("hpa-rate", True, 0.90, 5.0),
        _row("static-peak", False, 1.0, 9.0),
    ]
    pareto = mark(rows)
    said = verdict(rows, pareto)
    assert said.startswith("Verdict among the fair runs (oracle and strawman aside): ")
    assert "best in the most columns (2 of 3): #0 ebbtide (SLO attainment, breach min)" in said
    assert said.endswith("fair trade-off front (SLO attainment ↑, training goodput ↑): "
                         "#0 ebbtide, #1 hpa-rate.")  # fmt: skip
    assert "static-peak" not in said


def test_the_best_row_gives_direction_and_calls_a_capped_p99_a_cap() -> None:
    """The table's last row: each ranked column's best value and which way is better; a
    worst 5-minute P99 at the timeout is written as the cap it is."""
    best = {
        "p99_worst_5min_ms": {"direction": "min", "value": TIMEOUT_MS, "runs": [0]},
        "slo_attainment": {"direction": "max", "value": 0.5, "runs": [0]},
    }
    row = best_row(best)
    assert row[0] == "<b>best</b>"
    assert "<b>30000 (timeout cap)</b> (↓ lower is better)" in row
    assert "<b>50.00%</b> (↑ higher is better)" in row


def test_past_the_label_limit_markers_show_their_text_on_hover_only() -> None:
    """Up to MAX_LABELLED decisions on a chart each marker prints kind and target; one more
    and the texts would pile up, so every marker is a bare arrowhead with the same hover."""
    ms = [
        {
            "ts": 100.0 + i,
            "action": "scale",
            "target": f"s/{i}",
            "outcome": "applied",
            "reason": "r",
        }
        for i in range(MAX_LABELLED + 1)
    ]
    assert [n["text"] for n in decision_markers(ms[:-1])] == [
        f"scale s/{i}" for i in range(MAX_LABELLED)
    ]
    many = decision_markers(ms)
    assert {n["text"] for n in many} == {"▼"}
    assert many[-1]["hovertext"] == f"scale s/{MAX_LABELLED} (applied)<br>r"

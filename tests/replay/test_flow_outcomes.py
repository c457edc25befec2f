"""MIG flows in reports end with their final outcome: a conversion decided ``in_progress`` takes
the outcome of its node's flow end (``applied``, ``failed``), or ``unfinished`` when the run
ended first; the report's decision table and hover text show it with the time it ended."""

from __future__ import annotations

from typing import Any

from controller.offline.accounting.outputs import settle_flows
from controller.offline.accounting.report import _decision_rows
from controller.simcluster.values import Effect


def marker(ts: float, action: str, target: str, outcome: str = "in_progress") -> dict[str, Any]:
    return {"ts": ts, "action": action, "target": target, "reason": "idle", "outcome": outcome}


def test_each_flow_takes_the_end_on_its_node_after_it() -> None:
    markers: list[dict[str, object]] = [
        marker(100.0, "mig_convert", "w0"),
        marker(150.0, "mig_convert", "w1"),
        marker(200.0, "scale", "serving/chat", "applied"),
        marker(900.0, "mig_revert", "w0"),
        marker(950.0, "mig_convert", "w2"),
        marker(960.0, "mig_convert", "w3", "refused"),
    ]
    effects = [
        Effect(50.0, "mig_done", "w2", "an earlier flow"),
        Effect(300.0, "mig_done", "w0", "all-1g.10gb in pool mig"),
        Effect(400.0, "mig_failed", "w1", "rolled back to whole"),
        Effect(1100.0, "mig_done", "w0", "all-disabled in pool whole"),
        Effect(1200.0, "scaled", "w2", ""),
    ]
    settle_flows(markers, effects)
    got = [(m["target"], m["outcome"], m.get("finished")) for m in markers]
    assert got == [
        ("w0", "applied", 300.0),
        ("w1", "failed", 400.0),
        ("serving/chat", "applied", None),
        ("w0", "applied", 1100.0),
        ("w2", "unfinished", None),  # its node's only end came before it
        ("w3", "refused", None),
    ]
    assert markers[1]["detail"] == "rolled back to whole"
    rows = _decision_rows(markers)
    assert rows[1][3] == "failed at 1970-01-01T00:06:40Z"
    assert rows[4][3] == "unfinished"

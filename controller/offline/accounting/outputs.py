"""What a replay or a simulation run leaves behind: the file names, one ``decisions.jsonl`` line
per carried-out decision, the accounting of each action, and the run's result (the summary, the
time series and the report's markers) that :mod:`.report` writes out.

Shared by both offline drivers, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from controller.loop.port import ActionResult, Outcome
from controller.offline.accounting.summary import Summary
from controller.offline.accounting.timeline import Timeline
from controller.simcluster.values import Effect
from policies.decisions import decision_to_dict

__all__ = [
    "DECISIONS_FILE",
    "MAX_MARKERS",
    "REPORT_FILE",
    "SUMMARY_FILE",
    "RunResult",
    "clear_outputs",
    "count_action",
    "decision_line",
    "settle_flows",
]

DECISIONS_FILE: Final = "decisions.jsonl"
SUMMARY_FILE: Final = "summary.json"
REPORT_FILE: Final = "report.html"
#: Decisions drawn one by one (with hover text) on the report's action plot.
MAX_MARKERS: Final = 2000
#: A MIG flow's end on its node (simulated cluster effects) → the outcome its marker shows.
_FLOW_ENDS: Final = {"mig_done": Outcome.APPLIED.value, "mig_failed": Outcome.FAILED.value}
_MIG_ACTIONS: Final = frozenset({"mig_convert", "mig_revert"})
#: A flow still running when the run ended: no outcome yet, and the report says so.
UNFINISHED: Final = "unfinished"

_DONE: Final = frozenset({Outcome.APPLIED, Outcome.IN_PROGRESS})


def decision_line(result: ActionResult) -> dict[str, object]:
    """One line of ``decisions.jsonl``: the explained decision and what became of it."""
    line = decision_to_dict(result.decision)
    line["applied"] = result.outcome in _DONE
    line["outcome"] = result.outcome.value
    line["detail"] = result.detail
    return line


def count_action(
    result: ActionResult,
    *,
    summary: Summary,
    timeline: Timeline,
    bucket: int,
    markers: list[dict[str, object]],
) -> None:
    """Account one carried-out decision in the summary, the timeline and the report markers."""
    d = result.decision
    summary.action(d.action, result.outcome.value)
    timeline.channel(f"actions:{d.action}", "sum")
    timeline.add(f"actions:{d.action}", bucket, 1.0)
    if len(markers) < MAX_MARKERS:
        markers.append(
            {
                "ts": d.at,
                "action": d.action,
                "target": d.target,
                "reason": d.explanation.reason,
                "outcome": result.outcome.value,
            }
        )


def settle_flows(markers: list[dict[str, object]], effects: Iterable[Effect]) -> None:
    """Give each MIG flow's marker its final outcome. A ``mig_convert`` or ``mig_revert`` is
    ``in_progress`` when decided (the drain has started); the flow ends minutes later on its
    node, in the simulated cluster (a ``mig_done`` or ``mig_failed`` effect), with no decision
    of its own. The marker takes the outcome of the first end on its node at or after it
    (``applied`` or ``failed``, with ``finished`` its time and ``detail`` the cluster's
    words); a flow still running when the run ended is ``unfinished``."""
    ends: dict[str, list[Effect]] = {}
    for effect in effects:
        if effect.kind in _FLOW_ENDS:
            ends.setdefault(effect.target, []).append(effect)
    flows = [
        m
        for m in markers
        if m["action"] in _MIG_ACTIONS and m["outcome"] == Outcome.IN_PROGRESS.value
    ]
    for marker in sorted(flows, key=lambda m: float(str(m["ts"]))):
        queue = ends.get(str(marker["target"]), [])
        while queue and queue[0].at < float(str(marker["ts"])):
            queue.pop(0)  # an end before this flow began belongs to an earlier one
        if not queue:
            marker["outcome"] = UNFINISHED
            continue
        end = queue.pop(0)
        marker["outcome"] = _FLOW_ENDS[end.kind]
        marker["finished"] = end.at
        marker["detail"] = end.detail


@dataclass(slots=True)
class RunResult:
    summary: Summary
    timeline: Timeline
    markers: list[dict[str, object]] = field(default_factory=list)
    """The first :data:`MAX_MARKERS` decisions: ``{ts, action, target, reason, outcome}``; a
    MIG flow's with its final outcome (:func:`settle_flows`)."""
    wall_s: float = 0.0
    command: str = "replay"
    """What produced it (``replay`` or ``simulate``): the report's title says so."""


def clear_outputs(out_dir: Path) -> None:
    """Remove a replay's outputs from ``out_dir``: an earlier run's, before a new one starts,
    or a failed run's partial ``decisions.jsonl``, so ``out_dir`` never looks complete when
    it is not."""
    for name in (DECISIONS_FILE, SUMMARY_FILE, REPORT_FILE):
        (out_dir / name).unlink(missing_ok=True)

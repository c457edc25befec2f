"""What a replay or a simulation run leaves behind: the file names, one ``decisions.jsonl`` line
per carried-out decision, the accounting of each action, and the run's result (the summary, the
time series and the report's markers) that :mod:`.report` writes out.

Shared by both offline drivers, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from controller.loop.port import ActionResult, Outcome
from controller.offline.accounting.summary import Summary
from controller.offline.accounting.timeline import Timeline
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
]

DECISIONS_FILE: Final = "decisions.jsonl"
SUMMARY_FILE: Final = "summary.json"
REPORT_FILE: Final = "report.html"
#: Decisions drawn one by one (with hover text) on the report's action plot.
MAX_MARKERS: Final = 2000

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


@dataclass(slots=True)
class RunResult:
    summary: Summary
    timeline: Timeline
    markers: list[dict[str, object]] = field(default_factory=list)
    """The first :data:`MAX_MARKERS` decisions: ``{ts, action, target, reason, outcome}``."""
    wall_s: float = 0.0
    command: str = "replay"
    """What produced it (``replay`` or ``simulate``): the report's title says so."""


def clear_outputs(out_dir: Path) -> None:
    """Remove a replay's outputs from ``out_dir``: an earlier run's, before a new one starts,
    or a failed run's partial ``decisions.jsonl``, so ``out_dir`` never looks complete when
    it is not."""
    for name in (DECISIONS_FILE, SUMMARY_FILE, REPORT_FILE):
        (out_dir / name).unlink(missing_ok=True)

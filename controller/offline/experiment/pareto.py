"""Trade-off curves of a comparison: which run dominates which, the Pareto fronts, and the best
value of each column.

A run ``a`` **dominates** ``b`` when it is at least as good on both objectives (SLO attainment
and training goodput, both higher-is-better) and better on one. The **front** is the runs no
other run dominates; a controller's **own front** is the same among its own runs (its settings'
trade-off curve); the **fair front** is the front among Ebbtide's runs and the fair peers'
(rows with ``fair``), leaving out the oracle and the strawman. A run without an attainment (no
request was evaluated) is on no front and dominates nothing. ``best`` gives, per column of the
table, the best value, its direction, and the runs that reach it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

__all__ = ["DIRECTIONS", "OBJECTIVES", "dominates", "mark"]

Direction = Literal["max", "min"]
OBJECTIVES: Final[tuple[str, ...]] = ("slo_attainment", "training_goodput_gpu_hours")
#: The columns of the comparison table a reader ranks runs by, and which way is better.
DIRECTIONS: Final[dict[str, Direction]] = {
    "slo_attainment": "max",
    "breach_minutes": "min",
    "p99_worst_5min_ms": "min",
    "training_goodput_gpu_hours": "max",
    "training_goodput_gpu_hours_optimistic": "max",
    "disruptions": "min",
    "preemptions": "min",
    "mean_gpu_util_pct": "max",
}


def _point(row: dict[str, Any]) -> tuple[float, ...] | None:
    values = [row.get(k) for k in OBJECTIVES]
    if any(v is None for v in values):
        return None
    return tuple(float(v) for v in values)  # type: ignore[arg-type]


def dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """``a`` is at least as good as ``b`` on every objective and better on one."""
    pa, pb = _point(a), _point(b)
    if pa is None or pb is None:
        return False
    return all(x >= y for x, y in zip(pa, pb, strict=True)) and pa != pb


def mark(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Give each row (changed in place) ``id`` (its index), ``dominates`` and ``dominated_by``
    (ids), ``pareto`` (``front``, ``dominated`` or ``none`` without an attainment) and
    ``own_front``; return ``compare.json``'s ``pareto`` object (objectives, the front's and
    the fair front's ids, the best value per column)."""
    for i, row in enumerate(rows):
        row["id"] = i
    for row in rows:
        row["dominates"] = [o["id"] for o in rows if dominates(row, o)]
        row["dominated_by"] = [o["id"] for o in rows if dominates(o, row)]
        if _point(row) is None:
            row["pareto"] = "none"
        else:
            row["pareto"] = "dominated" if row["dominated_by"] else "front"
        own = [o for o in rows if o["controller"] == row["controller"]]
        row["own_front"] = _point(row) is not None and not any(dominates(o, row) for o in own)
    fair = [r for r in rows if r.get("fair") or r["controller"] == "ebbtide"]
    fair_front = [
        r["id"] for r in fair if _point(r) is not None and not any(dominates(o, r) for o in fair)
    ]
    best: dict[str, dict[str, Any]] = {}
    for col, direction in DIRECTIONS.items():
        values = [r[col] for r in rows if r.get(col) is not None]
        if not values:
            continue
        top = max(values) if direction == "max" else min(values)
        best[col] = {
            "direction": direction,
            "value": top,
            "runs": [r["id"] for r in rows if r.get(col) == top],
        }
    return {
        "objectives": {k: DIRECTIONS[k] for k in OBJECTIVES},
        "front": [r["id"] for r in rows if r["pareto"] == "front"],
        "fair_front": fair_front,
        "best": best,
    }

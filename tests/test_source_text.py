"""Code and the README say why, not how fast it once ran: figures live in BENCHMARKS.md.

A measured figure in a docstring (``~3.4 µs a line on the dev box``) or a note of which issue
changed a line goes stale silently; BENCHMARKS.md says how each figure was measured and is
rerun. Design bounds stay in the code (a flush's size cap, a default); only measurements move.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: A measured figure (``~0.5 s``, ``~15%``), where it was measured, or an issue's number.
MEASURED = re.compile(
    r"~\s?[0-9][0-9.,]*\s?(µs|us|ms|s|%|kB|MB|MiB|GiB)(?![A-Za-z])"
    r"|\bdev box\b|\b[Ii]ssue \d+|\b[Ss]top \d+\b"
)


def _texts() -> list[Path]:
    code = [p for d in ("streams", "policies", "controller") for p in (ROOT / d).rglob("*.py")]
    return [*sorted(code), ROOT / "README.md"]


@pytest.mark.parametrize("path", _texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_measured_figures_or_issue_history(path: Path) -> None:
    """The file quotes no measured figure and no issue number (BENCHMARKS.md holds those)."""
    found = [
        f"{n}: {m.group(0)}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for m in [MEASURED.search(line)]
        if m is not None
    ]
    assert found == []

"""No function or method in streams/ or policies/ exists only for the tests.

A def whose name appears nowhere in the shipped code but its own definition is dead there:
it goes, or moves to a test helper (tests/support/engine_probes.py). Names are matched as
words across every shipped module, so this errs towards passing (a shared name hides a dead
def); what it does catch is a helper left behind for the tests alone.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("streams", "policies", "controller", "benchmarks", "scripts")
CHECKED = ("streams", "policies")
#: Called by a library, not by us: aiokafka's ConsumerRebalanceListener protocol.
CALLBACKS = {"on_partitions_revoked", "on_partitions_assigned"}


def _defs(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.name, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.name.startswith("_")
        and node.name not in CALLBACKS
    ]


def test_every_public_def_in_the_layers_has_a_shipped_caller() -> None:
    """Each public def in streams/ and policies/ is named somewhere else in shipped code."""
    sources = [p for d in SHIPPED for p in sorted((ROOT / d).rglob("*.py"))]
    text = "\n".join(p.read_text(encoding="utf-8") for p in sources)
    words = Counter(re.findall(r"\w+", text))
    defined = Counter(re.findall(r"\bdef (\w+)", text))
    unused = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sources
        if path.relative_to(ROOT).parts[0] in CHECKED
        for name, line in _defs(path)
        if words[name] - defined[name] <= 0
    ]
    assert unused == []

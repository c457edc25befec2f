"""The README's layout table and docs/architecture.md match the tree, and no two modules share a
name (a reader knows from a file's name which file it is)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("streams", "policies", "controller", "benchmarks")
PATH = re.compile(r"`((?:streams|policies|controller|benchmarks|tests|docs)/[\w/.]*)`")


def _paths(text: str) -> set[str]:
    return set(PATH.findall(text))


def test_every_path_the_docs_name_exists() -> None:
    for doc in ("README.md", "docs/architecture.md"):
        named = _paths((ROOT / doc).read_text())
        assert named, f"{doc} names no path: the pattern is wrong"
        missing = sorted(p for p in named if not (ROOT / p).exists())
        assert not missing, f"{doc} names paths that do not exist: {missing}"


def test_every_controller_package_is_in_the_layout_table() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout") :]
    rows = {p.rstrip("/") for p in _paths(table)}
    packages = {
        str(init.parent.relative_to(ROOT)) for init in (ROOT / "controller").glob("*/__init__.py")
    }
    assert packages, "no controller package found"
    assert packages <= rows, f"not in the README's layout table: {sorted(packages - rows)}"


def test_no_two_modules_share_a_name() -> None:
    names = Counter(
        f.name
        for package in PACKAGES
        for f in (ROOT / package).rglob("*.py")
        if f.name != "__init__.py"
    )
    assert sum(names.values()) > 100
    shared = sorted(n for n, count in names.items() if count > 1)
    assert not shared, f"module names used more than once: {shared}"

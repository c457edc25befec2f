"""The README's two set-up commands stay true: the main job runs as written; CI runs the tests."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_has_the_two_set_up_commands() -> None:
    """The first block installs and runs the main job; the second is the test script, which
    installs what pip cannot and the project before it runs pytest; .ci/run runs it exactly."""
    main, tests = COMMANDS[0], COMMANDS[1]
    assert "pip install -e ." in main
    assert "ebbtide replay" in main
    assert tests == "bash scripts/test.sh"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci
    script = (ROOT / "scripts" / "test.sh").read_text()
    for step in (
        "apt-get install",
        "prometheus",
        "python3 -m venv .venv",
        "pip install -q -e '.[dev]'",
    ):
        assert step in script, step
    assert script.rstrip().endswith('exec pytest "$@"')


@pytest.mark.slow
def test_the_main_command_runs_as_written(tmp_path: Path) -> None:
    """`ebbtide replay …` exactly as in the README (the part after the install) exits 0, shows
    the breach in the recorded incident and writes the report."""
    words = shlex.split(COMMANDS[0].split("&& ebbtide ", 1)[1])
    words[words.index("--out") + 1] = str(tmp_path / "out")
    result = subprocess.run(
        [sys.executable, "-m", "controller", *words],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "serving/chat" in result.stdout
    assert "1 breaches" in result.stdout
    assert (tmp_path / "out" / "report.html").is_file()


def test_make_bench_names_benchmarks_and_flags_that_exist() -> None:
    """`make bench` (issue 27: it runs every benchmark BENCHMARKS.md quotes) names files under
    benchmarks/ and flags their parsers define; a renamed benchmark broke it once."""
    lines = re.findall(
        r"^\tpython (benchmarks/\S+\.py)(.*)$", (ROOT / "Makefile").read_text(), re.M
    )
    assert len(lines) >= 8
    for script, args in lines:
        path = ROOT / script
        assert path.is_file(), script
        source = path.read_text()
        for flag in re.findall(r"--[\w-]+", args):
            assert f'"{flag}"' in source, f"{script} {flag}"

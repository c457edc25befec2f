"""``ebbtide simulate`` as a user reads it: its report says simulate, the utilization figures
say how they weigh GPUs, a burst outside the run is refused, long runs show progress."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import options
from controller.cli import simulate_command as simulate_module
from controller.cli.simulate_command import simulate

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
BALANCED = ROOT / "policies" / "library" / "balanced.yaml"


def _run(tmp_path: Path, *extra: str) -> tuple[int, str]:
    args = [str(SCENARIO), "--policy", str(BALANCED), "--out", str(tmp_path / "out"), *extra]
    result = CliRunner().invoke(simulate, args)
    return result.exit_code, result.output


def test_a_burst_outside_the_run_is_refused(tmp_path: Path) -> None:
    """--burst 50m:15m:6 in a 1h run would be cut short silently: a usage error instead."""
    code, output = _run(tmp_path, "--duration", "1h", "--burst", "50m:15m:6")
    assert code == 2
    assert "50m:15m:6 ends at 1h5m, after the run's --duration 1h" in output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_report_title_utilization_weighting_and_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report is titled simulate; the printed all-GPUs utilization is the --compare
    table's figure and says how it is weighted; on a terminal a progress bar runs over the
    simulated seconds."""
    monkeypatch.setattr(options, "stderr_is_terminal", lambda: True)
    seen: list[tuple[int, list[int]]] = []
    real = options.progress

    @contextlib.contextmanager
    def spy(length: int, label: str, unit: str) -> Iterator[Callable[[int], None] | None]:
        calls: list[int] = []
        seen.append((length, calls))
        with real(length, label, unit) as update:
            assert update is not None

            def both(position: int) -> None:
                calls.append(position)
                update(position)

            yield both

    monkeypatch.setattr(simulate_module, "progress", spy)
    code, output = _run(tmp_path, "--duration", "30m", "--burst", "10m:5m:6", "--compare")
    assert code == 0, output
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<title>Ebbtide simulate: balanced</title>" in page
    assert "<h1>Ebbtide simulate</h1>" in page
    assert "Latency modelled: a queueing model" in page  # closed loop, not as recorded
    overall = re.search(r"all GPUs: mean utilization ([\d.]+)% \(each physical GPU", output)
    assert overall is not None
    ebbtide_row = next(ln for ln in output.splitlines() if ln.split()[1:2] == ["ebbtide"])
    assert f"{overall.group(1)}%" in ebbtide_row
    assert "(per device)" in output
    assert "weighs each physical GPU the same" in output
    (length, calls) = seen[0]
    assert length == 1800
    assert calls[0] == 0
    assert calls[-1] > 1000

"""``ebbtide run`` tunes the garbage collector once start-up is done (issue 27)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.cli.run_command import GC_YOUNG_THRESHOLD, tune_gc
from controller.process.app import Controller

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gc_state() -> Iterator[None]:
    """The collector as it was before the test (tune_gc changes the whole process's)."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("gc_state")
def test_tune_gc_freezes_what_exists_and_collects_the_young_less_often() -> None:
    """Objects alive at the call leave the collector's sight; the youngest generation's
    threshold is raised, the older generations' kept."""
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    tune_gc()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 10, 10)


@pytest.mark.usefixtures("gc_state")
def test_run_tunes_gc_before_the_controller_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command wires it: when the controller starts running, start-up is frozen and the
    threshold is raised (on a simulated cluster, the controller's run replaced by a probe)."""
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    seen: list[tuple[int, int]] = []

    async def probe(self: Controller) -> None:
        seen.append((gc.get_freeze_count(), gc.get_threshold()[0]))

    monkeypatch.setattr(Controller, "run", probe)
    result = CliRunner().invoke(
        cli,
        [
            "run",
            "--policy",
            str(ROOT / "policies" / "library" / "balanced.yaml"),
            "--cluster",
            f"sim:{ROOT / 'examples' / 'scenario-small.yaml'}",
        ],
    )
    assert result.exit_code == 0, result.output
    ((frozen, young),) = seen
    assert frozen > 0
    assert young == GC_YOUNG_THRESHOLD

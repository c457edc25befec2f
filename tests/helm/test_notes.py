"""NOTES.txt says the mode the controller will really run in: dry when the chart's dryRun or
any policy's spec.dryRun says so, stopped when a policy's kill switch is on (real Helm engine)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import parse, render

LIVE = "LIVE: Ebbtide scales"


def _notes(chart: Any, values: dict[str, Any]) -> str:
    return parse("notes", values, render(chart, values)).notes


def _own_policy(**spec: object) -> dict[str, Any]:
    """A user policy file (replacing defaultPolicies) with ``spec`` on top of a minimal one."""
    return {
        "mine.yaml": {
            "apiVersion": "ebbtide.io/v1alpha1",
            "kind": "Policy",
            "metadata": {"name": "mine"},
            "spec": {
                "pools": {"whole": {"nodeSelector": {"ebbtide.io/pool": "whole"}, "kind": "whole"}},
                **spec,
            },
        }
    }


DRY_BY_POLICY = {
    "default policy": {"defaultPolicies": {"balanced.yaml": {"spec": {"dryRun": True}}}},
    "own policy": {"policies": _own_policy(dryRun=True)},
}


@pytest.mark.parametrize("case", DRY_BY_POLICY, ids=list(DRY_BY_POLICY))
def test_a_policys_dry_run_makes_the_notes_say_dry_run(chart: Any, case: str) -> None:
    """dryRun: false in the values but spec.dryRun: true in a policy: the controller stays dry,
    and the notes say DRY RUN, name the policy file and how to go live (before: LIVE)."""
    notes = _notes(chart, {"dryRun": False, **DRY_BY_POLICY[case]})
    assert LIVE not in notes
    assert "DRY RUN" in notes
    file = "balanced.yaml" if case == "default policy" else "mine.yaml"
    assert f"spec.dryRun: true in {file}" in notes


def test_a_kill_switch_makes_the_notes_say_stopped(chart: Any) -> None:
    """spec.killSwitch: true stops every decision: the notes say so, not LIVE."""
    notes = _notes(chart, {"dryRun": False, "policies": _own_policy(killSwitch=True)})
    assert LIVE not in notes
    assert "KILL SWITCH" in notes
    assert "spec.killSwitch: true in mine.yaml" in notes


def test_live_only_when_nothing_keeps_it_dry(chart: Any) -> None:
    """dryRun: false and no policy dry or stopped: LIVE, and no dry-run advice."""
    notes = _notes(chart, {"dryRun": False, "policies": _own_policy(dryRun=False)})
    assert LIVE in notes
    assert "DRY RUN" not in notes
    assert "KILL SWITCH" not in notes

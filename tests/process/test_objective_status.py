"""A ServiceObjective's status from the /status service entry: the four conditions with their
reasons, the printer columns' fields, and lastTransitionTime kept while a condition holds."""

from __future__ import annotations

from typing import Any

from controller.kube.objective_crd import Admission
from controller.process.objective_status import objective_status

ACCEPTED = Admission("team-a/search", True, "Accepted", "service team-a/search is in the policy")


def entry(**changes: Any) -> dict[str, Any]:
    """A /status service entry (controller.process.status), breaching at 3 of 1..3 replicas."""
    base: dict[str, Any] = {
        "service": "team-a/search",
        "workload": "team-a/search",
        "scaledBy": "ebbtide",
        "paused": False,
        "state": "breaching",
        "objectives": [
            {"percentile": 99.0, "objectiveMs": 300.0, "currentMs": 912.4, "samples": 400,
             "level": "above"}
        ],
        "replicas": {"current": 3, "desired": 3, "min": 1, "max": 3},
        "lastDecision": {"action": "scale", "target": "team-a/search", "from": 2, "to": 3,
                         "outcome": "applied", "reason": "P99 912ms > 300ms"},
        "blockedBy": ["at replicas.max (3)"],
    }  # fmt: skip
    return base | changes


def by_type(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_a_breaching_service_at_its_maximum() -> None:
    status = objective_status(
        ACCEPTED, entry(), blocked=[], generation=4, old=None, now="2026-12-04T10:00:00Z"
    )
    assert by_type(status) == {
        "Ready": ("True", "Accepted"),
        "Breaching": ("True", "ObjectiveBreached"),
        "AbleToScale": ("True", "ReadyForNewScale"),
        "ScalingLimited": ("True", "TooManyReplicas"),
    }
    assert status["objective"] == "P99 <= 300ms"
    assert status["current"] == "912.4ms"
    assert (status["state"], status["replicas"], status["desiredReplicas"]) == ("breaching", 3, 3)
    assert status["lastDecision"] == "scale team-a/search 2→3 applied: P99 912ms > 300ms"
    assert status["observedGeneration"] == 4
    assert status["paused"] is False


def test_what_blocks_it_is_the_reason_it_cannot_scale() -> None:
    """Paused first (the service's own block), then the controller's (dry-run)."""
    pause = "paused: ServiceObjective team-a/search carries ebbtide.io/paused=true"
    paused = entry(paused=True, blockedBy=[pause], state="ok")
    status = objective_status(
        ACCEPTED, paused, blocked=["dry-run (spec.dryRun): …"], generation=1, old=None, now="t"
    )
    able = next(c for c in status["conditions"] if c["type"] == "AbleToScale")
    assert (able["status"], able["reason"], able["message"]) == ("False", "Paused", pause)
    assert status["paused"] is True
    status = objective_status(
        ACCEPTED, entry(blockedBy=[]), blocked=["dry-run (spec.dryRun): x"], generation=1,
        old=None, now="t",
    )  # fmt: skip
    assert by_type(status)["AbleToScale"] == ("False", "DryRun")


def test_a_refused_object_says_why_and_nothing_else() -> None:
    taken = Admission("team-a/chat", False, "NameTaken", "service 'chat' is already defined …")
    status = objective_status(taken, None, blocked=[], generation=None, old=None, now="t")
    assert by_type(status) == {
        "Ready": ("False", "NameTaken"),
        "Breaching": ("Unknown", "NotInPolicy"),
        "AbleToScale": ("False", "NotInPolicy"),
        "ScalingLimited": ("Unknown", "NotInPolicy"),
    }
    assert set(status) == {"conditions"}


def test_transition_times_move_only_with_the_status() -> None:
    """Same statuses later: every lastTransitionTime is kept, so the whole status is equal to
    the one written (no write); recovery changes Breaching's time only."""
    first = objective_status(
        ACCEPTED, entry(), blocked=[], generation=1, old=None, now="2026-12-04T10:00:00Z"
    )
    again = objective_status(
        ACCEPTED, entry(), blocked=[], generation=1, old=first, now="2026-12-04T10:05:00Z"
    )
    assert again == first
    ok = entry(state="ok", objectives=[{**entry()["objectives"][0], "level": "below",
                                        "currentMs": 120.0}])  # fmt: skip
    later = objective_status(
        ACCEPTED, ok, blocked=[], generation=1, old=first, now="2026-12-04T10:09:00Z"
    )
    times = {c["type"]: c["lastTransitionTime"] for c in later["conditions"]}
    assert times["Breaching"] == "2026-12-04T10:09:00Z"
    assert times["Ready"] == times["AbleToScale"] == "2026-12-04T10:00:00Z"
    assert by_type(later)["Breaching"] == ("False", "WithinObjective")

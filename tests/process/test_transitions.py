"""Logs a person can follow: one event per SLO transition, leadership change and budget
exhaustion or restoration; one readable console line per decision, JSON unchanged."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from controller.process.logs import configure_logging, decision_line
from controller.process.transitions import Transitions
from policies.budgets import LogRecord
from policies.engine import Engine
from tests.policies.policy_fixtures import T0, cluster, feed_latency, make_policy


def _events(logs: list[dict[str, object]], *names: str) -> list[dict[str, object]]:
    return [e for e in logs if e["event"] in names]


def test_slo_transitions_are_logged_once_each() -> None:
    """A breach, its recovery and the return to ok are one event each, with the percentile
    against the objective; looking again without a change logs nothing."""
    engine = Engine(make_policy())
    snapshot = cluster().build()
    watch = Transitions(lambda: engine, lambda: False)
    states = []
    with capture_logs() as logs:
        t = T0
        for ms, seconds in ((50.0, 20), (400.0, 30), (20.0, 60)):
            for _ in range(seconds):
                feed_latency(engine, t, t + 1, ms)
                t += 1
                engine.evaluate(t, snapshot)
                watch.check(t)
                watch.check(t)  # a second look changes nothing
                states.append(engine.slo_state("serving/chat").state)
    changes = _events(logs, "slo.state_changed")
    assert [(c["from"], c["to"]) for c in changes] == [
        ("ok", "breaching"),
        ("breaching", "recovering"),
        ("recovering", "ok"),
    ]
    assert "breaching" in states
    assert states[-1] == "ok"
    breach = changes[0]
    assert breach["service"] == "serving/chat"
    assert breach["objective_ms"] == 100
    assert isinstance(breach["quantile_ms"], float)
    assert breach["quantile_ms"] > 100


def test_leadership_gained_and_lost_once_each() -> None:
    """Gaining and losing the right to act are one event each, at the look that sees it."""
    engine = Engine(make_policy())
    leading = [False]
    watch = Transitions(lambda: engine, lambda: leading[0])
    with capture_logs() as logs:
        watch.check(T0)
        leading[0] = True
        watch.check(T0 + 1)
        watch.check(T0 + 2)
        leading[0] = False
        watch.check(T0 + 3)
        watch.check(T0 + 4)
    got = [
        (e["event"], e["log_level"]) for e in _events(logs, "leadership.gained", "leadership.lost")
    ]
    assert got == [("leadership.gained", "info"), ("leadership.lost", "warning")]


def test_budget_exhausted_then_restored() -> None:
    """A budget spent to its max is one warning; when its window slides past the spending,
    one info that it is restored."""
    budgets = {
        "evictions": {"max": 4, "per": "10m"},
        "scaleSteps": {"max": 2, "per": "10m"},
        "migConversions": {"max": 2, "per": "1h"},
    }
    engine = Engine(make_policy(budgets=budgets))
    watch = Transitions(lambda: engine, lambda: False)
    with capture_logs() as logs:
        watch.check(T0)
        for i in range(2):
            engine.record(
                LogRecord(
                    id=f"d{i}", at=T0 + i, action="scale", cause="serving/chat", outcome="applied"
                )
            )
        watch.check(T0 + 5)
        watch.check(T0 + 6)
        watch.check(T0 + 605)
        watch.check(T0 + 606)
    got = _events(logs, "budget.exhausted", "budget.restored")
    assert [(e["event"], e["budget"]) for e in got] == [
        ("budget.exhausted", "scale_steps"),
        ("budget.restored", "scale_steps"),
    ]
    assert got[0]["max"] == 2


RECORD: dict[str, object] = {
    "id": "abc",
    "ts": T0,
    "action": "scale",
    "target": "serving/chat",
    "rule": "slo-breach-scale-up",
    "reason": "P99 412ms > 300ms for 30s",
    "kind": "Deployment",
    "role": "inference",
    "from": 2,
    "to": 4,
    "inputs": {"p99_ms": 412.0, "samples": 900},
    "thresholds": {"objective_ms": 300},
    "alternatives": [{"option": "to 8", "why_not": "maxStep 4"}],
    "dry_run": False,
    "outcome": "applied",
    "detail": "",
}


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_console_decision_is_one_readable_line(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the console a decision is one line: action, target, from→to, outcome, rule, reason;
    none of the inputs/thresholds/alternatives dump."""
    configure_logging(fmt="console")
    structlog.get_logger("ebbtide").info("decision", **RECORD)
    (line,) = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().err).strip().splitlines()
    assert (
        "decision scale serving/chat 2→4 applied (slo-breach-scale-up): P99 412ms > 300ms "
        "for 30s" in line
    )
    assert "inputs" not in line
    assert "alternatives" not in line
    assert len(line) < 160


def test_json_decision_is_unchanged(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON lines keep every field of the decision."""
    configure_logging(fmt="json")
    structlog.get_logger("ebbtide").info("decision", **RECORD)
    data = json.loads(capsys.readouterr().err)
    assert data["event"] == "decision"
    assert {k: data[k] for k in RECORD} == RECORD


def test_decision_line_for_other_actions() -> None:
    """MIG decisions show their profile, dry runs say so, and a refusal shows its detail."""
    mig = {
        "action": "mig_convert",
        "target": "node/w3",
        "profile": "all-1g.10gb",
        "outcome": "dry_run",
        "dry_run": True,
        "rule": "mig-convert",
        "reason": "idle",
    }
    assert decision_line(mig) == "mig_convert node/w3 → all-1g.10gb dry_run (mig-convert): idle"
    refused = RECORD | {"outcome": "refused", "detail": "budget scale_steps spent"}
    assert decision_line(refused).endswith("[budget scale_steps spent]")
    assert "2→4 refused" in decision_line(refused)

"""When a decision that did not happen is tried again, and what is left out of plans meanwhile,
decided from the result's typed fields (never from its detail text), as a table."""

from __future__ import annotations

import pytest

from controller.loop.feedback import (
    MIG_FAILED_HOLD_OFF_S,
    RESIZE_FAILED_HOLD_OFF_S,
    RETRY_HOLD_OFF_S,
    settle,
)
from controller.loop.port import NOT_LEADER, ActionResult, Outcome, Why
from policies.decisions import Decision, Evict, Explanation, MigConvert, Scale

WHY = Explanation.of("test", "test")
NOW = 1_800_000_000.0
EVICT = Evict(NOW, "ml/p0", "gpu-0", "ml/train", 30.0, WHY, cause="serving/chat")
UP = Scale(NOW, "serving/chat", "Deployment", 1, 2, "inference", WHY, cause="serving/chat")
SHRINK = Scale(NOW, "ml/train", "PyTorchJob", 4, 2, "training", WHY, cause="serving/chat")
GROW = Scale(NOW, "ml/train", "PyTorchJob", 2, 4, "training", WHY)
CONVERT = MigConvert(NOW, "gpu-3", "all-1g.10gb", "A100-80GB", WHY)

R = RETRY_HOLD_OFF_S


@pytest.mark.parametrize(
    ("decision", "outcome", "why", "transient", "detail", "retry_in", "hold_for"),
    [
        pytest.param(UP, Outcome.APPLIED, None, False, "", None, None, id="applied-untouched"),
        pytest.param(UP, Outcome.DRY_RUN, None, False, "", None, None, id="dry-run-untouched"),
        pytest.param(EVICT, Outcome.IN_PROGRESS, None, False, "", None, None, id="in-progress"),
        pytest.param(EVICT, Outcome.BLOCKED, None, False, "PDB", 0.0, R, id="pdb-next-victim"),
        pytest.param(UP, Outcome.BLOCKED, None, False, "429", 0.0, None, id="blocked-scale"),
        pytest.param(
            UP, Outcome.REFUSED, Why.NOT_LEADER, False, NOT_LEADER, 0.0, None, id="follower"
        ),
        pytest.param(UP, Outcome.REFUSED, Why.NOT_FREED, False, "", 0.0, None, id="not-freed"),
        pytest.param(
            UP,
            Outcome.REFUSED,
            None,
            False,
            NOT_LEADER + " (but untyped)",
            R,
            None,
            id="the-detail-is-not-parsed",
        ),
        pytest.param(UP, Outcome.REFUSED, None, False, "budget", R, None, id="refusal-waits"),
        pytest.param(
            UP, Outcome.REFUSED, Why.NOT_JOURNALED, False, "", R, None, id="no-intent-waits"
        ),
        pytest.param(
            CONVERT,
            Outcome.FAILED,
            None,
            False,
            "rolled back",
            R,
            MIG_FAILED_HOLD_OFF_S,
            id="mig-failed-node-held",
        ),
        pytest.param(
            SHRINK,
            Outcome.FAILED,
            None,
            False,
            "webhook",
            R,
            RESIZE_FAILED_HOLD_OFF_S,
            id="shrink-failed-held",
        ),
        pytest.param(
            SHRINK, Outcome.FAILED, None, True, "409", R, None, id="shrink-failed-transiently"
        ),
        pytest.param(GROW, Outcome.FAILED, None, False, "webhook", R, None, id="grow-not-held"),
    ],
)
def test_settle(
    decision: Decision,
    outcome: Outcome,
    why: Why | None,
    transient: bool,
    detail: str,
    retry_in: float | None,
    hold_for: float | None,
) -> None:
    result = ActionResult(decision, outcome, detail, transient=transient, why=why)
    (settled,) = settle([result], now=NOW)
    assert settled.retry_at == (None if retry_in is None else NOW + retry_in)
    assert settled.hold_until == (None if hold_for is None else NOW + hold_for)
    assert settled.done is (retry_in is None)
    assert (settled.decision, settled.outcome, settled.detail) == (decision, outcome, detail)

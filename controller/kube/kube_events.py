"""What the actuators tell people: Kubernetes Events, one log line per action, and counters.

Design:

* Every action and every refusal is visible on the object it concerns: ``kubectl describe``
  of the pod, the workload or the node shows a core/v1 Event whose reason says what happened
  (:func:`event_reason`: ``EbbtideScaled``, ``EbbtideEvicted``, ``EbbtideEvictionBlocked``,
  ``EbbtideRefused``, ``EbbtideWouldEvict`` in dry-run, ``EbbtideMigConverting``,
  ``EbbtideMigFailed``, …) and whose message names the rule, the reason and the key inputs and
  thresholds of the decision's explanation (:func:`explain`). Events are written the way
  client-go's legacy recorder writes them (``source``, ``first/lastTimestamp``, ``count``) plus
  ``reportingComponent``/``reportingInstance`` — the JSON names of core/v1's
  ``ReportingController``/``ReportingInstance`` — set to ``ebbtide.io/controller`` and the pod.
  Events of cluster-scoped objects (nodes) go to the ``default`` namespace, as kubelet's do.
* An Event is observability, not the action: a failed write is logged and counted, never
  raised, and only a leader writes them (checked right before the write).
* One structured log line per recorded result (``ebbtide.action``) carries the decision's JSON
  shape (:func:`policies.decisions.decision_to_dict`), the outcome and the detail.
* :class:`ActionStats` counts actions by type and outcome, MIG failures and failed Event
  writes, for the metrics endpoint to read later.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

import structlog
from kubernetes_asyncio import client

from controller.kube.client import Conflict, call
from controller.loop.port import ActionResult, Outcome
from policies.decisions import Action, Decision, decision_to_dict

__all__ = [
    "REPORTING_CONTROLLER",
    "ActionStats",
    "EventRecorder",
    "ObjectRef",
    "event_reason",
    "explain",
]

log = structlog.get_logger(__name__)

REPORTING_CONTROLLER: Final = "ebbtide.io/controller"
#: Namespace of Events about cluster-scoped objects (nodes), as kubelet and kubectl use.
CLUSTER_EVENT_NAMESPACE: Final = "default"
_MESSAGE_LIMIT: Final = 1024

_APPLIED: Final[dict[Action, str]] = {
    "scale": "EbbtideScaled",
    "evict": "EbbtideEvicted",
    "mig_convert": "EbbtideMigConverted",
    "mig_revert": "EbbtideMigReverted",
}
_WOULD: Final[dict[Action, str]] = {
    "scale": "EbbtideWouldScale",
    "evict": "EbbtideWouldEvict",
    "mig_convert": "EbbtideWouldConvertMig",
    "mig_revert": "EbbtideWouldRevertMig",
}
_STARTED: Final[dict[Action, str]] = {
    "mig_convert": "EbbtideMigConverting",
    "mig_revert": "EbbtideMigReverting",
    "evict": "EbbtidePreemptionNotice",
}


def event_reason(action: Action, outcome: Outcome) -> tuple[str, str] | None:
    """``(reason, type)`` of the Event for an outcome, or ``None`` when none is written
    (already done: nothing happened; in progress: only a flow's start, or a checkpoint
    notice, is an Event)."""
    mig = action in ("mig_convert", "mig_revert")
    if outcome is Outcome.APPLIED:
        return _APPLIED[action], "Normal"
    if outcome is Outcome.DRY_RUN:
        return _WOULD[action], "Normal"
    if outcome is Outcome.REFUSED:
        return "EbbtideRefused", "Normal"
    if outcome is Outcome.BLOCKED:
        return "EbbtideEvictionBlocked", "Normal"
    if outcome is Outcome.FAILED:
        return ("EbbtideMigFailed" if mig else "EbbtideActionFailed"), "Warning"
    if outcome is Outcome.IN_PROGRESS and action in _STARTED:
        return _STARTED[action], "Normal"
    return None


def _scalar(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def explain(decision: Decision, detail: str = "") -> str:
    """``[rule] reason; inputs: k=v, …; thresholds: k=v, …`` then the actuator's ``detail``."""
    exp = decision.explanation
    parts = [f"[{exp.rule}] {exp.reason}"]
    if exp.inputs:
        parts.append("inputs: " + ", ".join(f"{k}={_scalar(v)}" for k, v in exp.inputs.items()))
    if exp.thresholds:
        parts.append(
            "thresholds: " + ", ".join(f"{k}={_scalar(v)}" for k, v in exp.thresholds.items())
        )
    text = "; ".join(parts)
    return f"{detail} — {text}" if detail else text


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (``involvedObject``)."""

    kind: str
    name: str
    namespace: str | None = None
    api_version: str = "v1"
    uid: str | None = None

    def with_uid(self, uid: str | None) -> ObjectRef:
        return replace(self, uid=uid)

    def involved(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace is not None:
            out["namespace"] = self.namespace
        if self.uid is not None:
            out["uid"] = self.uid
        return out


@dataclass
class ActionStats:
    """Counters for metrics: actions by (action, outcome), MIG failures, failed Event writes."""

    actions: Counter[tuple[str, str]] = field(default_factory=Counter)
    mig_failures: int = 0
    events_written: int = 0
    events_failed: int = 0

    def count(self, action: str, outcome: Outcome) -> None:
        self.actions[(action, outcome.value)] += 1

    def total(self, *, action: str | None = None, outcome: Outcome | None = None) -> int:
        return sum(
            n
            for (a, o), n in self.actions.items()
            if action in (None, a) and (outcome is None or o == outcome.value)
        )


class EventRecorder:
    """Writes Events (leader only, never raising), log lines and counters for results."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        is_leader: Callable[[], bool],
        instance: str | None = None,
        stats: ActionStats | None = None,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 5.0,
    ) -> None:
        self._core: Any = client.CoreV1Api(api)  # untyped edge: bodies are plain dicts
        self._is_leader = is_leader
        self.instance = instance or socket.gethostname()
        self.stats = stats or ActionStats()
        self._clock = clock
        self._timeout_s = timeout_s

    async def report(
        self,
        result: ActionResult,
        ref: ObjectRef,
        *,
        reason: tuple[str, str] | None = None,
        event: bool = True,
        count: bool = True,
    ) -> ActionResult:
        """Count (unless ``count`` is false), log and (unless ``event`` is false) raise the
        Event for ``result``."""
        decision = result.decision
        if count:
            self.stats.count(decision.action, result.outcome)
            if result.outcome is Outcome.FAILED and decision.action in (
                "mig_convert",
                "mig_revert",
            ):
                self.stats.mig_failures += 1
        fields = decision_to_dict(decision)
        fields.pop("action", None)
        log.info(
            "ebbtide.action",
            action=decision.action,
            outcome=result.outcome.value,
            detail=result.detail,
            object=f"{ref.kind}/{ref.namespace + '/' if ref.namespace else ''}{ref.name}",
            **fields,
        )
        chosen = reason or event_reason(decision.action, result.outcome)
        if event and chosen is not None:
            await self.event(
                ref,
                reason=chosen[0],
                type=chosen[1],
                message=explain(decision, result.detail),
                action=decision.action,
            )
        return result

    async def event(
        self, ref: ObjectRef, *, reason: str, message: str, type: str = "Normal", action: str = ""
    ) -> None:
        """Create one core/v1 Event about ``ref``; failures are logged and counted."""
        if not self._is_leader():
            return
        now = self._clock()
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = ref.namespace or CLUSTER_EVENT_NAMESPACE
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{ref.name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": ref.involved(),
            "reason": reason,
            "message": message[:_MESSAGE_LIMIT],
            "type": type,
            "action": action,
            "source": {"component": REPORTING_CONTROLLER, "host": self.instance},
            "reportingComponent": REPORTING_CONTROLLER,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await call(
                lambda: self._core.create_namespaced_event(namespace, body),
                attempts=3,
                deadline_s=self._timeout_s,
                timeout_s=self._timeout_s,
            )
        except Conflict:  # an earlier try was written and only its answer was lost
            pass
        except Exception as exc:  # an Event never fails the action it reports
            self.stats.events_failed += 1
            log.warning("ebbtide.event_failed", reason=reason, object=ref.name, error=repr(exc))
            return
        self.stats.events_written += 1

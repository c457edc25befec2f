"""What a ServiceObjective's ``.status`` says: its conditions and the printer columns' fields.

Built from what ``/status`` answers for the service (:mod:`controller.process.status`), so
``kubectl get serviceobjectives``, ``kubectl describe`` and ``ebbtide status`` cannot disagree.
The conditions follow the HPA's (k8s.io/api ``autoscaling/v2``
``HorizontalPodAutoscalerCondition``: type, status, reason, message, lastTransitionTime; its
reasons ``ReadyForNewScale``, ``TooManyReplicas``, ``TooFewReplicas``, ``DesiredWithinRange``
where they mean the same here):

* ``Ready``: the object joined the policy (``Accepted``), or why not (``NamespaceNotAllowed``,
  ``NameTaken``, ``InvalidSpec``: :func:`controller.kube.objective_crd.with_objectives`);
* ``Breaching``: the SLO state: ``True`` while breaching or recovering, ``Unknown`` when stale or
  with too few samples, ``False`` within the objective;
* ``AbleToScale``: ``False`` with the first thing that blocks action now (paused, kill switch,
  dry-run, cooldown, a spent budget…), ``True`` (``ReadyForNewScale``) otherwise;
* ``ScalingLimited``: ``True`` at ``replicas.max`` (``TooManyReplicas``) or ``replicas.min``
  (``TooFewReplicas``).

A condition keeps its ``lastTransitionTime`` while its status stays the same, so a status that
did not change is equal to the one the object carries and costs no write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.kube.objective_crd import Admission

__all__ = ["objective_status"]

#: A service's ``blockedBy`` entry (its start) → the AbleToScale reason it gives.
_BLOCKS = (
    ("paused", "Paused"),
    ("kill switch", "KillSwitch"),
    ("dry-run", "DryRun"),
    ("cooldown", "Cooldown"),
    ("budget", "BudgetExhausted"),
    ("too few samples", "TooFewSamples"),
    ("stale", "Stale"),
    ("breachAfter", "BreachPending"),
)


def objective_status(
    verdict: Admission,
    service: Mapping[str, Any] | None,
    *,
    blocked: Sequence[str],
    generation: int | None,
    old: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """The status of the object ``verdict`` is about: ``service`` is its ``/status`` service
    entry (``None`` when it was refused), ``blocked`` what blocks every service (``/status``'s
    ``blockedBy``, less "not the leader": only the leader writes), ``old`` the status the
    object carries, ``now`` an RFC 3339 time."""
    kept = {c.get("type"): c for c in (old or {}).get("conditions") or () if isinstance(c, dict)}

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
        before = kept.get(kind)
        since = before.get("lastTransitionTime") if before is not None else None
        if before is None or before.get("status") != status or not since:
            since = now
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since,
        }

    ready = condition(
        "Ready", "True" if verdict.accepted else "False", verdict.reason, verdict.message
    )
    out: dict[str, Any] = {}
    if service is None:
        why = f"not in the policy: {verdict.reason}"
        conditions = [
            ready,
            condition("Breaching", "Unknown", "NotInPolicy", why),
            condition("AbleToScale", "False", "NotInPolicy", why),
            condition("ScalingLimited", "Unknown", "NotInPolicy", why),
        ]
    else:
        conditions = [
            ready,
            condition("Breaching", *_breaching(service)),
            condition("AbleToScale", *_able(service, blocked)),
            condition("ScalingLimited", *_limited(service)),
        ]
        (objective,) = service["objectives"][:1]
        current = objective["currentMs"]
        replicas = service["replicas"]
        out = {
            "objective": f"P{objective['percentile']:g} <= {objective['objectiveMs']:g}ms",
            "current": "-" if current is None else f"{current:g}ms",
            "state": service["state"],
            "paused": bool(service["paused"]),
        }
        if replicas["current"] is not None:
            out["replicas"] = replicas["current"]
        if replicas["desired"] is not None:
            out["desiredReplicas"] = replicas["desired"]
        if (last := service.get("lastDecision")) is not None:
            out["lastDecision"] = _decision(last)
    out["conditions"] = conditions
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def _breaching(service: Mapping[str, Any]) -> tuple[str, str, str]:
    (o,) = service["objectives"][:1]
    current = "no percentile yet" if o["currentMs"] is None else f"{o['currentMs']:g}ms"
    against = f"P{o['percentile']:g} {current} against {o['objectiveMs']:g}ms"
    state = service["state"]
    if state == "breaching":
        return "True", "ObjectiveBreached", f"{against}, above it for breachAfter"
    if state == "recovering":
        return "True", "Recovering", f"{against}; recovering, not yet for recoverAfter"
    if state == "stale":
        return "Unknown", "Stale", f"{against}; no verdict for staleAfter: the breach expired"
    if o["level"] == "none":
        return "Unknown", "TooFewSamples", f"{o['samples']} samples in the window: no verdict"
    return "False", "WithinObjective", against


def _able(service: Mapping[str, Any], blocked: Sequence[str]) -> tuple[str, str, str]:
    if service.get("scaledBy") != "ebbtide":
        return "False", "NotScaledByEbbtide", "the spec has no scale: Ebbtide does not scale it"
    for why in [*service["blockedBy"], *blocked]:
        for start, reason in _BLOCKS:
            if why.startswith(start):
                return "False", reason, why
    return "True", "ReadyForNewScale", "nothing blocks a scale now"


def _limited(service: Mapping[str, Any]) -> tuple[str, str, str]:
    r = service["replicas"]
    current, low, high = r["current"], r["min"], r["max"]
    if current is None:
        return "Unknown", "WorkloadNotFound", f"no workload {service['workload']} is watched"
    if high is not None and current >= high:
        return "True", "TooManyReplicas", f"{current} replicas: at replicas.max ({high})"
    if low is not None and current <= low:
        return "True", "TooFewReplicas", f"{current} replicas: at replicas.min ({low})"
    return "False", "DesiredWithinRange", f"{current} replicas, within {low or 0}..{high}"


def _decision(last: Mapping[str, Any]) -> str:
    change = f" {last['from']}→{last['to']}" if "from" in last and "to" in last else ""
    outcome = last.get("outcome", "decided")
    return f"{last.get('action')} {last.get('target')}{change} {outcome}: {last.get('reason')}"

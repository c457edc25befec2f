"""JobSet's validating admission webhook on update, for the test API server.

JobSet (kubernetes-sigs/jobset) runs a validating webhook, ``vjobset.kb.io``, on every create and
update of a JobSet; ``pkg/webhooks/jobset_webhook.go`` ``ValidateUpdate`` makes
``spec.replicatedJobs`` and ``spec.managedBy`` immutable, with one exception: while the JobSet is
suspended, or being suspended, the pod template's labels, annotations, nodeSelector, tolerations and
schedulingGates of each replicated job may change (what Kueue writes when it admits a job). So no
``replicas``, ``parallelism`` or ``completions`` of a running JobSet can change; the alpha
``ElasticJobSet`` feature gate (off by default) would allow ``parallelism``/``completions`` of
Indexed jobs, and never ``replicas``. It is not modelled: nothing here asks for it.


The webhook returns a plain ``field.ErrorList`` aggregate (``errs.ToAggregate()``), which
controller-runtime's custom validator answers with ``admission.Denied`` (``ValidationResponse``:
403, reason Forbidden), and the apiserver passes that on prefixed with who refused
(``k8s.io/apiserver`` ``pkg/admission/plugin/webhook/errors/statuserror.go`` ``ToStatusErr``):
``admission webhook "vjobset.kb.io" denied the request: spec.replicatedJobs: Invalid value: …:
field is immutable`` (several errors as ``[a, b]``). Replicated jobs are matched by position, as
the webhook's ``mungedSpec.ReplicatedJobs[index]`` does.
Go's semantic equality treats a missing list or map as an empty one, so empty values are pruned
before comparing; the bad value is rendered as JSON (Go prints its own struct syntax).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Final

from .kubeapi_objects import ApiError, Obj

__all__ = ["WEBHOOK", "validate_jobset_update"]

WEBHOOK: Final = "vjobset.kb.io"
_IMMUTABLE: Final = ("replicatedJobs", "managedBy")
_MUTABLE_WHILE_SUSPENDED: Final = (
    ("metadata", "labels"),
    ("metadata", "annotations"),
    ("spec", "nodeSelector"),
    ("spec", "tolerations"),
    ("spec", "schedulingGates"),
)
"""Under each replicated job's ``template.spec.template`` (the pod template)."""


def _pruned(value: Any) -> Any:
    """``value`` without null or empty members, as Go's semantic equality sees it."""
    if isinstance(value, dict):
        kept = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def _pod_template(job: Any) -> dict[str, Any]:
    spec = job.setdefault("template", {}).setdefault("spec", {})
    template: dict[str, Any] = spec.setdefault("template", {})
    return template


def _masked(old_jobs: list[Any], new_jobs: list[Any]) -> list[Any]:
    """``new_jobs`` with what a suspended JobSet may change copied back from ``old_jobs``
    (matched by position, as the webhook does)."""
    out = copy.deepcopy(new_jobs)
    for job, old in zip(out, old_jobs, strict=False):
        if not isinstance(job, dict) or not isinstance(old, dict):
            continue
        old_template, new_template = _pod_template(copy.deepcopy(old)), _pod_template(job)
        for part, key in _MUTABLE_WHILE_SUSPENDED:
            source = old_template.get(part) or {}
            target = new_template.setdefault(part, {})
            if key in source:
                target[key] = copy.deepcopy(source[key])
            else:
                target.pop(key, None)
    return out


def validate_jobset_update(old: Obj, new: Obj) -> ApiError | None:
    """The webhook's refusal of the update ``old`` → ``new`` (None: admitted)."""
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    wanted = {k: new_spec.get(k) for k in _IMMUTABLE}
    if old_spec.get("suspend") or new_spec.get("suspend"):
        wanted["replicatedJobs"] = _masked(
            old_spec.get("replicatedJobs") or [], new_spec.get("replicatedJobs") or []
        )
    causes = [
        {
            "reason": "FieldValueInvalid",
            "message": f"Invalid value: {json.dumps(new_spec.get(k))}: field is immutable",
            "field": f"spec.{k}",
        }
        for k in _IMMUTABLE
        if _pruned(wanted[k]) != _pruned(old_spec.get(k))
    ]
    if not causes:
        return None
    errors = [f"{c['field']}: {c['message']}" for c in causes]
    listed = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
    return ApiError(
        403, f'admission webhook "{WEBHOOK}" denied the request: {listed}', reason="Forbidden"
    )

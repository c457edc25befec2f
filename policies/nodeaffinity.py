"""Required node affinity, matched as kube-scheduler matches it.

Design:

* The rules are kubernetes' own (``staging/src/k8s.io/component-helpers/scheduling/corev1/
  nodeaffinity/nodeaffinity.go``, ``LazyErrorNodeSelector.Match``, and ``Requirement.Matches``
  in ``staging/src/k8s.io/apimachinery/pkg/labels/selector.go``): the ``nodeSelectorTerms`` of
  ``requiredDuringSchedulingIgnoredDuringExecution`` are ORed, the requirements of one term
  (its ``matchExpressions`` and ``matchFields``) ANDed, and a term with neither is skipped, so
  an affinity whose terms are all empty matches no node. ``In`` needs the label with one of the
  values; ``NotIn`` matches a node without the label too; ``Exists``/``DoesNotExist`` test the
  key; ``Gt``/``Lt`` compare the label read as a base-10 int64 (a node whose label is missing
  or not an integer does not match). ``matchFields`` knows one field, ``metadata.name``, with
  ``In``/``NotIn`` and exactly one value.
* What kubernetes would refuse to parse (an operator it does not know, ``In`` without values,
  ``Exists`` with values, ``Gt`` with a value that is not an integer, a field other than
  ``metadata.name``) raises :class:`UnknownAffinity` with one line saying where and why. The
  apiserver rejects such a pod, so meeting one means Ebbtide reads the spec differently than the
  cluster does (a newer API, a custom kind's template nobody validated): the caller marks the
  placement *unknown* and nothing is preempted on its behalf (:attr:`~policies.snapshot.
  Placement.unknown`), rather than guessing "anywhere" or "nowhere".
* Pure and dependency-free (no :mod:`policies.snapshot` import), so a
  :class:`~policies.snapshot.Placement` can hold a :class:`NodeAffinity` and one matcher serves
  the engine and the simulated scheduler (:func:`policies.placement.admits`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from policies.policy_errors import PoliciesError

__all__ = ["NODE_NAME_FIELD", "NodeAffinity", "Operator", "Requirement", "UnknownAffinity"]

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
#: The one node field ``matchFields`` may name (``extractNodeFields`` in nodeaffinity.go).
NODE_NAME_FIELD: Final = "metadata.name"
#: Go's ``strconv.ParseInt(s, 10, 64)`` syntax: an optional sign, then decimal digits only.
_INT: Final = re.compile(r"[+-]?[0-9]+")
_INT64: Final = (-(2**63), 2**63 - 1)


class UnknownAffinity(PoliciesError, ValueError):
    """Node affinity Ebbtide cannot read the way the apiserver would (module docstring)."""


def _int64(text: str) -> int | None:
    """``text`` as Go's ``ParseInt(text, 10, 64)`` reads it; ``None`` where that fails."""
    if not _INT.fullmatch(text):
        return None
    n = int(text)
    return n if _INT64[0] <= n <= _INT64[1] else None


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` entry (a label requirement), or with ``field`` one
    ``matchFields`` entry on the node's name."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()
    field: bool = False

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        """The node with ``labels`` and ``name`` meets this requirement."""
        if self.field:  # only metadata.name, In or NotIn with one value (checked when parsed)
            return (name == self.values[0]) == (self.operator == "In")
        op = self.operator
        value = labels.get(self.key)
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        have = _int64(value) if value is not None else None
        if have is None:
            return False
        want = int(self.values[0])
        return have > want if op == "Gt" else have < want

    def __str__(self) -> str:
        subject = NODE_NAME_FIELD if self.field else self.key
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{subject} {self.operator}"
        return f"{subject} {self.operator} [{', '.join(self.values)}]"


@dataclass(frozen=True, slots=True)
class NodeAffinity:
    """Required node affinity: a node matches when it meets every requirement of one term."""

    terms: tuple[tuple[Requirement, ...], ...]
    """Non-empty terms, ORed; the requirements of each ANDed. No terms: no node matches."""

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        """The node with ``labels`` and ``name`` may run the pod, as far as affinity goes."""
        return any(all(r.matches(labels, name) for r in term) for term in self.terms)

    def __str__(self) -> str:
        if not self.terms:
            return "no node (every nodeSelectorTerm is empty)"
        return " or ".join(f"({' and '.join(str(r) for r in term)})" for term in self.terms)

    @classmethod
    def parse(cls, required: Mapping[str, Any], *, where: str) -> NodeAffinity:
        """A ``requiredDuringSchedulingIgnoredDuringExecution`` node selector (the raw dict);
        ``where`` names it in errors. Raises :class:`UnknownAffinity` (module docstring)."""
        if not isinstance(required, Mapping):
            raise UnknownAffinity(f"{where}: not an object")
        terms: list[tuple[Requirement, ...]] = []
        for i, term in enumerate(required.get("nodeSelectorTerms") or ()):
            at = f"{where}.nodeSelectorTerms[{i}]"
            if not isinstance(term, Mapping):
                raise UnknownAffinity(f"{at}: not an object")
            reqs = [
                _requirement(e, at=f"{at}.matchExpressions[{j}]", field=False)
                for j, e in enumerate(term.get("matchExpressions") or ())
            ]
            reqs += [
                _requirement(e, at=f"{at}.matchFields[{j}]", field=True)
                for j, e in enumerate(term.get("matchFields") or ())
            ]
            if reqs:  # an empty term selects no objects: skipped, as kubernetes does
                terms.append(tuple(reqs))
        return cls(tuple(terms))


def _requirement(expr: Mapping[str, Any], *, at: str, field: bool) -> Requirement:
    """One requirement, checked as ``NewRequirement`` (labels) or
    ``nodeSelectorRequirementsAsFieldSelector`` (fields) checks it."""
    if not isinstance(expr, Mapping):
        raise UnknownAffinity(f"{at}: not an object")
    key = str(expr.get("key") or "")
    op = str(expr.get("operator") or "")
    raw = expr.get("values") or ()
    values = tuple(str(v) for v in cast(Sequence[Any], raw))
    if field:
        if key != NODE_NAME_FIELD:
            raise UnknownAffinity(f"{at}: field {key!r} is not one a node has (only metadata.name)")
        if op not in ("In", "NotIn"):
            raise UnknownAffinity(f"{at}: operator {op!r} on a field (only In and NotIn)")
        if len(values) != 1:
            raise UnknownAffinity(f"{at}: a field requirement takes one value, got {len(values)}")
        return Requirement(key, cast(Operator, op), values, field=True)
    if op not in _OPERATORS:
        raise UnknownAffinity(f"{at}: operator {op!r} is not one kubernetes knows")
    if not key:
        raise UnknownAffinity(f"{at}: no key")
    if op in ("In", "NotIn") and not values:
        raise UnknownAffinity(f"{at}: {op} without values")
    if op in ("Exists", "DoesNotExist") and values:
        raise UnknownAffinity(f"{at}: {op} takes no values, got {len(values)}")
    if op in ("Gt", "Lt") and (len(values) != 1 or _int64(values[0]) is None):
        raise UnknownAffinity(f"{at}: {op} takes one integer value, got {list(values)}")
    return Requirement(key, cast(Operator, op), values)

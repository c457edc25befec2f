"""``ebbtide policy test``: table-driven policy tests in YAML, like ``promtool test rules``.

A case file holds cases; each case gives a starting snapshot (in the :class:`SnapshotBuilder`
vocabulary), optional later snapshots, timed input events (single ones, or a series ``from``/
``to``/``every``), and expectations at given times: decisions that must appear (each a partial
match on :func:`~policies.decisions.decision_to_dict`), decisions that must not, or an exact
count. Times are offsets (``90s``) from a fixed epoch, so cases read like a timeline.

Design:

* The real :class:`~policies.engine.Engine` runs unchanged. Evaluations happen every
  ``evaluateEvery`` (default 5s) and also at every expectation and snapshot change time; the
  events due by an evaluation are observed before it, in time order.
* Case files are validated like policies (unknown keys are errors, ``FILE:LINE:COL``).
* A failing expectation is reported with a unified diff of what was expected against the
  decisions made at that time, so the author sees at once what differs. Both sides are
  written as YAML flow mappings (``{to: 3, dryRun: false}``), the language of the case file;
  each decision made ends in a YAML comment with its time (``# at 35s``): over a ``between``
  range the author sees when each came, and whether a missing one came too early or late.
* A case whose latency events name a service the policy does not define fails: the engine
  would ignore those events, so the case would pass or fail for a reason it does not show.
"""

from __future__ import annotations

import difflib
import heapq
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, model_validator

from policies.decisions import Decision, decision_to_dict
from policies.engine import Engine
from policies.loader import PolicyError, Source, validate_document
from policies.model import Duration, Policy, PositiveDuration, _Model, format_duration
from policies.snapshot import ANYWHERE, Placement, PodPhase, Snapshot, SnapshotBuilder
from streams.events import Event, GpuUtilization, InferenceLatency, InferenceLoad, Objective

__all__ = ["CaseFile", "CaseResult", "load_cases", "run_case", "run_cases"]

#: Case time 0 (2026-01-01T00:00:00Z).
EPOCH = 1_767_225_600.0
#: Fields shown for each decision in a diff.
_BRIEF = ("action", "target", "from", "to", "profile", "rule", "dry_run")


class NodeSpec(_Model):
    name: str
    gpus: int = 8
    model: str = "A100-80GB"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    cordoned: bool = False
    mig_config: str | None = None
    mig_state: str | None = None


class WorkloadSpec(_Model):
    namespace: str = "default"
    name: str
    kind: str = "Deployment"
    replicas: int = 1
    gpus_per_replica: int = 1
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    priority: int | None = None
    priority_class: str | None = None
    created: Duration = 0.0
    nodes: list[str | None] = Field(default_factory=list)
    """Place one pod per replica round-robin on these nodes (``null``: pending)."""
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of its pods (a checkpoint the workers report, ``ebbtide.io/last-checkpoint``)."""


class PodSpec(_Model):
    namespace: str = "default"
    name: str
    node: str | None = None
    phase: PodPhase | None = None
    gpus: int = 0
    mig: dict[str, int] = Field(default_factory=dict)
    priority: int | None = None
    priority_class: str | None = None
    workload: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    created: Duration = 0.0

    def add_to(self, b: SnapshotBuilder, *, start: float, placement: Placement = ANYWHERE) -> None:
        """Add this pod to ``b``; ``created`` counts from ``start``."""
        b.pod(
            self.namespace,
            self.name,
            node=self.node,
            phase=self.phase,
            gpus=self.gpus,
            mig=self.mig,
            priority=self.priority,
            priority_class=self.priority_class,
            workload=self.workload,
            labels=self.labels,
            annotations=self.annotations,
            created=start + self.created,
            placement=placement,
        )


class QuotaSpec(_Model):
    """A namespace's ``requests.nvidia.com/gpu`` ResourceQuota: hard limit and GPUs in use."""

    hard: int
    used: int = 0


class SnapshotSpec(_Model):
    priority_classes: dict[str, int] = Field(default_factory=dict)
    nodes: list[NodeSpec] = Field(default_factory=list)
    workloads: list[WorkloadSpec] = Field(default_factory=list)
    pods: list[PodSpec] = Field(default_factory=list)
    quotas: dict[str, QuotaSpec] = Field(default_factory=dict)
    """GPU quotas by namespace."""

    def build(self) -> Snapshot:
        b = SnapshotBuilder()
        for name, value in sorted(self.priority_classes.items()):
            b.priority_class(name, value)
        for n in self.nodes:
            b.node(
                n.name,
                gpus=n.gpus,
                model=n.model,
                labels=n.labels,
                annotations=n.annotations,
                cordoned=n.cordoned,
                mig_config=n.mig_config,
                mig_state=n.mig_state,
            )
        for w in self.workloads:
            b.workload(
                w.namespace,
                w.name,
                kind=w.kind,
                replicas=w.replicas,
                gpus_per_replica=w.gpus_per_replica,
                labels=w.labels,
                annotations=w.annotations,
                priority=w.priority,
                priority_class=w.priority_class,
                created=EPOCH + w.created,
                nodes=w.nodes,
                pod_annotations=w.pod_annotations,
            )
        for p in self.pods:
            p.add_to(b, start=EPOCH)
        for ns, q in sorted(self.quotas.items()):
            b.quota(ns, hard=q.hard, used=q.used)
        return b.build()


class EventSpec(_Model):
    """One event (``at``) or a series (``from``, ``to``, ``every``) of latency, load (a
    service's ``inference.load`` gauges) or utilization."""

    at: Duration | None = None
    from_: Annotated[Duration | None, Field(alias="from")] = None
    to: Duration | None = None
    every: PositiveDuration | None = None
    service: str | None = None
    namespace: str = "default"
    latency_ms: float | None = None
    samples_ms: list[float] | None = None
    objective: Objective = "e2e"
    """What a latency event measures (``e2e``, ``ttft``, ``tpot``)."""
    pod: str | None = None
    """The pod a load event is from (its gauges replace that pod's last ones)."""
    waiting: float | None = None
    running: float | None = None
    kv_cache_pct: float | None = None
    node: str | None = None
    gpu: int | None = None
    gpus: int | None = None
    """All GPUs ``0…gpus-1`` of the node."""
    util_pct: float | None = None

    @model_validator(mode="after")
    def _shape(self) -> EventSpec:
        series = self.from_ is not None or self.to is not None or self.every is not None
        if series == (self.at is not None):
            raise ValueError("give either at, or from/to/every")
        if series and (self.from_ is None or self.to is None or self.every is None):
            raise ValueError("a series needs from, to and every")
        if (self.service is None) == (self.node is None):
            raise ValueError("give either service (latency) or node (utilization)")
        load = (self.waiting, self.running, self.kv_cache_pct) != (None, None, None)
        latency = self.latency_ms is not None or self.samples_ms is not None
        if self.service is not None and load and latency:
            raise ValueError("a load event (waiting, running, kvCachePct) carries no latency")
        if (
            self.service is not None
            and not load
            and (self.latency_ms is None) == (self.samples_ms is None)
        ):
            raise ValueError("a latency event needs latencyMs or samplesMs")
        if self.node is not None and self.util_pct is None:
            raise ValueError("a utilization event needs utilPct")
        return self

    def times(self) -> Iterator[float]:
        if self.at is not None:
            yield self.at
            return
        assert self.from_ is not None
        assert self.to is not None
        assert self.every is not None
        i = 0
        while (t := self.from_ + i * self.every) < self.to:
            yield t
            i += 1

    def events(self, t: float) -> list[Event | InferenceLoad]:
        ts = EPOCH + t
        if self.service is not None and (self.latency_ms is None and self.samples_ms is None):
            return [
                InferenceLoad(
                    ts=ts,
                    service=self.service,
                    namespace=self.namespace,
                    version=1,
                    pod=self.pod,
                    waiting=self.waiting,
                    running=self.running,
                    kv_cache_pct=self.kv_cache_pct,
                )
            ]
        if self.service is not None:
            return [
                InferenceLatency(
                    ts=ts,
                    service=self.service,
                    namespace=self.namespace,
                    latency_ms=self.latency_ms,
                    samples_ms=self.samples_ms,
                    objective=self.objective,
                )
            ]
        assert self.node is not None
        assert self.util_pct is not None
        indexes = range(self.gpus) if self.gpus is not None else [self.gpu or 0]
        return [
            GpuUtilization(ts=ts, node=self.node, gpu=i, util_pct=self.util_pct) for i in indexes
        ]


Matcher = dict[str, Any]


class Expectation(_Model):
    at: Duration | None = None
    between: Annotated[list[Duration], Field(min_length=2, max_length=2)] | None = None
    decisions: list[Matcher] = Field(default_factory=list)
    """Each must match a decision taken then (partial match on the decision's JSON fields)."""
    forbidden: list[Matcher] = Field(default_factory=list)
    """None may match a decision taken then."""
    count: int | None = None
    """Exactly this many decisions then."""

    @model_validator(mode="after")
    def _when(self) -> Expectation:
        if (self.at is None) == (self.between is None):
            raise ValueError("give either at or between")
        return self

    def span(self) -> tuple[float, float]:
        if self.at is not None:
            return self.at, self.at
        assert self.between is not None
        return self.between[0], self.between[1]


class Change(_Model):
    at: Duration
    snapshot: SnapshotSpec


class Case(_Model):
    name: str
    snapshot: SnapshotSpec
    changes: list[Change] = Field(default_factory=list)
    events: list[EventSpec] = Field(default_factory=list)
    expect: Annotated[list[Expectation], Field(min_length=1)]


class CaseFile(_Model):
    evaluate_every: PositiveDuration = 5.0
    """Evaluate this often (and at every expectation and change time)."""
    cases: Annotated[list[Case], Field(min_length=1)]


@dataclass(frozen=True, slots=True)
class CaseResult:
    name: str
    passed: bool
    failures: tuple[str, ...] = ()


def load_cases(source: Source) -> tuple[CaseFile | None, list[PolicyError]]:
    """Validate a case file; errors are positioned like policy errors."""
    return validate_document(CaseFile, source)


#: A string YAML reads back as the same string without quotes.
_PLAIN = re.compile(r"[A-Za-z_][\w./-]*")
_YAML_WORDS = frozenset({"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"})


def _yaml(value: object) -> str:
    """``value`` as YAML flow text: ``serving/chat``, ``false``, ``null``, ``["a"]``."""
    if isinstance(value, str) and _PLAIN.fullmatch(value) and value.lower() not in _YAML_WORDS:
        return value
    return json.dumps(value)  # JSON is YAML flow syntax


def _matches(matcher: Matcher, got: dict[str, object]) -> bool:
    return all(k in got and got[k] == v for k, v in matcher.items())


def _brief(d: dict[str, object]) -> str:
    parts = [f"{k}: {_yaml(d[k])}" for k in _BRIEF if k in d]
    return "{" + ", ".join(parts) + "}"


def _matcher_text(m: Matcher) -> str:
    return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in m.items()) + "}"


def run_case(policy: Policy, case: Case, evaluate_every: float) -> CaseResult:
    """Run one case through a fresh engine and check its expectations."""
    defined = {f"{svc.namespace}/{name}" for name, svc in policy.spec.services.items()}
    unknown = sorted(
        {f"{e.namespace}/{e.service}" for e in case.events if e.service is not None} - defined
    )
    if unknown:
        return CaseResult(
            case.name,
            passed=False,
            failures=(
                f"events for services the policy does not define: {', '.join(unknown)} "
                f"(it defines {', '.join(sorted(defined)) or 'none'}; is the namespace right?)",
            ),
        )
    engine = Engine(policy)
    horizon = max(e.span()[1] for e in case.expect)
    ticks = {i * evaluate_every for i in range(int(horizon // evaluate_every) + 1)}
    ticks.update(t for e in case.expect for t in e.span() if e.at is not None)
    ticks.update(c.at for c in case.changes)
    snapshots = sorted(((c.at, c.snapshot.build()) for c in case.changes), key=lambda x: x[0])
    snapshot = case.snapshot.build()
    queue: list[tuple[float, int, EventSpec]] = []
    for i, spec in enumerate(case.events):
        for t in spec.times():
            if t <= horizon:
                queue.append((t, i, spec))
    heapq.heapify(queue)
    made: dict[float, list[dict[str, object]]] = {}
    for tick in sorted(ticks):
        while snapshots and snapshots[0][0] <= tick:
            snapshot = snapshots.pop(0)[1]
        while queue and queue[0][0] <= tick:
            t, _, spec = heapq.heappop(queue)
            for event in spec.events(t):
                engine.observe(event)
        decisions: list[Decision] = engine.evaluate(EPOCH + tick, snapshot)
        made[tick] = [decision_to_dict(d) for d in decisions]

    failures: list[str] = []
    for exp in case.expect:
        lo, hi = exp.span()
        timed = [(t, d) for t in sorted(made) if lo <= t <= hi for d in made[t]]
        got = [d for _, d in timed]
        when = (
            f"at {format_duration(lo)}"
            if lo == hi
            else f"between {format_duration(lo)} and {format_duration(hi)}"
        )
        missing = [m for m in exp.decisions if not any(_matches(m, d) for d in got)]
        present = [(m, t, d) for m in exp.forbidden for t, d in timed if _matches(m, d)]
        wrong_count = exp.count is not None and len(got) != exp.count
        if not (missing or present or wrong_count):
            continue
        lines = [f"{when}:"]
        if missing or wrong_count:
            want = [_matcher_text(m) for m in exp.decisions]
            have = [f"{_brief(d)}  # at {format_duration(t)}" for t, d in timed]
            diff = difflib.unified_diff(
                want, have, "expected", "got", lineterm="", n=len(have) + len(want)
            )
            lines += ["  " + line for line in diff] or ["  (no decisions)"]
            if wrong_count:
                lines.append(f"  expected {exp.count} decisions, got {len(got)}")
            if not have:
                lines.append("  got no decisions")
        for m, t, d in present:
            lines.append(
                f"  forbidden {_matcher_text(m)} matched {_brief(d)} at {format_duration(t)}: "
                f"{d.get('reason')}"
            )
        failures.append("\n".join(lines))
    return CaseResult(case.name, not failures, tuple(failures))


def run_cases(policy: Policy, cases: CaseFile) -> list[CaseResult]:
    """Every case in file order."""
    return [run_case(policy, case, cases.evaluate_every) for case in cases.cases]

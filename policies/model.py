"""The policy file format: a pydantic v2 model of ``apiVersion/kind/metadata/spec``.

Design:

* Every model is frozen, strict (a quoted number or boolean is an error, as in the JSON
  Schema: one set of rules for the CLI, editors and the chart), forbids unknown keys (a
  misspelt key is an error, never silently ignored) and uses camelCase aliases, so pydantic's
  error ``loc`` paths are exactly the keys the author wrote; :mod:`policies.loader` maps them
  back to ``FILE:LINE:COL``.
* Units are explicit in the text and normalised in the model: durations (``30s``, ``10m``,
  ``1h30m``, ``500ms``) become float seconds, percentages (``40%``) become fractions in
  ``[0, 1]``. Bare numbers are refused for both, so ``0.4`` versus ``40`` can never be confused.
* Checks that need the whole policy (a service naming a pool that does not exist, MIG pools of
  the wrong kind) are not pydantic validators: :meth:`Policy.problems` returns them with their
  ``loc`` so the loader can place them in the file like any other error, and the engine can refuse
  a policy on hot reload without a file at all.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from streams.events import Objective

__all__ = [
    "API_VERSION",
    "DO_NOT_DISRUPT",
    "KIND",
    "Budget",
    "BudgetsSpec",
    "CooldownsSpec",
    "CrowdSpec",
    "Duration",
    "ElasticSpec",
    "ForecastSpec",
    "LeadingSpec",
    "Loc",
    "Metadata",
    "MigSpec",
    "Percent",
    "Policy",
    "PolicySpec",
    "PoolSpec",
    "PositiveDuration",
    "Problem",
    "ReplicaBounds",
    "RestartsSpec",
    "ScaleDownSpec",
    "ScaleSpec",
    "ServiceSpec",
    "SignalsSpec",
    "SloSpec",
    "Step",
    "TaintSpec",
    "TrainingSpec",
    "VictimKey",
    "WorkBoundSpec",
    "format_duration",
    "format_loc",
    "format_percent",
    "parse_duration",
    "parse_percent",
    "parse_step",
    "policy_json_schema",
]

API_VERSION: Final = "ebbtide.io/v1alpha1"
KIND: Final = "Policy"
#: Pods and workloads carrying this annotation (any value but "false") are never disrupted.
DO_NOT_DISRUPT: Final = "ebbtide.io/do-not-disrupt"

_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE: Final = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+$")
_PART_RE: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_PERCENT_RE: Final = re.compile(r"^(\d+(?:\.\d+)?)\s*%$")

Loc = tuple[str | int, ...]


def parse_duration(value: object) -> float:
    """``"1h30m"`` → ``5400.0`` seconds; anything without a unit is refused."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f"a duration is a string with a unit, e.g. 30s, 10m, 1h30m; got {value!r}")
    text = value.strip()
    if not _DURATION_RE.match(text):
        raise ValueError(
            f"invalid duration {value!r}: use a number and a unit, e.g. 30s, 10m, 1h30m"
        )
    return sum(float(num) * _UNITS[unit] for num, unit in _PART_RE.findall(text))


def format_duration(seconds: float) -> str:
    """``5400.0`` → ``"1h30m"``: the inverse of :func:`parse_duration`, for explanations."""
    if seconds < 1 and seconds != 0:
        return f"{seconds * 1000:g}ms"
    rest = round(seconds, 3)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            whole = int(rest // size)
            parts.append(f"{whole}{unit}")
            rest -= whole * size
    if rest or not parts:
        parts.append(f"{rest:g}s")
    return "".join(parts)


def parse_percent(value: object) -> float:
    """``"40%"`` → ``0.4``; bare numbers are refused (is 0.4 forty percent or 0.4 percent?),
    and so is more than 100% — in percent, as the author wrote it, not as a fraction."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f"a percentage is a string ending in %, e.g. 40%; got {value!r}")
    match = _PERCENT_RE.match(value.strip())
    if not match:
        raise ValueError(f"invalid percentage {value!r}: write it like 40% or 12.5%")
    percent = float(match.group(1))
    if percent > 100:
        raise ValueError(f"a percentage here is at most 100%; got {value.strip()}")
    return percent / 100.0


def format_percent(fraction: float) -> str:
    """``0.9`` → ``"90%"``: the inverse of :func:`parse_percent`."""
    return f"{fraction * 100:.10g}%"


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    Field(ge=0),
    WithJsonSchema(
        {"type": "string", "pattern": _DURATION_RE.pattern, "examples": ["30s", "10m", "1h30m"]}
    ),
]
PositiveDuration = Annotated[Duration, Field(gt=0)]
_PERCENT_PATTERN: Final = r"^\d+(\.\d+)?\s*%$"
Percent = Annotated[
    float,
    BeforeValidator(parse_percent),
    WithJsonSchema({"type": "string", "pattern": _PERCENT_PATTERN, "examples": ["40%"]}),
]
_Name = Annotated[
    str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]
_Labels = dict[Annotated[str, Field(min_length=1)], str]
_MigProfile = Annotated[str, Field(pattern=r"^[1-9]g\.[0-9]+gb(\+me)?$")]
_ConfigName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9.+]*[a-z0-9])?$", max_length=63)]
_ALL_PROFILE_RE: Final = re.compile(r"^all-([1-9]g\.[0-9]+gb(\+me)?)$")
VictimKey = Literal["priority", "newest", "oldest", "leastProgress"]


class _Model(BaseModel):
    # strict: a value of the wrong JSON type ("200" for a number, "true" for a boolean) is an
    # error, as the shipped JSON Schema and the chart's values schema say, not coerced.
    # Units stay strings (durations, percentages, steps): their own validators parse them.
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


class Metadata(_Model):
    name: _Name
    """The policy's name; it appears in every decision and report."""
    description: str = ""
    """Free text for humans."""


class TaintSpec(_Model):
    key: Annotated[str, Field(min_length=1)]
    """Taint key, e.g. ``nvidia.com/mig``."""
    value: str = ""
    """Taint value."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    """What the taint does to pods that do not tolerate it."""


class PoolSpec(_Model):
    node_selector: Annotated[_Labels, Field(min_length=1)]
    """Labels a node must carry (all of them) to belong to this pool."""
    kind: Literal["whole", "mig"] = "whole"
    """``whole``: GPUs are handed out as whole cards; ``mig``: as MIG slices."""
    taints: list[TaintSpec] = []
    """Taints a node takes when a MIG flow moves it into this pool, and loses when one moves it
    out (matched by key and effect); taints the pools do not list are left alone."""


class ReplicaBounds(_Model):
    min: Annotated[int, Field(ge=0)] = 1
    """Never scale the service below this many replicas."""
    max: Annotated[int, Field(ge=1)]
    """Never scale the service above this many replicas."""

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaBounds:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        return self


class SloSpec(_Model):
    metric: Objective = "e2e"
    """Which latency the objective is on: the whole request (``e2e``), the time to the first
    token (``ttft``) or the time per output token (``tpot``). A service's latency events for
    other metrics (the ``objective`` field of ``inference.latency``) are not counted."""
    percentile: Annotated[float, Field(gt=0, lt=100)]
    """Which latency percentile the objective applies to, e.g. 99 or 99.9."""
    objective_ms: Annotated[float, Field(gt=0)]
    """The percentile must stay at or below this many milliseconds."""
    window: PositiveDuration = 60.0
    """Length of the sliding window the percentile is computed over."""
    resolution: PositiveDuration = 5.0
    """Width of one window slot; the window slides by this much. At most 720 slots."""
    breach_after: Duration = 30.0
    """The percentile must stay above the objective this long before the service breaches."""
    recover_below: Percent = 0.9
    """A breaching service recovers only below this fraction of the objective..."""
    recover_after: Duration = 60.0
    """...sustained for this long."""
    min_samples: Annotated[int, Field(ge=1)] = 20
    """Fewer requests than this in the window give no verdict (the state holds)."""
    stale_after: PositiveDuration = 300.0
    """A breaching or recovering service without a verdict this long becomes stale: the breach
    expires, and blocks training growth and MIG conversion no longer."""

    @model_validator(mode="after")
    def _slots(self) -> SloSpec:
        if self.resolution > self.window:
            raise ValueError("resolution must not be longer than window")
        if self.window / self.resolution > 720:
            raise ValueError("window / resolution gives more than 720 slots; raise the resolution")
        if self.recover_below > 1.0:
            raise ValueError("recoverBelow must be at most 100%")
        return self


def parse_step(value: object) -> int | float:
    """``2`` → 2 replicas (an ``int``); ``"25%"`` → 0.25 of the current replicas (a ``float``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"a step is at least 1 replica; got {value}")
        return value
    if isinstance(value, str) and value.strip().endswith("%"):
        fraction = parse_percent(value)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"a percentage step is above 0% and at most 100%; got {value!r}")
        return fraction
    raise ValueError(
        f"a step is a number of replicas (e.g. 1) or a percentage of them (e.g. 25%); got {value!r}"
    )


Step = Annotated[
    int | float,
    PlainValidator(parse_step),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": r"^\d+(\.\d+)?\s*%$", "examples": ["25%"]},
            ]
        }
    ),
]
"""A number of replicas (an ``int``) or a fraction of the current replicas (a ``float``)."""


class CrowdSpec(_Model):
    """A flash crowd's replicas go back soon after it, not a whole stabilization later
    (:mod:`policies.scaledown`): a recommendation above every one the service made over
    ``memory`` before the stabilization window is a level it has not needed before."""

    after: PositiveDuration = 300.0
    """Such a level is held this long after its last recommendation (the HPA's default
    stabilization), and goes back in one step to what the service has needed before."""
    memory: PositiveDuration = 86400.0
    """How far back a level counts as needed before: a level that recurs within it (a daily
    peak, a busy minute each hour) is held for the whole stabilization."""


class ScaleDownSpec(_Model):
    stabilization: Duration = 300.0
    """Scale down to the highest replica count recommended over this window (the HPA's
    scale-down stabilization), so a brief dip never scales down."""
    below: Percent = 0.5
    """Recommend fewer replicas only while the percentile is below this fraction of the
    objective."""
    max_step: Step = 1
    """Most replicas removed in one decision: a number, or a percentage of the current replicas
    (at least one)."""
    cooldown: Duration | None = None
    """Quiet time between two scale-downs of the service; defaults to the service's cooldown."""
    crowd: CrowdSpec | None = None
    """Give a flash crowd's replicas back soon after it (unset: every level is held for the
    whole stabilization)."""

    @model_validator(mode="after")
    def _below(self) -> ScaleDownSpec:
        if not 0.0 < self.below < 1.0:
            raise ValueError("below must be above 0% and below 100%")
        crowd = self.crowd
        if crowd is not None and crowd.after >= self.stabilization:
            raise ValueError("crowd.after must be shorter than stabilization")
        if crowd is not None and crowd.memory <= 2 * self.stabilization:
            raise ValueError("crowd.memory must be longer than twice stabilization")
        return self


class ForecastSpec(_Model):
    """Pre-scale for the load the last periods' shape predicts (:mod:`policies.forecast`)."""

    period: PositiveDuration = 86400.0
    """The load's season: its shape repeats every period (a day)."""
    max_error: Percent = 0.25
    """Use the forecast only while its recent mean relative error is at most this; above it,
    the service scales on what it observes."""


class LeadingSpec(_Model):
    """A leading indicator next to the percentile: the request rate moves before the latency
    window turns, so scale-up can start while the percentile is still within its objective."""

    rate_per_replica: Annotated[float, Field(gt=0)] | None = None
    """Requests/s one replica serves comfortably within the objective: whenever the request
    rate over the SLO window wants more replicas than the service has, scale up to
    ``ceil(rate / ratePerReplica)`` (bounded like a breach response), breaching or not; and
    never scale down below it. With ``learn``, the rate used until the learned one is
    confident."""
    learn: bool = False
    """Learn the rate per replica online from the service's own percentile against its load
    per replica (:mod:`policies.capacity`); until that fit is confident, ``ratePerReplica``
    if given, else the latency rules alone decide."""
    learn_at: Percent | None = None
    """The share of the objective at which the fitted percentile gives the learned rate;
    unset, the objective over ``1 + scale.tolerance`` (the edge of the band in which the
    breach response holds)."""
    tolerance: Percent = 0.0
    """Ask for more replicas only once the planned rate is more than this above what the
    current replicas serve at the rate per replica (the HPA's ``behavior.scaleUp.tolerance``,
    KEP-4951, for the rate): a rate that hovers at a replica boundary does not take a GPU from
    training for a replica the next window no longer asks for. A breach still adds one."""
    headroom: bool = False
    """Ask for the load one pod start-up ahead: the rate plus its recent growth over the
    start-up time (scale-up), or plus the steepest recent rise (scale-down keeps only what
    could be brought back in time)."""
    startup: Duration | None = None
    """A replica's start-up time for ``headroom`` and ``forecast``; observed from the snapshot
    (creation to Running) when absent."""
    forecast: ForecastSpec | None = None
    """Also plan for the highest rate the load's shape over the last periods predicts within
    one start-up; off when absent."""

    @model_validator(mode="after")
    def _one_rate(self) -> LeadingSpec:
        if self.rate_per_replica is None and not self.learn:
            raise ValueError("give ratePerReplica, or learn: true")
        if self.learn_at is not None and not 0.0 < self.learn_at <= 1.0:
            raise ValueError("learnAt must be above 0% and at most 100%")
        if self.tolerance >= 1.0:
            raise ValueError("tolerance must be below 100%")
        return self


class SignalsSpec(_Model):
    """Load signals beside the percentile, each with a per-replica target, read from the
    ``inference.load`` events the agent's scraper publishes (docs/events.md) and from the
    service's own pod-attributed GPU readings. Each asks for the replicas that bring it to its
    target (the HPA's ``ceil(replicas * value / target)``); the service scales up to the most
    any signal (or objective) asks for and down only when every one agrees (kubernetes
    ``pkg/controller/podautoscaler/horizontal.go``, ``computeReplicasForMetrics``)."""

    waiting: Annotated[float, Field(gt=0)] | None = None
    """Requests waiting (queue depth) per replica: ask for ``ceil(sum of waiting / this)``."""
    running: Annotated[float, Field(gt=0)] | None = None
    """Requests being served (concurrency) per replica: ask for ``ceil(sum / this)``."""
    kv_cache: Percent | None = None
    """Mean KV-cache usage of the replicas: ask for ``ceil(replicas * mean / this)``."""
    gpu_utilization: Percent | None = None
    """Mean utilization of the GPUs the service's own pods hold (``gpu.utilization`` readings
    that name the pod): ask for ``ceil(replicas * mean / this)``."""
    stale_after: PositiveDuration = 30.0
    """A pod's last reading older than this no longer counts; a signal with no fresh reading
    asks for nothing and never agrees to a scale-down."""

    @model_validator(mode="after")
    def _some(self) -> SignalsSpec:
        if (
            self.waiting is None
            and self.running is None
            and self.kv_cache is None
            and self.gpu_utilization is None
        ):
            raise ValueError("name at least one signal: waiting, running, kvCache, gpuUtilization")
        for name, value in (("kvCache", self.kv_cache), ("gpuUtilization", self.gpu_utilization)):
            if value is not None and value <= 0.0:
                raise ValueError(f"{name} must be above 0%")
        return self


class WorkBoundSpec(_Model):
    """When added replicas do not move the percentile: the latency is set by the work (a
    diffusion step, a long generation), not by queueing. After ``afterSteps`` scale-ups in a
    row that cut the load per replica by at least ``loadDrop`` and leave the percentile, as
    extrapolated to ``replicas.max``, above the objective, the service stops climbing on its
    latency, holds, says so, and scales on its load signals only (down too) until the
    percentile moves with the load again."""

    after_steps: Annotated[int, Field(ge=1)] = 2
    """Scale-ups in a row that did not help before latency stops driving the service."""
    load_drop: Percent = 0.2
    """A scale-up is judged only when it cut the request rate per replica by at least this."""
    settle: Duration | None = None
    """How long after a scale-up the percentile is read again; defaults to the SLO window plus
    ``breachAfter`` (the window then holds only requests served at the new size)."""

    @model_validator(mode="after")
    def _drop(self) -> WorkBoundSpec:
        if not 0.0 < self.load_drop < 1.0:
            raise ValueError("loadDrop must be above 0% and below 100%")
        return self


class ScaleSpec(_Model):
    kind: str = "Deployment"
    """Kind of the workload to scale through its /scale subresource."""
    tolerance: Percent = 0.1
    """Do nothing while percentile/objective is within 1 ± tolerance (as the HPA does)."""
    max_step: Annotated[int, Field(ge=1)] | None = None
    """Most replicas added in one decision; unbounded when absent."""
    down: ScaleDownSpec | None = None
    """Give capacity back when the service is comfortably within its objective; without it
    Ebbtide never scales the service down."""
    leading: LeadingSpec | None = None
    """Scale on the request rate too, ahead of the percentile; off when absent. It is the
    request-rate signal of ``signals``, combined with them the same way."""
    signals: SignalsSpec | None = None
    """Scale on load signals too (queue depth, concurrency, KV cache, GPU utilization);
    off when absent."""
    work_bound: WorkBoundSpec | None = None
    """Notice when added replicas do not move the percentile, stop climbing on it and scale on
    the load signals; off when absent."""
    ready_ends_cooldown: bool = False
    """End the service's cooldown early once every replica runs and ``slo.breachAfter`` has
    passed since the last action: a burst is met at the pace pods start, not one ``maxStep``
    per fixed cooldown."""
    shrink_first: bool = False
    """Scale up only into GPUs free now: GPUs that shrinking or evicting training frees are
    taken by the next step once they are free, so the scheduler never preempts training to
    place Ebbtide's own new replicas while a shrink's grace period runs. Needs
    ``readyEndsCooldown`` (the next step then comes as soon as the GPUs are free)."""

    @model_validator(mode="after")
    def _shrink_first(self) -> ScaleSpec:
        if self.shrink_first and not self.ready_ends_cooldown:
            raise ValueError(
                "shrinkFirst needs readyEndsCooldown: the step into the freed GPUs would wait "
                "a whole cooldown"
            )
        return self


class ServiceSpec(_Model):
    namespace: _Name = "default"
    """Namespace of the service (events are keyed namespace/service)."""
    workload: _Name | None = None
    """Name of the workload running the service; defaults to the service name."""
    pool: str
    """The pool (from spec.pools) the service's replicas run in."""
    gpus_per_replica: Annotated[int, Field(ge=0)] = 1
    """Whole GPUs one replica requests."""
    replicas: ReplicaBounds | None = None
    """Bounds on the service's replicas; required when ``scale`` is set."""
    slo: SloSpec
    """The service level objective (the primary one: it sizes the breach response and names
    the service's percentile in reports)."""
    objectives: list[SloSpec] = []
    """Further objectives, each on its own metric or percentile (e.g. ``tpot`` beside a
    ``ttft`` ``slo``): the service breaches when any objective breaches and has recovered
    only when every one has; each sizes a scale-up by its own ratio and must agree to a
    scale-down."""
    scale: ScaleSpec | None = None
    """Give Ebbtide the service as a scale target; without it Ebbtide only frees GPUs for the
    service's pending pods (another autoscaler scales it)."""
    cooldown: Duration | None = None
    """Quiet time after an action for this service; defaults to spec.cooldowns.service."""

    @model_validator(mode="after")
    def _bounds_for_scale(self) -> ServiceSpec:
        if self.scale is not None and self.replicas is None:
            raise ValueError("replicas (min/max) is required when scale is set")
        return self

    def all_objectives(self) -> list[SloSpec]:
        """``slo`` then ``objectives``: every objective the service has."""
        return [self.slo, *self.objectives]

    def has_signals(self) -> bool:
        """Whether the service is ruled on more than its one percentile (further objectives,
        load signals, the work-bound check): its rules then run every tick."""
        scale = self.scale
        return bool(self.objectives) or (
            scale is not None and (scale.signals is not None or scale.work_bound is not None)
        )


class ElasticSpec(_Model):
    min_replicas_annotation: str = "ebbtide.io/min-replicas"
    """Annotation on a training workload giving the fewest replicas it can shrink to."""
    max_replicas_annotation: str = "ebbtide.io/max-replicas"
    """Annotation giving the most replicas it may grow to."""
    grow_after: Duration = 300.0
    """Free GPUs must be seen this long, with no service breaching, before training grows."""
    grow_step: Annotated[int, Field(ge=1)] = 1
    """Replicas added to one workload per grow decision (``growTo: step``)."""
    grow_to: Literal["step", "idle"] = "step"
    """``step``: grow by ``growStep`` at a time; ``idle``: grow once into every GPU that stayed
    idle ``growAfter`` (up to the workload's maximum). A DDP/elastic job restarts every worker
    on each membership change, so ``idle`` pays one restart where ``step`` pays one per step."""
    regrow_after: Duration = 3600.0
    """Hysteresis: a DDP/elastic job Ebbtide shrank or evicted from is not grown back within
    this (each grow restarts it; a load that took its GPUs once is likely to again). Sweep
    tasks (a ``Job``'s pods) are not held: adding one restarts nothing."""


class CheckpointSpec(_Model):
    deadline: Duration = 300.0
    """How long a pod opted in to the checkpoint handshake (``ebbtide.io/checkpoint-handshake``)
    is given, after the preemption notice, to acknowledge a checkpoint before it is evicted;
    its own ``ebbtide.io/checkpoint-deadline-seconds`` annotation wins."""


class RestartsSpec(_Model):
    """How Ebbtide prices a membership change of a DDP/elastic training job: every worker stops
    and restarts from the job's last checkpoint (TorchElastic's ``_restart_workers``)."""

    restart_cost: Duration = 120.0
    """How long a job's workers compute nothing while it restarts."""
    checkpoint_every: PositiveDuration = 1800.0
    """How often a job checkpoints, counted from its last restart, when its pods report no
    ``ebbtide.io/last-checkpoint``: the work a restart would redo is estimated from it."""
    tasks_first: bool = False
    """Free GPUs by preempting restartable tasks (a ``Job``'s pods: each restarts alone) before
    resizing a DDP/elastic job, when that frees what is needed for fewer GPU-hours lost."""
    payback: Duration = 0.0
    """Grow a DDP/elastic job only when the GPUs it adds, kept this long, compute more than
    its restart costs (restart time on all its GPUs plus its work since the last checkpoint);
    0: every grow is worth it."""
    checkpoint_horizon: Duration = 0.0
    """Defer a grow of a job whose pods report a checkpoint due within this until just after
    it (the restart then redoes almost nothing); 0: never defer."""

    @model_validator(mode="after")
    def _horizon_within_interval(self) -> RestartsSpec:
        if self.checkpoint_horizon >= self.checkpoint_every:
            raise ValueError(
                f"checkpointHorizon ({format_duration(self.checkpoint_horizon)}) must be shorter "
                f"than checkpointEvery ({format_duration(self.checkpoint_every)}): a checkpoint "
                "would always be due within it"
            )
        return self


class TrainingSpec(_Model):
    selector: Annotated[_Labels, Field(min_length=1)]
    """Labels (all of them) that mark a workload and its pods as offline training."""
    pools: list[str] = []
    """Pools training may be shrunk, evicted or grown in; empty means every pool."""
    elastic: ElasticSpec = ElasticSpec()
    """Where elastic bounds come from and how training grows back."""
    victim_order: Annotated[list[VictimKey], Field(min_length=1)] = ["priority", "newest"]
    """Order victims are taken in: lowest priority first, then newest (or oldest, or least
    progress)."""
    grace_period: Duration = 30.0
    """Termination grace period given to evicted pods."""
    checkpoint: CheckpointSpec = CheckpointSpec()
    """The checkpoint handshake for these workloads' opted-in pods."""
    restarts: RestartsSpec = RestartsSpec()
    """Restart-aware resizing: what a membership change of a DDP/elastic job costs."""
    gang_minimum_annotation: str = "ebbtide.io/gang-minimum"
    """Annotation giving the fewest pods a gang-scheduled workload can run with."""
    progress_annotation: str = "ebbtide.io/progress"
    """Annotation with the job's progress (0..1), for the leastProgress victim key."""
    owner: Literal["others", "ebbtide"] = "others"
    """Who resizes a training workload that a HorizontalPodAutoscaler or KEDA ScaledObject
    also targets: ``others`` (Ebbtide refuses, with an Event) or ``ebbtide``."""


class MigSpec(_Model):
    enabled: bool = True
    """Turn MIG conversion and revert on or off."""
    from_pool: str
    """Whole-card pool that idle nodes are converted out of."""
    to_pool: str
    """MIG pool converted nodes join."""
    convert_below: Percent
    """Convert only while the whole-card pool's mean utilization is below this..."""
    convert_after: PositiveDuration
    """...for this long, and only nodes idle for this whole period."""
    node_idle_below: Percent = 0.05
    """A node is idle when every GPU on it stays at or below this utilization."""
    max_concurrent: Annotated[int, Field(ge=1)] = 1
    """Most nodes converting (or reverting) at the same time."""
    min_whole_nodes: Annotated[int, Field(ge=0)] = 0
    """Always keep at least this many nodes in the whole-card pool."""
    profiles: Annotated[
        dict[
            Annotated[str, Field(min_length=1)],
            _ConfigName | Annotated[list[_ConfigName], Field(min_length=1)],
        ],
        Field(min_length=1),
    ]
    """Target MIG config (mig-parted name) per GPU model, e.g. ``A100-80GB: all-1g.10gb``, or
    several in order of preference (``[all-1g.10gb, all-balanced]``): a conversion then takes
    the one that covers most of the pending MIG demand."""
    configs: dict[_ConfigName, dict[_MigProfile, Annotated[int, Field(ge=1, le=7)]]] = {}
    """Named mig-parted configs beyond ``all-<profile>``, with their instances per GPU, e.g.
    ``all-balanced: {1g.10gb: 2, 2g.20gb: 1, 3g.40gb: 1}`` (the names the MIG manager's config
    file defines)."""
    revert_after: PositiveDuration
    """Revert a MIG node when pending pods have demanded whole GPUs this long."""
    stuck_after: PositiveDuration = 900.0
    """A conversion not visible in the snapshot after this long stops counting as in flight."""

    def layouts_for(self, gpu_model: str) -> list[str]:
        """The configs a GPU model may be converted to, in order of preference."""
        named = self.profiles.get(gpu_model)
        return [] if named is None else [named] if isinstance(named, str) else list(named)

    @model_validator(mode="after")
    def _known_configs(self) -> MigSpec:
        errors: list[str] = []
        for model in sorted(self.profiles):
            for name in self.layouts_for(model):
                if name not in self.configs and not _ALL_PROFILE_RE.match(name):
                    errors.append(
                        f"profiles.{model}: {name!r} is neither all-<profile> nor in configs"
                    )
        for name, slices in sorted(self.configs.items()):
            used = sum(int(p.split("g.", 1)[0]) * n for p, n in slices.items())
            if not slices or used > 7:
                errors.append(f"configs.{name}: uses {used} of a GPU's 7 compute slices")
        if errors:
            raise ValueError("; ".join(errors))
        return self


class Budget(_Model):
    max: Annotated[int, Field(ge=0)]
    """At most this many actions..."""
    per: PositiveDuration
    """...in any sliding window this long."""


class BudgetsSpec(_Model):
    evictions: Budget = Budget.model_validate({"max": 10, "per": "10m"})
    """Pod evictions."""
    scale_steps: Budget = Budget.model_validate({"max": 30, "per": "10m"})
    """Scale decisions (inference up, training shrink or grow)."""
    mig_conversions: Budget = Budget.model_validate({"max": 2, "per": "1h"})
    """MIG conversions and reverts together."""


class CooldownsSpec(_Model):
    service: Duration = 120.0
    """Quiet time for a service after an action taken for it."""
    training_grow: Duration = 300.0
    """Quiet time before training grows after any shrink, eviction or grow."""


class PolicySpec(_Model):
    dry_run: bool = False
    """Decide and explain, but mark every decision dry-run: actuators write nothing."""
    kill_switch: bool = False
    """Stop deciding altogether; windows and SLO states keep updating."""
    protected_namespaces: list[_Name] = ["kube-system"]
    """Pods in these namespaces are never disrupted."""
    pools: dict[_Name, PoolSpec]
    """GPU node pools by name."""
    services: dict[_Name, ServiceSpec] = {}
    """Inference services and their SLOs, by service name."""
    training: TrainingSpec | None = None
    """Which workloads are offline training, and how they yield GPUs."""
    mig: MigSpec | None = None
    """When idle whole-card nodes become MIG nodes, and back."""
    budgets: BudgetsSpec = BudgetsSpec()
    """Most disruptive actions per sliding window."""
    cooldowns: CooldownsSpec = CooldownsSpec()
    """Quiet times after actions."""


class Problem(BaseModel):
    """One thing wrong with a policy that pydantic alone cannot see."""

    model_config = ConfigDict(frozen=True)
    loc: Loc
    message: str


class Policy(_Model):
    api_version: Literal["ebbtide.io/v1alpha1"]
    """Always ebbtide.io/v1alpha1."""
    kind: Literal["Policy"]
    """Always Policy."""
    metadata: Metadata
    spec: PolicySpec

    def sha256(self) -> str:
        """sha256 of the canonical policy (its JSON by alias): equal for equal policies,
        whatever the YAML layout, comments or file split."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=False)
        for svc in data["spec"]["services"].values():
            # keys added later, at their defaults: out, so a policy that does not use them
            # keeps the digest it had before they existed (logs, metrics, the decisions log)
            if not svc["objectives"]:
                del svc["objectives"]
            scale = svc["scale"]
            for key in ("signals", "workBound"):
                if scale is not None and scale[key] is None:
                    del scale[key]
        canonical = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def digest(self) -> str:
        """The first 16 hex digits of :meth:`sha256`: how logs, metrics and reports name the
        active policy."""
        return self.sha256()[:16]

    def problems(self) -> list[Problem]:
        """Cross-reference errors (undefined pools, mis-kinded MIG pools, duplicate services)."""
        spec = self.spec
        out: list[Problem] = []

        def pool_ref(loc: Loc, name: str, kind: str | None = None) -> None:
            if name not in spec.pools:
                known = ", ".join(sorted(spec.pools)) or "none"
                out.append(Problem(loc=loc, message=f"undefined pool {name!r} (pools: {known})"))
            elif kind is not None and spec.pools[name].kind != kind:
                out.append(Problem(loc=loc, message=f"pool {name!r} must be of kind {kind}"))

        seen: dict[str, str] = {}
        for name in sorted(spec.services):
            svc = spec.services[name]
            pool_ref(("spec", "services", name, "pool"), svc.pool)
            pairs = {(svc.slo.metric, svc.slo.percentile)}
            for i, obj in enumerate(svc.objectives):
                pair = (obj.metric, obj.percentile)
                if pair in pairs:
                    out.append(
                        Problem(
                            loc=("spec", "services", name, "objectives", i),
                            message=f"a second objective on the P{obj.percentile:g} "
                            f"{obj.metric}: give each metric and percentile one objective",
                        )
                    )
                pairs.add(pair)
            key = f"{svc.namespace}/{name}"
            if key in seen:
                out.append(Problem(loc=("spec", "services", name), message=f"duplicate {key}"))
            seen[key] = name
        if spec.training is not None:
            for i, pool in enumerate(spec.training.pools):
                pool_ref(("spec", "training", "pools", i), pool)
        if spec.mig is not None:
            pool_ref(("spec", "mig", "fromPool"), spec.mig.from_pool, "whole")
            pool_ref(("spec", "mig", "toPool"), spec.mig.to_pool, "mig")
        return out

    def service_key(self, name: str) -> str:
        """``namespace/name`` of a service, as events key it."""
        return f"{self.spec.services[name].namespace}/{name}"


def format_loc(loc: Loc) -> str:
    """``("spec", "training", "pools", 0)`` → ``spec.training.pools[0]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def policy_json_schema() -> dict[str, Any]:
    """JSON Schema (2020-12) of the policy file, by alias, for editors. Defaults are written
    as a policy file writes them (``30s``, ``90%``), not as the model holds them (``30.0``,
    ``0.9``): an editor inserts them as they are, and the validator must accept them."""
    schema = Policy.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, Any] = schema.get("$defs", {})
    for node in [schema, *defs.values()]:
        for prop in node.get("properties", {}).values():
            if "default" in prop:
                prop["default"] = _as_written(prop["default"], prop, defs)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://ebbtide.io/schemas/policy.v1alpha1.json"
    schema["title"] = "Ebbtide policy"
    return schema


def _as_written(value: Any, prop: dict[str, Any], defs: dict[str, Any]) -> Any:
    """``value`` (a default as the model holds it) as the policy file spells it, following
    ``prop``'s ``$ref`` into nested objects (budgets, cooldowns)."""
    if "$ref" in prop:
        prop = defs[prop["$ref"].rsplit("/", 1)[1]]
    if isinstance(value, dict):
        props = prop.get("properties", {})
        return {k: _as_written(v, props.get(k, {}), defs) for k, v in value.items()}
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if prop.get("pattern") == _DURATION_RE.pattern:
        return format_duration(value)
    if prop.get("pattern") == _PERCENT_PATTERN:
        return format_percent(value)
    return value

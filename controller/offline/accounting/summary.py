"""What a replay measured: SLO attainment and breaches, GPU use, actions, events.

Definitions (the README and ``summary.json`` use exactly these):

* **Ticks.** The replay evaluates at ticks ``T_k = T_0 + k * dt`` of event time (``dt`` is
  ``--evaluate-every``; ``T_0`` is the first event's time rounded up to a multiple of ``dt``),
  each tick after every event at or before it was observed. Each tick stands for ``dt`` seconds.
* **Evaluated time** of a service: the ticks at which its window held at least ``minSamples``
  requests (the engine's level is not ``none``), times ``dt``.
* **Within objective** at a tick: the window's percentile (the element of rank
  ``floor(q (n - 1))`` of the window's ``n`` requests, computed exactly from the engine's
  exceedance counters) is at or below ``objectiveMs``.
* **attainment** = ticks within objective / evaluated ticks (``null`` when none was evaluated).
* **breach_seconds** = evaluated ticks above the objective, times ``dt``.
* **breaches**: maximal runs of consecutive ticks above the objective; ``start`` is the first
  such tick, ``end`` the first tick after the run (or the last tick + ``dt``), ``peak_ms`` the
  highest windowed percentile (sketch estimate, within the window's relative accuracy) read
  during the run, once per window slot (``resolution``). A tick without a verdict ends a
  run. Breaches are of the *windowed* percentile, as the engine sees it: a burst shows from
  its start (within one window slot) until it has left the window. At most ``MAX_BREACHES``
  are listed per service; ``breaches_total`` counts them all.
* **Pool utilization**: each GPU (or MIG instance) counts with the last utilization it reported
  (sample-and-hold); a pool's utilization at a tick is the mean over its devices that have
  reported; ``mean_util_pct`` is the mean over the ticks that had one. A node's devices are
  those of its current layout: a MIG conversion or revert drops the previous layout's
  (:mod:`controller.offline.accounting.poolmeter`, the meter simulate uses too).
* **GPUs by use** (from the simulated cluster's snapshot at each tick): ``inference`` — whole
  GPUs held by pods of a policy service's workload; ``training`` — whole GPUs held by any other
  pod; ``mig`` — GPUs of nodes partitioned (or being partitioned) into MIG; ``idle`` — the
  remaining whole GPUs. ``idle_gpu_seconds`` = idle GPUs summed over ticks, times ``dt``.
  Utilization comes from the recording and allocation from the simulation (the replay is open
  loop): they can disagree once actions changed the cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from controller.offline.accounting.timeline import Timeline
from policies.model import Policy

__all__ = [
    "MAX_BREACHES",
    "MODELLED",
    "MODELLED_FIT",
    "RECORDED",
    "Breach",
    "PoolAccount",
    "ServiceAccount",
    "Summary",
    "sample_reclaimable",
]

MAX_BREACHES: Final = 1000
#: Services the policy does not name whose latency events a summary counts.
MAX_STRANGERS: Final = 100
USES: Final = ("inference", "training", "idle", "mig", "reconfiguring")
ACTIONS: Final = ("evict", "scale", "mig_convert", "mig_revert")


@dataclass(slots=True)
class Breach:
    start: float
    end: float
    peak_ms: float | None


@dataclass(slots=True)
class ServiceAccount:
    """One service's SLO accounting over the replay."""

    key: str
    objective_ms: float
    percentile: float
    evaluated: int = 0
    within: int = 0
    breaches: list[Breach] = field(default_factory=list)
    breaches_total: int = 0
    _open: Breach | None = None

    def tick(self, now: float, level: str, quantile_ms: float | None) -> None:
        """Account the tick at ``now``; ``quantile_ms`` is only read when ``level`` is above."""
        if level == "none":
            self.close(now)
            return
        self.evaluated += 1
        if level != "above":
            self.within += 1
            self.close(now)
            return
        run = self._open
        if run is None:
            run = self._open = Breach(now, now, quantile_ms)
        elif quantile_ms is not None and (run.peak_ms is None or quantile_ms > run.peak_ms):
            run.peak_ms = quantile_ms

    def repeat(self, level: str, ticks: int) -> None:
        """``ticks`` more ticks at ``level`` after one :meth:`tick` at it, each accounted as
        :meth:`tick` would without a percentile: a replay accounts a quiet service's ticks (and
        a breach's between its peak reads) at once."""
        if level != "none":
            self.evaluated += ticks
            if level != "above":
                self.within += ticks

    def close(self, end: float) -> None:
        run = self._open
        if run is None:
            return
        run.end = end
        self._open = None
        self.breaches_total += 1
        if len(self.breaches) < MAX_BREACHES:
            self.breaches.append(run)

    @property
    def in_breach(self) -> bool:
        return self._open is not None

    def to_dict(self, dt: float) -> dict[str, Any]:
        return {
            "objective_ms": self.objective_ms,
            "percentile": self.percentile,
            "attainment": self.within / self.evaluated if self.evaluated else None,
            "evaluated_seconds": self.evaluated * dt,
            "breach_seconds": (self.evaluated - self.within) * dt,
            "breaches": [
                {"start": b.start, "end": b.end, "peak_ms": _round(b.peak_ms)}
                for b in self.breaches
            ],
            "breaches_total": self.breaches_total,
        }


@dataclass(slots=True)
class PoolAccount:
    """One pool's utilization and GPUs by use over the replay."""

    name: str
    kind: str
    util_ticks: int = 0
    util_sum: float = 0.0
    ticks: int = 0
    use_sum: Counter[str] = field(default_factory=Counter)
    reclaimable_gpu_s: float = 0.0
    """GPUs held but idle (:attr:`policies.engine.PoolStatus.reclaimable_gpus`), integrated
    from one sample per timeline bucket (:func:`sample_reclaimable`)."""

    def tick(self, util_pct: float | None, uses: dict[str, int]) -> None:
        self.tick_util(util_pct)
        self.hold_uses(uses, 1)

    def tick_util(self, util_pct: float | None) -> None:
        """One tick's utilization (its GPUs by use come through :meth:`hold_uses`)."""
        self.ticks += 1
        if util_pct is not None:
            self.util_ticks += 1
            self.util_sum += util_pct

    def hold_uses(self, uses: dict[str, int], ticks: int) -> None:
        """The GPUs by use of ``ticks`` ticks that saw the same."""
        for use, n in uses.items():
            self.use_sum[use] += n * ticks

    def to_dict(self, dt: float) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "mean_util_pct": _round(self.util_sum / self.util_ticks if self.util_ticks else None),
            "idle_gpu_seconds": self.use_sum["idle"] * dt,
            "reclaimable_gpu_hours": round(self.reclaimable_gpu_s / 3600.0, 3),
            "gpu_seconds": {use: self.use_sum[use] * dt for use in USES},
            "mean_gpus": {
                use: _round(self.use_sum[use] / self.ticks if self.ticks else None) for use in USES
            },
        }


def sample_reclaimable(
    summary: Summary, timeline: Timeline, bucket: int, reclaimable: Mapping[str, int]
) -> None:
    """Record each pool's reclaimable GPUs (pool -> GPUs, from the engine's
    :meth:`~policies.engine.Engine.reclaimable`) on a sample tick
    (:meth:`Timeline.is_sample_tick`): the ``reclaim:<pool>`` series, and GPU-seconds as if the
    value held for the bucket's ticks. Once a bucket, not every tick: it reads every GPU's
    idleness, costly at 10,000 GPUs."""
    seconds = timeline.stride * summary.dt
    for name, gpus in reclaimable.items():
        account = summary.pools.get(name)
        if account is not None:
            timeline.add(f"reclaim:{name}", bucket, float(gpus))
            account.reclaimable_gpu_s += gpus * seconds


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


#: Replay is open loop: the latencies are the recording's whatever the policy decides, so its
#: attainment is the recorded one, the same for every policy.
RECORDED: Final = (
    "as recorded: replay is open loop, so attainment is what the recording shows whatever the "
    "policy decides (ebbtide simulate closes the loop)"
)
#: Simulate closes the loop: latencies come from a queueing model of the replicas it runs.
MODELLED: Final = (
    "modelled: a queueing model of the replicas the controller runs (closed loop, see "
    "controller/offline/models/queueing.py)"
)

#: Counterfactual replay closes the loop with a latency model fitted to the recording.
MODELLED_FIT: Final = (
    "modelled (fit): a queueing model fitted to this recording, driven by the replicas this "
    "policy runs (closed loop, see docs/replay.md); services whose fit is poor keep their "
    "recorded latencies (fit.<service>.modelled)"
)


@dataclass(slots=True)
class Summary:
    """Everything ``summary.json`` reports, accumulated during the replay."""

    policy: Policy
    policy_sha256: str
    dt: float
    services: dict[str, ServiceAccount]
    pools: dict[str, PoolAccount]
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    by_action_outcome: Counter[tuple[str, str]] = field(default_factory=Counter)
    first_tick: float | None = None
    last_tick: float | None = None
    ticks: int = 0
    engine: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    rejected_lines: list[tuple[int, str]] = field(default_factory=list)
    """The first rejected lines of the recording: ``(line number, "code: detail")``."""
    latency: str = RECORDED
    """Where the latencies attainment is computed from (:data:`RECORDED`, :data:`MODELLED` or
    :data:`MODELLED_FIT`)."""
    fit: dict[str, Any] | None = None
    """Per service, the fitted latency model and its validation (``--model fit`` only)."""
    latency_matched: int = 0
    """Latency events for a service of the policy: observed, late, or modelled instead."""
    strangers: Counter[str] = field(default_factory=Counter)
    """Latency events for services the policy does not name, by ``namespace/name`` (the first
    :data:`MAX_STRANGERS` such services)."""

    def not_in_policy(self, key: str) -> None:
        """Count a latency event for ``key``, a service the policy does not name."""
        if key in self.strangers or len(self.strangers) < MAX_STRANGERS:
            self.strangers[key] += 1

    def nothing_replayed(self) -> str | None:
        """Why this replay replayed nothing, or ``None`` when it replayed something: every
        event rejected (counted by reason, with the first rejected line), or latency events
        only for services the policy does not name (both sides named). A replay of
        utilization alone is a replay: it drives the pools' decisions."""
        if not self.accepted:
            if not self.rejected:
                return "the recording holds no event"
            reasons = ", ".join(f"{code} {n}" for code, n in self.rejected.most_common())
            first = f"; first: line {self.rejected_lines[0][0]}: {self.rejected_lines[0][1][:120]}"
            return f"all {sum(self.rejected.values())} events were rejected ({reasons})" + (
                first if self.rejected_lines else ""
            )
        if self.strangers and not self.latency_matched:
            seen = ", ".join(f"{key} ({n} events)" for key, n in self.strangers.most_common(5))
            more = len(self.strangers) - 5
            ours = ", ".join(self.services) or "no service"
            return (
                f"no latency event is for a service of the policy: the recording has {seen}"
                + (f" and {more} more services" if more > 0 else "")
                + f"; the policy names {ours}"
            )
        return None

    @classmethod
    def for_policy(cls, policy: Policy, sha256: str, dt: float) -> Summary:
        spec = policy.spec
        services = {
            f"{s.namespace}/{name}": ServiceAccount(
                f"{s.namespace}/{name}", s.slo.objective_ms, s.slo.percentile
            )
            for name, s in sorted(spec.services.items())
        }
        pools = {name: PoolAccount(name, p.kind) for name, p in sorted(spec.pools.items())}
        return cls(policy, sha256, dt, services, pools)

    def action(self, action: str, outcome: str) -> None:
        self.actions[action] += 1
        self.outcomes[outcome] += 1
        self.by_action_outcome[action, outcome] += 1

    def to_dict(self) -> dict[str, Any]:
        dt = self.dt
        total_rejected = sum(self.rejected.values())
        by_action: dict[str, dict[str, int]] = {}
        for (action, outcome), n in sorted(self.by_action_outcome.items()):
            by_action.setdefault(action, {})[outcome] = n
        return {
            "policy": {
                "name": self.policy.metadata.name,
                "sha256": self.policy_sha256,
                "digest": self.policy.digest(),
            },
            "events": {
                "total": self.accepted + total_rejected,
                "accepted": self.accepted,
                "rejected": total_rejected,
                "rejected_by_code": dict(sorted(self.rejected.items())),
                "rejected_lines": [{"line": n, "reason": r} for n, r in self.rejected_lines],
                "services_not_in_policy": dict(sorted(self.strangers.items())),
                "engine": dict(sorted(self.engine.items())),
            },
            "time": {
                "start": self.first_tick,
                "end": self.last_tick + dt if self.last_tick is not None else None,
                "evaluate_every_s": dt,
                "ticks": self.ticks,
            },
            "slo": {key: acc.to_dict(dt) for key, acc in self.services.items()},
            "latency": self.latency,
            "actions": {
                "total": sum(self.actions.values()),
                "by_type": {a: self.actions[a] for a in ACTIONS},
                "by_outcome": dict(sorted(self.outcomes.items())),
                "by_type_and_outcome": by_action,
            },
            "pools": {name: acc.to_dict(dt) for name, acc in self.pools.items()},
            "inventory": list(self.notes),
        } | ({} if self.fit is None else {"fit": self.fit})

"""Log lines a person can follow: one event each time something changes state.

The controller's decisions are logged one by one, but the states behind them (is a service
breaching? may this replica act? is a budget spent?) were visible only as metrics. Once per
evaluation :class:`Transitions` compares what the engine and the runtime say now with what they
said last time and logs one event per change:

* ``slo.state_changed`` (``service``, ``from``, ``to``, the percentile against its objective);
* ``leadership.gained`` / ``leadership.lost``: whether this replica may actuate
  (:meth:`~controller.loop.port.ClusterRuntime.is_leader`, which also turns false when a lease
  renewal lapses without the election noticing, unlike the elector's own ``leader.changed``);
* ``budget.exhausted`` / ``budget.restored``: a budget's window has nothing left, and later has;
* ``latency.work_bound`` / ``latency.queueing``: added replicas did not move a service's
  percentile (``scale.workBound``), so its load signals size it; later its latency moves with
  the load again. These two are also returned as :class:`~controller.loop.port.Notice` s, which
  the process raises as Kubernetes Events on the service's workload (``LatencyNotScaling``, a
  Warning, and ``LatencyScaling``): ``kubectl describe`` shows why the service stopped
  climbing where the HPA shows ``ScalingLimited``.

Policy reloads are logged where they happen (``policy.reloaded`` / ``policy.rejected`` in
:mod:`controller.process.app`). The first look records the starting state and logs only what
is not the quiet default (a service already breaching, a replica leading, a budget spent, as
a restart that read the decisions log back can find them), so a restart does not log every
service as a transition.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from controller.loop.port import Notice
from policies.engine import Engine
from policies.snapshot import Snapshot

__all__ = ["Transitions"]

log = structlog.get_logger("ebbtide")


class Transitions:
    """Remembers the last states seen and logs each change (see the module docstring)."""

    def __init__(self, engine: Callable[[], Engine], is_leader: Callable[[], bool]) -> None:
        self._engine = engine
        self._is_leader = is_leader
        self._slo: dict[str, str] = {}
        self._leading = False
        self._exhausted: set[str] = set()
        self._work_bound: set[str] = set()

    def check(self, now: float, snapshot: Snapshot | None = None) -> list[Notice]:
        """Compare with the last look; log one event per change. Returns the changes to raise
        as Events on a workload (its kind from ``snapshot``, else ``Deployment``)."""
        engine = self._engine()
        policy = engine.policy
        seen: dict[str, str] = {}
        for name, spec in sorted(policy.spec.services.items()):
            key = policy.service_key(name)
            state = seen[key] = engine.slo_state(key).state
            before = self._slo.get(key, "ok")
            if state != before:  # the percentile is merged only then: this runs every tick
                log.info(
                    "slo.state_changed",
                    service=key,
                    **{"from": before, "to": state},
                    percentile=spec.slo.percentile,
                    quantile_ms=_ms(engine.quantile(key, now)),
                    objective_ms=spec.slo.objective_ms,
                )
        self._slo = seen  # a service a reload removed is forgotten
        notices: list[Notice] = []

        def notice(key: str, reason: str, message: str, *, warning: bool) -> None:
            # rare (a state change): the workload and its kind are looked up only then
            for name, spec in policy.spec.services.items():
                if policy.service_key(name) == key:
                    ns, wl = spec.namespace, spec.workload or name
                    kind = next(
                        (
                            w.kind
                            for w in (snapshot.workloads if snapshot else ())
                            if (w.namespace, w.name) == (ns, wl)
                        ),
                        "Deployment",
                    )
                    notices.append(Notice(f"{ns}/{wl}", kind, reason, message, warning))

        bound = {key: why for key, why in engine.work_bound().items() if why is not None}
        for key in sorted(bound.keys() - self._work_bound):
            hint = "latency no longer scales the service up; its load signals size it"
            log.warning("latency.work_bound", service=key, evidence=bound[key], hint=hint)
            notice(key, "LatencyNotScaling", f"{bound[key]}; {hint}", warning=True)
        for key in sorted(self._work_bound - bound.keys()):
            log.info("latency.queueing", service=key, hint="its latency scales it again")
            notice(key, "LatencyScaling", "latency moves with the load again", warning=False)
        self._work_bound = set(bound)
        leading = self._is_leader()
        if leading != self._leading:
            if leading:
                log.info("leadership.gained", hint="this replica now carries decisions out")
            else:
                log.warning("leadership.lost", hint="decisions are refused until it leads again")
            self._leading = leading
        for budget in engine.budget_states(now):
            spent = budget.remaining <= 0
            if spent and budget.name not in self._exhausted:
                self._exhausted.add(budget.name)
                log.warning(
                    "budget.exhausted",
                    budget=budget.name,
                    max=budget.max,
                    per_s=budget.per_s,
                    hint="actions it counts are refused until the window slides",
                )
            elif not spent and budget.name in self._exhausted:
                self._exhausted.discard(budget.name)
                log.info(
                    "budget.restored",
                    budget=budget.name,
                    remaining=budget.remaining,
                    max=budget.max,
                )
        return notices


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)

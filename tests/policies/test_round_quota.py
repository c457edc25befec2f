"""A namespace's GPU quota is shared by the decisions of one evaluation round: what a grow or a
scale-up adds is charged before the next one, so two of them never both take its last GPU
(issue 21, item 14)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
from policy_fixtures import BASE, T0, latency, make_policy, training

from policies.decisions import Scale
from policies.engine import Engine
from policies.snapshot import SnapshotBuilder

POOL_A = {"ebbtide.io/pool": "a"}
POOL_B = {"ebbtide.io/pool": "b"}
GROW_AFTER_S = 60.0


def service(name: str, namespace: str) -> dict[str, object]:
    """The fixtures' chat service, renamed, in ``namespace`` and pool ``a``."""
    svc = copy.deepcopy(BASE["spec"]["services"]["chat"])
    svc.update(namespace=namespace, pool="a")
    return {name: svc}


@dataclass(frozen=True)
class Case:
    services: dict[str, str]
    """Service name → namespace: each one replica on ``a0``, breaching in the last round."""
    jobs: dict[str, tuple[str, str]]
    """Training workload name → (namespace, node): two replicas, may grow to four."""
    quotas: dict[str, int]
    """Namespace → GPUs its quota has left."""
    want: set[tuple[str, int, int]]
    """The scale decisions of the last round: (target, from, to)."""


CASES = [
    pytest.param(
        Case(
            services={},
            jobs={"one": ("ml", "a1"), "two": ("ml", "b0")},
            quotas={"ml": 1},
            want={("ml/one", 2, 3)},
        ),
        id="two-pools-grow-into-one-namespace-with-one-gpu-left:-one-grows",
    ),
    pytest.param(
        Case(
            services={},
            jobs={"one": ("ml", "a1"), "two": ("research", "b0")},
            quotas={"ml": 1, "research": 1},
            want={("ml/one", 2, 3), ("research/two", 2, 3)},
        ),
        id="two-pools-two-namespaces-with-a-gpu-each:-both-grow",
    ),
    pytest.param(
        Case(
            services={"chat": "serving"},
            jobs={"batch": ("serving", "b0")},
            quotas={"serving": 1},
            want={("serving/chat", 1, 2)},
        ),
        id="a-scale-up-takes-the-last-gpu-the-grow-of-its-namespace-gets-none",
    ),
    pytest.param(
        Case(
            services={"chat": "serving", "chat2": "serving"},
            jobs={},
            quotas={"serving": 1},
            want={("serving/chat", 1, 2)},
        ),
        id="two-scale-ups-in-one-namespace-with-one-gpu-left:-one-scales",
    ),
]


def slow(engine: Engine, case: Case, start: float, end: float) -> None:
    """20 requests a second at 5x every service's 100 ms objective over ``[start, end)``."""
    for t in range(int(start), int(end)):
        engine.advance(t + 1)  # events newer than the engine's clock are not counted yet
        for name, ns in case.services.items():
            for k in range(20):
                engine.observe(latency(t + k / 20, 500.0, service=name, ns=ns))


def last_round(case: Case) -> list[Scale]:
    """Evaluate at T0 (the pools' GPUs go free), once while the services' latency is over
    the objective, and when the grow is due and the services breach: that round's scales."""
    b = SnapshotBuilder()
    for node, labels in (("a0", POOL_A), ("a1", POOL_A), ("b0", POOL_B)):
        b.node(node, gpus=8, labels=labels)
    for name, ns in case.services.items():
        b.workload(ns, name, replicas=1, nodes=["a0"])
    for name, (ns, node) in case.jobs.items():
        training(b, name, replicas=2, nodes=[node], max_replicas=4, namespace=ns)
    for ns, left in case.quotas.items():
        b.quota(ns, hard=10, used=10 - left)
    snap = b.build()
    services: dict[str, object] = {}
    for name, ns in case.services.items():
        services |= service(name, ns)
    pools = {
        "a": {"nodeSelector": POOL_A, "kind": "whole"},
        "b": {"nodeSelector": POOL_B, "kind": "whole"},
    }
    engine = Engine(make_policy(pools=pools, services=services, mig=None))
    assert engine.evaluate(T0, snap) == []
    breach_at, due = T0 + GROW_AFTER_S - 15, T0 + GROW_AFTER_S + 1
    slow(engine, case, breach_at - 20, breach_at)
    assert engine.evaluate(breach_at, snap) == []  # over the objective: breaching in 10 s
    slow(engine, case, breach_at, due)
    decisions = engine.evaluate(due, snap)
    return [d for d in decisions if isinstance(d, Scale)]


@pytest.mark.parametrize("case", CASES)
def test_one_round_charges_the_namespace_quota_before_the_next_grow(case: Case) -> None:
    """The decisions of one round together stay within each namespace's GPU quota."""
    got = {(d.target, d.from_replicas, d.to_replicas) for d in last_round(case)}
    assert got == case.want

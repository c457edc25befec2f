"""Required node affinity as kube-scheduler matches it (kubernetes
``staging/src/k8s.io/component-helpers/scheduling/corev1/nodeaffinity/nodeaffinity.go`` and
``apimachinery/pkg/labels/selector.go``), and what the engine does with it: no training evicted
on a node the replica can never use, nothing preempted for affinity it cannot read."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from policy_fixtures import BASE, T0, TRAINING, WHOLE, make_policy, run

from controller.kube.translate import placement_from
from controller.simcluster.nodeindex import NodeIndex, NodeRec
from policies.decisions import Evict, Scale
from policies.engine import Engine
from policies.nodeaffinity import NodeAffinity, UnknownAffinity
from policies.placement import admits
from policies.snapshot import Placement, Pod, SnapshotBuilder

PRODUCT = "nvidia.com/gpu.product"


def term(*exprs: dict[str, Any], fields: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """One nodeSelectorTerm with these matchExpressions (and matchFields)."""
    out: dict[str, Any] = {"matchExpressions": list(exprs)}
    if fields:
        out["matchFields"] = list(fields)
    return out


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": op}
    if values:
        out["values"] = list(values)
    return out


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelectorTerms": list(terms)}


def affinity_spec(*terms: dict[str, Any]) -> dict[str, Any]:
    """A pod spec whose required node affinity has these terms."""
    return {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required(*terms)}
        }
    }


H100_OR_H200 = term(expr(PRODUCT, "In", "H100", "H200"))


@pytest.mark.parametrize(
    ("selector", "labels", "name", "want"),
    [
        pytest.param(required(H100_OR_H200), {PRODUCT: "H200"}, "n", True, id="in-second-value"),
        pytest.param(required(H100_OR_H200), {PRODUCT: "A100"}, "n", False, id="in-other-value"),
        pytest.param(required(H100_OR_H200), {}, "n", False, id="in-label-missing"),
        pytest.param(
            required(term(expr(PRODUCT, "NotIn", "A100"))), {PRODUCT: "H100"}, "n", True, id="notin"
        ),
        pytest.param(
            required(term(expr(PRODUCT, "NotIn", "A100"))),
            {PRODUCT: "A100"},
            "n",
            False,
            id="notin-listed",
        ),
        pytest.param(
            required(term(expr(PRODUCT, "NotIn", "A100"))), {}, "n", True, id="notin-label-missing"
        ),
        pytest.param(required(term(expr("gpu", "Exists"))), {"gpu": ""}, "n", True, id="exists"),
        pytest.param(required(term(expr("gpu", "Exists"))), {}, "n", False, id="exists-missing"),
        pytest.param(
            required(term(expr("spot", "DoesNotExist"))), {}, "n", True, id="does-not-exist"
        ),
        pytest.param(
            required(term(expr("spot", "DoesNotExist"))),
            {"spot": "true"},
            "n",
            False,
            id="does-not-exist-present",
        ),
        pytest.param(
            required(term(expr("mem", "Gt", "40"))), {"mem": "80"}, "n", True, id="gt-above"
        ),
        pytest.param(
            required(term(expr("mem", "Gt", "40"))), {"mem": "40"}, "n", False, id="gt-equal"
        ),
        pytest.param(
            required(term(expr("mem", "Gt", "40"))), {"mem": "80GB"}, "n", False, id="gt-not-int"
        ),
        pytest.param(required(term(expr("mem", "Gt", "40"))), {}, "n", False, id="gt-missing"),
        pytest.param(
            required(term(expr("mem", "Lt", "+40"))), {"mem": "-3"}, "n", True, id="lt-signed"
        ),
        pytest.param(
            required(term(expr("mem", "Lt", "40"))), {"mem": " 3"}, "n", False, id="lt-space"
        ),
        pytest.param(
            required(term(expr(PRODUCT, "In", "H100"), expr("zone", "In", "a"))),
            {PRODUCT: "H100", "zone": "b"},
            "n",
            False,
            id="one-term-is-anded",
        ),
        pytest.param(
            required(term(expr(PRODUCT, "In", "H100")), term(expr("zone", "In", "a"))),
            {PRODUCT: "A100", "zone": "a"},
            "n",
            True,
            id="terms-are-ored",
        ),
        pytest.param(
            required(term(), H100_OR_H200), {PRODUCT: "H100"}, "n", True, id="empty-term-skipped"
        ),
        pytest.param(required(term()), {PRODUCT: "H100"}, "n", False, id="only-empty-terms"),
        pytest.param(required(), {}, "n", False, id="no-terms"),
        pytest.param(
            required(term(fields=(expr("metadata.name", "In", "n1"),))),
            {},
            "n1",
            True,
            id="field-name-in",
        ),
        pytest.param(
            required(term(fields=(expr("metadata.name", "NotIn", "n1"),))),
            {},
            "n1",
            False,
            id="field-name-notin",
        ),
        pytest.param(
            required(
                term(
                    H100_OR_H200["matchExpressions"][0], fields=(expr("metadata.name", "In", "n2"),)
                )
            ),
            {PRODUCT: "H100"},
            "n1",
            False,
            id="fields-and-labels-anded",
        ),
    ],
)
def test_node_affinity_matches_as_kubernetes(
    selector: dict[str, Any], labels: dict[str, str], name: str, want: bool
) -> None:
    """Each operator, several terms and matchFields match as nodeaffinity.go and
    labels.Requirement.Matches decide."""
    before = copy.deepcopy(selector)
    assert NodeAffinity.parse(selector, where="r").matches(labels, name) is want
    assert selector == before  # input not mutated


@pytest.mark.parametrize(
    ("selector", "why"),
    [
        pytest.param(required(term(expr("k", "Near", "x"))), "operator 'Near'", id="operator"),
        pytest.param(required(term(expr("k", "In"))), "In without values", id="in-no-values"),
        pytest.param(
            required(term(expr("k", "Exists", "x"))), "Exists takes no values", id="exists-values"
        ),
        pytest.param(required(term(expr("k", "Gt", "1.5"))), "one integer value", id="gt-float"),
        pytest.param(required(term(expr("k", "Lt", "1", "2"))), "one integer value", id="lt-two"),
        pytest.param(
            required(term(fields=(expr("spec.unschedulable", "In", "true"),))),
            "field 'spec.unschedulable'",
            id="field-not-name",
        ),
        pytest.param(
            required(term(fields=(expr("metadata.name", "In", "a", "b"),))),
            "one value",
            id="field-two-values",
        ),
        pytest.param(
            required(term(fields=(expr("metadata.name", "Exists"),))),
            "operator 'Exists' on a field",
            id="field-exists",
        ),
    ],
)
def test_affinity_kubernetes_would_not_parse_is_unknown(selector: dict[str, Any], why: str) -> None:
    """What the apiserver would refuse is not guessed: one line saying where and why."""
    with pytest.raises(UnknownAffinity, match=why) as err:
        NodeAffinity.parse(selector, where="spec")
    assert str(err.value).startswith("spec.nodeSelectorTerms[0].")


def test_placement_from_keeps_rich_affinity_and_marks_unknown() -> None:
    """The kube translation keeps multi-value In (it used to be dropped, i.e. "anywhere") and
    marks a placement it cannot read unknown, which no node admits."""
    h100 = SnapshotBuilder().node("h", labels={PRODUCT: "H100"}).build().nodes[0]
    a100 = SnapshotBuilder().node("a", labels={PRODUCT: "A100"}).build().nodes[0]
    where = placement_from(affinity_spec(H100_OR_H200))
    assert (admits(h100, where), admits(a100, where)) == (True, False)
    odd = placement_from(affinity_spec(term(expr(PRODUCT, "Near", "H100"))))
    assert odd.unknown is not None
    assert "operator 'Near'" in odd.unknown
    assert not admits(h100, odd)


def test_simulated_scheduler_uses_the_same_fit_rule() -> None:
    """The simulated scheduler places a pod by the engine's rule: on the H200, never the
    emptier A100."""
    b = SnapshotBuilder().node("a", gpus=8, labels={PRODUCT: "A100"})
    nodes = b.node("h", gpus=8, labels={PRODUCT: "H200"}).build().nodes
    index = NodeIndex()
    for n in nodes:
        index.update(NodeRec.of(n))
    where = placement_from(affinity_spec(H100_OR_H200))
    pod = Pod("ml", "p", None, "Pending", 1, placement=where)
    rec = index.fit(pod, where)
    assert rec is not None
    assert rec.node.name == "h"


def _breach_cluster(where: Placement) -> SnapshotBuilder:
    """Pool ``whole``: an A100 node full of low-priority training and an H100 node full of
    more important training; chat (1 GPU a replica) runs outside the pool, placed by ``where``."""
    b = SnapshotBuilder()
    for name, product, prio in (("a0", "A100", 10), ("h0", "H100", 50)):
        b.node(name, gpus=8, labels={**WHOLE, PRODUCT: product})
        for i in range(8):
            b.pod("ml", f"{name}-t{i}", node=name, gpus=1, labels=TRAINING, priority=prio)
    b.node("s0", gpus=1, labels={PRODUCT: "H100"})
    b.workload("serving", "chat", replicas=1, gpus_per_replica=1, nodes=["s0"], placement=where)
    return b


def _first_decisions(where: Placement) -> list[Any]:
    chat = copy.deepcopy(BASE["spec"]["services"]["chat"])
    engine = Engine(make_policy(services={"chat": chat}, mig=None))
    ds: list[Any] = []
    for _, ds in run(engine, _breach_cluster(where).build(), T0, T0 + 12, 250.0):
        if ds:
            break
    return ds


def test_breach_evicts_training_only_where_the_replica_can_run() -> None:
    """Regression: chat pinned by ``gpu.product In [H100, H200]`` breaches; the A100's training
    is the cheapest victim but chat can never use that node. The translation used to read
    the affinity as "anywhere" and the engine evicted on the A100; now only on the H100."""
    ds = _first_decisions(placement_from(affinity_spec(H100_OR_H200)))
    evicted = [d.pod for d in ds if isinstance(d, Evict)]
    assert evicted
    assert all(p.startswith("ml/h0-") for p in evicted), evicted


def test_nothing_is_preempted_for_affinity_the_engine_cannot_read() -> None:
    """A breaching service whose affinity is unknown frees no GPUs; nothing is free, so it
    is not scaled either."""
    where = placement_from(affinity_spec(term(expr(PRODUCT, "Near", "H100"))))
    ds = [
        d
        for _, ds in run(
            Engine(make_policy(mig=None)), _breach_cluster(where).build(), T0, T0 + 40, 250.0
        )
        for d in ds
    ]
    assert not [d for d in ds if isinstance(d, Evict | Scale)]


def test_unknown_affinity_scales_into_free_gpus_and_says_why() -> None:
    """With free GPUs in the pool the service still scales into them, and the decision's
    explanation says why no training was freed."""
    where = placement_from(affinity_spec(term(expr(PRODUCT, "Near", "H100"))))
    b = _breach_cluster(where).node("f0", gpus=2, labels=WHOLE)
    ds = [
        d for _, ds in run(Engine(make_policy(mig=None)), b.build(), T0, T0 + 12, 250.0) for d in ds
    ]
    scales = [d for d in ds if isinstance(d, Scale)]
    assert not [d for d in ds if isinstance(d, Evict)]
    assert [d.to_replicas for d in scales] == [3]
    why = {a.option: a.why_not for a in scales[0].explanation.alternatives}
    assert "unknown" in why["free GPUs from training"]
    assert "operator 'Near'" in why["free GPUs from training"]

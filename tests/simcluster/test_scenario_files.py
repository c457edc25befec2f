"""Scenario files: the shipped example loads; invalid files give exact FILE:LINE:COL errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.simcluster import ScenarioLoadError, SimCluster, load_scenario, load_scenario_text
from policies.inventory import Inventory
from policies.loader import load_policy_text
from policies.placement import room
from policies.snapshot import GpuQuota, Taint, Toleration

REPO = Path(__file__).resolve().parents[2]

VALID = """\
apiVersion: ebbtide.io/v1alpha1
kind: Scenario
metadata: {name: t}
spec:
  seed: 1
  delays: {podStartup: 5s, migFailureProbability: 10%}
  pools:
    whole: {nodeSelector: {ebbtide.io/pool: whole}}
  priorityClasses: {low: 10}
  nodes:
    - {name: "w-{i}", count: 2, gpus: 4, labels: {ebbtide.io/pool: whole}}
  workloads:
    - name: train
      replicas: 3
      gpusPerReplica: 2
      pool: whole
      priorityClass: low
      elastic: {min: 1, max: 4}
  pods:
    - {name: solo, gpus: 1, node: w-1}
"""


def errors_of(text: str) -> list[str]:
    with pytest.raises(ScenarioLoadError) as info:
        load_scenario_text(text, "s.yaml")
    return [str(e) for e in info.value.errors]


def test_a_valid_scenario_loads_and_builds_a_cluster() -> None:
    """The format's pieces land where they should: groups, elastic annotations, delays, seed."""
    sc = load_scenario_text(VALID)
    snap = sc.to_snapshot()
    assert [n.name for n in snap.nodes] == ["w-0", "w-1"]
    wl = snap.workloads[0]
    assert dict(wl.annotations) == {"ebbtide.io/min-replicas": "1", "ebbtide.io/max-replicas": "4"}
    assert (wl.priority, wl.replicas) == (10, 3)
    assert {p.key: p.node for p in snap.pods} == {
        "default/solo": "w-1",
        "default/train-0": "w-1",  # best fit: the node with the fewest free GPUs
        "default/train-1": "w-0",
        "default/train-2": "w-0",
    }
    c = SimCluster.from_scenario(sc)
    assert (c.seed, c.delays.pod_startup_s, c.delays.mig_failure_probability) == (1, 5.0, 0.1)


def test_the_shipped_example_loads() -> None:
    """examples/scenario-small.yaml: 8 nodes, 2 pools, 2 services, 2 elastic jobs, all placed."""
    sc = load_scenario(REPO / "examples" / "scenario-small.yaml")
    c = SimCluster.from_scenario(sc)
    snap = c.snapshot()
    assert len(snap.nodes) == 8
    assert set(c.gpus_by_use()) == {"whole", "mig"}
    assert c.pending_pods() == ()
    elastic = [w for w in snap.workloads if "ebbtide.io/min-replicas" in w.annotations]
    assert len(elastic) == 2


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(
            "  seed: 1\n",
            "  seed: 1\n  sed: 2\n",
            ["s.yaml:6:3: spec.sed: unknown key (did you mean 'seed'?)"],
            id="unknown-key",
        ),
        pytest.param(
            "gpusPerReplica: 2",
            "gpusPerReplica: two",
            ["s.yaml:15:23: spec.workloads[0].gpusPerReplica: Input should be a valid integer"],
            id="wrong-type",
        ),
        pytest.param(
            "      pool: whole\n",
            "      pool: wholesale\n",
            ["s.yaml:16:13: spec.workloads[0].pool: undefined pool 'wholesale' (whole)"],
            id="undefined-pool",
        ),
        pytest.param(
            "podStartup: 5s",
            "podStartup: 5",
            [
                "s.yaml:6:24: spec.delays.podStartup: "
                "a duration is a string with a unit, e.g. 30s, 10m, 1h30m; got 5"
            ],
            id="bad-duration",
        ),
        pytest.param(
            "node: w-1}",
            "node: w-9}",
            ["s.yaml:20:35: spec.pods[0].node: undefined node 'w-9'"],
            id="undefined-node",
        ),
        pytest.param(
            '{name: "w-{i}", count: 2,',
            '{name: "w-{i}",',
            ["s.yaml:11:7: spec.nodes[0]: {i} in a name needs a count"],
            id="group-without-count",
        ),
        pytest.param(
            "priorityClass: low",
            "priorityClass: lowest",
            ["s.yaml:17:22: spec.workloads[0].priorityClass: undefined priority class 'lowest'"],
            id="undefined-priority-class",
        ),
    ],
)
def test_invalid_scenarios_are_reported_at_file_line_col(
    old: str, new: str, expected: list[str]
) -> None:
    """Each problem is placed at its key or value with the path and a clear message."""
    assert old in VALID
    assert errors_of(VALID.replace(old, new, 1)) == expected


def test_every_problem_is_reported_together() -> None:
    """Two unrelated mistakes give two errors in file order."""
    text = VALID.replace("kind: Scenario", "kind: Policy").replace("pool: whole", "pool: x")
    got = errors_of(text)
    assert len(got) == 2
    assert got[0].startswith("s.yaml:2:7: kind: ")


def test_an_unreadable_file_is_a_load_error(tmp_path: Path) -> None:
    """A missing file is a ScenarioLoadError naming it, not a traceback."""
    with pytest.raises(ScenarioLoadError, match=r"missing\.yaml:1:1: cannot read"):
        load_scenario(tmp_path / "missing.yaml")


def test_the_documented_example_is_valid() -> None:
    """The complete example in docs/scenarios.md loads and places every pod."""
    text = (REPO / "docs" / "scenarios.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    c = SimCluster.from_scenario(load_scenario_text(example, "docs/scenarios.md"))
    assert c.pending_pods() == ()
    assert c.gpus_by_use()["whole"].training == 40


TAINTED = """\
apiVersion: ebbtide.io/v1alpha1
kind: Scenario
metadata: {name: tainted}
spec:
  pools:
    whole: {nodeSelector: {ebbtide.io/pool: whole}}
  nodes:
    - {name: w-0, gpus: 4, labels: {ebbtide.io/pool: whole},
       taints: [{key: gpu, value: reserved, effect: NoSchedule}]}
    - {name: w-1, gpus: 1, labels: {ebbtide.io/pool: whole}}
  workloads:
    - {namespace: ml, name: train, replicas: 1, gpusPerReplica: 2, pool: whole,
       labels: {ebbtide.io/class: training}}
  pods:
    - {name: filler, gpus: 1, node: w-1}
"""


@pytest.mark.parametrize("tolerates", [False, True], ids=["taint-repels", "toleration-lands"])
def test_a_taint_no_pod_tolerates_leaves_room_nobody_can_use(tolerates: bool) -> None:
    """The pool has 4 GPUs free for a 2-GPU replica, all on the tainted w-0 (w-1 has one GPU):
    nothing fits, and the engine sees the pending pod as no demand (no node could ever take
    it); tolerating the taint it lands there."""
    text = TAINTED
    if tolerates:
        text = text.replace("labels: {ebbtide.io/class: training}}", (
            "labels: {ebbtide.io/class: training},\n"
            "       tolerations: [{key: gpu, operator: Exists}]}"))  # fmt: skip
    c = SimCluster.from_scenario(load_scenario_text(text, "t.yaml"))
    snap = c.snapshot()
    assert [n.taints for n in snap.nodes if n.name == "w-0"] == [(Taint("gpu", "reserved"),)]
    [train] = [p for p in snap.pods if p.workload == "ml/train"]
    policy = load_policy_text((REPO / "policies" / "library" / "balanced.yaml").read_text())
    inv = Inventory(snap, policy)
    if tolerates:
        assert train.node == "w-0"
        assert train.placement.tolerations == (Toleration("gpu", "Exists"),)
    else:
        assert train.node is None
        assert inv.free["whole"] == 4  # pool counts say enough
        assert room(inv.nodes.values(), inv.node_free, train.placement, gpus=2) == {}
        assert inv.unplaceable == [train]


def test_a_namespace_quota_holds_pods_back() -> None:
    """quotas: ml may hold 2 GPUs: the third replica is not created, and the snapshot shows
    the quota with its use."""
    text = TAINTED.replace("replicas: 1, gpusPerReplica: 2", "replicas: 3, gpusPerReplica: 1")
    text = text.replace("taints: [{key: gpu, value: reserved, effect: NoSchedule}]", "taints: []")
    text += "  quotas: {ml: {hard: 2}}\n"
    snap = SimCluster.from_scenario(load_scenario_text(text, "q.yaml")).snapshot()
    assert len([p for p in snap.pods if p.workload == "ml/train"]) == 2
    assert snap.quotas == (GpuQuota("ml", 2, 2),)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(
            "effect: NoSchedule",
            "effect: NoSchedul",
            "t.yaml:9:53: spec.nodes[0].taints[0].effect: Input should be 'NoSchedule', "
            "'PreferNoSchedule' or 'NoExecute'",
            id="bad-effect",
        ),
        pytest.param(
            "labels: {ebbtide.io/class: training}}",
            "labels: {ebbtide.io/class: training}, tolerations: [{value: x}]}",
            "t.yaml:13:60: spec.workloads[0].tolerations[0]: "
            "a toleration without a key needs operator: Exists",
            id="toleration-without-key",
        ),
        pytest.param(
            "  pods:\n",
            "  quotas: {ml: {hard: -1}}\n  pods:\n",
            "t.yaml:14:23: spec.quotas.ml.hard: Input should be greater than or equal to 0",
            id="negative-quota",
        ),
    ],
)
def test_taints_tolerations_and_quotas_are_validated(old: str, new: str, expected: str) -> None:
    assert old in TAINTED
    with pytest.raises(ScenarioLoadError) as info:
        load_scenario_text(TAINTED.replace(old, new, 1), "t.yaml")
    assert [str(e) for e in info.value.errors] == [expected]

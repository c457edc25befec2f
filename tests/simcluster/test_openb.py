"""The OpenB importer: exact output on a hand-written CSV pair, sane output on the real trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli.scenario_commands import scenario
from controller.simcluster import SimCluster, load_scenario, load_scenario_text
from controller.simcluster.openb import (
    OpenbError,
    build_document,
    from_openb,
    read_nodes,
    read_pods,
)

HERE = Path(__file__).resolve().parent
NODES = HERE / "fixtures" / "nodes.csv"
PODS = HERE / "fixtures" / "pods.csv"
TRACE = HERE.parents[2] / "shared" / "data" / "alibaba-openb-2023"
TRACE_NODES = TRACE / "openb_node_list_gpu_node.csv"
TRACE_PODS = TRACE / "openb_pod_list_default.csv"
POOL = {"ebbtide.io/pool": "whole"}


def node(name: str, gpus: int, model: str) -> dict[str, object]:
    return {"name": name, "gpus": gpus, "model": model, "labels": POOL}


def workload(ns: str, name: str, replicas: int, gpus: int, created: str, **extra: object) -> dict:  # type: ignore[type-arg]
    kind, cls = ("Deployment", "openb-ls") if ns == "serving" else ("Job", "openb-be")
    out: dict[str, object] = {
        "namespace": ns,
        "name": name,
        "kind": kind,
        "replicas": replicas,
        "gpusPerReplica": gpus,
        "pool": "whole",
        "priorityClass": cls,
        "created": created,
    }
    out.update(extra)
    return out


def test_fixture_pair_gives_the_exact_scenario() -> None:
    """At the peak (t=800): groups by shape, LS→services, BE→elastic jobs, others standalone."""
    doc, summary = build_document(read_nodes(NODES), read_pods(PODS))
    training = {"ebbtide.io/class": "training"}
    assert doc == {
        "apiVersion": "ebbtide.io/v1alpha1",
        "kind": "Scenario",
        "metadata": {"name": "openb", "description": "Alibaba OpenB GPU cluster at t=800s"},
        "spec": {
            "seed": 0,
            "pools": {"whole": {"nodeSelector": POOL, "kind": "whole"}},
            "priorityClasses": {
                "openb-guaranteed": 2000,
                "openb-ls": 1000,
                "openb-burstable": 500,
                "openb-be": 10,
            },
            "nodes": [
                node("node-a", 2, "P100-16GB"),
                node("node-b", 8, "V100-32GB"),
                node("node-c", 4, "T4-16GB"),
                node("node-d", 8, "G2"),
            ],
            "workloads": [
                workload(
                    "training", "be-000", 3, 1, "300s",
                    labels=training,
                    elastic={"min": 1, "max": 6},
                    annotations={"openb.alibaba.com/shape": "cpu=3000m memory=5600Mi gpu=1x810m"},
                    podAnnotations={"openb.alibaba.com/gpu-milli": "810"},
                ),
                workload(
                    "serving", "ls-000", 2, 1, "0s",
                    annotations={
                        "openb.alibaba.com/shape": "cpu=8000m memory=30000Mi gpu=1x1000m"
                    },
                ),
                workload(
                    "training", "be-001", 1, 2, "600s",
                    labels=training,
                    elastic={"min": 1, "max": 2},
                    annotations={
                        "openb.alibaba.com/shape": "cpu=16000m memory=64000Mi gpu=2x1000m"
                    },
                ),
                workload(
                    "serving", "ls-001", 1, 1, "200s",
                    annotations={"openb.alibaba.com/shape": "cpu=4000m memory=16000Mi gpu=1x470m"},
                    podAnnotations={"openb.alibaba.com/gpu-milli": "470"},
                ),
            ],
            "pods": [
                {
                    "namespace": "other",
                    "name": "pod-g-1",
                    "gpus": 1,
                    "pool": "whole",
                    "priorityClass": "openb-guaranteed",
                    "created": "700s",
                }
            ],
        },
    }  # fmt: skip
    assert str(summary) == (
        "openb: 4 nodes, 22 GPUs; pods alive at t=800s: 2 services (3 pods), "
        "2 training jobs (4 pods), 1 other pods; 9 GPUs requested"
    )


@pytest.mark.parametrize(
    ("at", "services", "jobs", "others"),
    [
        pytest.param(900, 2, 1, 2, id="t=900: be-4 gone, burstable pod born"),
        pytest.param(5000, 0, 0, 0, id="t=5000: all deleted"),
        pytest.param("all", 2, 2, 2, id="all: every scheduled GPU pod"),
    ],
)
def test_at_chooses_the_pods(at: int | str, services: int, jobs: int, others: int) -> None:
    """--at picks pods alive at T (creation <= T < deletion), or every scheduled one."""
    _, s = build_document(read_nodes(NODES), read_pods(PODS), at=at)  # type: ignore[arg-type]
    assert (s.services, s.training_jobs, s.other_pods) == (services, jobs, others)


def test_generated_file_loads_and_keeps_attribution() -> None:
    """The rendered text is a valid scenario with the trace's attribution in its header."""
    text, _ = from_openb(NODES, PODS, command="ebbtide scenario from-openb a b")
    assert text.startswith("# Derived from the Alibaba Cluster Trace Program")
    assert "# Generated by: ebbtide scenario from-openb a b\n" in text
    c = SimCluster.from_scenario(load_scenario_text(text))
    assert c.pending_pods() == ()
    assert c.gpus_by_use()["whole"].training == 5


def test_bad_rows_are_reported_with_file_and_line(tmp_path: Path) -> None:
    """A non-integer GPU count names the file, line and column."""
    bad = tmp_path / "nodes.csv"
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,eight,T4\n")
    with pytest.raises(OpenbError, match=r"nodes.csv:2: gpu: not an integer: 'eight'"):
        read_nodes(bad)
    bad.write_text("sn,gpu\nn1,2\n")
    with pytest.raises(OpenbError, match="missing columns: model"):
        read_nodes(bad)


def test_cli_writes_the_file_and_prints_a_summary(tmp_path: Path) -> None:
    """`scenario from-openb --out` writes a loadable file and summarises on stderr."""
    out = tmp_path / "s.yaml"
    result = CliRunner().invoke(
        scenario, ["from-openb", str(NODES), str(PODS), "--out", str(out), "--max-nodes", "2"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "openb: 2 nodes, 6 GPUs"  # node-a and node-c: evenly spaced in result.stderr
    assert len(load_scenario(out).spec.nodes) == 2
    bad = CliRunner().invoke(scenario, ["from-openb", str(NODES), str(PODS), "--at", "soon"])
    assert bad.exit_code == 2
    ok = CliRunner().invoke(scenario, ["validate", str(out)])
    assert ok.exit_code == 0
    assert "ok (2 nodes" in ok.stdout


@pytest.mark.skipif(not TRACE_PODS.exists(), reason="the OpenB trace is not in ../shared/data")
@pytest.mark.parametrize("at", ["peak", pytest.param("all", marks=pytest.mark.slow)])
def test_the_real_trace_gives_a_sane_scenario(at: str) -> None:
    """The full OpenB trace loads; node, GPU and pod counts match the data's README."""
    text, s = from_openb(TRACE_NODES, TRACE_PODS, at=at)  # type: ignore[arg-type]
    assert (s.nodes, s.gpus) == (1213, 6212)
    assert s.services > 0
    assert s.training_jobs > 0
    pods = s.service_pods + s.training_pods + s.other_pods
    assert 0 < pods <= 8152
    if at == "all":
        assert pods > 5000
    sc = load_scenario_text(text)
    assert sum(n.count or 1 for n in sc.spec.nodes) == 1213
    use = SimCluster.from_scenario(sc).gpus_by_use()["whole"]
    assert use.total == 6212
    assert use.inference > 0
    assert use.training > 0

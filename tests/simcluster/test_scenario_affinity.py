"""Scenario files express required node affinity as Kubernetes writes it; the simulated
scheduler and the engine read it with the same rule (policies.placement.admits)."""

from __future__ import annotations

import pytest

from controller.simcluster import ScenarioLoadError, SimCluster, load_scenario_text

PINNED = """\
apiVersion: ebbtide.io/v1alpha1
kind: Scenario
metadata: {name: pinned}
spec:
  pools:
    whole: {nodeSelector: {ebbtide.io/pool: whole}}
  nodes:
    - {name: a-0, gpus: 8, labels: {ebbtide.io/pool: whole, nvidia.com/gpu.product: A100}}
    - {name: h-0, gpus: 8, labels: {ebbtide.io/pool: whole, nvidia.com/gpu.product: H100}}
    - {name: b-0, gpus: 8, labels: {ebbtide.io/pool: whole, nvidia.com/gpu.product: H200,
                                    spot: "true"}}
  workloads:
    - name: chat
      replicas: 3
      pool: whole
      nodeAffinity:
        nodeSelectorTerms:
          - matchExpressions:
              - {key: nvidia.com/gpu.product, operator: In, values: [H100, H200]}
              - {key: spot, operator: DoesNotExist}
"""


def test_pods_land_only_where_their_affinity_allows() -> None:
    """Three replicas pinned to H100/H200 off spot nodes all go to h-0: never the A100, never
    the spot H200; and the engine's view of the placement carries the same affinity."""
    c = SimCluster.from_scenario(load_scenario_text(PINNED, "p.yaml"))
    snap = c.snapshot()
    assert {p.node for p in snap.pods} == {"h-0"}
    [chat] = snap.workloads
    assert str(chat.placement.affinity) == (
        "(nvidia.com/gpu.product In [H100, H200] and spot DoesNotExist)"
    )


def test_affinity_the_apiserver_would_refuse_is_an_error() -> None:
    """``In`` without values is reported at its place in the file, as a schema error is."""
    text = PINNED.replace("operator: In, values: [H100, H200]", "operator: In")
    with pytest.raises(ScenarioLoadError) as info:
        load_scenario_text(text, "p.yaml")
    [error] = [str(e) for e in info.value.errors]
    assert error.startswith("p.yaml:")
    assert "spec.workloads[0].nodeAffinity" in error
    assert "In without values" in error

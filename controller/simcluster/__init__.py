"""The simulated cluster: scenario files, a deterministic cluster behind the cluster port, and
the Alibaba OpenB importer.

``load_scenario(path)`` reads a scenario file; ``SimCluster.from_scenario(scenario)`` builds the
cluster; a replay or simulation then alternates ``advance(now)``, ``snapshot()`` and
``await apply(decisions)``.
"""

from controller.simcluster.scenario import (
    Scenario,
    ScenarioLoadError,
    build_cluster,
    check_scenario,
    load_scenario,
    load_scenario_text,
)
from controller.simcluster.simulator import SimCluster
from controller.simcluster.values import (
    DEFAULT_TRAINING_SELECTOR,
    EPOCH,
    UNPOOLED,
    Effect,
    EffectKind,
    GpuUse,
    PodTemplate,
    SimDelays,
)

__all__ = [
    "DEFAULT_TRAINING_SELECTOR",
    "EPOCH",
    "UNPOOLED",
    "Effect",
    "EffectKind",
    "GpuUse",
    "PodTemplate",
    "Scenario",
    "ScenarioLoadError",
    "SimCluster",
    "SimDelays",
    "build_cluster",
    "check_scenario",
    "load_scenario",
    "load_scenario_text",
]

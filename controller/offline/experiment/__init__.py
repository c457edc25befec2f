"""Closed-loop simulation: ``ebbtide simulate``.

A load generator (:mod:`.load`) offers requests to the policy's inference services; a queueing
model (:mod:`.latency`) turns load and the replicas Running in the simulated cluster into request
latencies; :mod:`.telemetry` turns what runs on each GPU into utilization readings; the events go
to a controller — Ebbtide's engine (events late by :class:`EventLag`), or a peer from
:mod:`.peers` / :mod:`.baselines` — whose decisions change the simulated cluster and so the next
latencies (:mod:`.closedloop`); an independent meter measures attainment. The outputs are
replay's, plus per run the figures of :mod:`.figures` (training goodput: :mod:`.goodput`) and,
for a comparison, the Pareto marks of :mod:`.pareto`.
"""

from controller.offline.experiment.baselines import PollingAutoscaler, StaticPlan, static_partition
from controller.offline.experiment.closedloop import (
    CONTROLLERS,
    FAIR,
    Bench,
    EventLag,
    Run,
    RunSpec,
    SimulateSettings,
    run_controller,
)
from controller.offline.experiment.figures import RunFigures
from controller.offline.experiment.goodput import Goodput, lost_work
from controller.offline.experiment.load import (
    AzureTrace,
    Burst,
    Diurnal,
    LoadShape,
    parse_burst,
    poisson,
)
from controller.offline.models.queueing import (
    ServiceModel,
    ServiceQueue,
    default_model,
    latency_samples,
)

__all__ = [
    "CONTROLLERS",
    "FAIR",
    "AzureTrace",
    "Bench",
    "Burst",
    "Diurnal",
    "EventLag",
    "Goodput",
    "LoadShape",
    "PollingAutoscaler",
    "Run",
    "RunFigures",
    "RunSpec",
    "ServiceModel",
    "ServiceQueue",
    "SimulateSettings",
    "StaticPlan",
    "default_model",
    "latency_samples",
    "lost_work",
    "parse_burst",
    "poisson",
    "run_controller",
    "static_partition",
]

"""Counterfactual replay closes the loop: the policy's replicas change the latencies it sees."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from replay_builders import (
    POLICY,
    T0,
    burst_rate,
    chat_events,
    one_node_cluster,
    policy,
    queue_chat_events,
    write_recording,
)

from controller.offline.accounting.summary import MODELLED_FIT
from controller.offline.models.fit import Fit, LatencyFit, fit_service
from controller.offline.replay.counterfactual import (
    FitRecorder,
    ModelledLatency,
    _tick_of,
    counterfactual_replay,
)
from controller.offline.replay.replayer import ReplaySettings, Withheld, replay
from controller.simcluster import SimCluster
from policies.model import Policy
from streams.events import InferenceLatency, LatencyHistogram

FIXED = policy(POLICY.replace("replicas: {min: 1, max: 8}", "replicas: {min: 2, max: 2}"))
SCALING = policy(POLICY.replace("replicas: {min: 1, max: 8}", "replicas: {min: 2, max: 8}"))


def cluster(p: Policy) -> Callable[[float], SimCluster]:
    """Node ``n0`` (8 GPUs) running two replicas of ``serving/chat``."""
    return lambda start: one_node_cluster(start, replicas=2, of=p)


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 minutes of chat served by two replicas that never scaled: a burst to 0.9 of their
    capacity breaches the 100 ms objective."""
    path = tmp_path_factory.mktemp("cf") / "burst.jsonl"
    return write_recording(path, queue_chat_events(40, rate=burst_rate))


def attainment(summary: dict[str, object]) -> float:
    value = summary["slo"]["serving/chat"]["attainment"]  # type: ignore[index]
    assert isinstance(value, float)
    return value


@pytest.mark.slow
def test_a_policy_that_scales_up_attains_more_than_one_that_never_does(
    recording: Path, tmp_path: Path
) -> None:
    """Open loop both policies attain the recorded figure; counterfactually the one that scales
    chat up during the burst attains more than the one that cannot, and the one that cannot
    (what the recording did) stays near the recorded figure: the modelled latencies follow the
    replicas this run has."""
    settings = ReplaySettings()
    opened = {
        name: attainment(
            replay(
                recording,
                policy=p,
                cluster=cluster(p),
                out_dir=tmp_path / f"open-{name}",
                settings=settings,
            ).summary.to_dict()
        )
        for name, p in (("fixed", FIXED), ("scaling", SCALING))
    }
    assert opened["fixed"] == opened["scaling"] < 0.9
    modelled = {}
    for name, p in (("fixed", FIXED), ("scaling", SCALING)):
        result, fits = counterfactual_replay(
            recording, policy=p, recorded_policy=FIXED, cluster=cluster,
            out_dir=tmp_path / name, settings=settings,
        )  # fmt: skip
        assert fits["serving/chat"].modelled, fits["serving/chat"].reason
        summary = result.summary.to_dict()
        assert summary["latency"] == MODELLED_FIT
        assert summary["fit"]["serving/chat"]["validation"]["held_points"] == 12
        modelled[name] = attainment(summary)
        scaled = summary["actions"]["by_type"]["scale"]
        assert (scaled > 0) == (name == "scaling")
    assert modelled["scaling"] > modelled["fixed"] + 0.05
    assert modelled["fixed"] == pytest.approx(opened["fixed"], abs=0.05)


@pytest.mark.parametrize(
    ("ts", "dt", "tick"),
    [
        pytest.param(100.0, 1.0, 100, id="on a tick: that tick"),
        pytest.param(100.2, 1.0, 101, id="between: the next"),
        pytest.param(100.0, 0.1, 1000, id="float dt on a tick"),
        pytest.param(100.05, 0.1, 1001, id="float dt between"),
    ],
)
def test_an_event_counts_for_the_tick_it_is_observed_before(
    ts: float, dt: float, tick: int
) -> None:
    """Arrivals are modelled at the tick the runner observes the recorded event before:
    ceil(ts / dt), a tick's own time included, robust to float dt."""
    assert _tick_of(ts, dt) == tick


def test_a_service_without_a_usable_fit_keeps_its_recorded_latencies(tmp_path: Path) -> None:
    """Latency that does not follow load (a step at constant load) fits poorly: the summary
    flags the service and its attainment is exactly the open-loop replay's."""
    recording = write_recording(tmp_path / "flat.jsonl", chat_events(1500, burst=(600, 900)))
    settings = ReplaySettings()
    opened = replay(recording, policy=SCALING, cluster=cluster(SCALING),
                    out_dir=tmp_path / "open", settings=settings)  # fmt: skip
    result, fits = counterfactual_replay(
        recording, policy=SCALING, recorded_policy=SCALING, cluster=cluster,
        out_dir=tmp_path / "cf", settings=settings,
    )  # fmt: skip
    fit = result.summary.to_dict()["fit"]["serving/chat"]
    assert fit["modelled"] is False
    assert fit["reason"].startswith("poor fit")
    assert not fits["serving/chat"].modelled
    assert attainment(result.summary.to_dict()) == attainment(opened.summary.to_dict())


def test_the_fit_pass_counts_histogram_requests_and_replicas() -> None:
    """A histogram's requests count as arrivals and in the minute's percentiles (at their
    bucket's bound, the overflow at the last), and each tick records the Running replicas."""
    recorder = FitRecorder(FIXED, 1.0)
    histogram = LatencyHistogram(bounds_ms=[10.0, 100.0], counts=[60, 38, 2])
    event = InferenceLatency(ts=T0 + 1, service="chat", namespace="serving", histogram=histogram)
    assert recorder.filter([event]) == [event]
    recorder.tick(T0 + 1, cluster(FIXED)(T0).snapshot())
    (obs,) = recorder.observed()
    assert (list(obs.arrivals), list(obs.replicas)) == ([100], [2])
    assert (list(obs.pq_ms), list(obs.p50_ms)) == ([100.0], [10.0])


def _fit_pass(recording: Path) -> FitRecorder:
    """The fit pass of counterfactual replay under the fixed-replicas policy."""
    recorder = FitRecorder(FIXED, 1.0)
    replay(recording, policy=FIXED, cluster=cluster(FIXED),
           out_dir=recording.parent / "fit", hook=recorder)  # fmt: skip
    return recorder


def test_pods_named_on_latency_events_are_the_replicas_fitted_to(tmp_path: Path) -> None:
    """The recording's chat ran 2 replicas, then 4 from minute 20, which the fixed-replicas
    policy's replay cannot know. When the latency events name their pods, the fit counts them
    per minute and finds the per-replica capacity (5 req/s) within 15%; without the names it
    fits the replay's 2 replicas throughout, misses it by more, and its validation error on
    the held-back minutes (all at 4 replicas) shows it."""
    fits = {}
    for named in (True, False):
        events = queue_chat_events(
            40, rate=lambda s: 2.0 * burst_rate(s), replicas=lambda s: 2 if s < 1200 else 4,
            name_pods=named,
        )  # fmt: skip
        (tmp_path / str(named)).mkdir()
        recorder = _fit_pass(write_recording(tmp_path / str(named) / "r.jsonl", events))
        (obs,) = recorder.observed()
        fits[named] = fit_service(obs)
        where = recorder.replicas_from("serving/chat", FIXED)
        assert where.startswith("pods named on its latency events (40 of 40 min)") == named
        assert set(obs.replicas) == ({2, 4} if named else {2})
    named_fit, blind_fit = fits[True].fit, fits[False].fit
    assert named_fit is not None
    assert blind_fit is not None
    assert named_fit.capacity_rps == pytest.approx(5.0, rel=0.15)
    assert abs(blind_fit.capacity_rps - 5.0) > abs(named_fit.capacity_rps - 5.0)
    named_v, blind_v = fits[True].validation, fits[False].validation
    assert named_v is not None
    assert blind_v is not None
    assert named_v["mape_pct"] < 20.0 < 100.0 < blind_v["mape_pct"]


def test_withheld_latency_events_still_drive_the_clock(tmp_path: Path) -> None:
    """A recording of latency events only: the counterfactual replay ticks over the same span
    as the open-loop one (the recorded events it withholds from the engine still move time)
    and the engine sees the modelled requests."""
    events = [e for e in queue_chat_events(25, rate=burst_rate) if isinstance(e, InferenceLatency)]
    recording = write_recording(tmp_path / "latency-only.jsonl", events)
    settings = ReplaySettings()
    opened = replay(recording, policy=FIXED, cluster=cluster(FIXED),
                    out_dir=tmp_path / "open", settings=settings).summary.to_dict()  # fmt: skip
    result, fits = counterfactual_replay(
        recording, policy=FIXED, recorded_policy=FIXED, cluster=cluster,
        out_dir=tmp_path / "cf", settings=settings,
    )  # fmt: skip
    assert fits["serving/chat"].modelled, fits["serving/chat"].reason
    summary = result.summary.to_dict()
    assert summary["time"] == opened["time"]
    assert summary["time"]["ticks"] == 25 * 60
    assert summary["slo"]["serving/chat"]["evaluated_seconds"] > 0.9 * 25 * 60


def test_a_late_recorded_request_is_modelled_at_the_next_tick() -> None:
    """A recorded event older than the last tick run (late, as the runner observes it) is
    withheld and its requests are drawn at the next tick, not lost."""
    fitted = LatencyFit(p0_ms=30.0, capacity_rps=5.0, jitter=0.1, r2=0.9, rmse_ms=1.0,
                        points=40, load_range=(1.0, 4.0))  # fmt: skip
    hook = ModelledLatency(FIXED, {"serving/chat": Fit("serving/chat", 0.99, fitted, None, True,
                                                       "fitted")}, 1.0)  # fmt: skip
    snapshot = cluster(FIXED)(T0).snapshot()
    assert hook.tick(T0 + 10, snapshot) == []
    late = InferenceLatency(ts=T0 + 5, service="chat", namespace="serving", samples_ms=[1.0] * 7)
    assert hook.filter([late]) == [Withheld(T0 + 5)]
    (drawn,) = hook.tick(T0 + 11, snapshot)
    assert isinstance(drawn, InferenceLatency)
    assert (drawn.ts, len(drawn.samples_ms or [])) == (T0 + 11, 7)
    assert hook.tick(T0 + 12, snapshot) == []

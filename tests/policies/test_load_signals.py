"""Several objectives per service, load signals beside the percentile (queue depth,
concurrency, KV cache, the service's own GPU utilization) and the work-bound latency check,
through the engine: scale up to the most any signal asks, down only when every one agrees
(kubernetes pkg/controller/podautoscaler/horizontal.go, computeReplicasForMetrics)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from policy_fixtures import T0, feed_latency, policy_dict, to_yaml
from ruamel.yaml import YAML
from test_scaledown import chat_cluster as cluster

from policies.casetest import load_cases, run_cases
from policies.decisions import Decision, Scale
from policies.engine import Engine
from policies.loader import PolicyLoadError, Source, load_policy, load_policy_text, read_sources
from policies.model import Policy
from streams.events import GpuUtilization, InferenceLatency, InferenceLoad

DOWN = {"stabilization": "20s", "below": "50%", "maxStep": 10, "cooldown": "1s"}


def chat_policy(*, objectives: list[dict[str, Any]] | None = None, **scale: Any) -> Policy:
    """The base test policy (chat: P99 within 100ms over 30s, breachAfter 10s, cooldown 30s,
    1..10 replicas) with ``scale`` extended by ``scale`` and further ``objectives``."""
    data = policy_dict()
    chat = data["spec"]["services"]["chat"]
    chat["scale"].update(scale)
    if objectives:
        chat["objectives"] = objectives
    return load_policy_text(to_yaml(data), "test.yaml")


def load(ts: float, pod: str, **gauges: float) -> InferenceLoad:
    return InferenceLoad(ts=ts, service="chat", namespace="serving", version=1, pod=pod, **gauges)


def scales(decisions: list[Decision]) -> list[tuple[str, int, int]]:
    return [
        (d.explanation.rule, d.from_replicas, d.to_replicas)
        for d in decisions
        if isinstance(d, Scale) and d.role == "inference"
    ]


def drive(
    engine: Engine,
    replicas: int,
    seconds: int,
    *,
    ms: float = 20.0,
    per_s: int = 20,
    gauges: dict[str, float] | None = None,
    gpu_pct: float | None = None,
    follow: bool = True,
) -> tuple[list[Decision], int]:
    """``seconds`` of ``per_s`` requests at ``ms`` and, every second, each running pod's
    ``gauges`` (split evenly: they are the service's totals) and GPU reading; the cluster takes
    every inference scale when ``follow``. Returns the decisions and the replicas at the end."""
    out: list[Decision] = []
    for s in range(seconds):
        now = T0 + s
        feed_latency(engine, now, now + 1, ms, per_s=per_s)
        for i in range(replicas):
            if gauges:
                share = {k: (v / replicas if k != "kv_cache_pct" else v) for k, v in gauges.items()}
                engine.observe(load(now + 0.5, f"chat-{i}", **share))
            if gpu_pct is not None:
                engine.observe(
                    GpuUtilization(
                        ts=now + 0.5, node="w0", gpu=i, util_pct=gpu_pct, pod=f"serving/chat-{i}"
                    )
                )
        decisions = engine.evaluate(now + 1, cluster(replicas))
        out += decisions
        for d in decisions:
            if follow and isinstance(d, Scale) and d.role == "inference":
                replicas = d.to_replicas
    return out, replicas


# -- scale up to the most any signal asks ---------------------------------------------------

SIGNALS = [
    # (signals, gauges as service totals, pod GPU %, replicas asked from 2)
    ({"waiting": 4}, {"waiting": 30.0}, None, 8),
    ({"running": 8}, {"running": 40.0}, None, 5),
    ({"kvCache": "50%"}, {"kv_cache_pct": 90.0}, None, 4),
    ({"gpuUtilization": "40%"}, None, 95.0, 5),
    # several: the most any asks (waiting 30/4 = 8 beats running 20/8 = 3)
    ({"waiting": 4, "running": 8}, {"waiting": 30.0, "running": 20.0}, None, 8),
]


@pytest.mark.parametrize(("signals", "gauges", "gpu", "want"), SIGNALS)
def test_a_signal_scales_up_while_the_percentile_is_fine(
    signals: dict[str, Any], gauges: dict[str, float] | None, gpu: float | None, want: int
) -> None:
    """P99 20ms against 100ms: no breach, yet the signal over its per-replica target at 2
    replicas asks for ``want`` and gets it at once (``signal-scale-up``)."""
    engine = Engine(chat_policy(signals=signals))
    decisions, _ = drive(engine, 2, 5, gauges=gauges, gpu_pct=gpu, follow=False)
    assert scales(decisions)[:1] == [("signal-scale-up", 2, want)]
    first = next(d for d in decisions if isinstance(d, Scale))
    assert "wants" in first.explanation.reason
    assert first.explanation.inputs["work_bound"] is False


def test_without_signals_the_same_load_does_nothing() -> None:
    engine = Engine(chat_policy())
    decisions, _ = drive(engine, 2, 5, gauges={"waiting": 30.0}, gpu_pct=95.0)
    assert scales(decisions) == []
    assert engine.observed > 0


def test_within_tolerance_a_signal_asks_for_nothing() -> None:
    """waiting 8.4 at 4 a replica for 2 replicas: ratio 1.05, inside the 10% tolerance."""
    engine = Engine(chat_policy(signals={"waiting": 4}))
    decisions, _ = drive(engine, 2, 5, gauges={"waiting": 8.4}, follow=False)
    assert scales(decisions) == []


# -- scale down only when every signal agrees -----------------------------------------------


def test_scale_down_waits_for_every_signal() -> None:
    """At 8 replicas with the P99 at 20ms the percentile alone gives replicas back; a queue
    depth of 24 at 4 a replica (6, raised by the 10% tolerance: 7) holds it at 7, and with no
    queue at all it goes down to the minimum as without the signal."""
    plain, left = drive(Engine(chat_policy(down=DOWN)), 8, 90)
    assert left == 1, scales(plain)
    held, left = drive(
        Engine(chat_policy(down=DOWN, signals={"waiting": 4})), 8, 90, gauges={"waiting": 24.0}
    )
    assert left == 7, scales(held)
    assert "every signal agrees" in next(d.explanation.reason for d in held if isinstance(d, Scale))
    free, left = drive(
        Engine(chat_policy(down=DOWN, signals={"waiting": 4})), 8, 90, gauges={"waiting": 0.0}
    )
    assert left == 1, scales(free)


def test_a_signal_without_readings_vetoes_scale_down() -> None:
    """No inference.load at all: the queue-depth signal cannot agree, so nothing goes back
    (as the HPA skips a scale-down while a metric is unavailable)."""
    decisions, left = drive(Engine(chat_policy(down=DOWN, signals={"waiting": 4})), 8, 90)
    assert scales(decisions) == []
    assert left == 8


def test_stale_readings_expire() -> None:
    """Queue depth 40 for 5 s, then silence: after staleAfter (10 s) the reading no longer
    counts, so it neither asks for more nor agrees to fewer."""
    engine = Engine(chat_policy(signals={"waiting": 4, "staleAfter": "10s"}))
    for s in range(5):
        engine.observe(load(T0 + s, "chat-0", waiting=40.0))
    sig = engine._intake.signals["serving/chat"]
    assert sig.fresh("waiting", T0 + 5, 10.0) == [40.0]
    assert sig.fresh("waiting", T0 + 20, 10.0) == []
    assert sig.gauges["waiting"] == {}  # forgotten, not only skipped


def test_load_events_the_policy_cannot_use_are_counted() -> None:
    engine = Engine(chat_policy(signals={"waiting": 4, "staleAfter": "10s"}))
    plain = Engine(chat_policy())
    engine.advance(T0 + 100)
    assert not engine.observe(InferenceLoad(ts=T0, service="nope", version=1, waiting=1.0))
    assert not engine.observe(load(T0, "chat-0", waiting=1.0))  # 100 s old, stale at 10 s
    assert engine.observe(load(T0 + 99, "chat-0", waiting=1.0))
    assert not plain.observe(load(T0, "chat-0", waiting=1.0))
    assert engine._intake.load_dropped == {"unknown_service": 1, "stale": 1}
    assert plain._intake.load_dropped == {"unused": 1}


# -- several objectives ---------------------------------------------------------------------

TPOT = {"metric": "tpot", "percentile": 95, "objectiveMs": 40, "window": "30s",
        "resolution": "1s", "breachAfter": "10s", "recoverBelow": "80%",
        "recoverAfter": "20s", "minSamples": 10}  # fmt: skip


def tpot(engine: Engine, start: float, ms: float, per_s: int = 20) -> None:
    for k in range(per_s):
        engine.observe(
            InferenceLatency(
                ts=start + k / per_s,
                service="chat",
                namespace="serving",
                latency_ms=ms,
                objective="tpot",
            )
        )


def test_a_further_objective_breaching_scales_by_its_own_ratio() -> None:
    """e2e at 20ms (fine), TPOT at 70ms against 40ms: after breachAfter the service breaches
    on TPOT and scales 2→4 (ceil(2 x 1.75)); without the TPOT objective its events are only
    counted as another metric."""
    for objectives, want in (([TPOT], [("slo-breach-scale-up", 2, 4)]), (None, [])):
        engine = Engine(chat_policy(objectives=objectives))
        got: list[Decision] = []
        for s in range(15):
            feed_latency(engine, T0 + s, T0 + s + 1, 20.0)
            tpot(engine, T0 + s, 70.0)
            got += engine.evaluate(T0 + s + 1, cluster(2))
        assert scales(got) == want
        if objectives:
            d = next(d for d in got if isinstance(d, Scale))
            assert "tpot" in d.explanation.reason
            assert d.explanation.thresholds["objective_ms"] == 40
        else:
            assert engine.other_metric == 15 * 20


def test_scale_down_needs_every_objective_within_itself() -> None:
    """e2e at 20ms would give replicas back; TPOT at 38ms (over half of its 40ms) holds them."""
    engine = Engine(chat_policy(objectives=[TPOT], down=DOWN))
    replicas = 8
    got: list[Decision] = []
    for s in range(90):
        feed_latency(engine, T0 + s, T0 + s + 1, 20.0)
        tpot(engine, T0 + s, 38.0)
        got += engine.evaluate(T0 + s + 1, cluster(replicas))
    assert scales(got) == []


def test_the_old_slo_form_is_one_e2e_objective() -> None:
    policy = chat_policy()
    chat = policy.spec.services["chat"]
    assert chat.objectives == []
    assert [o.metric for o in chat.all_objectives()] == ["e2e"]
    assert not chat.has_signals()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"objectives": [{"percentile": 99, "objectiveMs": 50}]},
            "test.yaml:38:9: spec.services.chat.objectives[0]: a second objective on the P99 e2e",
        ),
        (
            {"scale": {"tolerance": "10%", "signals": {"staleAfter": "10s"}}},
            "spec.services.chat.scale.signals: name at least one signal",
        ),
        (
            {"scale": {"tolerance": "10%", "signals": {"kvCache": 0.8}}},
            "spec.services.chat.scale.signals.kvCache: a percentage is a string ending in %",
        ),
        (
            {"scale": {"tolerance": "10%", "workBound": {"loadDrop": "0%"}}},
            "spec.services.chat.scale.workBound: loadDrop must be above 0%",
        ),
    ],
)
def test_loader_messages(change: dict[str, Any], message: str) -> None:
    data = policy_dict()
    data["spec"]["services"]["chat"].update(change)
    with pytest.raises(PolicyLoadError) as err:
        load_policy_text(to_yaml(data), "test.yaml")
    assert message in str(err.value)


# -- work-bound latency ---------------------------------------------------------------------

WORK_BOUND = {"maxStep": 2, "workBound": {"afterSteps": 2, "loadDrop": "20%"}}


def work_bound_day(engine: Engine, seconds: int, *, gauges: dict[str, float] | None) -> list[int]:
    """Every request takes 500ms whatever the replicas (objective 100ms): the work, not the
    queue. Returns the replicas after each second."""
    replicas, seen = 2, []
    for s in range(seconds):
        now = T0 + s
        feed_latency(engine, now, now + 1, 500.0)
        for i in range(replicas):
            if gauges:
                engine.observe(load(now + 0.5, f"chat-{i}", **gauges))
        for d in engine.evaluate(now + 1, cluster(replicas)):
            if isinstance(d, Scale) and d.role == "inference":
                replicas = d.to_replicas
        seen.append(replicas)
    return seen


def test_latency_only_ratchets_to_max() -> None:
    """Without the check, a latency no replica can fix climbs to replicas.max and stays."""
    seen = work_bound_day(Engine(chat_policy(maxStep=2)), 400, gauges=None)
    assert seen[-1] == 10


def test_work_bound_stops_climbing_and_says_why() -> None:
    """Two scale-ups (2→4, 4→6) halve and then cut by a third the load per replica and leave
    P99 at 500ms: work-bound; the service holds at 6 instead of climbing to 10, and the next
    breach response says latency is set by the work."""
    data = policy_dict()
    data["spec"]["services"]["chat"]["scale"].update(WORK_BOUND)
    data["spec"]["services"]["chat"]["cooldown"] = "60s"
    engine = Engine(load_policy_text(to_yaml(data), "test.yaml"))
    seen = work_bound_day(engine, 400, gauges=None)
    assert max(seen) == 6, seen
    assert seen[-1] == 6
    wb = engine._intake.signals["serving/chat"].work_bound
    assert wb.active
    assert "at replicas.max (10) it would still be" in wb.evidence


def test_work_bound_gives_replicas_back_on_the_load_signals() -> None:
    """Work-bound with an empty queue: the latency, intrinsically high, does not veto; the
    queue-depth signal agrees to fewer, so the service goes down to its minimum. While the
    queue holds 4 a replica at 6 replicas it stays."""
    data = policy_dict()
    chat = data["spec"]["services"]["chat"]
    chat["scale"].update(WORK_BOUND, signals={"waiting": 4}, down=DOWN)
    chat["cooldown"] = "60s"
    policy = load_policy_text(to_yaml(data), "test.yaml")
    seen = work_bound_day(Engine(policy), 500, gauges={"waiting": 0.0})
    assert max(seen) == 6, seen
    assert seen[-1] == 1, seen
    busy = work_bound_day(Engine(policy), 500, gauges={"waiting": 4.0})
    assert busy[-1] == 6, busy


def test_queueing_latency_is_not_work_bound() -> None:
    """Latency that halves when the replicas double (queueing) never trips the check."""
    data = policy_dict()
    data["spec"]["services"]["chat"]["scale"].update(WORK_BOUND)
    data["spec"]["services"]["chat"]["cooldown"] = "60s"
    engine = Engine(load_policy_text(to_yaml(data), "test.yaml"))
    replicas = 2
    for s in range(400):
        now = T0 + s
        feed_latency(engine, now, now + 1, 800.0 / replicas)
        for d in engine.evaluate(now + 1, cluster(replicas)):
            if isinstance(d, Scale) and d.role == "inference":
                replicas = d.to_replicas
    assert not engine._intake.signals["serving/chat"].work_bound.active
    assert replicas >= 8  # at 8 the P99 is at its objective: within tolerance


# -- the incremental schedule stays equivalent ----------------------------------------------


@pytest.mark.parametrize("gauges", [{"waiting": 24.0}, {"waiting": 0.0}, None])
def test_incremental_equals_full(gauges: dict[str, float] | None) -> None:
    """Signals, a further objective and the work-bound check: the incremental engine decides
    exactly what ticking everything decides."""
    data = policy_dict()
    chat = data["spec"]["services"]["chat"]
    chat["scale"].update(WORK_BOUND, signals={"waiting": 4}, down=DOWN)
    chat["objectives"] = [TPOT]
    policy = load_policy_text(to_yaml(data), "test.yaml")
    runs = []
    for incremental in (True, False):
        engine = Engine(policy, incremental=incremental)
        replicas, log = 2, []
        for s in range(300):
            now = T0 + s
            if s % 7:
                feed_latency(engine, now, now + 1, 500.0 if s < 200 else 20.0)
                tpot(engine, now, 30.0)
            if gauges is not None and s % 3 == 0:
                engine.observe(load(now + 0.5, "chat-0", **gauges))
            snap = cluster(replicas)
            if engine.idle(now + 1, snap):
                continue
            for d in engine.evaluate(now + 1, snap):
                log.append((now, dataclasses.astuple(d)[1:6]))
                if isinstance(d, Scale) and d.role == "inference":
                    replicas = d.to_replicas
        runs.append(log)
    assert runs[0] == runs[1]
    assert runs[0]


def test_rewind_covers_the_longest_objective() -> None:
    """A restarted controller rewinds over the longest window of any objective: a further
    objective's 20m window, not only the primary's 30s (or the 10m utilization window)."""
    from controller.process.aggregate import longest_window_s

    assert longest_window_s(chat_policy()) == 600.0
    longer = chat_policy(objectives=[{**TPOT, "window": "20m", "resolution": "10s"}])
    assert longest_window_s(longer) == 1200.0


def test_work_bound_is_logged_and_scraped() -> None:
    """Turning work-bound is one ``latency.work_bound`` log event with its evidence, and
    ``ebbtide_service_work_bound{service}`` reads 1 (0 before); unusable load events are
    counted in ``ebbtide_load_events_dropped_total{reason}``."""
    from prometheus_client import generate_latest
    from structlog.testing import capture_logs

    from controller.process.metrics import Metrics, StateSources
    from controller.process.transitions import Transitions

    data = policy_dict()
    data["spec"]["services"]["chat"]["scale"].update(WORK_BOUND)
    data["spec"]["services"]["chat"]["cooldown"] = "60s"
    engine = Engine(load_policy_text(to_yaml(data), "test.yaml"))
    engine.observe(InferenceLoad(ts=T0, service="nope", version=1, waiting=1.0))
    clock = [T0]
    sources = StateSources(
        engine=lambda: engine, consumer=lambda: None, is_leader=lambda: True, clock=lambda: clock[0]
    )
    metrics = Metrics(sources)
    assert (
        'ebbtide_service_work_bound{service="serving/chat"} 0.0'
        in generate_latest(metrics.registry).decode()
    )
    watch = Transitions(lambda: engine, lambda: False)
    replicas = 2
    notices = []
    with capture_logs() as logs:
        for s in range(300):
            now = T0 + s
            feed_latency(engine, now, now + 1, 500.0)
            for d in engine.evaluate(now + 1, cluster(replicas)):
                if isinstance(d, Scale) and d.role == "inference":
                    replicas = d.to_replicas
            notices += watch.check(now + 1, cluster(replicas))
    events = [e for e in logs if e["event"] == "latency.work_bound"]
    assert len(events) == 1
    assert events[0]["service"] == "serving/chat"
    # ... and one Warning Event on the workload, where `kubectl describe` shows it
    [notice] = notices
    assert (notice.workload, notice.kind, notice.reason, notice.warning) == (
        "serving/chat",
        "Deployment",
        "LatencyNotScaling",
        True,
    )
    assert "would still be" in notice.message
    assert "would still be" in str(events[0]["evidence"])
    text = generate_latest(metrics.registry).decode()
    assert 'ebbtide_service_work_bound{service="serving/chat"} 1.0' in text
    assert 'ebbtide_load_events_dropped_total{reason="unknown_service"} 1.0' in text


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("policy", "cases", "count"),
    [("policy-llm-signals.yaml", "policy-llm-signals.cases.yaml", 4)],
)
def test_the_example_passes_its_cases(policy: str, cases: str, count: int) -> None:
    """examples/policy-llm-signals.yaml against its case file: TPOT breaching scales by its
    own ratio, a queue scales up with both latencies fine, the KV cache holds replicas the
    objectives would give back, and with every signal low a replica goes."""
    loaded = load_policy(read_sources((EXAMPLES / policy,)))
    path = EXAMPLES / cases
    parsed, errors = load_cases(Source(str(path), path.read_text()))
    assert not errors
    assert parsed is not None
    results = run_cases(loaded, parsed)
    assert [r.name for r in results if not r.passed] == []
    assert len(results) == count


def test_a_case_event_is_latency_or_load_never_both() -> None:
    text = """cases:
  - name: x
    snapshot: {nodes: [{name: w0}]}
    events: [{service: chat, at: 1s, latencyMs: 5, waiting: 3}]
    expect: [{at: 1s, count: 0}]
"""
    parsed, errors = load_cases(Source("c.cases.yaml", text))
    assert parsed is None
    assert "a load event (waiting, running, kvCachePct) carries no latency" in str(errors[0])


def test_policies_without_the_new_keys_keep_their_digest() -> None:
    """The digest (logs, metrics, the decisions log) leaves out objectives, signals and
    workBound at their defaults: a policy spelling them at their defaults has the digest of one
    that does not name them (so adding the keys to the model changed no digest); using one
    changes it. (Pinning the library's digest instead broke with every edit of the library.)"""
    library = Path(__file__).resolve().parents[2] / "policies/library"
    balanced = load_policy(read_sources((library / "balanced.yaml",)))
    data = YAML(typ="safe").load((library / "balanced.yaml").read_text())
    for svc in data["spec"]["services"].values():
        svc["objectives"] = []
    assert load_policy_text(to_yaml(data), "spelled.yaml").digest() == balanced.digest()
    assert chat_policy().digest() != chat_policy(signals={"waiting": 4}).digest()
    assert chat_policy().digest() != chat_policy(objectives=[TPOT]).digest()


def test_a_reload_keeps_what_an_unchanged_objective_and_gauges_hold() -> None:
    """Reloading with the same TPOT objective keeps its window and the gauges; a changed one
    starts afresh; a policy without signals drops the service's signals."""
    engine = Engine(chat_policy(objectives=[TPOT], signals={"waiting": 4}))
    tpot(engine, T0, 70.0)
    engine.observe(load(T0, "chat-0", waiting=3.0))
    sig = engine._intake.signals["serving/chat"]
    track = sig.objectives[0]
    assert engine.reload(chat_policy(objectives=[TPOT], signals={"waiting": 8})).accepted
    kept = engine._intake.signals["serving/chat"]
    assert kept is sig
    assert kept.objectives[0] is track
    assert kept.gauges["waiting"]["chat-0"] == (T0, 3.0)
    changed = {**TPOT, "objectiveMs": 60}
    assert engine.reload(chat_policy(objectives=[changed], signals={"waiting": 8})).accepted
    assert engine._intake.signals["serving/chat"].objectives[0] is not track
    assert engine.reload(chat_policy()).accepted
    assert engine._intake.signals == {}


def test_the_kill_switch_still_steps_further_objectives() -> None:
    """With the kill switch on nothing is decided, but a further objective's state keeps
    updating (as the primary's does): TPOT over its objective for breachAfter breaches."""
    data = policy_dict(killSwitch=True)
    data["spec"]["services"]["chat"]["objectives"] = [TPOT]
    engine = Engine(load_policy_text(to_yaml(data), "test.yaml"))
    for s in range(15):
        feed_latency(engine, T0 + s, T0 + s + 1, 20.0)
        tpot(engine, T0 + s, 70.0)
        assert engine.evaluate(T0 + s + 1, cluster(2)) == []
    assert engine._intake.signals["serving/chat"].objectives[0].state.state == "breaching"


def test_a_further_objective_breaching_holds_training_growth() -> None:
    """Free GPUs and no primary breach would grow training after growAfter; TPOT breaching
    holds it, as a primary breach does (chat at replicas.max: nothing else holds it)."""
    data = policy_dict()
    data["spec"]["services"]["chat"]["objectives"] = [TPOT]
    data["spec"]["services"]["chat"]["replicas"] = {"min": 1, "max": 2}
    policy = load_policy_text(to_yaml(data), "test.yaml")
    grew = {}
    for name, ms in (("tpot fine", 10.0), ("tpot breaching", 70.0)):
        engine = Engine(policy)
        got: list[Decision] = []
        for s in range(150):
            feed_latency(engine, T0 + s, T0 + s + 1, 20.0)
            tpot(engine, T0 + s, ms)
            got += engine.evaluate(T0 + s + 1, cluster(2))
        grew[name] = any(d.explanation.rule == "grow-training" for d in got)
    assert grew == {"tpot fine": True, "tpot breaching": False}

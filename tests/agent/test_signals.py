"""Expositions of real servers (prometheus_client, their exact declarations) to events: parsing,
histogram deltas, counter resets, the overflow bucket, bad expositions."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from agent.expositions import VLLM_E2E_BUCKETS, sglang, tgi, vllm
from controller.agent.exposition import BadExposition, Exposition, parse_exposition
from controller.agent.servers import BUILTIN, ServerKind
from controller.agent.signals import SignalTracker, Target
from streams.events import (
    MAX_LATENCY_MS,
    EventDecoder,
    InferenceLatency,
    InferenceLoad,
    encode_event,
)


def parse(text: bytes | str, kind: ServerKind) -> Exposition:
    raw = text.decode() if isinstance(text, bytes) else text
    expo = parse_exposition(raw, histograms=kind.histogram_names(), values=kind.value_names())
    assert isinstance(expo, Exposition), expo
    return expo


def latency(events: list[InferenceLatency | InferenceLoad], objective: str) -> InferenceLatency:
    (found,) = [e for e in events if isinstance(e, InferenceLatency) and e.objective == objective]
    return found


def load(events: list[InferenceLatency | InferenceLoad]) -> InferenceLoad:
    (found,) = [e for e in events if isinstance(e, InferenceLoad)]
    return found


VLLM_TARGET = Target(url="http://10.0.0.7:8000/metrics", kind=BUILTIN["vllm"], service="chat",
                     namespace="prod", pod="chat-7d9f-abc", model="tiny-llama")  # fmt: skip


def test_vllm_deltas_per_objective_and_load() -> None:
    """The first scrape is a baseline; the second publishes exactly the requests in between,
    per objective, in milliseconds, plus queue depth, concurrency, KV cache and rates."""
    v = vllm(engines=2)
    v.serve(e2e_s=0.4, ttft_s=0.03, tpot_s=0.02, tokens=50)  # before the baseline: not published
    tracker = SignalTracker()
    first = tracker.events(
        VLLM_TARGET, parse(generate_latest(v.registry), VLLM_TARGET.kind), ts=100.0, now=10.0
    )
    assert [type(e) for e in first] == [InferenceLoad]  # gauges only: no rate, no delta yet
    v.serve(e2e_s=1.2, ttft_s=0.05, tpot_s=0.02, tokens=30, engine="0")
    v.serve(e2e_s=9000.0, ttft_s=0.07, tpot_s=0.04, tokens=30, engine="1")  # past every bound
    v.waiting.labels("tiny-llama", "0").set(3)
    v.waiting.labels("tiny-llama", "1").set(4)
    v.running.labels("tiny-llama", "0").set(8)
    v.kv_cache.labels("tiny-llama", "0").set(0.25)
    v.kv_cache.labels("tiny-llama", "1").set(0.5)
    events = tracker.events(
        VLLM_TARGET, parse(generate_latest(v.registry), VLLM_TARGET.kind), ts=101.0, now=12.0
    )

    e2e = latency(events, "e2e")
    assert e2e.service == "chat"
    assert e2e.namespace == "prod"
    assert e2e.pod == "chat-7d9f-abc"
    assert e2e.histogram is not None
    # 7680 s is past the 1 h an event may carry: that bound folds into the overflow
    assert e2e.histogram.bounds_ms == [
        b * 1000 for b in VLLM_E2E_BUCKETS if b * 1000 <= MAX_LATENCY_MS
    ]
    assert sum(e2e.histogram.counts) == 2
    assert e2e.histogram.counts[e2e.histogram.bounds_ms.index(1500.0)] == 1  # 1.2 s: (1.0, 1.5]
    assert e2e.histogram.counts[-1] == 1  # 9000 s: the overflow
    ttft = latency(events, "ttft")
    assert ttft.histogram is not None
    assert sum(ttft.histogram.counts) == 2
    assert ttft.histogram.counts[ttft.histogram.bounds_ms.index(60.0)] == 1  # 50 ms: (40, 60]
    assert sum(latency(events, "tpot").histogram.counts) == 2  # type: ignore[union-attr]

    signals = load(events)
    assert (signals.waiting, signals.running, signals.server) == (7.0, 8.0, "vllm")
    assert signals.kv_cache_pct == 50.0  # the fullest engine
    assert signals.request_rate == pytest.approx(1.0)  # 2 requests in 2 s
    assert signals.tokens_per_s == pytest.approx(30.0)
    assert signals.interval_s == pytest.approx(2.0)
    decoder = EventDecoder(load=True)
    for event in events:  # every event is one the controller accepts
        assert decoder.decode_any(encode_event(event), now=200.0) == event


def test_restart_counts_what_came_after_it() -> None:
    """A server restarted between two scrapes (counters lower than before): everything since
    the restart is the delta, as Prometheus' rate() reads a reset; the reset is counted."""
    v = vllm()
    for _ in range(5):
        v.serve(e2e_s=0.4, ttft_s=0.03, tpot_s=0.02, tokens=10)
    tracker = SignalTracker()
    tracker.events(
        VLLM_TARGET, parse(generate_latest(v.registry), VLLM_TARGET.kind), ts=1.0, now=1.0
    )
    restarted = vllm()
    restarted.serve(e2e_s=2.2, ttft_s=0.03, tpot_s=0.02, tokens=10)
    events = tracker.events(
        VLLM_TARGET, parse(generate_latest(restarted.registry), VLLM_TARGET.kind), ts=2.0, now=2.0
    )
    e2e = latency(events, "e2e")
    assert e2e.histogram is not None
    assert sum(e2e.histogram.counts) == 1
    assert e2e.histogram.counts[e2e.histogram.bounds_ms.index(2500.0)] == 1
    assert load(events).request_rate == pytest.approx(1.0)  # 1 request since the restart, 1 s
    assert tracker.stats.resets >= 2


def test_changed_bounds_restart_the_series() -> None:
    """Bounds that change between scrapes (an upgrade in place) publish nothing for that
    interval and are counted; the next scrape publishes again."""
    kind = BUILTIN["kserve"]
    target = Target(url="http://k/metrics", kind=kind, service="iris")

    def expo(bounds: str, counts: str) -> Exposition:
        lines = ["# TYPE request_predict_seconds histogram"]
        for le, c in zip(bounds.split(), counts.split(), strict=True):
            lines.append(f'request_predict_seconds_bucket{{le="{le}",model_name="iris"}} {c}')
        lines.append(f'request_predict_seconds_count{{model_name="iris"}} {counts.split()[-1]}')
        return parse("\n".join(lines) + "\n", kind)

    tracker = SignalTracker()
    tracker.events(target, expo("0.1 1 +Inf", "1 2 3"), ts=1, now=1)
    assert not [
        e
        for e in tracker.events(target, expo("0.1 0.5 1 +Inf", "1 2 3 4"), ts=2, now=2)
        if isinstance(e, InferenceLatency)
    ]
    assert tracker.stats.bounds_changed == 1
    (again,) = [
        e
        for e in tracker.events(target, expo("0.1 0.5 1 +Inf", "1 2 3 6"), ts=3, now=3)
        if isinstance(e, InferenceLatency)
    ]
    assert again.histogram is not None
    assert again.histogram.counts == [0, 0, 0, 2]


def test_sglang_and_tgi_names_from_their_sources() -> None:
    """SGLang's ttft/itl/e2e and TGI's e2e/tpot histograms and load gauges are read."""
    reg, m = sglang()
    tracker = SignalTracker()
    target = Target(url="http://s/metrics", kind=BUILTIN["sglang"], service="s")
    tracker.events(target, parse(generate_latest(reg), target.kind), ts=1, now=1)
    m["ttft"].labels("m").observe(0.2)  # type: ignore[attr-defined]
    m["itl"].labels("m").observe(0.01)  # type: ignore[attr-defined]
    m["e2e"].labels("m").observe(3.0)  # type: ignore[attr-defined]
    m["queue"].labels("m").set(5)  # type: ignore[attr-defined]
    m["token_usage"].labels("m").set(0.8)  # type: ignore[attr-defined]
    events = tracker.events(target, parse(generate_latest(reg), target.kind), ts=2, now=2)
    assert {e.objective for e in events if isinstance(e, InferenceLatency)} == {
        "e2e",
        "ttft",
        "tpot",
    }
    assert (load(events).waiting, load(events).kv_cache_pct) == (5.0, 80.0)

    reg, m = tgi()
    target = Target(url="http://t/metrics", kind=BUILTIN["tgi"], service="t")
    tracker.events(target, parse(generate_latest(reg), target.kind), ts=1, now=1)
    m["duration"].observe(0.7)  # type: ignore[attr-defined]
    m["tpot"].observe(0.03)  # type: ignore[attr-defined]
    m["generated"].observe(42)  # type: ignore[attr-defined]
    m["success"].inc()  # type: ignore[attr-defined]
    m["queue"].set(2)  # type: ignore[attr-defined]
    events = tracker.events(target, parse(generate_latest(reg), target.kind), ts=2, now=3)
    assert {e.objective for e in events if isinstance(e, InferenceLatency)} == {"e2e", "tpot"}
    assert load(events).waiting == 2.0
    assert load(events).tokens_per_s == pytest.approx(21.0)  # 42 tokens over 2 s
    assert load(events).request_rate == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param(
            "<html>502 Bad Gateway</html>\n", "not a Prometheus text exposition", id="html"
        ),
        pytest.param(
            'vllm:num_requests_waiting{model_name="x" 3\n', "not a Prometheus", id="broken-labels"
        ),
        pytest.param("vllm:num_requests_waiting abc\n", "not a Prometheus", id="bad-value"),
    ],
)
def test_garbage_is_one_line_not_an_exception(text: str, reason: str) -> None:
    kind = BUILTIN["vllm"]
    out = parse_exposition(text, histograms=kind.histogram_names(), values=kind.value_names())
    assert isinstance(out, BadExposition)
    assert reason in out.reason
    assert "\n" not in out.reason


def test_shrinking_buckets_and_missing_inf_are_problems_not_events() -> None:
    """A histogram whose cumulative counts decrease with the bound, or with neither +Inf nor
    _count, is reported and left out; the rest of the exposition is still read."""
    text = (
        "# TYPE request_predict_seconds histogram\n"
        'request_predict_seconds_bucket{le="0.1",model_name="a"} 5\n'
        'request_predict_seconds_bucket{le="1",model_name="a"} 3\n'
        'request_predict_seconds_bucket{le="+Inf",model_name="a"} 6\n'
        'request_predict_seconds_bucket{le="0.1",model_name="b"} 1\n'
        'request_predict_seconds_bucket{le="+Inf",model_name="b"} 2\n'
    )
    kind = BUILTIN["kserve"]
    out = parse_exposition(text, histograms=kind.histogram_names(), values=kind.value_names())
    assert isinstance(out, Exposition)
    assert len(out.problems) == 1
    assert "decrease" in out.problems[0]
    assert [dict(labels) for labels, _ in out.histograms["request_predict_seconds"]] == [
        {"model_name": "b"}
    ]


def test_sample_cap_bounds_the_work() -> None:
    text = "".join(f'x{{i="{i}"}} 1\n' for i in range(50))
    out = parse_exposition(text, histograms=(), values=("x",), max_samples=10)
    assert isinstance(out, BadExposition)
    assert "more than 10 samples" in out.reason


def test_match_keeps_one_model_of_a_multi_model_server() -> None:
    """Triton serves several models; a target can read one of them."""
    kind = BUILTIN["triton"]
    text = (
        "# TYPE nv_inference_pending_request_count gauge\n"
        'nv_inference_pending_request_count{model="a",version="1"} 4\n'
        'nv_inference_pending_request_count{model="b",version="1"} 9\n'
    )
    target = Target(url="http://t/m", kind=kind, service="a", match=(("model", "a"),))
    events = SignalTracker().events(target, parse(text, kind), ts=1, now=1)
    assert load(events).waiting == 4.0


def test_problem_counts_stay_bounded() -> None:
    """Problems are keyed by series; past MAX_PROBLEMS distinct ones they count as "other"."""
    from controller.agent.signals import MAX_PROBLEMS, SignalStats

    stats = SignalStats()
    for i in range(MAX_PROBLEMS + 50):
        stats.note(f"m{{pod='{i}'}}: cumulative bucket counts decrease with the bound")
    stats.note("m{pod='0'}: cumulative bucket counts decrease with the bound")
    assert len(stats.problems) == MAX_PROBLEMS + 1
    assert stats.problems["other"] == 50
    assert sum(stats.problems.values()) == MAX_PROBLEMS + 51


def test_a_server_that_just_started_publishes_its_first_counts() -> None:
    """A new replica (a new pod, so a new target) whose process started moments before its
    first scrape: its counts are all recent, and they are published, not taken as a baseline.
    One that started long before is a baseline as ever."""
    from prometheus_client import ProcessCollector

    from controller.agent.signals import PROCESS_START

    v = vllm()
    ProcessCollector(registry=v.registry)  # what vLLM's default registry exposes
    v.serve(e2e_s=0.4, ttft_s=0.03, tpot_s=0.02, tokens=10)
    kind = VLLM_TARGET.kind
    expo = parse_exposition(generate_latest(v.registry).decode(), histograms=kind.histogram_names(),
                            values=kind.value_names() | {PROCESS_START})  # fmt: skip
    assert isinstance(expo, Exposition)
    (start,) = expo.values[PROCESS_START]
    fresh = SignalTracker(fresh_s=30).events(VLLM_TARGET, expo, ts=start.value + 5, now=1.0)
    assert sum(latency(fresh, "e2e").histogram.counts) == 1  # type: ignore[union-attr]
    old = SignalTracker(fresh_s=30).events(VLLM_TARGET, expo, ts=start.value + 3600, now=1.0)
    assert [type(e) for e in old] == [InferenceLoad]


def test_tgi_as_its_rust_exporter_writes_counters() -> None:
    """TGI's router exposes through metrics-exporter-prometheus, which writes a counter under
    its own name, without ``_total``: the kind reads that spelling too."""
    text = (
        "# TYPE tgi_request_success counter\n"
        "tgi_request_success 10\n"
        "# TYPE tgi_queue_size gauge\n"
        "tgi_queue_size 3\n"
    )
    kind = BUILTIN["tgi"]
    target = Target(url="http://t/metrics", kind=kind, service="t")
    tracker = SignalTracker()
    tracker.events(target, parse(text, kind), ts=1, now=1)
    events = tracker.events(target, parse(text.replace(" 10\n", " 16\n"), kind), ts=2, now=3)
    assert load(events).request_rate == pytest.approx(3.0)
    assert load(events).waiting == 3.0

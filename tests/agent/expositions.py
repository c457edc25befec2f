"""Expositions of real inference servers, generated with prometheus_client exactly as each
server declares its metrics (names, types, label names, bucket bounds), cited per server.

Each builder returns a registry and the metric objects, so a test can observe requests and
read ``generate_latest(registry)``: the bytes the server itself would answer on ``/metrics``.
"""

from __future__ import annotations

# ruff: noqa: E501  (declarations as the servers write them, one per line)
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# vllm-project/vllm: vllm/v1/metrics/loggers.py (PrometheusStatLogger)
VLLM_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
VLLM_TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                     5.0, 7.5, 10.0, 20.0, 40.0, 80.0]  # fmt: skip
VLLM_E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip


@dataclass
class Vllm:
    registry: CollectorRegistry
    running: Gauge
    waiting: Gauge
    kv_cache: Gauge
    success: Counter
    generation_tokens: Counter
    prompt_tokens: Counter
    ttft: Histogram
    tpot: Histogram
    e2e: Histogram

    def serve(
        self, e2e_s: float, ttft_s: float, tpot_s: float, tokens: int, engine: str = "0"
    ) -> None:
        """One finished request, recorded as vLLM's ``record()`` does."""
        labels = ("tiny-llama", engine)
        self.ttft.labels(*labels).observe(ttft_s)
        self.tpot.labels(*labels).observe(tpot_s)
        self.e2e.labels(*labels).observe(e2e_s)
        self.success.labels(*labels, "stop").inc()
        self.generation_tokens.labels(*labels).inc(tokens)
        self.prompt_tokens.labels(*labels).inc(10)


def vllm(engines: int = 1) -> Vllm:
    reg = CollectorRegistry()
    ln = ["model_name", "engine"]
    v = Vllm(
        reg,
        Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", ln, registry=reg),
        Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", ln, registry=reg),
        Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", ln, registry=reg),
        Counter("vllm:request_success", "Count of successfully processed requests.", [*ln, "finished_reason"], registry=reg),
        Counter("vllm:generation_tokens", "Number of generation tokens processed.", ln, registry=reg),
        Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", ln, registry=reg),
        Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ln, buckets=VLLM_TTFT_BUCKETS, registry=reg),
        Histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", ln, buckets=VLLM_TPOT_BUCKETS, registry=reg),
        Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", ln, buckets=VLLM_E2E_BUCKETS, registry=reg),
    )  # fmt: skip
    for engine in range(engines):
        labels = ("tiny-llama", str(engine))
        for gauge in (v.running, v.waiting, v.kv_cache):
            gauge.labels(*labels).set(0)
    return v


# sgl-project/sglang: python/sglang/srt/metrics/collector.py; bounds as in
# docs/references/production_metrics.md (the first ones of each histogram)
SGLANG_TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
]
SGLANG_E2E_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
]
SGLANG_ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04,
                      0.06, 0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0]  # fmt: skip


def sglang() -> tuple[CollectorRegistry, dict[str, object]]:
    reg = CollectorRegistry()
    ln = ["model_name"]
    m: dict[str, object] = {
        "running": Gauge("sglang:num_running_reqs", "The number of running requests.", ln, registry=reg),
        "queue": Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", ln, registry=reg),
        "token_usage": Gauge("sglang:token_usage", "The token usage.", ln, registry=reg),
        "requests": Counter("sglang:num_requests_total", "Number of requests processed.", ln, registry=reg),
        "gen": Counter("sglang:generation_tokens_total", "Number of generation tokens processed.", ln, registry=reg),
        "prompt": Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", ln, registry=reg),
        "ttft": Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ln, buckets=SGLANG_TTFT_BUCKETS, registry=reg),
        "itl": Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ln, buckets=SGLANG_ITL_BUCKETS, registry=reg),
        "e2e": Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", ln, buckets=SGLANG_E2E_BUCKETS, registry=reg),
    }  # fmt: skip
    return reg, m


# huggingface/text-generation-inference: router/src/server.rs sets the buckets of every
# histogram whose name ends in "duration" to 0.0001 * 1.5**k, k = 1..35, and those of
# tgi_request_generated_tokens to max_total_tokens / 100 * (x + 1), x < 100.
TGI_DURATION_BUCKETS = [0.0001 * 1.5**k for k in range(1, 36)]
TGI_MAX_TOTAL_TOKENS = 2048
TGI_TOKEN_BUCKETS = [TGI_MAX_TOTAL_TOKENS / 100 * (x + 1) for x in range(100)]


def tgi() -> tuple[CollectorRegistry, dict[str, object]]:
    """TGI's router metrics, names from docs/source/reference/metrics.md, buckets from
    router/src/server.rs (the router is Rust: metrics-exporter-prometheus writes the same text
    format, its counters without a ``_total`` suffix; the kind reads both spellings)."""
    reg = CollectorRegistry()
    m: dict[str, object] = {
        "queue": Gauge("tgi_queue_size", "Current queue size", registry=reg),
        "batch": Gauge("tgi_batch_current_size", "Current batch size", registry=reg),
        "success": Counter("tgi_request_success", "Number of successful requests", registry=reg),
        "duration": Histogram("tgi_request_duration", "Total time spent processing the request", buckets=TGI_DURATION_BUCKETS, registry=reg),
        "tpot": Histogram("tgi_request_mean_time_per_token_duration", "Mean time per token per request", buckets=TGI_DURATION_BUCKETS, registry=reg),
        "generated": Histogram("tgi_request_generated_tokens", "Generated tokens per request", buckets=TGI_TOKEN_BUCKETS, registry=reg),
    }  # fmt: skip
    return reg, m


def otel_views() -> list[object]:
    """OpenTelemetry SDK views that export instruments ``e2e``, ``ttft``, ``tokens`` and
    ``waiting`` under vLLM's names and bounds, as the Collector's Prometheus receiver keeps
    them (an SDK instrument name cannot hold ``:``)."""
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    return [
        View(instrument_name="e2e", name="vllm:e2e_request_latency_seconds",
             aggregation=ExplicitBucketHistogramAggregation(VLLM_E2E_BUCKETS)),
        View(instrument_name="ttft", name="vllm:time_to_first_token_seconds",
             aggregation=ExplicitBucketHistogramAggregation(VLLM_TTFT_BUCKETS)),
        View(instrument_name="tokens", name="vllm:generation_tokens"),
        View(instrument_name="waiting", name="vllm:num_requests_waiting"),
    ]  # fmt: skip

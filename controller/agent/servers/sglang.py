"""SGLang, from ``python/sglang/srt/metrics/collector.py`` (``SchedulerMetricsCollector``,
``TokenizerMetricsCollector``) and ``docs/references/production_metrics.md``: labels
``model_name`` (and more per deployment); gauges ``sglang:num_queue_reqs``,
``sglang:num_running_reqs``, ``sglang:token_usage`` (the KV pool's used fraction, 0 to 1);
counters ``sglang:num_requests_total``, ``sglang:generation_tokens_total``,
``sglang:prompt_tokens_total``; histograms ``sglang:e2e_request_latency_seconds``,
``sglang:time_to_first_token_seconds`` and ``sglang:inter_token_latency_seconds`` (earlier
releases: ``sglang:time_per_output_token_seconds``). Needs ``--enable-metrics``; served on the
server's port, 30000 by default."""

from controller.agent.servers.kind import LatencySource, ServerKind

SGLANG = ServerKind(
    name="sglang",
    port=30000,
    source="sgl-project/sglang: python/sglang/srt/metrics/collector.py",
    latency=(
        LatencySource(metric="sglang:e2e_request_latency_seconds", objective="e2e"),
        LatencySource(metric="sglang:time_to_first_token_seconds", objective="ttft"),
        LatencySource(metric="sglang:inter_token_latency_seconds", objective="tpot"),
        LatencySource(metric="sglang:time_per_output_token_seconds", objective="tpot"),
    ),
    waiting=("sglang:num_queue_reqs",),
    running=("sglang:num_running_reqs",),
    kv_cache=("sglang:token_usage",),
    requests=("sglang:num_requests_total",),
    tokens=("sglang:generation_tokens_total",),
    prompt_tokens=("sglang:prompt_tokens_total",),
)

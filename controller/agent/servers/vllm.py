"""vLLM (V1 engine), from ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``): every
metric carries ``model_name`` and ``engine`` labels (one series per data-parallel engine, summed
here); ``vllm:kv_cache_usage_perc`` (0 to 1, was ``vllm:gpu_cache_usage_perc`` before 0.9);
``vllm:time_per_output_token_seconds`` (renamed ``vllm:inter_token_latency_seconds`` in later
releases); counters ``vllm:request_success`` (label ``finished_reason``),
``vllm:generation_tokens``, ``vllm:prompt_tokens`` exposed with ``_total``. Served by the
OpenAI-compatible API server on its HTTP port, 8000 by default."""

from controller.agent.servers.kind import LatencySource, ServerKind

VLLM = ServerKind(
    name="vllm",
    port=8000,
    source="vllm-project/vllm: vllm/v1/metrics/loggers.py",
    latency=(
        LatencySource(metric="vllm:e2e_request_latency_seconds", objective="e2e"),
        LatencySource(metric="vllm:time_to_first_token_seconds", objective="ttft"),
        LatencySource(metric="vllm:inter_token_latency_seconds", objective="tpot"),
        LatencySource(metric="vllm:time_per_output_token_seconds", objective="tpot"),
    ),
    waiting=("vllm:num_requests_waiting",),
    running=("vllm:num_requests_running",),
    kv_cache=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    requests=("vllm:request_success_total",),
    tokens=("vllm:generation_tokens_total",),
    prompt_tokens=("vllm:prompt_tokens_total",),
)

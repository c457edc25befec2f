"""Text Generation Inference, from ``docs/source/reference/metrics.md`` (the router's
``/metrics``): ``tgi_request_duration`` (e2e, seconds),
``tgi_request_mean_time_per_token_duration`` (inter-token latency, seconds), gauges
``tgi_queue_size`` and ``tgi_batch_current_size``, counter ``tgi_request_success``; generated
and prompt tokens are histograms per request (``tgi_request_generated_tokens``,
``tgi_request_input_length``), whose ``_sum`` counts tokens. TGI has no time-to-first-token
histogram and no KV-cache gauge. Served on the router's port, 80 in the container image."""

from controller.agent.servers.kind import LatencySource, ServerKind

TGI = ServerKind(
    name="tgi",
    port=80,
    source="huggingface/text-generation-inference: docs/source/reference/metrics.md",
    latency=(
        LatencySource(metric="tgi_request_duration", objective="e2e"),
        LatencySource(metric="tgi_request_mean_time_per_token_duration", objective="tpot"),
    ),
    waiting=("tgi_queue_size",),
    running=("tgi_batch_current_size",),
    requests=("tgi_request_success", "tgi_request_success_total"),
    tokens=("tgi_request_generated_tokens_sum",),
    prompt_tokens=("tgi_request_input_length_sum",),
)

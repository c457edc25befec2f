"""Triton Inference Server, from ``docs/user_guide/metrics.md``: per model (labels ``model``,
``version``) the counters ``nv_inference_request_success`` and gauge
``nv_inference_pending_request_count``. Triton's request latencies are cumulative counters
(``nv_inference_request_duration_us``) by default, which give a mean, not a percentile: they
are not published. With ``--metrics-config histogram_latencies=true`` it also exposes
``nv_inference_first_response_histogram_ms`` (time to the first response, in milliseconds),
read here as ``ttft``. Metrics on port 8002."""

from controller.agent.servers.kind import LatencySource, ServerKind

TRITON = ServerKind(
    name="triton",
    port=8002,
    source="triton-inference-server/server: docs/user_guide/metrics.md",
    latency=(
        LatencySource(
            metric="nv_inference_first_response_histogram_ms", objective="ttft", unit_ms=1.0
        ),
    ),
    waiting=("nv_inference_pending_request_count",),
    requests=("nv_inference_request_success", "nv_inference_request_success_total"),
)

"""KServe's Python model server (``kserve.ModelServer``), from ``python/kserve/kserve/
metrics.py``: histograms ``request_preprocess_seconds``, ``request_predict_seconds``,
``request_postprocess_seconds``, ``request_explain_seconds``, label ``model_name``, with
prometheus_client's default buckets (5 ms to 10 s). The predict step is read as the request's
``e2e`` latency (pre- and post-processing are usually negligible; a transformer-heavy model
should use a custom kind). Its ``_count`` counts requests. Served on the HTTP port, 8080."""

from controller.agent.servers.kind import LatencySource, ServerKind

KSERVE = ServerKind(
    name="kserve",
    port=8080,
    source="kserve/kserve: python/kserve/kserve/metrics.py",
    latency=(LatencySource(metric="request_predict_seconds", objective="e2e"),),
    requests=("request_predict_seconds_count",),
)

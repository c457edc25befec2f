"""Tests of the node telemetry agent (``ebbtide agent``) and its fake NVML."""

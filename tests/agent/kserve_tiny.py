"""A tiny model served by KServe's real Python model server (``kserve.ModelServer``), for the
end-to-end test: ``python kserve_tiny.py HTTP_PORT DELAY_S``. Its ``predict`` sleeps
``DELAY_S`` (a model whose latency is set by the work) and sums the inputs; the server exposes
its own Prometheus metrics on ``/metrics`` of the HTTP port (``kserve/metrics.py``)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import kserve


class Tiny(kserve.Model):  # type: ignore[misc]
    def __init__(self, name: str, delay_s: float) -> None:
        super().__init__(name)
        self.delay_s = delay_s
        self.ready = True

    async def predict(self, payload: Any, headers: Any = None, response_headers: Any = None) -> Any:
        await asyncio.sleep(self.delay_s)
        body = json.loads(payload) if isinstance(payload, bytes | str) else payload
        return {"predictions": [sum(row) for row in body["instances"]]}


if __name__ == "__main__":
    port, delay = int(sys.argv[1]), float(sys.argv[2])
    sys.argv = sys.argv[:1]  # kserve parses its own flags from the command line
    kserve.ModelServer(http_port=port, enable_grpc=False, workers=1).start([Tiny("tiny", delay)])

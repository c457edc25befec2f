"""The process's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz`` and ``/status`` (aiohttp).

``/healthz`` answers 200 while the process's root tasks are alive (a liveness probe restarts a
wedged controller). ``/readyz`` answers 200 only when a check callback says the controller is
ready — the cluster cache has synced and the consumer is caught up — and 503 with the reasons
otherwise, so a rollout waits for a new replica to have a complete picture. ``/status`` answers
JSON: per service and pool what the controller sees and what blocks it now
(:mod:`controller.process.status`; ``ebbtide status`` reads it), on every replica.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from controller.controller_errors import ControllerError

__all__ = ["CannotServe", "HealthServer"]


class CannotServe(ControllerError, ConnectionError):
    """The health and metrics port could not be bound (in use, or not ours to bind)."""


#: Returns the reasons the controller is not ready (empty: ready).
ReadinessCheck = Callable[[], list[str]]
LivenessCheck = Callable[[], list[str]]
#: Returns the ``/status`` answer (JSON data).
StatusReport = Callable[[], dict[str, Any]]


class HealthServer:
    """Serves metrics and probes on ``host:port`` (port 0 picks a free one; see :attr:`port`)."""

    def __init__(
        self,
        address: str,
        *,
        registry: CollectorRegistry,
        ready: ReadinessCheck,
        alive: LivenessCheck,
        status: StatusReport | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        self._host, self._port = host or "0.0.0.0", int(port)
        self._registry, self._ready, self._alive = registry, ready, alive
        self._status = status
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        if status is not None:
            app.router.add_get("/status", self._status_json)
        self._runner = web.AppRunner(app, access_log=None)
        self.port = self._port

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise CannotServe(
                f"cannot serve metrics on {self._host}:{self._port}: {exc.strerror}"
            ) from exc
        server = site._server
        if server is not None and server.sockets:  # type: ignore[attr-defined]
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def close(self) -> None:
        await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    @staticmethod
    def _answer(problems: list[str]) -> web.Response:
        if problems:
            return web.Response(status=503, text="\n".join(problems) + "\n")
        return web.Response(text="ok\n")

    async def _healthz(self, request: web.Request) -> web.Response:
        return self._answer(self._alive())

    async def _readyz(self, request: web.Request) -> web.Response:
        return self._answer(self._ready())

    async def _status_json(self, request: web.Request) -> web.Response:
        assert self._status is not None
        return web.json_response(self._status())

"""Connecting to the Kubernetes API, its errors as a small tree, and retries.

Every API call of the adapter goes through :func:`call`: it turns ``ApiException`` and transport
errors into :class:`KubeError` subclasses (kopf does the same) and retries the transient ones —
5xx, 429 that is not a disruption-budget refusal, timeouts, dropped connections — with jittered
exponential backoff (tenacity). Conflicts (409) are *not* retried here: the caller must re-read
the object and decide again, which is the only safe answer to a stale write.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from controller.controller_errors import ControllerError

__all__ = [
    "ApiLimits",
    "Conflict",
    "Forbidden",
    "KubeConfigError",
    "KubeError",
    "NotFound",
    "TooManyRequests",
    "Transient",
    "call",
    "connect",
]

T = TypeVar("T")
Obj = dict[str, Any]


class KubeConfigError(ControllerError):
    """No usable cluster configuration (no in-cluster account, no readable kubeconfig)."""


class KubeError(ControllerError):
    """An API call failed; ``status`` is the HTTP status (0 for a transport error)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class NotFound(KubeError):
    """404: the object is gone (often: the work is already done)."""


class Conflict(KubeError):
    """409: a stale ``resourceVersion`` or an object that already exists. Re-read, re-decide."""


class Forbidden(KubeError):
    """403: RBAC does not allow it. Not retried; the chart's ClusterRole is wrong. (A validating
    webhook's denial is a 403 too, ``admission webhook "NAME" denied the request: …``: that is
    a plain :class:`KubeError`, the object's rules refused the change.)"""


class TooManyRequests(KubeError):
    """429. ``disruption_budget`` is set when an Eviction was refused by a PDB."""

    def __init__(self, message: str, *, disruption_budget: bool) -> None:
        super().__init__(message, status=429)
        self.disruption_budget = disruption_budget


class Transient(KubeError):
    """5xx, throttling, a timeout or a dropped connection: worth retrying."""


def translate(exc: BaseException) -> KubeError:
    """The :class:`KubeError` for ``exc`` (an ``ApiException`` or a transport error)."""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = f"{status} {exc.reason}: {_status_message(exc)}"
        if status == 404:
            return NotFound(message, status=status)
        if status == 409:
            return Conflict(message, status=status)
        if status == 403 and "admission webhook" not in message:
            return Forbidden(message, status=status)
        if status == 429:
            pdb = "disruption budget" in (exc.body or "")
            if pdb:
                return TooManyRequests(message, disruption_budget=True)
            return Transient(message, status=429)
        if status >= 500:
            return Transient(message, status=status)
        return KubeError(message, status=status)
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ClientError):
        return Transient(f"transport: {exc!r}")
    raise TypeError(f"not a Kubernetes API error: {exc!r}") from exc


def _status_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message", exc.body))
    except ValueError:
        return str(exc.body)


async def call(
    fn: Callable[[], Awaitable[T]],
    *,
    attempts: int = 5,
    deadline_s: float = 30.0,
    timeout_s: float = 10.0,
) -> T:
    """Run one API call with a per-try timeout, retrying :class:`Transient` failures."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(Transient),
        wait=wait_random_exponential(multiplier=0.1, max=5.0),
        stop=stop_after_attempt(attempts) | stop_after_delay(deadline_s),
        reraise=True,
    ):
        with attempt:
            try:
                async with asyncio.timeout(timeout_s):
                    return await fn()
            except (TimeoutError, ApiException, aiohttp.ClientError) as exc:
                raise translate(exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover - tenacity re-raises


@dataclass(frozen=True, slots=True)
class ApiLimits:
    """How hard one API call is tried (see :func:`call`)."""

    timeout_s: float = 10.0
    """Timeout of one try."""
    attempts: int = 5
    """Tries of a call failing transiently (5xx, throttled 429, timeouts)."""
    deadline_s: float = 30.0
    """Give up retrying after this long."""

    async def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await call(
            fn, attempts=self.attempts, deadline_s=self.deadline_s, timeout_s=self.timeout_s
        )

    async def get(self, api: client.ApiClient, path: str, **query: str) -> Obj:
        """GET ``path`` as plain JSON: no model classes, whose client-side validation would
        refuse partial objects, and the same ``dict`` shape for built-in and custom kinds."""
        out: Obj = await self.run(
            lambda: api.call_api(
                path,
                "GET",
                query_params=list(query.items()),
                header_params={"Accept": "application/json"},
                response_types_map={200: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
        )
        return out


async def connect(
    kubeconfig: Path | None = None, *, context: str | None = None, pool_size: int = 256
) -> client.ApiClient:
    """An API client: in-cluster when running in a pod (and no kubeconfig is given), else from
    ``kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``. ``pool_size`` bounds concurrent
    connections: every open watch holds one, so it must exceed the number of watches."""
    if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException as exc:
            raise KubeConfigError(f"in-cluster configuration failed: {exc}") from exc
        configuration = client.Configuration.get_default_copy()
        configuration.connection_pool_maxsize = pool_size
        return client.ApiClient(configuration)
    path = kubeconfig or Path(os.environ.get("KUBECONFIG", "~/.kube/config")).expanduser()  # noqa: ASYNC240 - once, at start-up
    if not path.is_file():
        raise KubeConfigError(
            f"no Kubernetes configuration: {path} does not exist and this is not a pod "
            "(set --kubeconfig or KUBECONFIG)"
        )
    configuration = client.Configuration()
    configuration.connection_pool_maxsize = pool_size
    try:
        await config.load_kube_config(
            config_file=str(path), context=context, client_configuration=configuration
        )
    except (config.ConfigException, OSError, ValueError) as exc:
        raise KubeConfigError(f"cannot load kubeconfig {path}: {exc}") from exc
    return client.ApiClient(configuration)

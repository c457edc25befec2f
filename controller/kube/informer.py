"""A list+watch cache of one Kubernetes resource, in the manner of client-go's reflector.

Design:

* **Raw JSON.** Objects stay the dicts the API server sent: lists and watch streams are read
  with ``_preload_content=False`` and parsed with :mod:`json`, never deserialized into
  ``kubernetes_asyncio`` model classes (slow, and lossy for custom resources). Requests go through
  ``ApiClient.call_api``, so authentication and TLS come from the client's configuration.
* **One reflector per scope.** A scope is the whole cluster or one namespace (an informer given
  several namespaces runs one list+watch loop per namespace into a shared store). A loop LISTs in
  pages (``limit``/``continue``), remembers the list's ``resourceVersion``, then WATCHes from it
  with ``allowWatchBookmarks`` and a server-side timeout (randomised, as client-go does, so many
  watches do not reconnect together), and applies ADDED/MODIFIED/DELETED to the store. A watch
  that ends normally is resumed from the last version seen; bookmarks only move that version.
* **410 Gone** (an ERROR event with code 410, a 410 answer to the watch, or an expired
  ``continue`` token) means the version is compacted away: the loop LISTs again and *replaces*
  its part of the store, emitting the implied ADDED/MODIFIED/DELETED changes, so a consumer that
  follows the change callback stays consistent with the store.
* **An API that is not installed.** A custom kind whose CRD is absent answers 404 to LIST and
  WATCH, as a real apiserver does. An informer built ``optional`` (the workload kinds) treats that
  as an empty, synced scope — so one missing CRD cannot keep the cache from syncing and the
  controller from acting — logs it once, and LISTs again every ``rediscover_s`` until the kind
  appears (objects it held are deleted from the store if the CRD goes away). Without
  ``optional``, a 404 is an ordinary failure.
* **Any other failure** (5xx, transport errors, a dead connection, malformed lines) is logged and
  retried after a jittered exponential backoff (full jitter, capped), resuming the watch from the
  last version when there is one. The loop never exits on an error; only :meth:`Informer.stop` or
  cancellation end it. List pages go through :func:`controller.kube.client.call`, which already
  retries transient failures per request.
* **Observable state:** :attr:`Informer.synced` (every scope has listed once), a monotonically
  increasing :attr:`Informer.version` that moves once per batch of store changes (one watch event,
  or one re-list), :meth:`Informer.items`, and an optional synchronous ``on_change`` callback
  called with each :class:`Change` before ``version`` moves. Objects handed out are the cache's
  own dicts: treat them as read-only.

:meth:`Informer.apply` and :meth:`Informer.replace` are the two store operations the loops use;
they are public so benchmarks and unit tests can drive a store without a server.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from controller.kube.client import KubeError, NotFound, call, translate

__all__ = ["Backoff", "Change", "ChangeType", "Informer", "Obj", "Resource", "object_key"]

Obj = dict[str, Any]
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]
_EVENT_TYPES: Final = frozenset({"ADDED", "MODIFIED", "DELETED"})
#: A watch that ends sooner than this without any event counts as a failure (backoff), so a
#: server or proxy that closes streams at once is not hammered.
_MIN_WATCH_S: Final = 1.0

log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Resource:
    """Where a resource lives in the API: ``group=""`` is the core group."""

    plural: str
    version: str = "v1"
    group: str = ""
    namespaced: bool = True

    def path(self, namespace: str | None) -> str:
        """The collection URL path, in ``namespace`` when given (namespaced resources only)."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace is not None and self.namespaced:
            return f"{root}/namespaces/{namespace}/{self.plural}"
        return f"{root}/{self.plural}"

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


@dataclass(frozen=True, slots=True)
class Change:
    """One change to the store. ``obj`` is the new object (the last known one for DELETED)."""

    type: ChangeType
    key: str
    obj: Obj
    old: Obj | None


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Jittered exponential backoff between failed list/watch attempts."""

    base_s: float = 0.5
    """Upper bound of the first delay; doubles per consecutive failure."""
    max_s: float = 30.0
    """Cap of the upper bound."""

    def delay(self, failures: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**(failures-1))], at least 10% of it."""
        bound = min(self.max_s, self.base_s * 2 ** max(0, failures - 1))
        return rng.uniform(bound / 10, bound)


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


class _Gone(Exception):
    """The resourceVersion we hold is too old (410): list again."""


class Informer:
    """A list+watch cache of one resource, filtered by selectors, keyed by ``namespace/name``."""

    def __init__(
        self,
        api: ApiClient,
        resource: Resource,
        *,
        namespaces: Iterable[str] = (),
        label_selector: str | None = None,
        field_selector: str | None = None,
        on_change: Callable[[Change], None] | None = None,
        page_size: int = 500,
        watch_timeout_s: float = 300.0,
        request_timeout_s: float = 30.0,
        backoff: Backoff = Backoff(),
        optional: bool = False,
        rediscover_s: float = 60.0,
        rng: random.Random | None = None,
    ) -> None:
        self.api = api
        self.resource = resource
        scopes = tuple(sorted(set(namespaces))) if resource.namespaced else ()
        self._scopes: tuple[str | None, ...] = scopes or (None,)
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.on_change = on_change
        self.page_size = page_size
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s
        self.backoff = backoff
        self.optional = optional
        """The API may be absent (a CRD): a 404 means "none installed", not a failure."""
        self.rediscover_s = rediscover_s
        """How often an absent API is looked for again."""
        self._absent = False
        self._rng = rng or random.Random()
        self._store: dict[str, Obj] = {}
        self._version = 0
        self._listed: set[str | None] = set()
        self._synced = asyncio.Event()
        self._stopping = asyncio.Event()
        self._log = log.bind(resource=str(resource))

    # --- observable state ------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once every scope has completed its first LIST."""
        return self._synced.is_set()

    @property
    def installed(self) -> bool:
        """False while an :attr:`optional` resource's API answers 404 (its CRD is absent)."""
        return not self._absent

    @property
    def version(self) -> int:
        """Moves (up) whenever the store changes; equal versions mean an unchanged store."""
        return self._version

    def items(self) -> list[Obj]:
        """The cached objects (the cache's own dicts: do not mutate)."""
        return list(self._store.values())

    def keys(self) -> Iterator[str]:
        return iter(self._store)

    def get(self, key: str) -> Obj | None:
        """The cached object with ``key`` (``namespace/name`` or ``name``), if any."""
        return self._store.get(key)

    def __len__(self) -> int:
        return len(self._store)

    async def wait_synced(self) -> None:
        """Return once :attr:`synced` is true."""
        await self._synced.wait()

    # --- store operations ------------------------------------------------------------------------

    def apply(self, event_type: str, obj: Obj) -> Change | None:
        """Apply one watch event to the store; the change it made, or None when it made none."""
        if event_type not in _EVENT_TYPES:
            raise ValueError(f"not a store event: {event_type}")
        key = object_key(obj)
        old = self._store.get(key)
        change: Change | None = None
        if event_type == "DELETED":
            if old is not None:
                del self._store[key]
                change = Change("DELETED", key, obj, old)
        elif old is None:
            self._store[key] = obj
            change = Change("ADDED", key, obj, None)
        elif _rv(old) != _rv(obj) or not _rv(obj):
            self._store[key] = obj
            change = Change("MODIFIED", key, obj, old)
        if change is not None:
            self._publish([change])
        return change

    def replace(self, objects: Iterable[Obj], *, namespace: str | None = None) -> list[Change]:
        """Replace the store (or only ``namespace``'s part of it) with ``objects``: the result of
        a LIST. Returns the implied changes; an unchanged object (same resourceVersion) is none."""
        fresh = {object_key(o): o for o in objects}
        changes: list[Change] = []
        for key, gone in list(self._store.items()):
            in_scope = namespace is None or key.startswith(f"{namespace}/")
            if in_scope and key not in fresh:
                del self._store[key]
                changes.append(Change("DELETED", key, gone, gone))
        for key, obj in fresh.items():
            old = self._store.get(key)
            if old is None:
                changes.append(Change("ADDED", key, obj, None))
            elif _rv(old) != _rv(obj) or not _rv(obj):
                changes.append(Change("MODIFIED", key, obj, old))
            else:
                continue
            self._store[key] = obj
        self._publish(changes)
        return changes

    def _publish(self, changes: list[Change]) -> None:
        if not changes:
            return
        if self.on_change is not None:
            for change in changes:
                try:
                    self.on_change(change)
                except Exception:
                    self._log.exception("informer.callback_failed", key=change.key)
        self._version += 1

    # --- running ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to end; it cancels its loops and returns."""
        self._stopping.set()

    async def run(self) -> None:
        """List and watch until :meth:`stop` is called or the task is cancelled."""
        try:
            async with asyncio.TaskGroup() as group:
                loops = [
                    group.create_task(
                        self._reflect(scope), name=f"informer {self.resource} {scope}"
                    )
                    for scope in self._scopes
                ]
                await self._stopping.wait()
                for task in loops:
                    task.cancel()
        finally:
            self._stopping.clear()  # so that it can run again

    async def _reflect(self, namespace: str | None) -> None:
        """One scope's list+watch loop: never returns, never raises but CancelledError."""
        logger = self._log.bind(namespace=namespace) if namespace else self._log
        version: str | None = None
        failures = 0
        while True:
            try:
                if version is None:
                    version = await self._list(namespace)
                    self._mark_listed(namespace)
                    if self._absent:
                        self._absent = False
                        logger.info("informer.api_installed")
                    logger.debug("informer.listed", resource_version=version, objects=len(self))
                version = await self._watch(namespace, version)
                failures = 0
            except _Gone as gone:
                logger.info("informer.relist", reason=str(gone), resource_version=version)
                version = None
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if self.optional and _not_found(error):
                    version = None
                    await self._skip_absent(namespace, error)
                    continue
                if isinstance(error, _WatchBroken):
                    version = error.version
                    failures = 0 if error.progressed else failures
                failures += 1
                delay = self.backoff.delay(failures, self._rng)
                logger.warning(
                    "informer.retry",
                    error=_describe(error),
                    failures=failures,
                    delay_s=round(delay, 3),
                    resource_version=version,
                )
                await asyncio.sleep(delay)

    def _mark_listed(self, namespace: str | None) -> None:
        self._listed.add(namespace)
        if len(self._listed) == len(self._scopes):
            self._synced.set()

    async def _skip_absent(self, namespace: str | None, error: Exception) -> None:
        """The API is not installed: hold nothing for the scope, count it as listed, warn once,
        and wait before looking again."""
        if not self._absent:
            self._absent = True
            self._log.warning(
                "informer.api_absent",
                error=_describe(error),
                rediscover_s=self.rediscover_s,
                hint="the kind is skipped until its CRD is installed",
            )
        self.replace((), namespace=namespace)
        self._mark_listed(namespace)
        await asyncio.sleep(self.rediscover_s)

    async def _list(self, namespace: str | None) -> str:
        """LIST every page and replace the scope's store; returns the list's resourceVersion."""
        objects: list[Obj] = []
        token: str | None = None
        while True:
            query = self._selectors()
            if self.page_size:
                query.append(("limit", str(self.page_size)))
            if token:
                query.append(("continue", token))
            try:
                page = await call(
                    functools.partial(self._get_json, namespace, query),
                    timeout_s=self.request_timeout_s,
                )
            except KubeError as error:
                if error.status == 410 and token:
                    self._log.info("informer.continue_expired", namespace=namespace)
                    objects, token = [], None
                    continue
                raise
            kind = self.resource.plural
            for obj in page.get("items") or []:
                # A list's items carry no apiVersion/kind; watch events do. Keep them alike.
                obj.setdefault("apiVersion", page.get("apiVersion", ""))
                obj.setdefault("kind", str(page.get("kind", kind)).removesuffix("List"))
                objects.append(obj)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if not token:
                self.replace(objects, namespace=namespace)
                return str(meta.get("resourceVersion", ""))

    async def _get_json(self, namespace: str | None, query: list[tuple[str, str]]) -> Obj:
        response = await self._request(namespace, query, limits=self.request_timeout_s)
        try:
            body = await response.read()
        finally:
            response.release()
        data = json.loads(body)
        if not isinstance(data, dict):
            raise ValueError(f"a list answer must be a JSON object, got {type(data).__name__}")
        return data

    async def _watch(self, namespace: str | None, version: str) -> str:
        """WATCH from ``version`` until the stream ends; returns the last version seen. A stream
        that breaks, or ends at once without a single event, raises :class:`_WatchBroken`."""
        timeout = self.watch_timeout_s * self._rng.uniform(1.0, 2.0)
        query = [
            *self._selectors(),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", version),
            ("timeoutSeconds", str(max(1, int(timeout)))),
        ]
        read_timeout = aiohttp.ClientTimeout(
            sock_connect=self.request_timeout_s, sock_read=timeout + self.request_timeout_s
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await self._request(namespace, query, limits=read_timeout)
        progressed = False
        try:
            while True:
                line = await response.content.readline()
                if not line:
                    if not progressed and loop.time() - started < _MIN_WATCH_S:
                        raise ConnectionResetError("the watch ended at once without events")
                    return version
                if not line.strip():
                    continue
                event = json.loads(line)
                version = self._on_event(event, version)
                progressed = True
        except (_Gone, asyncio.CancelledError):
            raise
        except Exception as error:
            # Keep the version reached: the next attempt resumes from it.
            raise _WatchBroken(version, progressed) from error
        finally:
            response.close()

    def _on_event(self, event: Any, version: str) -> str:
        """Apply one watch event; the resourceVersion to resume from afterwards."""
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict):
            raise ValueError(f"malformed watch event: {str(event)[:200]}")
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            message = f"{code} {obj.get('reason', '')}: {obj.get('message', '')}"
            if code == 410:
                raise _Gone(message)
            raise KubeError(f"watch error {message}", status=code)
        new_version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if kind == "BOOKMARK":
            return new_version
        if kind not in _EVENT_TYPES:
            raise ValueError(f"unknown watch event type {kind!r}")
        self.apply(kind, obj)
        return new_version

    async def _request(
        self, namespace: str | None, query: list[tuple[str, str]], *, limits: Any
    ) -> Any:
        """GET the collection, unparsed; a non-2xx answer raises (410 as :class:`_Gone`)."""
        response = await self.api.call_api(
            self.resource.path(namespace),
            "GET",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=limits,
        )
        if 200 <= response.status < 300:
            return response
        try:
            body = (await response.read()).decode("utf-8", "replace")
        finally:
            response.release()
        if response.status == 410 and ("watch", "true") in query:
            raise _Gone(f"410 {response.reason}")
        error = ApiException(status=response.status, reason=response.reason)
        error.body = body
        raise error

    def _selectors(self) -> list[tuple[str, str]]:
        query: list[tuple[str, str]] = []
        if self.label_selector:
            query.append(("labelSelector", self.label_selector))
        if self.field_selector:
            query.append(("fieldSelector", self.field_selector))
        return query


class _WatchBroken(Exception):
    """A watch stream failed after reaching ``version``; ``progressed`` if events came first."""

    def __init__(self, version: str, progressed: bool) -> None:
        super().__init__(f"watch broke at resourceVersion {version}")
        self.version = version
        self.progressed = progressed


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _not_found(error: BaseException) -> bool:
    """A 404 from a LIST (already a :class:`NotFound`) or from opening a WATCH."""
    return isinstance(error, NotFound) or (isinstance(error, ApiException) and error.status == 404)


def _describe(error: BaseException) -> str:
    cause = error.__cause__ if isinstance(error, _WatchBroken) else error
    if isinstance(cause, ApiException | aiohttp.ClientError | TimeoutError):
        return str(translate(cause))
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(error)

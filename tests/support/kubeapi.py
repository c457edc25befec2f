"""A Kubernetes API server for integration tests: real HTTP, in-memory state.

No kube-apiserver can run on the test machines, so the controller's Kubernetes adapter is tested
against this server with the real client (``kubernetes_asyncio``) over a real socket.

Why not subclass ``kmock``'s ``KubernetesEmulator``: against kubernetes_asyncio 36.1 it misses
``watch=True``, selectors, PUT, eviction, uid/resourceVersion/409, ``/scale``, ``/status`` and
stateless faults (see ``../shared/FACTS.md``, relative to the repository root), i.e. nearly every
handler would be overridden and its store would need resource versions and watch history it does
not have. What is left of it would be the routing, which is 40 lines here. So this is a compact
aiohttp server of its own (aiohttp ships with kubernetes_asyncio), in four modules:

- ``kubeapi_objects``: pure functions: selectors, patches, disruption-budget arithmetic, Status,
  and the ``make_pod``/``make_node`` builders.
- ``kubeapi_store``: the synchronous store: resource versions, conflicts, finalizers, watch
  history with 410 Expired, pod defaults and PDB status upkeep.
- ``kubeapi_faults``: scripted faults and the request log.
- ``kubeapi_rbac``: the RBAC authorizer, over the roles the Helm chart renders.
- ``kubeapi`` (this module): URL routing, list/watch streaming, ``/status``, ``/scale``,
  ``pods/NAME/eviction``, kubeconfig, direct-store helpers for tests.

Requests flow: log → authorize (a request the roles do not grant is a 403, kept in
``forbidden``) → fault (which answers before the store is touched, so a fault never changes
state) → route → store. The handler of a request whose client hung up is cancelled
(``handler_cancellation``), so a fault that delays past the client's timeout changes nothing
either. ``close()`` ends every open watch before stopping the site, so teardown never hangs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from .kubeapi_faults import Fault, Faults, LoggedRequest
from .kubeapi_objects import (
    MERGE_PATCH,
    ApiError,
    Obj,
    apply_patch,
    get_path,
    label_selector_string,
    labels_of,
    parse_field_selector,
    parse_label_selector,
    pod_is_healthy,
    set_path,
    status_object,
)
from .kubeapi_rbac import Authorizer
from .kubeapi_store import PYTORCHJOB, ResourceType, Store, WatchEvent

__all__ = ["Fault", "Faults", "KubeAPIServer", "LoggedRequest"]

_TRUE = frozenset({"1", "t", "T", "true", "True", "TRUE"})
_EVICTION_DENIED = "Cannot evict pod as it would violate the pod's disruption budget."


class _PageNotFound(Exception):
    """A path under a group/version nothing serves: a real apiserver's mux answers it with a
    plain-text ``404 page not found`` (as for a CRD that is not installed), not a Status."""


@dataclass(frozen=True)
class _Target:
    resource: ResourceType
    namespace: str | None
    name: str | None
    sub: str | None


class KubeAPIServer:
    """The test server. Use ``async with KubeAPIServer() as server:`` or start()/close()."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        resources: tuple[ResourceType, ...] = (PYTORCHJOB,),
        history_limit: int = 1000,
        store: Store | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.store = store or Store(history_limit=history_limit)
        for resource in resources:
            self.store.register(resource)
        self.faults = Faults()
        self.requests: list[LoggedRequest] = []
        self.errors: list[Exception] = []
        """Unexpected exceptions in request handlers (server bugs); each was answered 500."""
        self.authorizer = authorizer
        """Decides every request as RBAC would (None: everything is allowed)."""
        self.forbidden: list[str] = []
        """The message of every 403 the authorizer answered."""
        self._host, self._port = host, port
        self._closing = asyncio.Event()
        self._activity = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=2.0, access_log=None
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        self._port = self._runner.addresses[0][1]
        self.url = f"http://{self._host}:{self._port}"

    async def close(self) -> None:
        """End open watches and delayed requests, then stop serving."""
        self._closing.set()
        self.store.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- helpers for tests: direct store access ------------------------------------------------

    def add_resource(self, resource: ResourceType) -> None:
        """Serve another (custom) resource type."""
        self.store.register(resource)

    def remove_resource(self, name: str) -> None:
        """Stop serving a resource type (kind or plural), as when its CRD is deleted."""
        self.store.unregister(self.store.resolve(name))

    async def create(self, obj: Obj) -> Obj:
        """Create an object as given, status included (over HTTP, status is dropped).

        The resource comes from apiVersion/kind, the namespace from metadata (else default).
        """
        resource = self.store.resolve_object(obj)
        namespace = obj.get("metadata", {}).get("namespace", "default")
        return self.store.create(
            resource, namespace if resource.namespaced else None, obj, keep_status=True
        )

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        """An object by kind/plural, or None when it does not exist."""
        try:
            return self.store.get(self.store.resolve(kind), namespace, name)
        except ApiError:
            return None

    def objects(self, kind: str, namespace: str | None = None) -> list[Obj]:
        """All objects of a kind, optionally in one namespace."""
        return self.store.list_objects(self.store.resolve(kind), namespace)

    async def patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Obj,
        *,
        subresource: str | None = None,
    ) -> Obj:
        """Merge-patch an object (``subresource="status"`` to change its status)."""
        return self.store.patch(
            self.store.resolve(kind), namespace, name, patch, MERGE_PATCH, subresource=subresource
        )

    async def delete(self, kind: str, namespace: str | None, name: str) -> None:
        self.store.delete(self.store.resolve(kind), namespace, name)

    def compact(self) -> None:
        """Drop the watch history: a watch from any older resourceVersion gets 410 Gone."""
        self.store.compact()

    async def until(self, check: Callable[[], bool], *, within: float = 5.0) -> None:
        """Wait until ``check()`` holds, checking again whenever a request arrives or its
        handler ends (answered or cancelled): a condition on what clients asked for (and, by
        then, saw), no polling."""
        async with asyncio.timeout(within), self._activity:
            await self._activity.wait_for(check)

    async def _poke(self) -> None:
        async with self._activity:
            self._activity.notify_all()

    def requests_matching(
        self, *, method: str | None = None, path_regex: str = ""
    ) -> list[LoggedRequest]:
        pattern = re.compile(path_regex)
        return [r for r in self.requests if method in (None, r.method) and pattern.search(r.path)]

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig (JSON, which is YAML) pointing at this server; returns its path."""
        path = Path(path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "ebbtide-test",
            "clusters": [{"name": "ebbtide-test", "cluster": {"server": self.url}}],
            "users": [{"name": "ebbtide-test", "user": {"token": "ebbtide-test-token"}}],
            "contexts": [
                {
                    "name": "ebbtide-test",
                    "context": {
                        "cluster": "ebbtide-test",
                        "user": "ebbtide-test",
                        "namespace": namespace,
                    },
                }
            ],
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    # --- HTTP ----------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        content_type = request.headers.get("Content-Type", "")
        raw = await request.read()
        entry = LoggedRequest(
            request.method,
            request.path,
            dict(request.query),
            None,
            content_type,
            user_agent=request.headers.get("User-Agent", ""),
        )
        self.requests.append(entry)
        await self._poke()
        try:
            return await self._answer(request, entry, raw, content_type)
        finally:  # answered, or cancelled because the client hung up
            entry.finished = True
            await self._poke()

    async def _answer(
        self, request: web.Request, entry: LoggedRequest, raw: bytes, content_type: str
    ) -> web.StreamResponse:
        try:
            entry.body = self._decode(raw, content_type)
            if self.authorizer is not None and (
                refusal := self.authorizer.refusal(request.method, request.path, request.query)
            ):
                self.forbidden.append(refusal.message)
                raise refusal
            fault = self.faults.take(request.method, request.path)
            if fault is not None and fault.commit:
                response = await self._route(request, entry.body, content_type)
                await self._sleep(fault.delay)
            else:
                if fault is not None and fault.delay and not await self._sleep(fault.delay):
                    raise ApiError(503, "the server is shutting down")
                if fault is not None and fault.status is not None:
                    raise ApiError(fault.status, fault.message)
                response = await self._route(request, entry.body, content_type)
        except _PageNotFound:
            response = web.Response(status=404, text="404 page not found\n")
        except ApiError as error:
            headers = {"Retry-After": "1"} if error.code == 429 else None
            response = web.json_response(error.status(), status=error.code, headers=headers)
        except Exception as error:  # a bug in this server: answer, and keep it for the test
            self.errors.append(error)
            response = web.json_response(ApiError(500, repr(error)).status(), status=500)
        entry.status = response.status
        return response

    @staticmethod
    def _decode(raw: bytes, content_type: str) -> Any:
        if "yaml" in content_type:
            raise ApiError(415, f"unsupported media type {content_type!r} in this test server")
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as error:
            raise ApiError(400, f"invalid JSON body: {error}") from error

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server closes first; False when it did."""
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            return True
        return False

    def _target(self, path: str) -> _Target:
        segs = [s for s in path.split("/") if s]
        if segs[:1] == ["api"] and len(segs) >= 3:
            group, version, rest = "", segs[1], segs[2:]
        elif segs[:1] == ["apis"] and len(segs) >= 4:
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        if not any((r.group, r.version) == (group, version) for r in self.store.resources.values()):
            raise _PageNotFound  # no CRD installed serves this group/version
        namespace = None
        candidate = self.store.resources.get((group, rest[2])) if len(rest) >= 3 else None
        if rest[0] == "namespaces" and candidate is not None and candidate.namespaced:
            namespace, rest = rest[1], rest[2:]
        resource = self.store.lookup(group, version, rest[0])
        if len(rest) > 3 or (resource.namespaced and len(rest) > 1 and namespace is None):
            raise ApiError(404, "the server could not find the requested resource")
        return _Target(
            resource,
            namespace,
            rest[1] if len(rest) > 1 else None,
            rest[2] if len(rest) > 2 else None,
        )

    async def _route(
        self, request: web.Request, body: Any, content_type: str
    ) -> web.StreamResponse:
        t, method = self._target(request.path), request.method
        if method == "GET" and t.name is None and request.query.get("watch", "") in _TRUE:
            return await self._watch(request, t)
        if method in ("POST", "PUT") and not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        # _serve is synchronous, so no other request runs while a dry run is in effect.
        if request.query.get("dryRun") and method != "GET":
            with self.store.dry_run():
                answer, code = self._serve(t, method, request.query, body, content_type)
        else:
            answer, code = self._serve(t, method, request.query, body, content_type)
        return web.json_response(answer, status=code)

    def _serve(
        self, t: _Target, method: str, query: Any, body: Any, content_type: str
    ) -> tuple[Obj, int]:
        """Everything but watch: (answer, HTTP status)."""
        store = self.store
        if t.name is None:
            if method == "GET":
                return self._list(t, query), 200
            if method == "POST":
                return store.create(t.resource, t.namespace, body), 201
        elif t.sub in (None, "status"):
            if method == "GET":
                return store.get(t.resource, t.namespace, t.name), 200
            if method == "PUT":
                return store.update(t.resource, t.namespace, t.name, body, subresource=t.sub), 200
            if method == "PATCH":
                patched = store.patch(
                    t.resource, t.namespace, t.name, body, content_type, subresource=t.sub
                )
                return patched, 200
            if method == "DELETE" and t.sub is None:
                return self._delete(t, body or {}), 200
        elif t.sub == "scale" and t.resource.replicas_path:
            return self._scale_request(t, method, body, content_type), 200
        elif t.sub == "eviction" and t.resource.key == ("", "pods") and method == "POST":
            return self._evict(t, body), 201
        else:
            raise ApiError(404, "the server could not find the requested resource")
        raise ApiError(405, f"method {method} is not supported here")

    def _list(self, t: _Target, query: Any) -> Obj:
        label = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(query.get("fieldSelector"))
        items = [
            o
            for o in self.store.list_objects(t.resource, t.namespace)
            if label(labels_of(o)) and fields(o)
        ]
        meta: Obj = {"resourceVersion": str(self.store.resource_version)}
        if token := query.get("continue"):
            try:
                after = tuple(json.loads(base64.urlsafe_b64decode(token)))
            except ValueError as error:
                raise ApiError(400, f"invalid continue token {token!r}") from error
            items = [o for o in items if _sort_key(o) > after]
        limit = _int_param(query, "limit")
        if limit and len(items) > limit:
            items, rest = items[:limit], len(items) - limit
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps(_sort_key(items[-1])).encode()
            ).decode()
            meta["remainingItemCount"] = rest
        return {
            "apiVersion": t.resource.api_version,
            "kind": f"{t.resource.kind}List",
            "metadata": meta,
            "items": items,
        }

    async def _watch(self, request: web.Request, t: _Target) -> web.StreamResponse:
        label = parse_label_selector(request.query.get("labelSelector"))
        fields = parse_field_selector(request.query.get("fieldSelector"))
        timeout = _int_param(request.query, "timeoutSeconds") or None
        since = _int_param(request.query, "resourceVersion")
        bookmarks = request.query.get("allowWatchBookmarks", "") in _TRUE
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            watcher = self.store.watch(t.resource, t.namespace, since)
        except ApiError as error:
            await _write_line(response, {"type": "ERROR", "object": error.status()})
            return response
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        try:
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), remaining)
                except TimeoutError:
                    if bookmarks:
                        await _write_line(
                            response,
                            {
                                "type": "BOOKMARK",
                                "object": {
                                    "apiVersion": t.resource.api_version,
                                    "kind": t.resource.kind,
                                    "metadata": {
                                        "resourceVersion": str(self.store.resource_version)
                                    },
                                },
                            },
                        )
                    break
                if event is None:
                    break
                kind = _visible(event, lambda o: label(labels_of(o)) and fields(o))
                if kind is not None:
                    await _write_line(response, {"type": kind, "object": event.obj})
        except ConnectionError:
            pass
        finally:
            self.store.unwatch(watcher)
        return response

    def _delete(self, t: _Target, options: Obj) -> Obj:
        assert t.name is not None
        remaining = self.store.delete(
            t.resource, t.namespace, t.name, preconditions=options.get("preconditions")
        )
        if remaining is not None:
            return remaining
        return status_object(
            200,
            "",
            reason="",
            details={"name": t.name, "group": t.resource.group, "kind": t.resource.plural},
        )

    # --- subresources ----------------------------------------------------------------------------

    def _scale_request(self, t: _Target, method: str, body: Any, content_type: str) -> Obj:
        assert t.name is not None
        current = self.store.get(t.resource, t.namespace, t.name)
        if method == "GET":
            return _scale_of(t.resource, current)
        if method == "PATCH":
            body = apply_patch(_scale_of(t.resource, current), body, content_type)
        elif method != "PUT":
            raise ApiError(405, f"method {method} is not supported on /scale")
        replicas = get_path(body, "spec.replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiError(422, f"Scale.spec.replicas: Invalid value: {replicas!r}")
        wanted_version = get_path(body, "metadata.resourceVersion")
        if wanted_version:
            current["metadata"]["resourceVersion"] = wanted_version
        assert t.resource.replicas_path is not None
        set_path(current, t.resource.replicas_path, replicas)
        return _scale_of(t.resource, self.store.update(t.resource, t.namespace, t.name, current))

    def _evict(self, t: _Target, eviction: Obj) -> Obj:
        """policy/v1 Eviction: delete the pod unless a matching PDB forbids it (429)."""
        assert t.name is not None
        assert t.namespace is not None
        pod = self.store.get(t.resource, t.namespace, t.name)
        budgets = self.store.matching_budgets(pod)
        if len(budgets) > 1:
            raise ApiError(
                500,
                "This pod has more than one PodDisruptionBudget, which the "
                "eviction subresource does not support.",
            )
        phase = (pod.get("status") or {}).get("phase")
        if budgets and phase not in ("Pending", "Succeeded", "Failed"):
            pdb = budgets[0]
            status = self.store.budget_status(pdb)
            healthy = pod_is_healthy(pod)
            if (healthy and status["disruptionsAllowed"] < 1) or (
                not healthy and status["currentHealthy"] < status["desiredHealthy"]
            ):
                raise ApiError(
                    429,
                    _EVICTION_DENIED,
                    details={
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {pdb['metadata']['name']} needs "
                                f"{status['desiredHealthy']} healthy pods and has "
                                f"{status['currentHealthy']} currently",
                            }
                        ]
                    },
                )
        options = eviction.get("deleteOptions") or {}
        self.store.delete(
            t.resource, t.namespace, t.name, preconditions=options.get("preconditions")
        )
        return status_object(201, "", reason="")


def _int_param(query: Any, name: str) -> int:
    try:
        return int(query.get(name) or 0)
    except ValueError as error:
        raise ApiError(400, f"invalid {name} {query.get(name)!r}") from error


def _sort_key(obj: Obj) -> tuple[str, str]:
    return (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])


def _scale_of(resource: ResourceType, obj: Obj) -> Obj:
    """The ``autoscaling/v1`` Scale view of a scalable object."""
    assert resource.replicas_path is not None
    meta = obj["metadata"]
    status: Obj = {"replicas": int(get_path(obj, resource.status_replicas_path or "") or 0)}
    selector = get_path(obj, resource.selector_path) if resource.selector_path else None
    if isinstance(selector, dict):
        selector = label_selector_string(selector)
    if selector:
        status["selector"] = selector
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {"replicas": int(get_path(obj, resource.replicas_path) or 0)},
        "status": status,
    }


def _visible(event: WatchEvent, match: Callable[[Obj], bool]) -> str | None:
    """The event type a selector-filtered watch sees: objects move in and out of the view."""
    now = match(event.obj)
    if event.type == "DELETED":
        return "DELETED" if now else None
    before = event.old is not None and event.type == "MODIFIED" and match(event.old)
    if now:
        return "MODIFIED" if before else "ADDED"
    return "DELETED" if before else None


async def _write_line(response: web.StreamResponse, payload: Obj) -> None:
    await response.write(json.dumps(payload).encode() + b"\n")

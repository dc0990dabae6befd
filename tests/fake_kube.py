"""A loopback Kubernetes API server speaking the API's real JSON: list/watch, bookmarks, 410, 403, /scale."""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from fake_kube_selectors import _fields_match, _selector_matches
from fake_kube_tokens import TokenIssuer

TOKEN = "fake-service-account-token"
USER = "system:serviceaccount:keda:keda-gpu-scaler"


@dataclass(frozen=True)
class Kind:
    """A resource type the fake serves: where it lives and, when it has /scale, where its selector is."""

    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    scale_selector: Callable[[dict[str, Any]], str] | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


def match_labels_selector(obj: dict[str, Any]) -> str:
    """status.selector of a Deployment's /scale: its spec.selector in the label selector string form."""
    labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


POD = Kind("", "v1", "Pod", "pods")
DEPLOYMENT = Kind("apps", "v1", "Deployment", "deployments", match_labels_selector)
STATEFULSET = Kind("apps", "v1", "StatefulSet", "statefulsets", match_labels_selector)
DAEMONSET = Kind("apps", "v1", "DaemonSet", "daemonsets")  # no /scale subresource, as in Kubernetes
SCALED_OBJECT = Kind("keda.sh", "v1alpha1", "ScaledObject", "scaledobjects")
# A custom resource with /scale whose selector lives in status, like LeaderWorkerSet's hpaPodSelector.
LEADER_WORKER_SET = Kind(
    "leaderworkerset.x-k8s.io",
    "v1",
    "LeaderWorkerSet",
    "leaderworkersets",
    lambda obj: (obj.get("status") or {}).get("hpaPodSelector") or "",
)
SERVICE = Kind("", "v1", "Service", "services")
INFERENCE_POOL = Kind("inference.networking.k8s.io", "v1", "InferencePool", "inferencepools")
KINDS = (POD, DEPLOYMENT, STATEFULSET, DAEMONSET, SCALED_OBJECT, LEADER_WORKER_SET, SERVICE, INFERENCE_POOL)


def status(code: int, reason: str, message: str, kind: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if kind:
        body["details"] = {"kind": kind}
    return body


@dataclass
class _Watcher:
    kind: Kind
    namespace: str | None
    selector: str
    bookmarks: bool
    fields: str = ""
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    request: web.Request | None = None

    def wants(self, obj: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        return (
            (self.namespace is None or meta.get("namespace") == self.namespace)
            and _selector_matches(self.selector, meta.get("labels") or {})
            and _fields_match(self.fields, meta)
        )


class FakeKube:
    """An in-memory API server: objects with resourceVersions, an event history, watches and RBAC denials."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, namespace, name) → object
        self.revision = 1000
        self.oldest_revision = self.revision  # watches from older resourceVersions get 410 Gone
        self.history: list[tuple[int, str, Kind, dict[str, Any]]] = []
        self.watchers: list[_Watcher] = []
        self.denied: set[tuple[str, str, str | None]] = set()  # (verb, resource, namespace or None)
        self.requests: list[tuple[str, str]] = []  # (path, query string) of every request
        self.tokens = TokenIssuer()  # serviceaccounts/token (TokenRequest)
        self.port = 0
        self._runner: web.AppRunner | None = None

    # --- lifecycle ------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        app = web.Application(middlewares=[self._authenticate])
        app.router.add_get("/api", self._core_versions)
        app.router.add_get("/apis", self._groups)
        app.router.add_get("/api/v1", self._core_resources)
        app.router.add_get("/api/v1/pods", self._pods)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._pods)
        app.router.add_get("/api/v1/namespaces/{namespace}/services", self._services)
        app.router.add_get("/apis/{group}/{version}/namespaces/{namespace}/{plural}", self._collection)
        app.router.add_get("/apis/{group}/{version}", self._resources)
        app.router.add_get("/apis/{group}/{version}/", self._resources)
        app.router.add_get("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}", self._get)
        app.router.add_get(
            "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/scale", self._scale
        )
        self.tokens.route(app, self._forbidden)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Go away like a crashed API server: watches end, new connections are refused."""
        self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "scaler", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "scaler"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))  # JSON is YAML
        return path

    # --- changing the cluster -------------------------------------------------------------------------

    def _key(self, kind: Kind, namespace: str, name: str) -> tuple[str, str, str]:
        return (f"{kind.plural}.{kind.group}", namespace, name)

    def put(self, kind: Kind, obj: dict[str, Any], *, notify: bool = True) -> dict[str, Any]:
        """Create or replace an object; notify=False changes it without any watch event (events lost)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        key = self._key(kind, meta.get("namespace", ""), meta["name"])
        old = self.objects.get(key)
        self.revision += 1
        meta["resourceVersion"] = str(self.revision)
        meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        self.objects[key] = obj
        if notify:
            self._event("MODIFIED" if old else "ADDED", kind, obj)
        return obj

    def delete(self, kind: Kind, namespace: str, name: str) -> None:
        obj = self.objects.pop(self._key(kind, namespace, name))
        self.revision += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self._event("DELETED", kind, obj)

    def _event(self, kind_of_event: str, kind: Kind, obj: dict[str, Any]) -> None:
        self.history.append((self.revision, kind_of_event, kind, obj))
        for watcher in self.watchers:
            if watcher.kind == kind and watcher.wants(obj):
                watcher.queue.put_nowait({"type": kind_of_event, "object": obj})

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: older resourceVersions now get 410 Gone."""
        self.history.clear()
        self.oldest_revision = self.revision

    def bookmark(self) -> None:
        """Send a BOOKMARK with the current resourceVersion to every watch that allowed bookmarks."""
        for watcher in self.watchers:
            if watcher.bookmarks:
                event = {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": watcher.kind.kind,
                        "apiVersion": watcher.kind.api_version,
                        "metadata": {"resourceVersion": str(self.revision)},
                    },
                }
                watcher.queue.put_nowait(event)

    def end_watches(self) -> None:
        """End every open watch, as the API server does at timeoutSeconds or on restart."""
        for watcher in self.watchers:
            watcher.queue.put_nowait(None)

    def drop_watches(self) -> None:
        """Cut every open watch's connection mid-stream, as a load balancer's idle timeout does."""
        for watcher in self.watchers:
            if watcher.request is not None and watcher.request.transport is not None:
                watcher.request.transport.abort()

    def deny(self, verb: str, resource: str, namespace: str | None = None) -> None:
        """RBAC: refuse verb on resource (e.g. 'pods', 'scaledobjects.keda.sh', 'deployments/scale.apps')."""
        self.denied.add((verb, resource, namespace))

    def allow_all(self) -> None:
        self.denied.clear()

    def count(self, path: str, *, watch: bool | None = None) -> int:
        """Requests made to path (watch=True: only watches, False: only non-watch requests)."""
        return sum(
            1
            for p, query in self.requests
            if p == path and (watch is None or ("watch=true" in query.lower()) == watch)
        )

    # --- HTTP -----------------------------------------------------------------------------------------

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.path, request.query_string))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response(status(401, "Unauthorized", "Unauthorized"), status=401)
        response: web.StreamResponse = await handler(request)
        return response

    def _forbidden(self, verb: str, resource: str, group: str, namespace: str | None) -> web.Response | None:
        full = f"{resource}.{group}" if group else resource
        # A denial for namespace None is one for cluster-scope requests only (a RoleBinding may still
        # grant the namespace), as RBAC would have it.
        if (verb, full, namespace) not in self.denied:
            return None
        where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
        base = resource.split("/")[0]
        message = (
            f'{base}{"." + group if group else ""} is forbidden: User "{USER}" cannot {verb} resource'
            f' "{resource}" in API group "{group}"{where}'
        )
        return web.json_response(status(403, "Forbidden", message, base), status=403)

    async def _core_versions(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        )

    async def _groups(self, _: web.Request) -> web.Response:
        groups: dict[str, list[str]] = {}
        for kind in KINDS:
            if kind.group:
                groups.setdefault(kind.group, [])
                if kind.version not in groups[kind.group]:
                    groups[kind.group].append(kind.version)
        items = [
            {
                "name": name,
                "versions": [{"groupVersion": f"{name}/{v}", "version": v} for v in versions],
                "preferredVersion": {"groupVersion": f"{name}/{versions[0]}", "version": versions[0]},
            }
            for name, versions in groups.items()
        ]
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": items})

    def _resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        kinds = [k for k in KINDS if k.group == group and k.version == version]
        if not kinds:
            return None
        resources: list[dict[str, Any]] = []
        for kind in kinds:
            resources.append(
                {
                    "name": kind.plural,
                    "singularName": kind.kind.lower(),
                    "namespaced": True,
                    "kind": kind.kind,
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                }
            )
            if kind.scale_selector is not None:
                resources.append(
                    {
                        "name": f"{kind.plural}/scale",
                        "singularName": "",
                        "namespaced": True,
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "verbs": ["get", "patch", "update"],
                    }
                )
        group_version = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }

    async def _core_resources(self, _: web.Request) -> web.Response:
        return web.json_response(self._resource_list("", "v1"))

    async def _resources(self, request: web.Request) -> web.Response:
        body = self._resource_list(request.match_info["group"], request.match_info["version"])
        if body is None:
            return web.json_response(
                status(404, "NotFound", "the server could not find the requested resource"), status=404
            )
        return web.json_response(body)

    def _kind(self, group: str, version: str, plural: str) -> Kind | None:
        return next((k for k in KINDS if (k.group, k.version, k.plural) == (group, version, plural)), None)

    def _find(self, request: web.Request) -> tuple[Kind | None, dict[str, Any] | None]:
        info = request.match_info
        kind = self._kind(info["group"], info["version"], info["plural"])
        if kind is None:
            return None, None
        return kind, self.objects.get(self._key(kind, info["namespace"], info["name"]))

    def _not_found(self, kind: Kind | None, name: str) -> web.Response:
        what = f"{kind.plural}.{kind.group}" if kind else "resource"
        message = f'{what} "{name}" not found' if kind else "the server could not find the requested resource"
        return web.json_response(status(404, "NotFound", message, kind.plural if kind else None), status=404)

    async def _get(self, request: web.Request) -> web.Response:
        info = request.match_info
        denied = self._forbidden("get", info["plural"], info["group"], info["namespace"])
        if denied is not None:
            return denied
        kind, obj = self._find(request)
        if obj is None:
            return self._not_found(kind, info["name"])
        return web.json_response(obj)

    async def _scale(self, request: web.Request) -> web.Response:
        info = request.match_info
        denied = self._forbidden("get", f"{info['plural']}/scale", info["group"], info["namespace"])
        if denied is not None:
            return denied
        kind, obj = self._find(request)
        if kind is None or kind.scale_selector is None:
            return self._not_found(None, info["name"])
        if obj is None:
            return self._not_found(kind, info["name"])
        replicas = (obj.get("spec") or {}).get("replicas", 1)
        meta = obj["metadata"]
        scale = {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
                "creationTimestamp": meta["creationTimestamp"],
            },
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas, "selector": kind.scale_selector(obj)},
        }
        return web.json_response(scale)

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, POD, request.match_info.get("namespace"))

    async def _services(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, SERVICE, request.match_info["namespace"])

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        kind = self._kind(info["group"], info["version"], info["plural"])
        if kind is None:
            return self._not_found(None, info["plural"])
        return await self._list_or_watch(request, kind, info["namespace"])

    async def _list_or_watch(
        self, request: web.Request, kind: Kind, namespace: str | None
    ) -> web.StreamResponse:
        query = request.query
        watching = query.get("watch", "").lower() in ("1", "true")
        denied = self._forbidden("watch" if watching else "list", kind.plural, kind.group, namespace)
        if denied is not None:
            return denied
        selector = query.get("labelSelector", "")
        fields = query.get("fieldSelector", "")
        try:
            _fields_match(fields, {})
        except ValueError as error:
            return web.json_response(status(400, "BadRequest", str(error)), status=400)
        if watching:
            return await self._watch(request, kind, namespace, selector, fields)
        items = []
        for (plural, ns, _), obj in sorted(self.objects.items()):
            meta = obj["metadata"]
            if (
                plural == f"{kind.plural}.{kind.group}"
                and namespace in (None, ns)
                and _selector_matches(selector, meta.get("labels") or {})
                and _fields_match(fields, meta)
            ):
                item = copy.deepcopy(obj)
                # List items carry no kind/apiVersion on the wire; the list does.
                del item["kind"], item["apiVersion"]
                items.append(item)
        return web.json_response(
            {
                "kind": f"{kind.kind}List",
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self.revision)},
                "items": items,
            }
        )

    async def _watch(
        self, request: web.Request, kind: Kind, namespace: str | None, selector: str, fields: str = ""
    ) -> web.StreamResponse:
        query = request.query
        since = query.get("resourceVersion", "")
        timeout = float(query.get("timeoutSeconds", "1800"))
        bookmarks = query.get("allowWatchBookmarks", "").lower() == "true"
        watcher = _Watcher(kind, namespace, selector, bookmarks, fields, request=request)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(event: dict[str, Any]) -> None:
            await response.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")

        if since not in ("", "0") and int(since) < self.oldest_revision:
            # What the API server does for a compacted resourceVersion: 200, then one ERROR event.
            gone = status(410, "Expired", f"too old resource version: {since} ({self.oldest_revision})")
            await send({"type": "ERROR", "object": gone})
            await response.write_eof()
            return response
        if since in ("", "0"):
            for (plural, _, _), obj in sorted(self.objects.items()):
                if plural == f"{kind.plural}.{kind.group}" and watcher.wants(obj):
                    await send({"type": "ADDED", "object": obj})
        else:
            for revision, event_type, event_kind, obj in self.history:
                if revision > int(since) and event_kind == kind and watcher.wants(obj):
                    await send({"type": event_type, "object": obj})
        self.watchers.append(watcher)
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), remaining)
                except TimeoutError:
                    break
                if event is None:
                    break
                await send(event)
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.remove(watcher)
        return response


# --- objects as the API serves them -------------------------------------------------------------------


def pod(
    name: str,
    namespace: str,
    labels: dict[str, str],
    node: str | None,
    *,
    phase: str = "Running",
    ready: bool = True,
    deleting: bool = False,
    ports: Sequence[tuple[str, int]] = (),
    ip: str | None = "127.0.0.1",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        metadata["deletionGracePeriodSeconds"] = 30
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.example/app:1",
                "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports],
            }
        ]
    }
    if node:
        spec["nodeName"] = node
    conditions = [
        {"type": "PodScheduled", "status": "True" if node else "False"},
        {"type": "Initialized", "status": "True"},
        {"type": "ContainersReady", "status": "True" if ready else "False"},
        {"type": "Ready", "status": "True" if ready else "False"},
    ]
    pod_status: dict[str, Any] = {"phase": phase, "conditions": conditions}
    if ip and phase == "Running":
        pod_status["podIP"] = ip
        pod_status["podIPs"] = [{"ip": ip}]
    return {"metadata": metadata, "spec": spec, "status": pod_status}


def deployment(name: str, namespace: str, match_labels: dict[str, str], replicas: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": match_labels},
            "template": {"metadata": {"labels": match_labels}, "spec": {"containers": []}},
        },
    }


def scaled_object(
    name: str,
    namespace: str,
    target: dict[str, str] | None,
    triggers: list[dict[str, Any]],
) -> dict[str, Any]:
    spec: dict[str, Any] = {"triggers": triggers}
    if target is not None:
        spec["scaleTargetRef"] = target
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def service(
    name: str, namespace: str, selector: dict[str, str] | None, ports: Sequence[int] = (9002,)
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "clusterIP": "10.96.0.10",
        "ports": [{"name": f"p{p}", "port": p, "targetPort": p, "protocol": "TCP"} for p in ports],
    }
    if selector is not None:
        spec["selector"] = selector
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def inference_pool(
    name: str,
    namespace: str,
    picker: str,
    *,
    kind: str | None = None,
    group: str | None = None,
    model_servers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An InferencePool of inference.networking.k8s.io/v1; kind None leaves endpointPickerRef.kind out (Service)."""
    ref: dict[str, Any] = {"name": picker, "port": {"number": 9002}}
    if kind is not None:
        ref["kind"] = kind
    if group is not None:
        ref["group"] = group
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": model_servers or {"app": "vllm"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": ref,
        },
    }

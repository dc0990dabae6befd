"""Kubernetes API access through kubernetes_asyncio: connection, the few calls discovery makes, errors that name permissions."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
from kubernetes_asyncio import client, config

from keda_gpu_scaler.core.errors import KubeError
from keda_gpu_scaler.pages.jsonpieces import OFF_LOOP_BYTES, loads_in_pieces

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 10.0


class Gone(KubeError):
    """410 Gone: the resourceVersion to watch from is too old; the cache must be listed again."""


@dataclass(frozen=True, slots=True)
class NamedKind:
    """A namespaced resource discovery follows one object of, by name."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str


INFERENCE_POOLS = NamedKind("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool")
SERVICES = NamedKind("", "v1", "services", "Service")
SCALED_OBJECTS = NamedKind("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject")


class ConnectError(Exception):
    """Kubernetes credentials could not be loaded (no in-cluster service account, bad kubeconfig)."""


@dataclass(frozen=True, slots=True)
class Permission:
    """One RBAC permission an API call needs, for messages that say exactly what to grant."""

    verb: str
    resource: str
    group: str = ""
    namespace: str | None = None  # None: cluster-wide

    def __str__(self) -> str:
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        where = f"in namespace {self.namespace!r}" if self.namespace else "cluster-wide"
        return f"{self.verb} {resource} {where}"

    def rule(self) -> str:
        return f"apiGroups: [{self.group!r}], resources: [{self.resource!r}], verbs: [{self.verb!r}]"


def _status_message(body: bytes) -> str:
    try:
        status = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:300]
    if isinstance(status, dict):
        return str(status.get("message") or status.get("reason") or "")
    return ""


def api_error(status: int, body: bytes, permission: Permission) -> KubeError:
    said = _status_message(body)
    if status == 403:
        return KubeError(
            f"Kubernetes RBAC denies the scaler permission to {permission}: grant its ServiceAccount a"
            f" (Cluster)Role rule {{{permission.rule()}}} (the API server said: {said})",
            status,
        )
    if status == 401:
        return KubeError(
            f"the Kubernetes API server rejected the scaler's credentials (401 Unauthorized) when trying to"
            f" {permission}: {said}",
            status,
        )
    if status == 410:
        return Gone(f"410 Gone when trying to {permission}: {said}", status)
    if status == 404:
        return KubeError(f"not found ({permission}): {said}", status)
    return KubeError(f"the Kubernetes API answered {status} when trying to {permission}: {said}", status)


def transport_error(error: BaseException, permission: Permission) -> KubeError:
    detail = "timed out" if isinstance(error, TimeoutError) else f"{type(error).__name__}: {error}"
    return KubeError(f"the Kubernetes API server is unreachable ({detail}) when trying to {permission}")


async def connect(kubeconfig: str | None) -> client.ApiClient:
    """An API client from a kubeconfig (path, or several joined with ':') or the in-cluster service account."""
    configuration = client.Configuration()
    try:
        if kubeconfig:
            await config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration, persist_config=False
            )
        else:
            # Refreshes the projected service-account token as the kubelet rotates it.
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, ValueError) as error:
        source = f"kubeconfig {kubeconfig!r}" if kubeconfig else "the in-cluster service account"
        raise ConnectError(f"cannot load Kubernetes credentials from {source}: {error}") from None
    # One long-lived connection per watched namespace: a pool limit would queue short requests behind them.
    configuration.connection_pool_maxsize = None  # type: ignore[assignment]  # documented: no limit
    if not configuration.proxy:  # a kubeconfig's proxy-url wins, as with kubectl
        configuration.proxy = environment_proxy(configuration.host)
    api_client = client.ApiClient(configuration)
    # The generated client's session trusts the environment: aiohttp then looks up the proxy variables
    # and ~/.netrc in a worker thread on every request, two thread hops per call (4-6 % of the scaler's
    # samples with 500 ScaledObjects re-read every 30 s). The proxy was read once above; netrc
    # credentials would only clash with the bearer token. Its only setter is the constructor.
    session = api_client.rest_client.pool_manager
    session._trust_env = False
    return api_client


def environment_proxy(server: str | None) -> str | None:
    """The proxy the environment names for the API server (HTTPS_PROXY, NO_PROXY, ...), as kubectl reads it."""
    url = urlsplit(server or "")
    if not url.hostname or proxy_bypass(url.hostname):
        return None
    return getproxies().get(url.scheme)


class KubeApi:
    """The few calls discovery makes, answering parsed JSON (no model classes) and raising KubeError."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)

    async def close(self) -> None:
        await self.api_client.close()

    async def _open(
        self, permission: Permission, call: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> aiohttp.ClientResponse:
        # _preload_content=False: the raw response, so lists are not turned into model objects and a
        # watch can be streamed; the generated client still builds the request, URL and credentials.
        try:
            response: aiohttp.ClientResponse = await call(*args, _preload_content=False, **kwargs)
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise transport_error(error, permission) from error
        except client.ApiException as error:  # raised by the client for statuses it sees itself
            raise api_error(
                error.status or 0, str(error.body or error.reason).encode(), permission
            ) from error
        if not 200 <= response.status < 300:  # 201 Created answers a create (a TokenRequest)
            try:
                body = await response.read()
            except (aiohttp.ClientError, TimeoutError):
                body = b""
            finally:
                response.release()
            raise api_error(response.status, body, permission)
        return response

    async def _json(
        self, permission: Permission, call: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        response = await self._open(
            permission, call, *args, _request_timeout=REQUEST_TIMEOUT_SECONDS, **kwargs
        )
        try:
            body = await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise transport_error(error, permission) from error
        finally:
            response.release()
        try:
            if len(body) > OFF_LOOP_BYTES:
                # An unpaginated pod list of a large cluster is megabytes: decoded a pod at a time in a
                # worker thread, not in one call that holds the event loop (and every RPC) meanwhile.
                data = await asyncio.to_thread(loads_in_pieces, body, ("items",))
            else:
                data = json.loads(body)
        except (ValueError, RecursionError) as error:
            raise KubeError(
                f"the Kubernetes API answered something that is not JSON to {permission}"
            ) from error
        if not isinstance(data, dict):
            raise KubeError(f"the Kubernetes API answered an unexpected document to {permission}")
        return data

    async def scaled_object(self, namespace: str, name: str) -> dict[str, Any]:
        permission = Permission("get", "scaledobjects", "keda.sh", namespace)
        return await self._json(
            permission, self._custom.get_namespaced_custom_object, "keda.sh", "v1alpha1", namespace,
            "scaledobjects", name,
        )  # fmt: skip

    async def api_resources(self, group: str, version: str) -> dict[str, Any]:
        # Discovery documents are readable by every authenticated user (the system:discovery role).
        permission = Permission("get", f"/apis/{group}/{version}", "(non-resource URL)")
        return await self._json(permission, self._custom.get_api_resources, group, version)

    async def scale(self, group: str, version: str, namespace: str, plural: str, name: str) -> dict[str, Any]:
        permission = Permission("get", f"{plural}/scale", group, namespace)
        return await self._json(
            permission,
            self._custom.get_namespaced_custom_object_scale,
            group,
            version,
            namespace,
            plural,
            name,
        )

    async def create_token(self, namespace: str, name: str, seconds: int, audience: str) -> dict[str, Any]:
        """A TokenRequest for ServiceAccount namespace/name valid for `audience` only (so not at the API
        server), answered with its status (token, expiry)."""
        permission = Permission("create", "serviceaccounts/token", namespace=namespace)
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds, "audiences": [audience]},
        }
        return await self._json(
            permission, self._core.create_namespaced_service_account_token, name, namespace, body
        )

    def _pod_call(
        self, namespace: str | None, label_selector: str | None
    ) -> tuple[Permission, Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        kwargs: dict[str, Any] = {"label_selector": label_selector} if label_selector else {}
        if namespace is None:
            return Permission("list", "pods"), self._core.list_pod_for_all_namespaces, (), kwargs
        return (
            Permission("list", "pods", namespace=namespace),
            self._core.list_namespaced_pod,
            (namespace,),
            kwargs,
        )

    async def list_pods(self, namespace: str | None, label_selector: str | None) -> dict[str, Any]:
        permission, call, args, kwargs = self._pod_call(namespace, label_selector)
        return await self._json(permission, call, *args, **kwargs)

    async def watch_pods(
        self,
        namespace: str | None,
        label_selector: str | None,
        resource_version: str,
        timeout: float,
        on_open: Callable[[], None] = lambda: None,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Watch events from resource_version on, until the server ends the watch; raises Gone on 410.

        on_open is called once the API server has accepted the watch (before any event arrives).
        """
        permission, call, args, kwargs = self._pod_call(namespace, label_selector)
        async for event in self._watch(permission, call, args, kwargs, resource_version, timeout, on_open):
            yield event

    # --- one named object of a namespace: InferencePools and Services ---------------------------------

    def _named_call(
        self, what: NamedKind, namespace: str, name: str | None
    ) -> tuple[Permission, Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        # metadata.name is a field selector every resource supports: the list and the watch carry only
        # the one object, and watching it needs the same RBAC as watching all of them. No name: all of
        # the namespace's objects of that kind.
        kwargs: dict[str, Any] = {} if name is None else {"field_selector": f"metadata.name={name}"}
        permission = Permission("list", what.plural, what.group, namespace)
        if what.group:
            return (
                permission,
                self._custom.list_namespaced_custom_object,
                (what.group, what.version, namespace, what.plural),
                kwargs,
            )
        assert what.plural == "services", what
        return permission, self._core.list_namespaced_service, (namespace,), kwargs

    async def list_named(self, what: NamedKind, namespace: str, name: str | None) -> dict[str, Any]:
        """A list of the objects of kind `what` called `name` in namespace (none or one; all without a name)."""
        permission, call, args, kwargs = self._named_call(what, namespace, name)
        return await self._json(permission, call, *args, **kwargs)

    async def watch_named(
        self,
        what: NamedKind,
        namespace: str,
        name: str | None,
        resource_version: str,
        timeout: float,
        on_open: Callable[[], None] = lambda: None,
    ) -> AsyncGenerator[dict[str, Any], None]:
        permission, call, args, kwargs = self._named_call(what, namespace, name)
        async for event in self._watch(permission, call, args, kwargs, resource_version, timeout, on_open):
            yield event

    async def _watch(
        self,
        permission: Permission,
        call: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        resource_version: str,
        timeout: float,
        on_open: Callable[[], None],
    ) -> AsyncGenerator[dict[str, Any], None]:
        permission = Permission("watch", permission.resource, permission.group, permission.namespace)
        response = await self._open(
            permission,
            call,
            *args,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=resource_version,
            timeout_seconds=int(timeout),
            # No total deadline: the server ends the watch; a silent connection is caught by the read timeout.
            _request_timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=REQUEST_TIMEOUT_SECONDS, sock_read=timeout + 30
            ),
            **kwargs,
        )
        on_open()
        try:
            # The watch wire format: one JSON event {"type": ..., "object": ...} per line.
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError(event)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise api_error(int(status.get("code") or 500), json.dumps(status).encode(), permission)
                yield event
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise transport_error(error, permission) from error
        except ValueError as error:
            raise KubeError(
                f"the Kubernetes API sent a watch event that is not a JSON object ({permission})"
            ) from error
        finally:
            response.release()

"""Kubernetes API access through kubernetes_asyncio: connection, errors that name permissions, list+watch caches."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from keda_gpu_scaler.discovery.pods import PodInfo, pod_info

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 10.0
# The API server ends a watch after timeoutSeconds; informers in client-go pick 5-10 minutes at random
# so that many watches do not all reconnect at once.
WATCH_TIMEOUT_SECONDS = 300.0
MAX_BACKOFF_SECONDS = 30.0


class KubeError(Exception):
    """A failed API call, with a message that says what was attempted and what to do about it."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Gone(KubeError):
    """410 Gone: the resourceVersion to watch from is too old; the cache must be listed again."""


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
    return client.ApiClient(configuration)


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
            raise transport_error(error, permission) from None
        except client.ApiException as error:  # raised by the client for statuses it sees itself
            raise api_error(error.status or 0, str(error.body or error.reason).encode(), permission) from None
        if response.status != 200:
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
            raise transport_error(error, permission) from None
        finally:
            response.release()
        try:
            data = json.loads(body)
        except ValueError:
            raise KubeError(
                f"the Kubernetes API answered something that is not JSON to {permission}"
            ) from None
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
            raise transport_error(error, permission) from None
        except ValueError:
            raise KubeError(
                f"the Kubernetes API sent a watch event that is not a JSON object ({permission})"
            ) from None
        finally:
            response.release()


def _backoff(failures: int) -> float:
    return min(MAX_BACKOFF_SECONDS, 0.2 * 2.0 ** min(failures - 1, 10))


def _resource_version(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata") or {}
    version = meta.get("resourceVersion")
    return str(version) if version else None


class PodInformer:
    """A list+watch cache of pods (one namespace, or all namespaces with a label selector).

    Lists, then watches from the list's resourceVersion with bookmarks; a 410 Gone relists; other
    failures retry with a bounded backoff. While the last attempt failed, `error` says why, and readers
    must not trust `pods` (the API server may have moved on without us).
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str | None,
        label_selector: str | None,
        on_change: Callable[[], None],
        on_restart: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.label_selector = label_selector
        self._on_change = on_change
        self._on_restart = on_restart
        self.pods: dict[str, PodInfo] = {}
        self.synced = False
        self.error: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def what(self) -> str:
        where = f"namespace {self.namespace!r}" if self.namespace else "all namespaces"
        return f"pods in {where}" + (f" with labels {self.label_selector!r}" if self.label_selector else "")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"informer {self.what}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        version: str | None = None
        failures = 0
        while True:
            started = loop.time()
            events = 0
            try:
                if version is None:
                    version = await self._relist()
                async with contextlib.aclosing(
                    self._api.watch_pods(
                        self.namespace,
                        self.label_selector,
                        version,
                        WATCH_TIMEOUT_SECONDS * random.uniform(1.0, 2.0),
                        on_open=lambda: self._set_error(None),
                    )
                ) as stream:
                    async for event in stream:
                        events += 1
                        version = self._apply(event) or version
            except Gone:
                log.info("%s: resourceVersion %s is too old (410 Gone): listing again", self.what, version)
                self._on_restart("gone")
                version = None
                continue
            except KubeError as error:
                failures += 1
                self._set_error(str(error))
                self._on_restart("error")
                delay = _backoff(failures)
                log.warning("%s: %s; retrying in %.1fs", self.what, error, delay)
                await asyncio.sleep(delay * random.uniform(0.8, 1.0))
                continue
            except Exception as error:
                # Anything else (an object this code cannot read) must not end the watcher silently and
                # leave a cache that looks current: report it (calls answer UNAVAILABLE) and list again.
                failures += 1
                self._set_error(f"unexpected error watching {self.what}: {error!r}")
                self._on_restart("error")
                log.exception("%s: unexpected error; listing again", self.what)
                version = None
                await asyncio.sleep(_backoff(failures) * random.uniform(0.8, 1.0))
                continue
            # The server ended the watch. Reconnect at once, unless it keeps ending watches straight away.
            if events == 0 and loop.time() - started < 1.0:
                failures += 1
                await asyncio.sleep(_backoff(failures))
            else:
                failures = 0

    async def _relist(self) -> str:
        listing = await self._api.list_pods(self.namespace, self.label_selector)
        pods = {}
        for item in listing.get("items") or ():
            info = pod_info(item)
            pods[info.key] = info
        self.pods = pods
        self.synced = True
        self._set_error(None)
        self._on_change()
        version = _resource_version(listing)
        if version is None:
            raise KubeError(f"the Kubernetes API listed {self.what} without a resourceVersion")
        return version

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind in ("ADDED", "MODIFIED"):
            info = pod_info(obj)
            self.pods[info.key] = info
            self._on_change()
        elif kind == "DELETED":
            info = pod_info(obj)
            self.pods.pop(info.key, None)
            self._on_change()
        # BOOKMARK: nothing changed, but the resourceVersion moved on, so a reconnect resumes from there.
        return _resource_version(obj)

    def _set_error(self, error: str | None) -> None:
        if error != self.error:
            self.error = error
            self._on_change()

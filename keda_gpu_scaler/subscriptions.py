"""Keeps what each followed trigger needs collected in step with discovery, so evaluation only reads.

Inference triggers with Kubernetes read their target pods' own pages (SPEC §6). Which pages a trigger
wants follows discovery's answer for it: worked out again when discovery says the pods of its namespace
changed and when the subscription starts, never by an evaluation. A dropped subscription (a trigger
edited away, its ScaledObject forgotten) releases its pages at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from keda_gpu_scaler.collect.inference import WantedPages, metrics_port, pod_url
from keda_gpu_scaler.discovery.targets import Targets
from keda_gpu_scaler.errors import NoData
from keda_gpu_scaler.registry import Followed, Subscription
from keda_gpu_scaler.trigger import TriggerSpec

log = logging.getLogger(__name__)

Resolve = Callable[[str, str, TriggerSpec], Targets]


class PodPageSubscriptions:
    """Which target-pod pages each followed inference trigger wants, kept current from discovery."""

    def __init__(
        self,
        *,
        resolve: Resolve,
        pages: WantedPages,
        followed_in: Callable[[str], Iterable[Followed]],
        reads_pod_pages: Callable[[TriggerSpec], bool],
    ) -> None:
        self._resolve = resolve
        self._pages = pages
        self._followed_in = followed_in
        self._reads_pod_pages = reads_pod_pages
        self._due: set[str] = set()  # namespaces whose refresh is scheduled for the next loop turn

    def changed(self, namespace: str) -> None:
        """Discovery: the pods (or selectors) of a namespace changed. Coalesced: one pod event or a
        relist of thousands costs one refresh per loop turn."""
        if namespace in self._due:
            return
        self._due.add(namespace)
        asyncio.get_running_loop().call_soon(self._refresh_due, namespace)

    def subscribed(self, followed: Followed, subscription: Subscription) -> None:
        """A new trigger is followed: its pages are wanted as soon as discovery knows its pods."""
        self._refresh(followed, subscription)

    def dropped(self, followed: Followed, subscription: Subscription) -> None:
        if subscription.pages_from is not None:
            self._pages.release(_owner(followed, subscription))
            subscription.pages_from = None

    def _refresh_due(self, namespace: str) -> None:
        self._due.discard(namespace)
        for followed in self._followed_in(namespace):
            for subscription in list(followed.triggers.values()):
                self._refresh(followed, subscription)

    def _refresh(self, followed: Followed, subscription: Subscription) -> None:
        spec = subscription.spec
        if not self._reads_pod_pages(spec):
            return
        try:
            targets = self._resolve(followed.namespace, followed.name, spec)
        except NoData:
            return  # discovery does not know (yet, or for now): the pages wanted so far stay wanted
        before = subscription.pages_from
        if before is not None and before.endpoints is targets.endpoints:
            return  # one endpoints mapping per snapshot of the selection: the same pods, the same pages
        subscription.pages_from = targets
        pages: dict[str, tuple[str, str]] = {}
        declared: set[str] = set()  # pages at a port their pod declares (it owns that address:port)
        for pod in targets.pods:
            endpoint = targets.endpoints.get(pod)
            if endpoint is None or not endpoint.ready or not endpoint.ip:
                continue
            port = metrics_port(endpoint.port_list, spec.metrics_port)
            if port is None:
                followed.log_once(
                    f"pod {pod} has no container port {spec.metrics_port or 'named metrics or http, nor any'}:"
                    " its inference-server page cannot be read (set metricsPort)"
                )
                continue
            url = pod_url(endpoint.ip, port, spec.metrics_path)
            pages[url] = (followed.namespace, pod)
            if any(number == port for _, number in endpoint.port_list):
                declared.add(url)
        self._pages.want(_owner(followed, subscription), pages, declared)
        for url, binding in pages.items():
            if self._pages.filed_under(url) != binding:
                followed.log_once(
                    f"pod {binding[1]}: {url} is not read for it: another pod at the same address (e.g. hostNetwork"
                    " pods sharing a node's IP) is named for that page too, and a page is read only for the one pod"
                    " among them that declares its port as a container port"
                )


def _owner(followed: Followed, subscription: Subscription) -> tuple[str, str, TriggerSpec]:
    return (followed.namespace, followed.name, subscription.spec)

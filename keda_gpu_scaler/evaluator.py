"""Answers "what is this ScaledObject's value now?" from the store, without any I/O."""

from __future__ import annotations

from collections.abc import Callable

from keda_gpu_scaler.collect.scrape import Interest
from keda_gpu_scaler.collect.store import Store
from keda_gpu_scaler.errors import ConfigError, NoData
from keda_gpu_scaler.scaling import Evaluation, evaluate, pod_values
from keda_gpu_scaler.telemetry import Telemetry
from keda_gpu_scaler.trigger import Source, TriggerSpec


class Evaluator:
    def __init__(
        self,
        *,
        store: Store,
        interest: Interest,
        telemetry: Telemetry,
        max_staleness: float,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._interest = interest
        self._telemetry = telemetry
        self._max_staleness = max_staleness
        self._clock = clock

    def check(self, spec: TriggerSpec) -> None:
        """Reject triggers this server's configuration cannot serve (INVALID_ARGUMENT), before any data."""
        if spec.source is Source.PROMETHEUS:
            raise ConfigError(
                "metadata source='prometheus' is not available: this server has no Prometheus source configured;"
                " allowed: scrape"
            )
        if spec.pod_selector is not None:
            raise ConfigError(
                f"metadata podSelector={spec.pod_selector!r} needs Kubernetes discovery, which is off on this server;"
                " use podNamePrefix"
            )
        if spec.pod_name_prefix is None:
            raise ConfigError(
                "metadata podNamePrefix is required when the server runs without Kubernetes;"
                " allowed: the common name prefix of the target's pods, e.g. 'vllm-qwen-'"
            )

    def want(self, spec: TriggerSpec) -> None:
        """Note that a trigger wants data, so collection starts (or goes on) without any I/O here."""
        self.check(spec)
        self._interest.touch()

    def evaluate(self, namespace: str, name: str, spec: TriggerSpec) -> Evaluation:
        self.want(spec)
        try:
            evaluation = self._evaluate(namespace, spec)
        except NoData as error:
            self._telemetry.record_evaluation(namespace, name, spec, None, str(error))
            raise
        self._telemetry.record_evaluation(namespace, name, spec, evaluation, None)
        return evaluation

    def _evaluate(self, namespace: str, spec: TriggerSpec) -> Evaluation:
        prefix = spec.pod_name_prefix or ""
        view = self._store.view(namespace, self._clock(), self._max_staleness)
        problems = "; ".join(view.problems[:5])
        if view.sources == 0:
            raise NoData("no exporters are configured (--exporter-url) and no other source is available")
        if view.fresh_sources == 0:
            raise NoData(f"no exporter has fresh data: {problems}")
        families = spec.vendor.families
        readings = [r for r in view.readings if r.pod.startswith(prefix) and r.family in families]
        reporting = pod_values(readings, spec)
        # Target pods = pods the fresh pages name (with or without a usable value) + pods recently seen on
        # exporters that are now failing or stale; those without a value count as missing.
        named = {r.pod for r in readings}
        named.update(pod for pod in view.recently_seen if pod.startswith(prefix))
        try:
            return evaluate(reporting, named - reporting.keys(), spec, spec.effective_aggregation)
        except NoData as error:
            raise NoData(f"{error}{'; ' + problems if problems else ''}") from None

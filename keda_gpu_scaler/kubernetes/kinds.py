"""Which resource serves a scale target's kind, found through API discovery and kept for a while."""

from __future__ import annotations

from collections.abc import Callable

from keda_gpu_scaler.core.errors import KubeError
from keda_gpu_scaler.kubernetes.api import KubeApi
from keda_gpu_scaler.kubernetes.scaledobject import ScaleTarget

# How long a kind → plural look-up is trusted before a miss, or a kind without /scale, triggers a new
# discovery request (a CRD installed after the scaler started, or one that gains its /scale subresource in
# an upgrade, must become usable without a restart).
DISCOVERY_CACHE_SECONDS = 60.0


class ScaleKinds:
    """Kind → resource name (plural) per API group version, so any kind with a /scale subresource works."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._by_group: dict[tuple[str, str], tuple[float, dict[str, tuple[str, bool]]]] = {}

    async def plural(self, api: KubeApi, target: ScaleTarget) -> str:
        """The target's resource name; KubeError naming what is wrong when KEDA could not scale it either."""
        if not target.group:
            raise KubeError(
                f"scaleTargetRef apiVersion {target.api_version!r} (the core API group) is not supported"
            )
        key = (target.group, target.version)
        cached = self._by_group.get(key)
        now = self._clock()
        usable = cached is not None and cached[1].get(target.kind, ("", False))[1]
        if cached is None or (not usable and now - cached[0] > DISCOVERY_CACHE_SECONDS):
            document = await api.api_resources(target.group, target.version)
            names = {r.get("name") for r in document.get("resources") or ()}
            kinds = {
                r["kind"]: (r["name"], f"{r['name']}/scale" in names)
                for r in document.get("resources") or ()
                if r.get("kind") and r.get("name") and "/" not in r["name"]
            }
            cached = (now, kinds)
            self._by_group[key] = cached
        found = cached[1].get(target.kind)
        if found is None:
            raise KubeError(f"the API server does not serve kind {target.kind!r} in {target.api_version!r}")
        plural, has_scale = found
        if not has_scale:
            raise KubeError(f"kind {target.kind!r} has no /scale subresource, so KEDA cannot scale it either")
        return plural

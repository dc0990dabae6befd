"""The Kubernetes API client, for imports written before it moved to api.py (informers: informer.py)."""

from keda_gpu_scaler.discovery.api import ConnectError, Gone, KubeApi, KubeError, Permission, connect

__all__ = ["ConnectError", "Gone", "KubeApi", "KubeError", "Permission", "connect"]

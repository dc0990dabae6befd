"""keda-gpu-scaler: a KEDA external scaler for GPU workloads."""

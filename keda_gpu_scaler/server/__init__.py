"""The scaler as KEDA and operators reach it: gRPC, HTTP, admission, TLS, its own metrics and logs."""

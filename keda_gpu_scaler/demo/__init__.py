"""The demo (`keda-gpu-scaler demo`, `make run`): a simulated GPU fleet, LLM servers and an inference gateway on
loopback beside a real scaler. Not the product's core: nothing outside this package and the tests imports it."""

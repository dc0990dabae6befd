"""keda-gpu-scaler: a KEDA external scaler for GPU workloads and the LLM servers that run on them."""

# The one place the version is written: pyproject.toml reads it (setuptools' dynamic version), `--version`
# prints it, and a test checks the chart's appVersion, the image tags of manifests/ and the changelog
# against it. The image `make image` builds is tagged with it, the tag the chart and manifests expect.
__version__ = "0.5.0"

"""Error types of the domain; service.py maps each to one gRPC status code (walking the class hierarchy)."""

from __future__ import annotations


class ScalerError(Exception):
    """Base of the errors a call can answer with."""


class ConfigError(ScalerError):
    """Bad trigger metadata or a request the server's configuration cannot serve (INVALID_ARGUMENT)."""


class NoData(ScalerError):
    """The value cannot be computed from fresh data (UNAVAILABLE): never answered with a made-up 0."""


class UnknownMetric(ScalerError):
    """GetMetrics asked for a metric name this trigger does not serve (NOT_FOUND)."""


class ResourceExhausted(ScalerError):
    """A limit of the server is reached (RESOURCE_EXHAUSTED); the message names the flag that sets it."""


class TooManyStreams(ResourceExhausted):
    """More streams of one RPC (StreamIsActive, StreamMetricSpec) than --max-streams."""


class TooManyScaledObjects(ResourceExhausted):
    """More ScaledObjects followed at once than --max-scaledobjects."""


class KubeError(Exception):
    """A failed Kubernetes API call, with a message that says what was attempted and what to do about it
    (raised by kubernetes/api.py; here so that what only catches it need not import the API client)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def quoted(text: str, limit: int = 100) -> str:
    """repr() of caller input for an error message, cut to `limit` characters so errors cannot echo megabytes."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"

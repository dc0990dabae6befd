"""Error types of the domain; service.py maps each to one gRPC status code."""

from __future__ import annotations


class ScalerError(Exception):
    """Base of the errors a call can answer with."""


class ConfigError(ScalerError):
    """Bad trigger metadata or a request the server's configuration cannot serve (INVALID_ARGUMENT)."""


class NoData(ScalerError):
    """The value cannot be computed from fresh data (UNAVAILABLE): never answered with a made-up 0."""


class UnknownMetric(ScalerError):
    """GetMetrics asked for a metric name this trigger does not serve (NOT_FOUND)."""


class TooManyStreams(ScalerError):
    """More StreamIsActive streams than --max-streams (RESOURCE_EXHAUSTED)."""

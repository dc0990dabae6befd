"""Kubernetes name rules and page URLs, checked wherever one comes from outside (gRPC calls, flags)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# A namespace is a DNS-1123 label; a pod or ScaledObject name a DNS-1123 subdomain.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")

NAMESPACE_RULE = "at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit"
OBJECT_NAME_RULE = (
    "at most 253 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
)


def is_namespace(name: str) -> bool:
    return _DNS_LABEL.fullmatch(name) is not None


def is_object_name(name: str) -> bool:
    return _DNS_SUBDOMAIN.fullmatch(name) is not None


def is_http_url(url: str) -> bool:
    """An http(s) URL with a host, and a port of 1-65535 where one is given: what a page can be read at
    (an unclosed IPv6 bracket or port 99999 made urlsplit raise, or every read fail)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and port != 0

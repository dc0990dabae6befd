"""The fake API server's label and field selectors: the forms the tests use, kept apart from the scaler's
own parser so that the two check each other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    # The equality-based forms the tests use (k=v, k==v, k!=v, k, !k), kept apart from the scaler's parser.
    for part in filter(None, (p.strip() for p in selector.split(","))):
        if "!=" in part:
            key, value = part.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in part:
            key, value = part.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif part.startswith("!"):
            if part[1:].strip() in labels:
                return False
        elif part not in labels:
            return False
    return True


def _fields_match(selector: str, meta: Mapping[str, Any]) -> bool:
    # The field selectors every resource supports: metadata.name and metadata.namespace (= and ==, !=).
    for part in filter(None, (p.strip() for p in selector.split(","))):
        negate = "!=" in part
        field_name, value = part.replace("!=", "=").replace("==", "=").split("=", 1)
        have = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace")}
        if field_name.strip() not in have:
            raise ValueError(f"field label not supported: {field_name.strip()}")
        if (have[field_name.strip()] == value.strip()) == negate:
            return False
    return True

"""Keep the Helm chart in step with the scaler: its flag values, its values schema, its table of values.

`make chart-docs` rewrites, from settings.FLAGS and the `# --` comments of values.yaml:
  - the `flags:` block of charts/keda-gpu-scaler/values.yaml (one value per `serve` flag),
  - the `flags` property of charts/keda-gpu-scaler/values.schema.json,
  - the table of values in charts/keda-gpu-scaler/README.md (between chart-values markers; README.md links it).
The chart tests check that running it would change nothing.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from keda_gpu_scaler.config.flags import FLAGS, Flag  # noqa: E402
from keda_gpu_scaler.core.value_parsers import NumberParser  # noqa: E402

CHART = ROOT / "charts" / "keda-gpu-scaler"
VALUES = CHART / "values.yaml"
SCHEMA = CHART / "values.schema.json"
READMES = (CHART / "README.md",)

# Flags the chart sets from values of their own (a port, a Secret it mounts, a switch), not from `flags`.
STRUCTURED: dict[str, str] = {
    "--grpc-address": "service.grpcPort",
    "--http-address": "service.httpPort",
    "--exporter-selector": "exporterSelectors",
    "--tls-cert-file": "tls.enabled",
    "--tls-key-file": "tls.enabled",
    "--tls-client-ca-file": "tls.mtls.enabled",
    "--explain": "explain.enabled",
    "--gateway-token-file": "gateway.metricsToken.existingSecret",
    "--gateway-token-serviceaccount": "gateway.metricsToken.mode",
    "--gateway-token-plain-http": "gateway.metricsToken.plainHTTP",
}
# Where the chart's default differs from the scaler's, as in manifests/base: in a cluster the scaler
# finds pods and exporters itself, and logs are JSON.
CHART_DEFAULTS: dict[str, str] = {"--kubernetes": "on", "--log-format": "json"}

FLAGS_BEGIN, FLAGS_END = "# flags:begin\n", "# flags:end\n"
TABLE_BEGIN, TABLE_END = "<!-- chart-values:begin -->\n", "<!-- chart-values:end -->\n"


def value_name(flag: Flag) -> str:
    """--max-staleness → maxStaleness (the chart turns it back into KEDA_GPU_SCALER_MAX_STALENESS)."""
    head, *rest = flag.name.removeprefix("--").split("-")
    return head + "".join(part.capitalize() for part in rest)


def chart_flags() -> list[Flag]:
    return [flag for flag in FLAGS if flag.name not in STRUCTURED]


def flags_block() -> str:
    lines = ["flags:\n"]
    for flag in chart_flags():
        default = CHART_DEFAULTS.get(flag.name)
        scaler_default = "none" if flag.default is None else f"`{flag.default}`"
        help_text = flag.help[0].upper() + flag.help[1:]
        note = f"; the scaler's default: {scaler_default}" if default else f" (default: {scaler_default})"
        if flag.choices:
            note += "; one of " + ", ".join(f"`{c}`" for c in flag.choices)
        lines.append(f"  # -- `{flag.name}`: {help_text}{note}\n")
        value = json.dumps(default) if default is not None else "null"
        lines.append(f"  {value_name(flag)}: {value}\n")
    return "".join(lines)


def flag_schema(flag: Flag) -> dict[str, Any]:
    if flag.choices:
        return {"enum": [*flag.choices, None]}
    if flag.repeatable:
        return {"type": ["array", "null"], "items": {"type": "string", "minLength": 1}}
    if isinstance(flag.parse, NumberParser):
        return number_schema(flag.parse)
    return {"type": ["string", "number", "null"]}


def number_schema(parse: NumberParser) -> dict[str, Any]:
    """What a number flag's parser takes (> 0, within its bounds), so that the chart refuses at install what
    the scaler would refuse at start (in a crash loop)."""
    integer = parse.kind is int
    schema: dict[str, Any] = {"type": ["integer" if integer else "number", "null"]}
    if parse.low is not None:
        schema["minimum"] = parse.low
    elif integer:
        schema["minimum"] = 1
    else:
        schema["exclusiveMinimum"] = 0
    if parse.high is not None:
        schema["maximum"] = parse.high
    return schema


def schema_text(current: str) -> str:
    schema = json.loads(current)
    schema["properties"]["flags"] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {value_name(flag): flag_schema(flag) for flag in chart_flags()},
    }
    return json.dumps(schema, indent=2) + "\n"


def values_text(current: str) -> str:
    head, _, rest = current.partition(FLAGS_BEGIN)
    _, _, tail = rest.partition(FLAGS_END)
    return head + FLAGS_BEGIN + flags_block() + FLAGS_END + tail


_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?P<rest>.*)$")


def documented_values(text: str) -> list[tuple[str, str]]:
    """(dotted key, description) of every `# --` comment, in file order.

    A documented key's children are part of its row. An undocumented key must be a map whose children are
    documented: a bare undocumented value is an error, so nothing is left out of the table.
    """
    rows: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    skip_deeper_than: int | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped.removeprefix("# --").strip()]
            continue
        if stripped.startswith("#") or not stripped:
            if pending is not None and stripped.startswith("#"):
                pending.append(stripped.lstrip("#").strip())
            continue
        match = _KEY.match(line)
        indent = len(line) - len(line.lstrip(" "))
        if skip_deeper_than is not None:
            if indent > skip_deeper_than or stripped.startswith("- "):
                continue
            skip_deeper_than = None
        if match is None or stripped.startswith("- "):
            raise ValueError(f"values.yaml line {number}: not a documented key: {line!r}")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [match["key"]])
        if pending is not None:
            rows.append((path, " ".join(pending)))
            pending = None
            skip_deeper_than = indent
            continue
        if match["rest"].strip():
            raise ValueError(f"values.yaml line {number}: {path} has no `# --` comment")
        stack.append((indent, match["key"]))
    return rows


def _lookup(values: dict[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        node = node[part]
    return node


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def values_table(text: str) -> str:
    values = yaml.safe_load(text)
    lines = ["| value | default | meaning |\n", "|---|---|---|\n"]
    for path, description in documented_values(text):
        default = json.dumps(_lookup(values, path), separators=(",", ":"))
        lines.append(f"| `{path}` | `{_cell(default)}` | {_cell(description)} |\n")
    return "".join(lines)


def with_table(readme: str, table: str) -> str:
    head, sep, rest = readme.partition(TABLE_BEGIN)
    if not sep:
        raise ValueError(f"no {TABLE_BEGIN.strip()} marker")
    _, sep, tail = rest.partition(TABLE_END)
    if not sep:
        raise ValueError(f"no {TABLE_END.strip()} marker")
    return head + TABLE_BEGIN + table + TABLE_END + tail


def expected() -> dict[Path, str]:
    """Every generated file as it should be now."""
    values = values_text(VALUES.read_text())
    table = values_table(values)
    files = {VALUES: values, SCHEMA: schema_text(SCHEMA.read_text())}
    for readme in READMES:
        files[readme] = with_table(readme.read_text(), table)
    return files


def main() -> None:
    for path, text in expected().items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"updated {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

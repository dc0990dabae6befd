"""Generate the externalscaler gRPC stubs into keda_gpu_scaler/externalscaler (used by `make proto` and the build hook)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PROTO_FILE = "externalscaler.proto"


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # build-time dependency only

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "__init__.py").write_text('"""Generated externalscaler stubs (never committed)."""\n')
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO_DIR / PROTO_FILE),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed for {PROTO_DIR / PROTO_FILE}")
    # protoc writes `import externalscaler_pb2`, which only works from the output directory itself;
    # inside a package the gRPC module must import its messages relative to the package.
    grpc_module = out_dir / "externalscaler_pb2_grpc.py"
    text = grpc_module.read_text()
    text = re.sub(r"^import externalscaler_pb2 as", "from . import externalscaler_pb2 as", text, flags=re.M)
    grpc_module.write_text(text)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "keda_gpu_scaler" / "externalscaler"
    generate(target)

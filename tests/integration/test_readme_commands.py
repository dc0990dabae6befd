"""The shell commands of the README and the docs it moved its reference to still run: every command of
their ```sh blocks that this suite can run (the demo's grpcurl and curl commands against a running demo,
the CLI's help and version) is run as written, with the demo's ports moved to free ones. The rest is
listed with the reason it is not run here."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import sys
from pathlib import Path

import pytest
from support import eventually

ROOT = Path(__file__).resolve().parents[2]
# The README and the documents that hold what moved out of it.
DOCS = tuple(
    ROOT / name for name in ("README.md", "docs/operating.md", "docs/reference.md", "docs/development.md")
)

# Commands not run here, by their first word, and why.
NOT_RUN = {
    "make": "builds or runs the whole project (run by hand and in CI)",
    "docker": "needs a container engine (`make test-container` tests the image)",
    "helm": "needs a cluster (tests/integration/test_chart.py renders and lints the chart)",
    "kubectl": "needs a cluster (tests/integration/test_manifests.py validates the manifests)",
    "kustomize": "needs a cluster (tests/integration/test_manifests.py renders the manifests)",
    "cd": "part of a kustomize step",
    "cosign": "verifies a published image's signature (needs the registry and Sigstore)",
}
# The demo's default ports, as the README's commands name them.
DEMO_PORTS = {"grpc": 6000, "http": 8080, "control": 8081}


def shell_blocks(text: str) -> list[str]:
    """The ```sh blocks, and the commands (`$ ` lines) of the ```console blocks, which also show output."""
    blocks = re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M)
    for console in re.findall(r"^```console\n(.*?)^```", text, re.S | re.M):
        joined = re.sub(r"\\\n\s*", " ", console)
        blocks.append("\n".join(line[2:] for line in joined.splitlines() if line.startswith("$ ")))
    return blocks


def commands(block: str) -> list[str]:
    """The block's commands, continuation lines joined, comments and blank lines left out."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def runnable(command: str) -> bool:
    """A command this suite runs: against the loopback demo only, or the CLI asked for help or version."""
    first = command.split()[0]
    if first in NOT_RUN or "<" in command:  # `<a GPU pod from the banner>`: a placeholder to fill in
        return False
    if first == "grpcurl":
        # StreamIsActive and StreamMetricSpec stream until stopped: test_grpcurl, test_service and
        # test_spec_stream read streams.
        return "/Stream" not in command
    if first == "curl":
        return "http://127.0.0.1:" in command
    if first in ("keda-gpu-scaler", "python") and re.search(r"\s--(help|version)\b", command):
        return True
    # Assignments and `export` set what the next commands use.
    return bool(re.match(r"(export\s+)?[A-Z_]+=", command))


def every_block() -> list[str]:
    return [block for document in DOCS for block in shell_blocks(document.read_text())]


def test_the_docs_have_commands_to_run_and_say_why_others_are_not() -> None:
    every = [c for block in every_block() for c in commands(block)]
    assert sum(1 for c in every if c.startswith("grpcurl") and runnable(c)) >= 4
    assert any(c.startswith("curl") and runnable(c) for c in every)
    for command in every:
        first = command.split()[0]
        known = runnable(command) or first in NOT_RUN or "<" in command
        known = known or first in ("grpcurl", "keda-gpu-scaler", "curl", "python")
        assert known, f"the documented command {command!r} is neither run here nor listed in NOT_RUN"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def start_demo() -> tuple[asyncio.subprocess.Process, dict[str, int]]:
    control = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "keda_gpu_scaler",
        "demo",
        "--grpc-address",
        "127.0.0.1:0",
        "--http-address",
        "127.0.0.1:0",
        "--control-port",
        str(control),
        "--scrape-interval",
        "0.5",
        "--watch-interval",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    banner = ""
    while "gRPC (KEDA's side)" not in banner:
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert line, "the demo ended before printing its banner"
        banner += line.decode()
    found = re.search(
        r"gRPC \(KEDA's side\)\s+127\.0\.0\.1:(\d+)\s+HTTP\s+http://127\.0\.0\.1:(\d+)/", banner
    )
    assert found, banner
    return process, {"grpc": int(found.group(1)), "http": int(found.group(2)), "control": control}


def on_ports(command: str, ports: dict[str, int]) -> str:
    for name, default in DEMO_PORTS.items():
        command = command.replace(f"127.0.0.1:{default}", f"127.0.0.1:{ports[name]}")
    return command


@pytest.mark.grpcurl
async def test_every_documented_command_the_suite_can_run_still_runs() -> None:
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "grpcurl").exists() and not shutil.which("grpcurl"):
        pytest.skip("grpcurl is not installed (`make run` installs it in .venv/bin)")
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    process, ports = await start_demo()
    try:
        for block in every_block():
            script = [on_ports(c, ports) for c in commands(block) if runnable(c)]
            if not any(not re.match(r"(export\s+)?[A-Z_]+=", c) for c in script):
                continue
            # Each command must succeed; curl fails on an HTTP error as a person would notice one.
            text = 'set -euo pipefail\ncurl() { command curl --fail --silent --show-error "$@"; }\n'
            text += "\n".join(script) + "\n"

            async def block_runs(text: str = text) -> None:
                run = await asyncio.create_subprocess_exec(
                    "bash",
                    "-c",
                    text,
                    cwd=ROOT,
                    env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                out, err = await asyncio.wait_for(run.communicate(), 30)
                assert run.returncode == 0, f"{text}\n{out.decode()}\n{err.decode()}"

            # The demo's first scrapes may not have landed yet: a block may take a moment to pass.
            await eventually(block_runs, timeout=15, interval=0.5)
    finally:
        process.terminate()
        await process.wait()

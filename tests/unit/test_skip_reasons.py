"""The suite's pytest settings list every skipped test with its reason, as the README promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_skipped_test_is_listed_with_its_reason(tmp_path: Path) -> None:
    test = tmp_path / "test_skips.py"
    test.write_text(
        "import pytest\n\n\ndef test_needs_a_tool() -> None:\n    pytest.skip('the tool is not installed')\n"
    )
    # The project's own configuration, on a test file of its own: what `make test` prints for a skip.
    command = [sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml")]
    done = subprocess.run(
        [*command, "--rootdir", str(tmp_path), "-p", "no:randomly", "-p", "no:cacheprovider", str(test)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIPPED [1] test_skips.py:5: the tool is not installed" in done.stdout, done.stdout

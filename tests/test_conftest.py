"""The test suite's own layout: what tests/conftest.py promises about the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_each_test_file_runs_as_one_block():
    """pytest reorders tests to share session-scoped parametrized fixtures (``case``,
    ``any_case``) across files, which made the progress line list a file up to six times;
    conftest.py keeps each file's tests together, in collection order."""
    files = ["test_sharpness.py", "test_every_tool.py", "backends/test_backends.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *files], cwd=HERE,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    order = [line.split("::")[0] for line in done.stdout.splitlines() if "::" in line]
    blocks = [f for k, f in enumerate(order) if k == 0 or order[k - 1] != f]
    assert blocks == [f"tests/{f}" for f in files], blocks

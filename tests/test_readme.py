"""The README's first example runs as written, and the demo CLI works."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs():
    pytest.importorskip("xarray")
    if not README.exists():
        pytest.skip("README.md not next to the tests (installed elsewhere)")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    namespace: dict = {}  # the examples build on each other, as in a session
    for code in blocks:
        exec(compile(code, str(README), "exec"), namespace)


#: What tests skip without, that the test extra leaves out on purpose: PyTorch (several GB;
#: CI installs a CPU build in a step of its own) and scikit-learn (the digits extra's data).
LEFT_OUT = {"torch", "scikit-learn"}
#: The distribution that provides a module the tests import, where the names differ.
PROVIDER = {"sklearn": "scikit-learn", "distributed": "dask"}


def test_the_test_extra_installs_what_the_tests_would_skip_without():
    """``pip install ".[test]" && pytest -n auto`` (the README's command) runs every test but those
    of LEFT_OUT: a package a test file skips without is in the test extra."""
    root = README.parent
    if not (root / "pyproject.toml").is_file():
        pytest.skip("pyproject.toml not next to the tests")
    import tomllib
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["test"]
    installed = {re.match(r"[A-Za-z0-9_.-]+", req)[0].lower() for req in extra}
    skipped = {m[1].split(".")[0] for path in (root / "tests").rglob("*.py")
               for m in re.finditer(r"importorskip\(\"([\w.]+)\"", path.read_text())}
    needed = {PROVIDER.get(name, name) for name in skipped} - {"pysharp"}
    assert needed - installed == LEFT_OUT, needed - installed


def test_demo_quick(tmp_path, capsys):
    pytest.importorskip("xarray")
    from pysharp.cli import main

    assert main(["demo", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "EoS entry at step" in out
    # the theory's reduction runs from the edge onwards: entry -> end, and it falls
    m = re.search(r"spherical sharpness ([\d.]+) at EoS entry -> ([\d.]+) at the end", out)
    assert m, out
    assert float(m[1]) > float(m[2])
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert summary["sharpness_at_entry"] == pytest.approx(float(m[1]), abs=1e-3)
    assert summary["sharpness_at_entry"] > summary["sharpness_end"]


def test_python_dash_m_runs_the_cli(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pysharp", "info"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "backends:" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "pysharp", "reproduce", "nope"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert bad.returncode == 2 and "unknown experiment" in bad.stderr

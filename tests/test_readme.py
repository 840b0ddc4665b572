"""The README's first example runs as written, and the demo CLI works."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs():
    if not README.exists():
        pytest.skip("README.md not next to the tests (installed elsewhere)")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    namespace: dict = {}  # the examples build on each other, as in a session
    for code in blocks:
        exec(compile(code, str(README), "exec"), namespace)


def test_demo_quick(tmp_path, capsys):
    from pysharp.cli import main

    assert main(["demo", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "EoS entry at step" in out
    assert (tmp_path / "demo.json").exists()

"""Regenerate, or check, the type stub of the compiled core (pysharp/_core.pyi).

The stub is made from the built module by pybind11-stubgen (the ``lint`` extra pins
it), formatted by ruff and headed by a comment that says how it was made.

Usage (from the repository root, with pysharp built and installed)::

    python tools/stubs.py            # rewrite pysharp/_core.pyi
    python tools/stubs.py --check    # exit 1, naming the first difference, if it is stale
    python tools/stubs.py --module _cuda   # the CUDA module's stub (needs a PYSHARP_CUDA=ON build)
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HEADER = """\
# Generated from the built module by pybind11-stubgen, then `ruff format`: do not edit.
# Regenerate after changing the bindings: python tools/stubs.py (--check in CI).
"""


def generate(module: str) -> str:
    """The stub text of ``pysharp.<module>`` as the installed build defines it."""
    mod = importlib.import_module(f"pysharp.{module}")
    with tempfile.TemporaryDirectory() as tmp:
        # Run on the module's own folder, so the installed build is described whatever
        # the working directory holds.
        env_path = str(Path(mod.__file__).resolve().parent.parent)
        subprocess.run([sys.executable, "-m", "pybind11_stubgen", f"pysharp.{module}", "-o", tmp,
                        "--numpy-array-wrap-with-annotated"], check=True,
                       env={"PYTHONPATH": env_path, "PATH": ""}, cwd=tmp,
                       stdout=subprocess.DEVNULL)
        path = Path(tmp) / "pysharp" / f"{module}.pyi"
        text = path.read_text()
        doc_end = text.index('"""', 3) + 3 if text.startswith('"""') else 0
        path.write_text(text[:doc_end] + "\n\n" + HEADER + text[doc_end:])
        for ruff in (["check", "-q", "--select", "I", "--fix"], ["format", "-q"]):
            subprocess.run([sys.executable, "-m", "ruff", *ruff, str(path)], check=True,
                           cwd=ROOT)
        return path.read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="_core", choices=["_core", "_cuda"])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    target = ROOT / "pysharp" / f"{args.module}.pyi"
    fresh = generate(args.module)
    if not args.check:
        target.write_text(fresh)
        print(f"wrote {target.relative_to(ROOT)}")
        return 0
    old = target.read_text()
    if old == fresh:
        print(f"{target.relative_to(ROOT)} is current")
        return 0
    diff = list(difflib.unified_diff(old.splitlines(), fresh.splitlines(), "committed",
                                     "generated", lineterm="", n=1))
    print(f"{target.relative_to(ROOT)} is stale; run `python tools/stubs.py`. First lines "
          "of the difference:\n" + "\n".join(diff[:40]))
    return 1


if __name__ == "__main__":
    sys.exit(main())

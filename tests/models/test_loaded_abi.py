"""The table a loaded model's library exports is checked before pysharp._core reads it.

A library and the core exchange structs by reference (csrc/loaded_abi.hpp), so a table of
another version or layout, or none at all, must be refused with a message that says what
to do, never read: these tables are written by hand in C so that each check is reached.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pysharp._engine import loader
from pysharp.models import _compiler
from pysharp.models._compiler import ModelCompileError

# Table<Real> opens with `int abi_version;` and `Sizes sizes;` (size_t each).
TABLE = """\
#include <stddef.h>
struct Head { int abi_version; size_t sizes[%(n)d]; };
static const struct Head head = {%(version)d, {%(sizes)s}};
const void* pysharp_loaded_table(void) { return %(ret)s; }
"""


def library(tmp_path: Path, version: int, sizes: str = "0", ret: str = "&head") -> Path:
    src, so = tmp_path / "table.c", tmp_path / "table.so"
    n = len(loader.core().LOADED_ABI_SIZES_f64)
    src.write_text(TABLE % {"n": n, "version": version, "sizes": sizes, "ret": ret})
    subprocess.run([_compiler.compiler(), "-x", "c", "-shared", "-fPIC", str(src), "-o",
                    str(so)], check=True, cwd=tmp_path)
    return so


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", ["another version", "another layout", "no table"])
def test_a_table_the_core_cannot_read_is_refused(tmp_path, case, dtype):
    core = loader.core()
    version = core.LOADED_ABI_VERSION
    sizes = list(getattr(core, "LOADED_ABI_SIZES" + {"float64": "_f64", "float32": "_f32"}[dtype]))
    other = sizes[:2] + [sizes[2] + 8] + sizes[3:]  # one type of another size
    text = {"right": ", ".join(map(str, sizes)), "other": ", ".join(map(str, other))}
    so = {"another version": lambda: library(tmp_path, version + 1, text["right"]),
          "another layout": lambda: library(tmp_path, version, text["other"]),
          "no table": lambda: library(tmp_path, version, ret="NULL")}[case]()
    expect = "returned no table" if case == "no table" else "other pysharp headers"
    with pytest.raises(ModelCompileError, match=expect):
        _compiler._open_library(f"_abi_{case.replace(' ', '_')}_{dtype}", so, dtype)


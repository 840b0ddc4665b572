"""Write, or check, the C++ side of the method table (csrc/include/pysharp/engine/methods.hpp).

The table is ``METHODS`` in pysharp/_engine/methods.py; this script turns it into the engine's
``enum class Method``, ``kMethodCount``, the names ``pysharp._core.METHODS`` exports and the
properties the engine branches on. It loads that one file by path, so it runs before
pysharp is built.

Usage (from anywhere)::

    python tools/gen_methods.py            # rewrite the header
    python tools/gen_methods.py --check    # exit 1 if the header is stale (CI)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "pysharp" / "_engine" / "methods.py"
HEADER = ROOT / "csrc" / "include" / "pysharp" / "engine" / "methods.hpp"


def _table():
    spec = importlib.util.spec_from_file_location("_pysharp_methods", TABLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod.METHODS, mod.HYPERPARAMETERS


def _predicate(name: str, doc: str, methods) -> str:
    hits = [f"m == Method::{m.name}" for m in methods]
    body = " ||\n         ".join(hits) if hits else "false"
    return (f"// {doc}\nPYSHARP_HD constexpr bool {name}(Method m) {{\n"
            f"  return {body};\n}}\n")


def generate() -> str:
    """The header's text for the current table."""
    table, hyper = _table()
    methods = list(table.values())
    for m in methods:
        if unknown := set(m.hyper) - set(hyper):
            raise SystemExit(f"{TABLE}: method {m.name} reads unknown hyperparameters {unknown}")
    fields = "\n".join(f"  const Real* {h} = nullptr;  // {meaning} ({bound})"
                       for h, (meaning, bound) in hyper.items())
    bits = "\n".join(f"  kHyper_{h} = 1u << {i}," for i, h in enumerate(hyper))
    names_h = list(hyper)
    cases = "".join(f"\n      case {i}: return {h};" for i, h in enumerate(names_h[:-1]))
    cases += f"\n      default: return {names_h[-1]};"
    hyper_names = "".join(f'\n    "{h}",' for h in hyper)
    reads = "".join(f"\n    {' | '.join(f'kHyper_{h}' for h in m.hyper)},  // {m.name}"
                    for m in methods)
    width = max(len(f"{m.name} = {m.code},") for m in methods)
    enum = "\n".join(f"  {f'{m.name} = {m.code},':<{width}}  // {m.rule}" for m in methods)
    names = "".join(f'\n    "{m.name}",' for m in methods)
    codes = [m.code for m in methods]
    if codes != list(range(len(codes))):
        raise SystemExit(f"{TABLE}: method codes must be 0, 1, ... without gaps, got {codes}")
    return f"""\
// The trajectory engine's update rules. GENERATED from the method table METHODS in
// pysharp/_engine/methods.py by `python tools/gen_methods.py`: edit the table, not this file
// (CI runs the tool with --check). The update rules themselves are in trajectory.hpp.
#pragma once

#include "pysharp/core/config.hpp"

namespace pysharp {{

enum class Method : int {{
{enum}
}};
inline constexpr int kMethodCount = {len(methods)};

// Names by value (host side: pysharp._core.METHODS).
inline constexpr const char* kMethodNames[kMethodCount] = {{{names}
}};

// A batch's per-trajectory hyperparameters, each (B,) or null where the method does not
// read it (HYPERPARAMETERS in the table). Each method reads the fields its row names, never
// one borrowed for another meaning.
template <class Real>
struct Hyperparameters {{
{fields}

  // Field i, named kHyperparameterNames[i].
  PYSHARP_HD const Real*& field(int i) {{
    switch (i) {{{cases}
    }}
  }}
  PYSHARP_HD const Real* field(int i) const {{
    return const_cast<Hyperparameters*>(this)->field(i);  // read only
  }}

  // The same fields from trajectory `first` on.
  PYSHARP_HD Hyperparameters from(long long first) const {{
    Hyperparameters h = *this;
    for (int i = 0; i < {len(hyper)}; ++i)
      if (h.field(i)) h.field(i) += first;
    return h;
  }}
}};

// Field bits and names, in field order; kMethodHyper[m]: the fields method m reads.
enum HyperparameterBit : unsigned {{
{bits}
}};
inline constexpr int kHyperparameterCount = {len(hyper)};
inline constexpr const char* kHyperparameterNames[kHyperparameterCount] = {{{hyper_names}
}};
inline constexpr unsigned kMethodHyper[kMethodCount] = {{{reads}
}};

{_predicate("method_on_sphere",
            "Iterates stay on the unit sphere; the step size is eta, the effective LR.",
            [m for m in methods if m.on_sphere])}
{_predicate("method_has_reduced",
            "BN linear regression's exact reduced update exists for the method.",
            [m for m in methods if m.reduced])}
}}  // namespace pysharp
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    fresh = generate()
    if args.check:
        if not HEADER.exists() or HEADER.read_text() != fresh:
            print(f"{HEADER} is stale: run python tools/gen_methods.py",
                  file=sys.stderr)
            return 1
        return 0
    HEADER.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())

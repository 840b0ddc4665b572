"""Write, or check, the C++ side of the method and record tables (engine/methods.hpp and
engine/records.hpp in csrc/include/pysharp).

The method table is ``METHODS`` in pysharp/_engine/methods.py; this script turns it into the
engine's ``enum class Method``, ``kMethodCount``, the names ``pysharp._core.METHODS`` exports
and the properties the engine branches on. The record table is ``RECORDS`` in
pysharp/_engine/records.py; it becomes the X-macro ``PYSHARP_RECORDS`` from which the engine's
``BatchRecords`` and ``TrajectoryRecords`` and the modules' ``RunOutputs`` are written. It
loads those two files by path, so it runs before pysharp is built.

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
RECORDS_TABLE = ROOT / "pysharp" / "_engine" / "records.py"
RECORDS_HEADER = ROOT / "csrc" / "include" / "pysharp" / "engine" / "records.hpp"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


def _table():
    mod = _load(TABLE, "_pysharp_methods")
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


# Each code of a Record (pysharp/_engine/records.py) -> its C++ spelling in PYSHARP_RECORDS.
RECORD_TYPES = {"real": "Real", "u8": "std::uint8_t", "i64": "long long"}
RECORD_EVERY = {"": "none", "record": "record", "sharpness": "sharpness", "theta": "theta"}
RECORD_ITEM = {"": "none", "D": "point", "G": "groups", "k": "top_k"}
RECORD_WHEN = {"": "always", "sharpness": "sharpness", "groups": "groups", "top_k": "top_k"}


def _enum(name: str, codes: dict[str, str]) -> str:
    spelt = ", ".join(f'"{c}"' for c in codes)
    return (f"enum class {name} : int {{ {', '.join(codes.values())} }};\n"
            f"inline constexpr const char* k{name}Names[] = {{{spelt}}};")


def generate_records() -> str:
    """The text of engine/records.hpp for the current record table."""
    rows = _load(RECORDS_TABLE, "_pysharp_records").RECORDS
    taken = {"stride", "groups", "top_k"}  # TrajectoryRecords' and BatchRecords' other members
    for col in ("name", "field"):
        if len({getattr(r, col) for r in rows}) != len(rows):
            raise SystemExit(f"{RECORDS_TABLE}: two records share a {col}")
    for r in rows:
        if not (r.name.isidentifier() and r.field.isidentifier()) or r.field in taken:
            raise SystemExit(f"{RECORDS_TABLE}: record {r.name}: name and field must be C++ "
                             f"identifiers, and the field none of {sorted(taken)}")
        for value, codes in ((r.dtype, RECORD_TYPES), (r.every, RECORD_EVERY),
                             (r.item, RECORD_ITEM), (r.when, RECORD_WHEN)):
            if value not in codes:
                raise SystemExit(f"{RECORDS_TABLE}: record {r.name}: unknown code {value!r}")
    cells = [(f"X({r.name},", f"{r.field},", f"{RECORD_TYPES[r.dtype]},",
              f"{RECORD_EVERY[r.every]},", f"{RECORD_ITEM[r.item]},", f"{RECORD_WHEN[r.when]})")
             for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(5)]
    lines = [" ".join(c[i].ljust(widths[i]) for i in range(5)) + " " + c[5] for c in cells]
    width = max(len(line) for line in lines)
    table = "\n".join([*(f"  {line.ljust(width)} \\" for line in lines[:-1]), f"  {lines[-1]}"])
    return f"""\
// The arrays a trajectory run returns. GENERATED from the record table RECORDS in
// pysharp/_engine/records.py by `python tools/gen_methods.py`: edit the table, not this file
// (CI runs the tool with --check). The engine writes them in TrajectoryRunner::observe
// (trajectory.hpp); the modules allocate them in RunOutputs (bind_model.hpp).
#pragma once

#include "pysharp/core/config.hpp"

namespace pysharp {{

// A record's leading axis (Record.every): none (one per trajectory), or one row per record
// step, sharpness step or theta snapshot step.
{_enum("RecordEvery", RECORD_EVERY)}
// Its trailing axes per trajectory (Record.item): none, the point (D), one value per
// parameter group (G) or the top-k eigenvalues (k).
{_enum("RecordItem", RECORD_ITEM)}
// When it is filled (Record.when): always, when sharpness is tracked (else it has no rows),
// for a model of several groups, for top_k >= 2 (the last two absent from the result
// otherwise).
{_enum("RecordWhen", RECORD_WHEN)}

// X(name, field, T, every, item, when) per record, in the table's order: its key in the
// result dict, its pointer field of BatchRecords and TrajectoryRecords, its element type
// (Real: the run's precision), and its RecordEvery, RecordItem and RecordWhen codes.
#define PYSHARP_RECORDS(X) \\
{table}

// Each record's codes, for loops over the records (its element type is the X-macro's alone).
struct RecordSpec {{
  const char* name;
  const char* field;
  RecordEvery every;
  RecordItem item;
  RecordWhen when;
}};

#define PYSHARP_RECORD_SPEC(name, field, T, every, item, when) \\
  {{#name, #field, RecordEvery::every, RecordItem::item, RecordWhen::when}},
inline constexpr RecordSpec kRecords[] = {{PYSHARP_RECORDS(PYSHARP_RECORD_SPEC)}};
#undef PYSHARP_RECORD_SPEC
inline constexpr int kRecordCount = {len(rows)};

}}  // namespace pysharp
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    stale = 0
    for header, fresh in ((HEADER, generate()), (RECORDS_HEADER, generate_records())):
        if not args.check:
            header.write_text(fresh)
        elif not header.exists() or header.read_text() != fresh:
            print(f"{header} is stale: run python tools/gen_methods.py", file=sys.stderr)
            stale = 1
    return stale


if __name__ == "__main__":
    sys.exit(main())

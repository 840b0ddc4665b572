"""bench/results/gpu_h200.json and the GPU table of docs/tutorials/gpu.rst, from one run.

``python -m bench.gpu_report --ceilings C.json --bench B.json [--note TEXT]`` merges the
outputs of ``bench.gpu_ceilings`` and ``bench.gpu`` (bench/gpu_check.sh runs all three) into
bench/results/gpu_h200.json::

    {"source", "device", "ceilings": {"fp64_gemm_flops", "copy_bytes_per_s", "via"} | null,
     "rows": {ROW: {PEER: rate}}, "failed_checks": [...]}

and rewrites the table between the ``gpu-table`` markers of docs/tutorials/gpu.rst from it.
``--from-txt bench/results/gpu_h200.txt`` reads the first run's text log instead (it predates
the JSON and measured no ceilings); ``--table-only`` regenerates the table from the JSON.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULT = REPO / "bench" / "results" / "gpu_h200.json"
DOC = REPO / "docs" / "tutorials" / "gpu.rst"
START, END = ".. gpu-table-start", ".. gpu-table-end"
CUDA, JAX = "pysharp cuda", "jax gpu"


def from_txt(path: Path) -> dict:
    """The first run's log (bench.gpu's printed rows) as the JSON's rows."""
    rows: dict[str, dict[str, float]] = {}
    device, current = None, None
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if device is None and "," in line and not line.startswith(" "):
            device = line.split(",")[0].strip()
            continue
        m = re.fullmatch(r"(\S.*):", line)
        if m and not line.startswith(" ") and not line.startswith(("device", "jax devices")):
            current = rows.setdefault(m.group(1), {})
            continue
        m = re.fullmatch(r"\s+(.+?) ([0-9.]+e[+-]\d+)(?: \(.*\))?", line)
        if m and current is not None:
            current[m.group(1)] = float(m.group(2))
    return {"source": f"{path.name}: the first run, 2026-12-04; no ceilings measured",
            "device": device, "ceilings": None, "rows": rows, "failed_checks": []}


def from_runs(ceilings: Path | None, bench: Path, note: str) -> dict:
    b = json.loads(bench.read_text())
    c = json.loads(ceilings.read_text()) if ceilings and ceilings.is_file() else None
    device = b.get("device", {})
    return {"source": note or "bench/gpu_check.sh",
            "device": device.get("name") if isinstance(device, dict) else str(device),
            "ceilings": None if c is None else {k: c[k] for k in
                                                ("fp64_gemm_flops", "copy_bytes_per_s", "via")},
            "rows": b.get("rows", {}),
            "failed_checks": [x for x in b.get("checks", []) if not x.get("ok", True)]}


def _fmt(x: float | None) -> str:
    return "--" if x is None else f"{x:.2e}"


def table(result: dict) -> str:
    """The reStructuredText table (with a line on the ceilings above it)."""
    lines = []
    c = result.get("ceilings")
    where = f"{result.get('device') or 'GPU'}, from ``bench/results/gpu_h200.json`` " \
            f"({result['source']})"
    if c:
        lines.append(f"{where}: FP64 GEMM {c['fp64_gemm_flops'] / 1e12:.1f} TFLOP/s, device "
                     f"copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s ({c['via']}). Rates in "
                     "trajectory-steps/s (kernel rows: rows/s).")
    else:
        lines.append(f"{where}. Rates in trajectory-steps/s (kernel rows: rows/s).")
    lines += ["", ".. list-table::", "   :header-rows: 1", "",
              "   * - workload", f"     - {CUDA}", "     - pysharp cpp (host)",
              f"     - {JAX}", "     - cuda / JAX"]
    for row, rates in result["rows"].items():
        cpp = next((v for k, v in rates.items() if k.startswith("pysharp cpp")), None)
        cu, jx = rates.get(CUDA), rates.get(JAX)
        ratio = f"{cu / jx:.2f}x" if cu and jx else "--"
        lines += [f"   * - {row}", f"     - {_fmt(cu)}", f"     - {_fmt(cpp)}",
                  f"     - {_fmt(jx)}", f"     - {ratio}"]
    return "\n".join(lines) + "\n"


def write_table(result: dict, doc: Path = DOC) -> None:
    text = doc.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{doc} has no '{START}' ... '{END}' markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{START}\n\n{table(result)}\n{END}{tail}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ceilings", type=Path, help="bench.gpu_ceilings --json output")
    ap.add_argument("--bench", type=Path, help="bench.gpu --json output")
    ap.add_argument("--from-txt", type=Path, help="a text log of bench.gpu instead")
    ap.add_argument("--table-only", action="store_true", help="regenerate the docs table only")
    ap.add_argument("--note", default="", help="where the figures come from (commit, date)")
    ap.add_argument("--json", type=Path, default=RESULT)
    ap.add_argument("--doc", type=Path, default=DOC)
    args = ap.parse_args(argv)
    if args.table_only:
        result = json.loads(args.json.read_text())
    elif args.from_txt:
        result = from_txt(args.from_txt)
    elif args.bench:
        result = from_runs(args.ceilings, args.bench, args.note)
    else:
        ap.error("give --bench (with --ceilings), --from-txt or --table-only")
    if not args.table_only:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    write_table(result, args.doc)
    print(f"rewrote the table of {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

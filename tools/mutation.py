"""A small, bounded mutation-testing runner for pysharp's Python layer.

    python tools/mutation.py --max-mutants 80 --seed 1          # sample and run
    python tools/mutation.py --list --max-mutants 80 --seed 1   # show the sample only
    python tools/mutation.py --modules pysharp/theory.py --max-mutants 10
    python tools/mutation.py --rerun before.json --json after.json   # re-run its survivors
    python tools/mutation.py --cxx                              # hand C++ mutants (slow: builds)

Why not mutmut: mutmut 3 rewrites every function into trampolines inside its
own copy of the project, has no sampling, and first runs the whole default
suite to map tests to functions; on two shared cores that alone is most of
the budget. This runner is deliberately simple and honest:

1. Parse each module with ``ast`` and list single-point mutation sites:
   comparison flips (``<`` <-> ``<=``, ``<`` -> ``>=``, ``==`` <-> ``!=``,
   ``in`` <-> ``not in``, ``is`` <-> ``is not``), arithmetic swaps (``+`` <->
   ``-``, ``*`` <-> ``/``, ``**`` -> ``*``, ``//`` -> ``/``), unary minus and
   ``not`` removed, ``and`` <-> ``or``, constants perturbed (``True`` <->
   ``False``, int ``n`` -> ``n + 1``, float ``x`` -> ``2 x``, ``0.0`` -> ``1.0``),
   a ``raise`` deleted, and a guarded ``return`` (one inside an ``if``)
   deleted. Docstrings, strings, f-strings, annotations and the messages of
   ``raise`` statements are never mutated (changing them is not a bug a test
   must catch).
2. Draw a deterministic sample: each module's sites are shuffled with
   ``--seed`` and the sample takes them round-robin across modules up to
   ``--max-mutants``.
3. Copy ``pysharp/`` (with the compiled ``_core`` extension), ``tests/`` and
   ``pyproject.toml`` into a scratch directory, write the mutant over its
   module there, and run the test files mapped to that module
   (``TESTS`` below) with ``pytest -x -q``
   and a timeout from the scratch directory, so the mutated copy is the one
   imported (checked once before the run). Bytecode caching is off, so no
   stale ``.pyc`` can mask a mutant.
4. A mutant is *killed* when pytest fails, *timeout* when it exceeds the
   timeout (counted as detected, reported apart), *survived* when the tests
   pass. The score is (killed + timeout) / run.
5. ``--rerun REPORT`` takes the sample of an earlier report and runs only its
   survivors again (after new tests were written): adding tests cannot turn
   a killed mutant into a survivor, so the killed ones are carried over.
   The mutated modules must be unchanged since that report (checked by hash).

``--cxx`` runs the hand-written C++ mutants of ``CXX_MUTANTS`` instead: each
is applied to a scratch copy of ``csrc/``, compiled in a scratch CMake build
(each costs a compile of the core's units) and run against ``CXX_TESTS`` with the rebuilt ``_core``.

The report (``--json``) lists every mutant with its file, line, operator,
original and mutated source line and outcome.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: module -> the test files that exercise it.
TESTS: dict[str, list[str]] = {
    "pysharp/theory.py": ["tests/test_theory.py", "tests/test_validation.py"],
    "pysharp/stability.py": ["tests/test_stability.py", "tests/test_validation.py"],
    "pysharp/flow.py": ["tests/test_flow.py", "tests/test_validation.py"],
    "pysharp/dynamics.py": ["tests/test_dynamics.py", "tests/csrc/test_trajectory.py",
                            "tests/csrc/test_lanes.py", "tests/test_validation.py"],
    "pysharp/sharpness.py": ["tests/test_sharpness.py", "tests/csrc/test_trajectory.py",
                             "tests/test_flow.py", "tests/test_stability.py",
                             "tests/test_validation.py"],
    "pysharp/sgd.py": ["tests/test_sgd.py", "tests/models/test_ghost_bn.py",
                       "tests/test_stability.py", "tests/test_validation.py"],
    "pysharp/_engine/validation.py": ["tests/test_dynamics.py", "tests/test_sgd.py",
                                      "tests/test_sharpness.py", "tests/test_validation.py",
                                      "tests/models/test_models.py",
                                      "tests/engine/test_array_intake.py"],
    "pysharp/sweeps/_sweep.py": ["tests/sweeps/test_sweep.py", "tests/test_validation.py"],
    "pysharp/models/_base.py": ["tests/models/test_models.py", "tests/csrc/test_trajectory.py",
                                "tests/csrc/test_lanes.py", "tests/test_validation.py"],
    # without a GPU only its host-side arithmetic and checks can kill a mutant
    "pysharp/_backends/_cupy.py": ["tests/backends/test_cupy.py"],
    "pysharp/_backends/_tiles.py": ["tests/backends/test_tiles.py"],
}

#: hand C++ mutants: (header, exact original text, mutated text, what it breaks)
CXX_MUTANTS = [
    ("csrc/include/pysharp/models/toy3d.hpp", "g[1] = (-q0 - radial * y) * inv_r;",
     "g[1] = (q0 - radial * y) * inv_r;", "sign flip in one gradient component"),
    ("csrc/include/pysharp/models/bn_matrix_completion.hpp",
     "for (int q = 0; q < r; ++q) acc += a[q] * b[q];",
     "for (int q = 0; q < r - 1; ++q) acc += a[q] * b[q];",
     "off-by-one: the scores drop the last factor"),
    ("csrc/include/pysharp/models/bn_linear_regression.hpp",
     "for (int j = 0; j < d; ++j) w2 += value_of(w[j]) * value_of(w[j]);",
     "for (int j = 0; j < d - 1; ++j) w2 += value_of(w[j]) * value_of(w[j]);",
     "off-by-one in ||w||^2 of the 'Xc w = 0' threshold"),
    ("csrc/cpu/bn_linreg_rows.hpp", "for (int k = 0; k < d; ++k) {",
     "for (int k = 1; k < d; ++k) {", "the row kernel's Z drops its first term"),
    ("csrc/cpu/bn_linreg_rows.hpp", "const int width = std::min(NV * L, d - j0);",
     "const int width = std::min(NV * L, d - j0 - 1);",
     "the row kernel stores one gradient column short"),
    ("csrc/include/pysharp/tile/bn_mc.hpp", "scratch + 2 * D + m.N);",
     "scratch + 2 * D + m.N - 1);", "BN-MC tile: the loss slot overlaps the last score"),
    ("csrc/include/pysharp/tile/gd_wd_thread.hpp",
     "for (int i = 0; i < D; ++i) w[i] = decay * w[i] - lr * g[i];",
     "for (int i = 0; i < D; ++i) w[i] = decay * w[i] + lr * g[i];",
     "thread tiles: gradient ascent"),
    ("csrc/include/pysharp/tile/bn_mc.hpp", "rows[k] >= m1", "rows[k] > m1",
     "BN-MC tile: a row index equal to m1 passes the bounds check"),
    ("csrc/include/pysharp/tile/bn_mc_warp.hpp",
     "P::load(w, P::load(data.term_other, at) + q);", "P::load(w, P::load(data.term_other, at));",
     "BN-MC warp tile: the gradient reads the other factor's first column only"),
    ("csrc/include/pysharp/tile/warp.hpp", "int mask = kWarpLanes / 2; mask >= 1;",
     "int mask = kWarpLanes / 4; mask >= 1;", "warp_sum adds half the warp"),
    # (f = F - 1 .. 1 would be an equivalent mutant: start[F] is 2 N before and after)
    ("csrc/include/pysharp/tile/bn_mc_warp.hpp", "for (int f = F; f >= 1; --f)",
     "for (int f = F; f >= 2; --f)", "BN-MC factor lists: the second row's start not shifted"),
    ("csrc/include/pysharp/tile/bn_mc_warp.hpp", "obs[start[f] + j] : m.N;",
     "obs[start[f] + j] : 0;", "BN-MC warp terms: padding adds observation 0's term"),
    ("csrc/include/pysharp/tile/bn_mc_warp.hpp", "if (P::leader()) z[data.m.N] = 0.0;", "",
     "BN-MC warp tile: the padding terms' zero slot never written"),
    ("csrc/include/pysharp/tile/bn_linreg.hpp", "P::load_if(v1, at + reg<long long>(8 * b + i),",
     "P::load_if(v1, at + reg<long long>(8 * b),", "BN linreg tile: top_grad reads v1 twice "
     "at each pair's first coordinate"),
    ("csrc/include/pysharp/tile/gd_wd_io.hpp",
     "if (io.top_grad) io.top_grad[at] = root(n2) * io.top_grad[at];", "",
     "thread and warp tiles: top_grad not scaled by ||w||"),
    ("csrc/cpu/engine.hpp", "stream[l] = streams ? streams[rows[l]]",
     "stream[l] = streams ? streams[l]",
     "batched Lanczos: row l of a lane block keyed by the block's first streams"),
]
CXX_TESTS = ["tests/models/test_models.py", "tests/csrc/test_lanes.py",
             "tests/csrc/test_bn_linreg_rows.py", "tests/csrc/test_tile.py",
             "tests/backends/test_tiles.py"]

_CMP_SWAPS = {
    ast.Lt: (ast.LtE, ast.GtE), ast.LtE: (ast.Lt, ast.Gt), ast.Gt: (ast.GtE, ast.LtE),
    ast.GtE: (ast.Gt, ast.Lt), ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,),
    ast.In: (ast.NotIn,), ast.NotIn: (ast.In,), ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,),
}
_BIN_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
              ast.Pow: ast.Mult, ast.FloorDiv: ast.Div}


@dataclass
class Mutant:
    module: str
    index: int  # position of the site in ast.walk order
    op: str
    variant: int  # which alternative at that site
    line: int
    before: str = ""
    after: str = ""
    outcome: str = ""
    seconds: float = 0.0
    failed_test: str = ""

    @property
    def name(self) -> str:
        return f"{self.module}:{self.line}:{self.op}#{self.index}.{self.variant}"


def _protected(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings, f-strings, annotations, raise messages."""
    skip: set[int] = set()

    def mark(node):
        for sub in ast.walk(node):
            skip.add(id(sub))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                mark(body[0])
        if isinstance(node, ast.JoinedStr):
            mark(node)
        if isinstance(node, ast.Raise) and node.exc is not None:
            mark(node.exc)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.returns is not None:
                mark(node.returns)
            for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                if a.annotation is not None:
                    mark(a.annotation)
        if isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            mark(node)
    return skip


def _guarded_returns(tree: ast.AST) -> set[int]:
    """ids of return statements directly inside an if/else body (early exits)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            for stmt in node.body + node.orelse:
                if isinstance(stmt, ast.Return):
                    out.add(id(stmt))
    return out


def _alternatives(node: ast.AST, guarded: set[int]) -> list[str]:
    """Names of the mutations possible at ``node`` (one per variant)."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        return [f"cmp {type(node.ops[0]).__name__}->{t.__name__}"
                for t in _CMP_SWAPS.get(type(node.ops[0]), ())]
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAPS:
        return [f"binop {type(node.op).__name__}->{_BIN_SWAPS[type(node.op)].__name__}"]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        return [f"drop unary {type(node.op).__name__}"]
    if isinstance(node, ast.BoolOp):
        other = "Or" if isinstance(node.op, ast.And) else "And"
        return [f"boolop {type(node.op).__name__}->{other}"]
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            return [f"const {v}->{not v}"]
        if isinstance(v, int):
            return [f"const {v}->{v + 1}"]
        if isinstance(v, float) and v == v and abs(v) != float("inf"):
            return [f"const {v!r}->{(v * 2) if v else 1.0!r}"]
        return []
    if isinstance(node, ast.Raise):
        return ["delete raise"]
    if isinstance(node, ast.Return) and id(node) in guarded:
        return ["delete guarded return"]
    return []


def _apply(node: ast.AST, variant: int) -> None:
    if isinstance(node, ast.Compare):
        node.ops = [_CMP_SWAPS[type(node.ops[0])][variant]()]
    elif isinstance(node, ast.BinOp):
        node.op = _BIN_SWAPS[type(node.op)]()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            node.value = not v
        elif isinstance(v, int):
            node.value = v + 1
        else:
            node.value = v * 2 if v else 1.0


class _Replace(ast.NodeTransformer):
    """Replaces one node (by identity): unary ops by their operand, statements by ``pass``."""

    def __init__(self, target: ast.AST) -> None:
        self.target = target

    def generic_visit(self, node):
        if node is self.target:
            if isinstance(node, ast.UnaryOp):
                return node.operand
            return ast.copy_location(ast.Pass(), node)
        return super().generic_visit(node)


def sites(module: str) -> list[Mutant]:
    """Every mutation site of one module, in a stable order."""
    src = (ROOT / module).read_text()
    tree = ast.parse(src)
    skip, guarded = _protected(tree), _guarded_returns(tree)
    out = []
    for i, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        for v, op in enumerate(_alternatives(node, guarded)):
            out.append(Mutant(module, i, op, v, getattr(node, "lineno", 0)))
    return out


def mutate(module: str, mutant: Mutant) -> str:
    """The mutated module's source (via ast.unparse)."""
    src = (ROOT / module).read_text()
    tree = ast.parse(src)
    tree = copy.deepcopy(tree)
    node = list(ast.walk(tree))[mutant.index]
    if isinstance(node, (ast.UnaryOp, ast.Raise, ast.Return)):
        tree = _Replace(node).visit(tree)
    else:
        _apply(node, mutant.variant)
    ast.fix_missing_locations(tree)
    return ast.unparse(tree)


def sample(modules: list[str], max_mutants: int, seed: int) -> list[Mutant]:
    """Deterministic sample: per-module shuffles taken round-robin."""
    pools = []
    for m in modules:
        s = sites(m)
        random.Random(f"{seed}:{m}").shuffle(s)
        pools.append(s)
    out: list[Mutant] = []
    while len(out) < max_mutants and any(pools):
        for p in pools:
            if p and len(out) < max_mutants:
                out.append(p.pop())
    return out


def _module_hash(module: str) -> str:
    return hashlib.sha256((ROOT / module).read_bytes()).hexdigest()[:16]


def _source_line(text: str, node_line: int) -> str:
    lines = text.splitlines()
    return lines[node_line - 1].strip() if 0 < node_line <= len(lines) else ""


def _prepare(scratch: Path) -> None:
    shutil.copytree(ROOT / "pysharp", scratch / "pysharp",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", scratch / "tests",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # read by tests that check the Python layer against the C++ (g++, NVRTC) and the
    # example models; never mutated here
    for d in ("csrc", "examples"):
        shutil.copytree(ROOT / d, scratch / d, ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, scratch / f)


def _env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(scratch), PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1",
               NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _pytest(scratch: Path, tests: list[str], timeout: float) -> tuple[str, float, str]:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           "--no-header", "-o", "addopts=", "-m", "not slow and not gpu", *tests]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=scratch, env=_env(scratch), capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - t0, ""
    failed = next((ln for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))), "")
    return ("survived" if r.returncode == 0 else "killed"), time.monotonic() - t0, failed


def cxx_main() -> int:
    """Build and test each hand C++ mutant in a scratch build; print killed / survived."""
    import pybind11

    results = []
    with tempfile.TemporaryDirectory(prefix="pysharp-cxxmut-") as tmp:
        src, build, run = Path(tmp) / "src", Path(tmp) / "build", Path(tmp) / "run"
        src.mkdir()
        shutil.copytree(ROOT / "csrc", src / "csrc")
        for f in ("CMakeLists.txt", "pyproject.toml", "README.md"):
            shutil.copy(ROOT / f, src / f)
        run.mkdir()
        _prepare(run)
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja",
                        "-DCMAKE_BUILD_TYPE=Release", "-DPYSHARP_CUDA=OFF",
                        f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"],
                       check=True, capture_output=True)
        for header, old, new, what in CXX_MUTANTS:
            path = src / header
            original = path.read_text()
            if original.count(old) != 1:
                print(f"{header}: the original text is not found once; update CXX_MUTANTS")
                return 2
            path.write_text(original.replace(old, new))
            t0 = time.monotonic()
            b = subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True,
                               text=True)
            path.write_text(original)
            if b.returncode != 0:
                outcome, failed = "killed (does not compile)", ""
            else:
                for so in (run / "pysharp").glob("_core*.so"):
                    so.unlink()
                for so in build.glob("_core*.so"):
                    shutil.copy(so, run / "pysharp" / so.name)
                outcome, _, failed = _pytest(run, CXX_TESTS, timeout=1800)
            results.append((header, what, outcome, failed))
            print(f"{outcome:9s} {time.monotonic() - t0:6.0f}s {header}: {what}  {failed}",
                  flush=True)
    killed = sum(r[2] != "survived" for r in results)
    print(f"C++ hand mutants: {killed} of {len(results)} killed")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modules", nargs="*", default=list(TESTS), help="modules to mutate")
    p.add_argument("--max-mutants", type=int, default=80)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--list", action="store_true", help="print the sample and exit")
    p.add_argument("--json", type=Path, help="write the full report here")
    p.add_argument("--cxx", action="store_true", help="run the hand C++ mutants instead")
    p.add_argument("--rerun", type=Path, help="re-run the survivors of this earlier report")
    p.add_argument("--timeout-factor", type=float, default=4.0,
                   help="timeout = factor x the unmutated run's time + 20 s")
    args = p.parse_args(argv)
    if args.cxx:
        return cxx_main()
    for m in args.modules:
        if m not in TESTS:
            p.error(f"no test mapping for {m}; known: {', '.join(TESTS)}")
    carried: dict[str, str] = {}
    if args.rerun:
        old = json.loads(args.rerun.read_text())
        for m, h in old["hashes"].items():
            if _module_hash(m) != h:
                p.error(f"{m} changed since {args.rerun}: the sample would not be the same")
        mutants = [Mutant(**{k: d[k] for k in ("module", "index", "op", "variant", "line")})
                   for d in old["mutants"]]
        carried = {Mutant(**{k: d[k] for k in ("module", "index", "op", "variant", "line")}).name:
                   d["outcome"] for d in old["mutants"] if d["outcome"] in ("killed", "timeout")}
        args.seed, args.max_mutants = old["seed"], old["max_mutants"]
    else:
        mutants = sample(args.modules, args.max_mutants, args.seed)
    hashes = {m: _module_hash(m) for m in sorted({mt.module for mt in mutants})}

    def report() -> None:
        if args.json:
            done = [m for m in mutants if m.outcome]
            counts = {k: sum(m.outcome == k for m in done)
                      for k in ("killed", "timeout", "survived")}
            args.json.write_text(json.dumps({
                "seed": args.seed, "max_mutants": args.max_mutants,
                "hashes": hashes, "counts": counts,
                "score": (counts["killed"] + counts["timeout"]) / max(1, len(done)),
                "mutants": [asdict(m) for m in mutants]}, indent=1))

    for mt in mutants:
        original = (ROOT / mt.module).read_text()
        mt.before = _source_line(original, mt.line)
        mutated = mutate(mt.module, mt)
        # locate the changed line in the unparsed text for the report
        base = ast.unparse(ast.parse(original)).splitlines()
        new = mutated.splitlines()
        diff = [b for a, b in zip(base, new) if a != b]
        mt.after = diff[0].strip() if diff else "(no textual change)"
    if args.list:
        for mt in mutants:
            print(f"{mt.name:55s} {mt.after}")
        print(f"{len(mutants)} mutants")
        return 0

    with tempfile.TemporaryDirectory(prefix="pysharp-mut-") as tmp:
        scratch = Path(tmp)
        _prepare(scratch)
        probe = subprocess.run([sys.executable, "-c", "import pysharp; print(pysharp.__file__)"],
                               cwd=scratch, env=_env(scratch), capture_output=True, text=True)
        if not probe.stdout.strip().startswith(str(scratch)):
            print(f"scratch copy is not the one imported: {probe.stdout}{probe.stderr}")
            return 2
        baseline: dict[tuple[str, ...], float] = {}
        for mt in mutants:
            if mt.name in carried:
                mt.outcome, mt.failed_test = carried[mt.name], "(carried over)"
                continue
            tests = TESTS[mt.module]
            key = tuple(tests)
            if key not in baseline:
                outcome, secs, failed = _pytest(scratch, tests, timeout=1800)
                if outcome != "survived":
                    print(f"unmutated tests fail for {mt.module}: {failed or outcome}")
                    return 2
                baseline[key] = secs
            target = scratch / mt.module
            original = target.read_text()
            target.write_text(mutate(mt.module, mt))
            try:
                mt.outcome, mt.seconds, mt.failed_test = _pytest(
                    scratch, tests, timeout=args.timeout_factor * baseline[key] + 20)
            finally:
                target.write_text(original)
            print(f"{mt.outcome:9s} {mt.seconds:6.1f}s {mt.name:55s} {mt.after[:100]}", flush=True)
            report()

    counts = {k: sum(m.outcome == k for m in mutants) for k in ("killed", "timeout", "survived")}
    score = (counts["killed"] + counts["timeout"]) / max(1, len(mutants))
    print(f"\n{len(mutants)} mutants: {counts['killed']} killed, {counts['timeout']} timeout, "
          f"{counts['survived']} survived; score {100 * score:.1f}%")
    for mt in mutants:
        if mt.outcome == "survived":
            print(f"  SURVIVED {mt.name}\n      {mt.before}\n   -> {mt.after}")
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())

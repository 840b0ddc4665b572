"""Pieces shared by the benchmark scripts: importing pysharp, load monitoring, checks."""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent

#: A measurement during which other processes used more than this fraction of
#: the machine's CPU time is flagged with "!" (the number is not trustworthy).
BUSY_THRESHOLD = 0.15


def import_pysharp():
    """Import pysharp with its compiled core; returns (module, note or None).

    ``python -m bench.<script>`` puts the repository root first on sys.path, so
    the source tree's ``pysharp/`` shadows the installed package. When the
    source tree has no built ``_core`` (a non-editable install), fall back to
    the installed copy.
    """
    import pysharp

    if pysharp.build_info().get("available"):
        return pysharp, None
    first_reason = pysharp.build_info().get("reason")
    pkg_dir = Path(pysharp.__file__).resolve().parent
    if pkg_dir.parent != _REPO:
        raise ImportError(first_reason)
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _REPO]
    for name in [m for m in sys.modules if m == "pysharp" or m.startswith("pysharp.")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    try:
        import pysharp as installed
    except ImportError:
        sys.path[:] = saved_path
        raise ImportError(first_reason) from None
    finally:
        # Keep the repository root importable (for bench.*) after the switch.
        if str(_REPO) not in sys.path:
            sys.path.append(str(_REPO))
    if not installed.build_info().get("available"):
        raise ImportError(installed.build_info().get("reason", first_reason))
    note = (f"source tree {pkg_dir} has no built _core; using the installed pysharp at "
            f"{Path(installed.__file__).resolve().parent}")
    return installed, note


def start_benchmark(doc: str, argv=None, *, quick: str, json: str | None = None,
                    flags: tuple[tuple[str, str], ...] = ()):
    """The arguments every small benchmark takes, parsed, and pysharp imported.

    ``--quick`` (help ``quick``: what it shrinks) and, when ``json`` names what is written,
    ``--json PATH``; ``flags``: a benchmark's own on/off options, (name, help) each.
    Prints where pysharp came from when it is not the source tree's. Returns (args, pysharp).
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    for name, text in flags:
        parser.add_argument(name, action="store_true", help=text)
    if json:
        parser.add_argument("--json", metavar="PATH", help=f"write the {json} here")
    args = parser.parse_args(argv)
    ps, note = import_pysharp()
    if note:
        print(note)
    return args, ps


class LoadMonitor:
    """CPU time used by *other* processes while a measurement runs.

    Reads the machine-wide busy time from /proc/stat and subtracts this
    process's own CPU time (os.times), so a concurrent build or a second
    benchmark shows up as a fraction of the machine (0 = idle, 1 = all cores).
    None where /proc/stat is unavailable or the window is under 0.2 s.
    """

    _tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    min_window_s = 0.2

    @staticmethod
    def _busy():
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
        return (sum(fields[:8]) - idle) / LoadMonitor._tick

    def __enter__(self):
        t = os.times()
        self.t0, self.self0, self.busy0 = time.perf_counter(), t.user + t.system, self._busy()
        return self

    def __exit__(self, *exc):
        t = os.times()
        wall = time.perf_counter() - self.t0
        busy1 = self._busy()
        self.other = None
        # /proc/stat and os.times count clock ticks (10 ms): shorter windows are noise.
        if self.busy0 is not None and busy1 is not None and wall >= self.min_window_s:
            own = t.user + t.system - self.self0
            cores = os.cpu_count() or 1
            self.other = max(0.0, (busy1 - self.busy0 - own) / (wall * cores))
        return False


def timed(fn, repeats: int = 3) -> tuple[float, float | None]:
    """Best wall time of ``repeats`` calls of fn after one warm-up call (compilation,
    caches), and the other processes' CPU load during that best call."""
    fn()
    best, load = float("inf"), None
    for _ in range(repeats):
        with LoadMonitor() as mon:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
        if dt < best:
            best, load = dt, mon.other
    return best, load


def record_check(checks: list, row: str, peer: str, dev: float, tol: float) -> bool:
    """Append an agreement check {row, peer, rel_dev, ok} to ``checks``; return ok
    (``dev <= tol``), so a caller times the peer only when it agreed."""
    ok = dev <= tol
    checks.append({"row": row, "peer": peer, "rel_dev": dev, "ok": ok})
    return ok


# --------------------------------------------------------------------------- ceilings
def blas_info() -> dict:
    """Which BLAS NumPy's matmul runs, as threadpoolctl reports it.

    ``{"internal_api", "version", "architecture", "num_threads", "filepath"}`` of
    the first BLAS pool threadpoolctl finds (OpenBLAS names the kernel it picked,
    e.g. "SkylakeX", as ``architecture``; OPENBLAS_CORETYPE can force a slower
    one), with ``env``: the OPENBLAS_* / OMP_* variables set for this process.
    Without threadpoolctl: ``{"reason": ...}`` and ``env``.
    """
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(("OPENBLAS_", "OMP_", "MKL_"))}
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return {"reason": "threadpoolctl is not installed (pip install threadpoolctl)",
                "env": env}
    import numpy as np

    np.dot(np.ones((2, 2)), np.ones((2, 2)))  # load the BLAS before asking
    pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    if not pools:
        return {"reason": "threadpoolctl found no BLAS library loaded", "env": env}
    # NumPy's own BLAS (wheels bundle it in numpy.libs or numpy/.libs); SciPy or JAX may
    # have loaded others, which matmul does not call.
    numpy_dir = Path(np.__file__).resolve().parent
    mine = [p for p in pools if "numpy" in Path(p.get("filepath", "")).parent.name
            or Path(p.get("filepath", "")).resolve().is_relative_to(numpy_dir)]
    keys = ("internal_api", "version", "architecture", "num_threads", "filepath")
    info = {k: (mine or pools)[0].get(k) for k in keys}
    if not mine:
        info["note"] = "no BLAS inside numpy's folder: the first loaded one is shown"
    return {**info, "env": env}


def gemm_ceiling(dtype="float64", n: int = 2048, repeats: int = 3) -> dict:
    """The machine's practical FLOP ceiling: an n x n x n GEMM through NumPy's BLAS.

    A tuned DGEMM (SGEMM for float32) is the fastest FP code a machine commonly
    runs, so a workload's fraction of it says how much room is left, where the
    nominal peak (cores x clock x lanes x 2 FMA) depends on a clock that turbo
    or throttling moves. Best of ``repeats`` after a warm-up, 2 n^3 flops a call.

    Returns
    -------
    dict
        ``gflops`` (positive, finite), ``seconds`` (best call), ``load`` (other
        processes' CPU share during it, see :class:`LoadMonitor`), ``n``,
        ``dtype`` and ``blas`` (:func:`blas_info`).
    """
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    c = np.empty((n, n), dtype=dtype)
    t0 = time.perf_counter()
    np.matmul(a, b, out=c)  # also the warm-up
    # Enough products a timed call for LoadMonitor's window (it reports no load below it).
    inner = max(1, math.ceil(1.5 * LoadMonitor.min_window_s / (time.perf_counter() - t0)))

    def products():
        for _ in range(inner):
            np.matmul(a, b, out=c)

    best, load = timed(products, repeats)
    best /= inner
    return {"gflops": 2.0 * n ** 3 / best / 1e9, "seconds": best, "load": load, "n": n,
            "dtype": dtype.name, "products_per_call": inner, "blas": blas_info()}


def measured_ceilings(n: int = 2048, repeats: int = 3) -> dict:
    """{"float64": DGEMM ceiling, "float32": SGEMM ceiling} (:func:`gemm_ceiling`)."""
    return {dt: gemm_ceiling(dt, n, repeats) for dt in ("float64", "float32")}


def best_ceilings(*runs: dict) -> dict:
    """Per dtype, the fastest of several :func:`measured_ceilings` runs (a ceiling is
    the best the machine did; a slower measurement saw other load)."""
    out = {}
    for run in runs:
        for dt, c in run.items():
            if dt not in out or c["gflops"] > out[dt]["gflops"]:
                out[dt] = c
    return out


def peak_fraction(rate: float, flops_per_unit: float, gflops: float) -> float:
    """Fraction of a ceiling of ``gflops`` GFLOP/s that ``rate`` units/s of
    ``flops_per_unit`` flops each reach."""
    if not gflops > 0:
        raise ValueError(f"the ceiling must be positive, got {gflops} GFLOP/s")
    return rate * flops_per_unit / (gflops * 1e9)

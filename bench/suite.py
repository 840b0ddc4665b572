"""The engine's targets in one run: every workload of the lane engine, pysharp vs its peers.

Each row times pysharp and the peers a user would pick instead (JAX jit+vmap,
the NumPy reference, Numba) on the same inputs, after checking that they agree
(relative deviation <= 1e-8 on a short run before EoS entry; float32 rows and
sharpness rows to looser, stated bounds). Throughput is work per second (best
of 3 after a warm-up); ratios are pysharp / peer. With ``--baseline PATH`` the
pysharp rows are also timed, in a subprocess, on an older pysharp tree (its
compiled core built), so one run gives the before and after columns.

Usage (from the repository root)::

    python -m bench.suite                         # about 2-4 minutes on 2 cores
    python -m bench.suite --quick                 # smaller, under a minute
    python -m bench.suite --baseline ../old-tree --json bench-suite.json --markdown table.md
    python -m bench.suite --readme bench-suite.json   # rewrite README's table from a JSON
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if not __package__:  # run as a script: python bench/<name>.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import stability
from bench._common import (
    BUSY_THRESHOLD,
    best_ceilings,
    blas_info,
    import_pysharp,
    measured_ceilings,
    peak_fraction,
    record_check,
    timed,
)
from bench.engine import Problem, machine_info, make_numba, numpy_gd_wd, rel_dev
from bench.kernels import jax_kernels, jax_loss

LR, WD = 0.5, 2e-4


@dataclass
class Timing:
    """How the rows are timed: the best of ``repeats`` calls (``--repeats``; more find the
    quiet moments of a machine that other processes share), by wall time or, with
    ``cpu_time`` (``--cpu-time``), by the CPU time of the process, every library on one
    thread (ONE_THREAD)."""

    repeats: int = 3
    cpu_time: bool = False


TIMING = Timing()

#: The environment of a --cpu-time run: one thread for pysharp's OpenMP, the BLAS, Numba and
#: XLA's Eigen, so that the process's CPU time is one core's and no idle thread spins in it.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "NUMBA_NUM_THREADS": "1"}
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"
_ONE_THREAD_MARK = "BENCH_SUITE_ONE_THREAD"  # set in the re-executed process

#: The peers held to the instruction set of pysharp's core where it is narrower than the
#: CPU's (PYSHARP_CPU_TARGET=avx2 on an AVX-512 machine stands in for an AVX2 machine, whose
#: JAX and Numba could not use AVX-512 either): XLA's --xla_cpu_max_isa (SSE4_2 is XLA's
#: narrowest) and Numba's NUMBA_CPU_NAME, read when each library loads.
PEER_ISA = {"sse2": ("SSE4_2", "nehalem"), "avx2": ("AVX2", "haswell"),
            "avx512": ("AVX512", "skylake-avx512")}
_PEER_ISA_MARK = "BENCH_SUITE_PEER_ISA"  # set in the re-executed process


def cpu_best_target() -> str | None:
    """The widest of pysharp's x86 instruction sets this CPU runs, by NumPy's CPU features
    (None where NumPy does not say, as on ARM)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as has
    except ImportError:
        return None
    if all(has.get(f) for f in ("AVX512F", "AVX512CD", "AVX512BW", "AVX512DQ", "AVX512VL")):
        return "avx512"
    if has.get("AVX2") and has.get("FMA3"):
        return "avx2"
    return "sse2" if has.get("SSE2") else None


def narrower_target(ps, cpu_best: str | None = None) -> str | None:
    """The instruction set of pysharp's loaded core where it is narrower than the best one
    the CPU runs, else None. A portable build knows the sets the CPU runs; a build for one
    set (``PYSHARP_MARCH=x86-64-v3``) is compared with ``cpu_best`` (default: the CPU's, by
    :func:`cpu_best_target`)."""
    info = ps.build_info()
    target, runnable = info.get("cpu_target"), info.get("cpu_targets_runnable") or []
    if target not in OPENBLAS_CORETYPE or not runnable:
        return None
    order = list(OPENBLAS_CORETYPE)  # narrowest first
    best = runnable[-1]
    if len(runnable) == 1:
        best = cpu_best if cpu_best is not None else cpu_best_target()
    if best not in order or order.index(target) >= order.index(best):
        return None
    return target


def cpu_timed(fn, repeats: int) -> float:
    """Least CPU time of the process (all threads) over ``repeats`` calls of fn, after a
    warm-up call: the work a call costs, whatever share of the cores it was given."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def best_rate(fn, work: float, repeats: int | None = None) -> dict:
    """work / best time of fn over repeats (default TIMING.repeats), after a warm-up call:
    wall time, or CPU time with TIMING.cpu_time."""
    repeats = TIMING.repeats if repeats is None else repeats
    if TIMING.cpu_time:
        best = cpu_timed(fn, repeats)
        return {"rate": work / best, "seconds": best, "load": None}
    best, load = timed(fn, repeats)
    return {"rate": work / best, "seconds": best, "load": load}


def cpu_time_ceilings(n: int = 2048, repeats: int = 3) -> dict:
    """The GEMM ceilings of one thread by CPU time (``--cpu-time``), in the form of
    bench._common.measured_ceilings."""
    out = {}
    for dtype in ("float64", "float32"):
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n)).astype(dtype)
        b = rng.standard_normal((n, n)).astype(dtype)
        c = np.empty((n, n), dtype=dtype)
        best = cpu_timed(lambda: np.matmul(a, b, out=c), repeats)
        out[dtype] = {"gflops": 2.0 * n ** 3 / best / 1e9, "seconds": best, "load": None,
                      "n": n, "dtype": dtype, "clock": "cpu", "blas": blas_info()}
    return out


def ceilings(cpu_time: bool) -> dict:
    """The GEMM ceilings as the rows are timed: by wall time on the BLAS's threads, or by the
    CPU time of one thread."""
    return cpu_time_ceilings() if cpu_time else measured_ceilings()


def import_jax():
    try:
        import jax
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)
    return jax


def jax_gd_wd(jax, loss, lr, wd, dtype):
    """jit(vmap(fori_loop of GD+WD steps)) on the autodiff gradient of ``loss``."""
    jnp = jax.numpy
    grad = jax.grad(loss)
    decay = 1.0 - lr * wd

    def trajectory(w0, steps):
        return jax.lax.fori_loop(0, steps, lambda _, w: decay * w - lr * grad(w), w0)

    run = jax.jit(jax.vmap(trajectory, in_axes=(0, None)))
    return lambda W0, steps: np.asarray(
        run(jnp.asarray(W0, dtype=dtype), jnp.int32(steps)).block_until_ready())


# --------------------------------------------------------------------------- workloads
def trajectory_workloads(ps, quick: bool):
    """(key, model, jax name, B, steps, lr, wd, init norm)."""
    s = 4 if quick else 1
    lin = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    big = ps.BNLinearRegression.synthetic(d=100, n=200, seed=0)
    mc800 = ps.BNMatrixCompletion.synthetic(size=20, true_rank=2, rank=20, seed=0)
    mc80 = ps.BNMatrixCompletion.synthetic(size=10, true_rank=2, rank=4, seed=0)
    toy = ps.Toy3D(c=10.0)
    return [
        ("bn_linreg d40 n20 B4096", lin, "bn_linreg", 4096 // s, 1000 // s, LR, WD, 3.0),
        ("bn_linreg d100 n200 B1024", big, "bn_linreg", 1024 // s, 200 // s, LR, WD, 3.0),
        ("bn_mc D800 B256", mc800, "bn_mc", 256 // s, 200 // s, 0.1, 1e-3, 10.0),
        ("bn_mc D80 B4096", mc80, "bn_mc", 4096 // s, 300 // s, 0.1, 1e-3, 10.0),
        ("toy3d B65536", toy, "toy3d", 65536 // s, 1000 // s, 0.1, 1e-3, 3.0),
    ]


def pysharp_rows(ps, quick: bool) -> dict:
    """Every pysharp-only measurement, keyed by row name: {"rate": ...}."""
    out = {}
    for key, model, _, B, steps, lr, wd, norm in trajectory_workloads(ps, quick):
        W0 = model.random_point(B, seed=1, norm=norm)
        kw = dict(record_every=steps, sharpness_every=0)
        if isinstance(model, ps.BNLinearRegression):
            kw["reduced"] = False
        out[key] = best_rate(lambda: ps.run_gd_wd(model, W0, lr, wd, steps, **kw), B * steps)
        if key.startswith("bn_linreg d40"):
            W32 = W0.astype(np.float32)
            out[key + " float32"] = best_rate(
                lambda: ps.run_gd_wd(model, W32, lr, wd, steps, **kw), B * steps)
            tracked = dict(kw, sharpness_every=100)
            out[key + " sharpness every 100"] = best_rate(
                lambda: ps.run_gd_wd(model, W0, lr, wd, steps, **tracked), B * steps)
            reduced = dict(kw, reduced=True)
            out[key + " reduced"] = best_rate(
                lambda: ps.run_gd_wd(model, W0, lr, wd, steps, **reduced), B * steps)
    kb = 1024 if quick else 4096
    lin = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    mc = ps.BNMatrixCompletion.synthetic(size=20, true_rank=2, rank=20, seed=0)
    for name, model in (("bn_linreg", lin), ("bn_mc", mc), ("toy3d", ps.Toy3D(c=10.0))):
        W = model.random_point(kb, seed=2, norm=2.0)
        V = np.random.default_rng(3).standard_normal(W.shape)
        out[f"kernel {name} loss+grad B{kb}"] = best_rate(lambda: model.loss_and_grad(W), kb)
        out[f"kernel {name} hvp B{kb}"] = best_rate(lambda: model.hvp(W, V), kb)
    P = 64 if quick else 256
    Wp = lin.random_point(P, seed=4, norm=2.0)
    out[f"spherical_sharpness d40 B{P}"] = best_rate(
        lambda: ps.spherical_sharpness(lin, Wp, method="lanczos"), P)
    model, W0, lr, B, steps = stability.workload(ps, quick)
    out[sgd_key(model, W0, B)] = best_rate(
        lambda: stability.run_pysharp(ps, model, W0, lr, B, steps), len(W0) * steps)
    return out


def sgd_key(model, W0, batch: int) -> str:
    """The run_sgd row's name: bench.stability's workload."""
    n, d = model.X.shape
    return f"run_sgd linreg n{n} d{d} batch {batch} T{len(W0)}"


def peer_rows(ps, quick: bool, checks: list) -> dict:
    """Peer measurements keyed as pysharp_rows, each a dict of peer -> {"rate": ...}."""
    jax = import_jax()
    out: dict = {}
    for key, model, jname, B, steps, lr, wd, norm in trajectory_workloads(ps, quick):
        W0 = model.random_point(B, seed=1, norm=norm)
        peers = {}
        short = min(steps, 50)
        kw = dict(record_every=short, sharpness_every=0)
        if isinstance(model, ps.BNLinearRegression):
            kw["reduced"] = False
        ref = ps.run_gd_wd(model, W0[:64], lr, wd, short, **kw).w
        if jax is not None:
            jrun = jax_gd_wd(jax, jax_loss(jname, model, jax.numpy, np.float64), lr, wd,
                             np.float64)
            record_check(checks, key, "jax", rel_dev(jrun(W0[:64], short), ref), 1e-8)
            peers["jax"] = best_rate(lambda: jrun(W0, steps), B * steps)
        if jname == "bn_linreg":
            prob = Problem(model)
            record_check(checks, key, "numpy",
                         rel_dev(numpy_gd_wd(prob, W0[:64], lr, wd, short), ref), 1e-8)
            np_steps = max(steps // 10, 1)
            peers["numpy"] = best_rate(lambda: numpy_gd_wd(prob, W0, lr, wd, np_steps),
                                       B * np_steps, repeats=1)
            if key.startswith("bn_linreg d40"):
                try:
                    import numba
                    nrun = make_numba(numba)
                    record_check(checks, key, "numba",
                                 rel_dev(nrun(prob, W0[:64], lr, wd, short), ref), 1e-8)
                    peers["numba (naive prange)"] = best_rate(
                        lambda: nrun(prob, W0, lr, wd, steps), B * steps)
                    nb_kw = dict(kw, reduced=False, backend="numba")
                    nb = ps.run_gd_wd(model, W0[:64], lr, wd, short, **nb_kw).w
                    record_check(checks, key, "pysharp numba backend", rel_dev(nb, ref), 1e-8)
                    nb_steps = max(steps // 10, 1)
                    peers["pysharp numba backend"] = best_rate(
                        lambda: ps.run_gd_wd(model, W0, lr, wd, nb_steps,
                                             **dict(nb_kw, record_every=nb_steps)),
                        B * nb_steps, repeats=1)
                except ImportError:
                    pass
        out[key] = peers
    kb = 1024 if quick else 4096
    lin = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    mc = ps.BNMatrixCompletion.synthetic(size=20, true_rank=2, rank=20, seed=0)
    from pysharp import reference
    oracles = {
        "bn_linreg": reference.BNLinearRegressionReference(lin.X, lin.y),
        "bn_mc": reference.BNMatrixCompletionReference(mc.rows, mc.cols, mc.values, mc.shape,
                                                       mc.rank),
        "toy3d": reference.Toy3DReference(10.0),
    }
    for name, model in (("bn_linreg", lin), ("bn_mc", mc), ("toy3d", ps.Toy3D(c=10.0))):
        W = model.random_point(kb, seed=2, norm=2.0)
        V = np.random.default_rng(3).standard_normal(W.shape)
        ref = oracles[name]
        g_ps, hv_ps = model.loss_and_grad(W)[1], model.hvp(W, V)
        lg_peers = {"numpy reference": best_rate(lambda: ref.grad(W), kb)}
        hv_peers = {"numpy reference": best_rate(lambda: ref.hvp(W, V), kb)}
        checks.append({"row": f"kernel {name}", "peer": "numpy reference",
                       "rel_dev": max(rel_dev(ref.grad(W), g_ps), rel_dev(ref.hvp(W, V), hv_ps)),
                       "ok": True})
        if jax is not None:
            lg, hvp = jax_kernels(jax, jax_loss(name, model, jax.numpy, np.float64))
            jW, jV = jax.numpy.asarray(W), jax.numpy.asarray(V)
            dev = max(rel_dev(np.asarray(lg(jW)[1]), g_ps), rel_dev(np.asarray(hvp(jW, jV)), hv_ps))
            record_check(checks, f"kernel {name}", "jax", dev, 1e-8)
            lg_peers["jax"] = best_rate(lambda: lg(jW)[1].block_until_ready(), kb)
            hv_peers["jax"] = best_rate(lambda: hvp(jW, jV).block_until_ready(), kb)
        out[f"kernel {name} loss+grad B{kb}"] = lg_peers
        out[f"kernel {name} hvp B{kb}"] = hv_peers
    P = 64 if quick else 256
    Wp = lin.random_point(P, seed=4, norm=2.0)
    if jax is not None:
        loss = jax_loss("bn_linreg", lin, jax.numpy, np.float64)

        @jax.jit
        def top(W):
            Wn = W / jax.numpy.linalg.norm(W, axis=1, keepdims=True)
            return jax.numpy.linalg.eigvalsh(jax.vmap(jax.hessian(loss))(Wn))[:, -1]

        ours = ps.spherical_sharpness(lin, Wp, method="lanczos").eigenvalues[:, 0]
        record_check(checks, "spherical_sharpness", "jax",
                     rel_dev(np.asarray(top(jax.numpy.asarray(Wp))), ours), 1e-8)
        out[f"spherical_sharpness d40 B{P}"] = {
            "jax vmap(hessian)+eigvalsh": best_rate(
                lambda: top(jax.numpy.asarray(Wp)).block_until_ready(), P)}
    model, W0, lr, B, steps = stability.workload(ps, quick)
    key, T = sgd_key(model, W0, B), len(W0)
    ref = stability.run_pysharp(ps, model, W0, lr, B, steps)
    out[key] = {}
    for name, fn in stability.peers(model, W0, lr, B, steps).items():  # the same batches
        record_check(checks, key, name, rel_dev(fn(), ref), 1e-8)
        out[key][name] = best_rate(fn, T * steps)
    return out


def baseline_rows(path: str, quick: bool) -> dict:
    """pysharp_rows measured on another pysharp tree, in a subprocess.

    The subprocess starts without ``site`` (``-S``) and gets the site-packages folders on
    PYTHONPATH instead, so that an editable install's import hook (a ``.pth`` file, which
    runs before PYTHONPATH is searched) cannot put the installed pysharp in the old tree's
    place; the run refuses to report when pysharp came from anywhere else."""
    import site

    tree = Path(path).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "base.json"
        # This bench package first (the old tree may have its own), then the old pysharp.
        (Path(tmp) / "bench").symlink_to(Path(__file__).resolve().parent)
        paths = [tmp, str(tree), *site.getsitepackages()]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        cmd = [sys.executable, "-S", "-m", "bench.suite", "--pysharp-only", "--json", str(out),
               "--repeats", str(TIMING.repeats)]
        if quick:
            cmd.append("--quick")
        if TIMING.cpu_time:
            cmd.append("--cpu-time")
        subprocess.run(cmd, check=True, env=env, cwd=tmp)
        result = json.loads(out.read_text())
        if not Path(result["build"]["file"]).is_relative_to(tree):
            raise RuntimeError(f"the baseline run imported pysharp from {result['build']['file']}"
                               f", not from {tree}")
        return {"rows": result["pysharp"], "build": result["build"], "tree": str(tree)}


#: OpenBLAS's kernel for each instruction set of pysharp's portable core (OPENBLAS_CORETYPE).
OPENBLAS_CORETYPE = {"sse2": "Core2", "avx2": "Haswell", "avx512": "SkylakeX"}


def target_ceilings(ps) -> dict | None:
    """The GEMM ceilings of the instruction set that pysharp's loaded core runs, where it is
    narrower than the best one the CPU runs (``PYSHARP_CPU_TARGET=avx2`` on an AVX-512
    machine); None otherwise.

    The machine's BLAS uses the CPU's widest vectors, which code built for a narrower set
    cannot: half the FLOP rate for AVX2 on AVX-512. A core's fraction of that ceiling says
    nothing about its own room, so OpenBLAS is held to the core's set here
    (``OPENBLAS_CORETYPE``, read when the library loads, hence a subprocess): the ceiling
    the same core would meet on a CPU without the wider set."""
    target = narrower_target(ps)
    if target is None:
        return None
    root = Path(__file__).resolve().parent.parent
    code = ("import json, sys; from bench.suite import ceilings; "
            f"json.dump(ceilings({TIMING.cpu_time}), sys.stdout, default=float)")
    env = dict(os.environ, OPENBLAS_CORETYPE=OPENBLAS_CORETYPE[target],
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=root,
                          capture_output=True, text=True)
    return json.loads(done.stdout)


def fmt(x: float, load: float | None = None) -> str:
    """x to 3 digits; '!' when other processes used more than BUSY_THRESHOLD of the CPUs
    while it was timed (see bench._common.LoadMonitor)."""
    return f"{x:.3g}" + ("!" if load is not None and load > BUSY_THRESHOLD else "")


def fractions(result: dict, key: str, rate: float) -> tuple[float | None, float | None]:
    """(fraction of the measured GEMM ceiling, fraction of the nominal peak) of a row,
    None where the row has no FLOP count or the run no ceiling / no clock.

    float32 rows are taken against the SGEMM ceiling and twice the nominal FP64 peak
    (a SIMD register holds twice as many float32 lanes). Where the run measured the
    ceilings of the core's narrower instruction set (``target_ceilings``), those, and the
    nominal peak of the core's lanes."""
    flops = result.get("flops_per_unit", {}).get(key)
    if not flops:
        return None, None
    dtype = "float32" if "float32" in key else "float64"
    ceilings = result.get("target_ceilings") or result.get("ceilings", {})
    ceiling = ceilings.get(dtype, {}).get("gflops")
    peak = result["machine"].get("peak_fp64_gflops_estimate")
    lanes, machine_lanes = result.get("build", {}).get("lanes_f64"), result["machine"].get(
        "fp64_lanes")
    if peak and lanes and machine_lanes:
        peak *= min(lanes, machine_lanes) / machine_lanes
    if peak and result.get("cpu_time"):
        peak /= result["machine"].get("cores") or 1
    if peak and dtype == "float32":
        peak *= 2
    return (peak_fraction(rate, flops, ceiling) if ceiling else None,
            peak_fraction(rate, flops, peak) if peak else None)


def table(result: dict) -> str:
    """Markdown: one row per workload, pysharp (before, after), peers, ratios, and the
    fraction of the measured GEMM ceiling (of the nominal peak in brackets)."""
    measured = bool(result.get("ceilings"))
    last = "% of GEMM ceiling (of nominal peak)" if measured else "% of peak"
    base = result.get("baseline", {})
    baseline = base.get("rows", base)  # JSON files before the baseline's build was kept
    lines = [f"| workload | before | pysharp | peers (rate) | pysharp / peer | {last} |",
             "|---|---|---|---|---|---|"]
    for key, row in result["pysharp"].items():
        before = baseline.get(key, {}).get("rate")
        peers = result.get("peers", {}).get(key, {})
        rate = row["rate"]
        of_ceiling, of_peak = fractions(result, key, rate)
        pct = ""
        if of_ceiling is not None:
            pct = f"{100 * of_ceiling:.1f}%"
            if of_peak is not None:
                pct += f" ({100 * of_peak:.1f}%)"
        elif of_peak is not None:
            pct = f"{100 * of_peak:.1f}%" + (" (nominal)" if measured else "")
        lines.append("| " + " | ".join([
            key, fmt(before) if before else "", fmt(rate, row.get("load")),
            ", ".join(f"{p} {fmt(v['rate'])}" for p, v in peers.items()),
            ", ".join(f"{rate / v['rate']:.2f}x {p}" for p, v in peers.items()),
            pct]) + " |")
    return "\n".join(lines)


def ceiling_note(result: dict) -> str:
    """One sentence on the measured ceilings and the BLAS that ran them ('' without)."""
    c = result.get("ceilings")
    if not c:
        return ""
    d, f = c["float64"], c["float32"]
    blas = d.get("blas", {})
    if "reason" in blas:
        how = f"BLAS unidentified: {blas['reason']}"
    else:
        how = (f"{blas.get('internal_api')} {blas.get('version')}, "
               f"{blas.get('architecture')} kernel, {blas.get('num_threads')} threads")
        env = blas.get("env") or {}
        if env:
            how += ", with " + ", ".join(f"{k}={v}" for k, v in env.items())
    busy = [c["load"] for c in (d, f) if c.get("load") is not None]
    loaded = (f" Other processes used up to {max(busy):.0%} of the CPUs during the ceiling "
              "measurements." if busy and max(busy) > BUSY_THRESHOLD else "")
    clock = (" Every row and ceiling was timed on one thread by the process's CPU time "
             "(--cpu-time), against one core's nominal peak." if result.get("cpu_time") else "")
    return (f"Ceilings measured in the same run: DGEMM {d['gflops']:.0f} GFLOP/s, SGEMM "
            f"{f['gflops']:.0f} GFLOP/s ({d['n']}^3 through NumPy, {how}; the faster of a "
            "measurement before and one after the workloads); the last column is each "
            "workload's fraction of the DGEMM ceiling (SGEMM for float32 rows), of the "
            "nominal peak in brackets. A rate marked ! was timed while other processes used "
            f"more than {BUSY_THRESHOLD:.0%} of the CPUs.{loaded}{clock}{target_note(result)}")


def target_note(result: dict) -> str:
    """The sentence on the ceilings of the core's narrower instruction set ('' without)."""
    t = result.get("target_ceilings")
    if not t:
        return ""
    target = result["build"]["cpu_target"]
    return (f" The core ran its {target} build on a CPU with a wider set: the last column is "
            f"taken against OpenBLAS held to {target} (OPENBLAS_CORETYPE="
            f"{OPENBLAS_CORETYPE[target]}: DGEMM {t['float64']['gflops']:.0f}, SGEMM "
            f"{t['float32']['gflops']:.0f} GFLOP/s) and the nominal peak of its lanes; JAX "
            f"ran with --xla_cpu_max_isa={PEER_ISA[target][0]} and Numba with NUMBA_CPU_NAME="
            f"{PEER_ISA[target][1]}, as on a CPU without the wider set.")


README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- bench-suite:begin -->", "<!-- bench-suite:end -->"


def write_readme(result: dict, readme: Path = README) -> None:
    """Replace the block between README's bench-suite markers with this run's table."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} block")
    m = result["machine"]
    head = (f"{m['cpu']}, {m['cores']} cores, FP64 peak estimate "
            f"{m.get('peak_fp64_gflops_estimate') or 0:.0f} GFLOP/s (float32 rows: twice it); "
            "trajectory rows in "
            "trajectory-steps/s, kernel rows in rows/s, sharpness in points/s; ")
    if result.get("baseline", {}).get("tree"):
        head += f"`before` is the tree {result['baseline']['tree']}, measured in the same run."
    elif result.get("baseline"):
        head += ("`before` is the build before the lane engine (commit bb9910b), measured in "
                 "the same run.")
    else:
        head += "`before` is empty: this run timed no older tree (`--baseline`)."
    note = ceiling_note(result)
    if note:
        head += " " + note
    before, _, rest = text.partition(BEGIN)
    _, _, after = rest.partition(END)
    readme.write_text(f"{before}{BEGIN}\n{head}\n\n{table(result)}\n{END}{after}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller batches and runs")
    ap.add_argument("--baseline", metavar="PATH", help="an older pysharp tree to time too")
    ap.add_argument("--pysharp-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--readme", metavar="JSON", help="only rewrite README's table from a JSON")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    ap.add_argument("--markdown", metavar="PATH", help="write the table as Markdown")
    ap.add_argument("--repeats", type=int, default=TIMING.repeats, metavar="N",
                    help=f"timed calls a row takes the best of (default {TIMING.repeats})")
    ap.add_argument("--cpu-time", action="store_true",
                    help="one thread for every library and CPU time instead of wall time, "
                         "ceilings included: for a machine that other processes share")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    TIMING.repeats, TIMING.cpu_time = args.repeats, args.cpu_time
    if args.readme:
        write_readme(json.loads(Path(args.readme).read_text()))
        return 0
    ps, note = import_pysharp()
    # Thread counts and instruction sets are read when the libraries load: where either must
    # be held, run again with them set.
    env, flags = {}, [os.environ.get("XLA_FLAGS", "")]
    if args.cpu_time and os.environ.get(_ONE_THREAD_MARK) != "1":
        env.update(ONE_THREAD, **{_ONE_THREAD_MARK: "1"})
        flags.append(XLA_ONE_THREAD)
    target = narrower_target(ps)
    if target and os.environ.get(_PEER_ISA_MARK) != "1" and not args.pysharp_only:
        env.update(NUMBA_CPU_NAME=PEER_ISA[target][1], **{_PEER_ISA_MARK: "1"})
        flags.append(f"--xla_cpu_max_isa={PEER_ISA[target][0]}")
    if env:
        env["XLA_FLAGS"] = " ".join(f for f in flags if f)
        cmd = [sys.executable, "-m", "bench.suite", *(sys.argv[1:] if argv is None else argv)]
        return subprocess.run(cmd, env=dict(os.environ, **env), check=False).returncode
    first, first_target = ceilings(args.cpu_time), target_ceilings(ps)
    build = dict(ps.build_info(), file=str(Path(ps.__file__).resolve()))
    result = {"machine": machine_info(), "build": build, "quick": args.quick,
              "repeats": args.repeats, "cpu_time": args.cpu_time,
              "pysharp": pysharp_rows(ps, args.quick)}
    if not args.pysharp_only:
        if note:
            print(note)
        checks: list = []
        result["peers"] = peer_rows(ps, args.quick, checks)
        result["checks"] = checks
        if args.baseline:
            result["baseline"] = baseline_rows(args.baseline, args.quick)
        lin = Problem(ps.BNLinearRegression.synthetic(d=40, n=20, seed=0))
        big = Problem(ps.BNLinearRegression.synthetic(d=100, n=200, seed=0))
        result["flops_per_unit"] = {
            "bn_linreg d40 n20 B4096": lin.flops_per_step,
            "bn_linreg d40 n20 B4096 float32": lin.flops_per_step,
            "bn_linreg d100 n200 B1024": big.flops_per_step}
        sgd_model, sgd_W0, _, sgd_batch, _ = stability.workload(ps)
        result["flops_per_unit"][sgd_key(sgd_model, sgd_W0, sgd_batch)] = (
            stability.flops_per_step(sgd_model, sgd_batch))
        if args.quick:
            result["flops_per_unit"] = {}
    last = ceilings(args.cpu_time)
    result["ceilings"] = best_ceilings(first, last)
    result["ceiling_runs"] = [{dt: c["gflops"] for dt, c in run.items()} for run in (first, last)]
    if first_target:
        last_target = target_ceilings(ps)
        result["target_ceilings"] = best_ceilings(first_target, last_target)
        result["target_ceiling_runs"] = [{dt: c["gflops"] for dt, c in run.items()}
                                         for run in (first_target, last_target)]
    if not args.pysharp_only:
        print(ceiling_note(result))
        for c in checks:
            if not c["ok"]:
                print(f"MISMATCH {c['row']} vs {c['peer']}: rel dev {c['rel_dev']:.2e}")
    if not args.pysharp_only:
        md = table(result)
        print(md)
        if args.markdown:
            Path(args.markdown).write_text(md + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Engine benchmark: whole GD+WD trajectories on BN linear regression, pysharp vs peers.

The paper setting: ``BNLinearRegression.synthetic(d=40, n=20, seed=0)``,
``W0 = model.random_point(B, seed=1, norm=3.0)``, lr 0.5, wd 2e-4, float64,
B = 4096 trajectories of 2000 steps. Engines, measured side by side in one run:

1. pysharp ``run_gd_wd(..., record_every=steps, sharpness_every=0)``: one call
   into the compiled core (best of 3 after a warm-up). By default it uses the
   exact reduced update in the singular basis of Xc; the direct update
   (``reduced=False``) is timed too.
2. NumPy, batched: a Python loop over steps, the whole batch vectorised.
3. Numba (when importable): ``@njit(parallel=True, fastmath=False)``, prange
   over trajectories, the step loop inside.
4. JAX (x64): ``jit(vmap(trajectory))``, the trajectory a ``lax.fori_loop``.

The peers implement the gradient of L = 2 var(y) (1 - cos(Xc w, y - mean y))
themselves, grad = -2 var(y) Xc^T (u - f zhat) / ||z||, u = yc/||yc||,
zhat = z/||z||, f = u . zhat, from the model's X and y (not from pysharp).
Before timing, each peer's final iterate is compared with pysharp's on a short
run; a disagreement beyond 1e-8 relative is printed as a MISMATCH. Peers are
timed on the full batch but may run fewer steps (so that a repeat takes about
``--peer-seconds``); throughput is trajectory-steps per second either way.

Also timed: pysharp float32 vs float64; the overhead of in-run sharpness
tracking (sharpness_every = steps/20 vs 0); and the sharpness of the same
checkpoints by ``scipy.sparse.linalg.eigsh`` on a ``LinearOperator`` over
``model.hvp`` (how one does it with existing tools, point by point) vs
pysharp's batched ``spherical_sharpness``.

Usage (from the repository root)::

    python -m bench.engine                # full run, about 2-4 minutes on 2 cores
    python -m bench.engine --quick        # B=256, 200 steps, under 30 s
    python -m bench.engine --json out.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a script: python bench/<name>.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import BUSY_THRESHOLD, LoadMonitor, import_pysharp

#: Final iterates of every peer must match pysharp's to this relative deviation.
CHECK_TOL = 1e-8
#: float32 vs float64 agreement is only reported against this (loose) bound.
F32_TOL = 1e-3

LR, WD = 0.5, 2e-4


# --------------------------------------------------------------------------- imports
def import_optional(name):
    try:
        return importlib.import_module(name), None
    except Exception as exc:  # ImportError, or a broken install
        return None, f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- machine
def machine_info() -> dict:
    model, mhz, flags = platform.processor() or "unknown", [], set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key, val = key.strip(), val.strip()
        if key == "model name":
            model = val
        elif key == "cpu MHz":
            try:
                mhz.append(float(val))
            except ValueError:
                pass
        elif key == "flags" and not flags:
            flags = set(val.split())
    cores = os.cpu_count() or 1
    ghz = sum(mhz) / len(mhz) / 1e3 if mhz else None
    lanes = 8 if "avx512f" in flags else 4 if "avx2" in flags or "avx" in flags else 2
    # peak FP64 = cores * GHz * 2 FMA units * lanes * 2 flops per FMA
    peak = cores * ghz * 2 * lanes * 2 if ghz else None
    return {"cpu": model, "cores": cores, "ghz": ghz, "avx512f": "avx512f" in flags,
            "fp64_lanes": lanes, "peak_fp64_gflops_estimate": peak,
            "platform": platform.platform(), "python": platform.python_version()}


# --------------------------------------------------------------------------- timing
def best_of(fn, repeats: int, warmup: bool = True) -> dict:
    """Best wall time of ``repeats`` calls of fn (after one warm-up call)."""
    if warmup:
        fn()
    times, loads = [], []
    for _ in range(repeats):
        with LoadMonitor() as load:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        loads.append(load.other)
    i = int(np.argmin(times))
    return {"best_s": times[i], "times_s": times, "load": loads[i]}


# --------------------------------------------------------------------------- peers
class Problem:
    """The centred data and constants, computed from model.X, model.y (not pysharp)."""

    def __init__(self, model):
        X = np.asarray(model.X, dtype=np.float64)
        y = np.asarray(model.y, dtype=np.float64)
        self.Xc = np.ascontiguousarray(X - X.mean(axis=0))
        yc = y - y.mean()
        self.u = yc / np.linalg.norm(yc)
        self.scale = 2.0 * float(y.var())
        self.n, self.d = self.Xc.shape

    @property
    def flops_per_step(self) -> int:
        """Direct update: two matvecs with Xc (4 n d) plus vector ops."""
        return 4 * self.n * self.d + 10 * self.n + 4 * self.d


def numpy_gd_wd(prob: Problem, W0, lr, wd, steps):
    Xc, XcT, u, scale = prob.Xc, np.ascontiguousarray(prob.Xc.T), prob.u, prob.scale
    decay = 1.0 - lr * wd
    W = np.array(W0, dtype=np.float64, copy=True)
    for _ in range(steps):
        Z = W @ XcT                                         # (B, n)
        r = np.sqrt(np.einsum("bi,bi->b", Z, Z))[:, None]    # ||z||
        Z /= r                                              # zhat
        f = Z @ u                                           # u . zhat
        C = u - f[:, None] * Z
        C *= -scale / r
        W *= decay
        W -= lr * (C @ Xc)                                   # grad = Xc^T C
    return W


def make_numba(numba):
    from numba import njit, prange

    @njit(parallel=True, fastmath=False, cache=False)
    def gd_wd(W0, Xc, u, scale, lr, wd, steps):
        B, d = W0.shape
        n = Xc.shape[0]
        W = W0.copy()
        decay = 1.0 - lr * wd
        for b in prange(B):
            w = W[b]
            z = np.empty(n)
            g = np.empty(d)
            for _ in range(steps):
                r2 = 0.0
                for i in range(n):
                    s = 0.0
                    for j in range(d):
                        s += Xc[i, j] * w[j]
                    z[i] = s
                    r2 += s * s
                r = math.sqrt(r2)
                f = 0.0
                for i in range(n):
                    z[i] /= r
                    f += u[i] * z[i]
                coef = -scale / r
                for j in range(d):
                    g[j] = 0.0
                for i in range(n):
                    c = coef * (u[i] - f * z[i])
                    for j in range(d):
                        g[j] += c * Xc[i, j]
                for j in range(d):
                    w[j] = decay * w[j] - lr * g[j]
        return W

    def run(prob, W0, lr, wd, steps):
        return gd_wd(np.ascontiguousarray(W0, dtype=np.float64), prob.Xc, prob.u,
                     prob.scale, float(lr), float(wd), int(steps))
    return run


def make_jax(jax, prob: Problem, lr, wd):
    jnp = jax.numpy
    Xc = jnp.asarray(prob.Xc)
    u = jnp.asarray(prob.u)
    scale, decay = prob.scale, 1.0 - lr * wd

    def step(_, w):
        z = Xc @ w
        r = jnp.sqrt(z @ z)
        zh = z / r
        f = u @ zh
        g = -scale * (Xc.T @ (u - f * zh)) / r
        return decay * w - lr * g

    def trajectory(w0, steps):
        return jax.lax.fori_loop(0, steps, step, w0)

    batched = jax.jit(jax.vmap(trajectory, in_axes=(0, None)))

    def run(prob_, W0, lr_, wd_, steps):
        out = batched(jnp.asarray(W0, dtype=jnp.float64), jnp.int32(steps))
        return np.asarray(out.block_until_ready())
    return run


def rel_dev(W, W_ref) -> float:
    """max over trajectories of ||W_b - Wref_b|| / ||Wref_b||."""
    W = np.asarray(W, dtype=np.float64)
    W_ref = np.asarray(W_ref, dtype=np.float64)
    return float(np.max(np.linalg.norm(W - W_ref, axis=-1) / np.linalg.norm(W_ref, axis=-1)))


# --------------------------------------------------------------------------- formatting
def fmt_rate(x, load=None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3e}" + ("!" if load is not None and load > BUSY_THRESHOLD else "")


def load_tag(t) -> str:
    load = t.get("load")
    return f" (! other processes used {load:.0%} of the CPUs)" if (
        load is not None and load > BUSY_THRESHOLD) else ""


def print_table(head, body, right_from=1):
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.rjust(w) if i >= right_from else c.ljust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    line = fmt(head)
    print(line)
    print("-" * len(line))
    for b in body:
        print(fmt(b))


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.engine",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="B=256, 200 steps, few repeats (smoke test; noisy numbers)")
    p.add_argument("--batch", type=int, default=None, help="trajectories (default 4096)")
    p.add_argument("--steps", type=int, default=None, help="steps (default 2000)")
    p.add_argument("--peer-seconds", type=float, default=None,
                   help="target wall time of one timed peer run; peers run fewer steps "
                        "than --steps when needed (default 6, quick 0.5)")
    p.add_argument("--eigsh-trajectories", type=int, default=None,
                   help="trajectories whose checkpoints scipy eigsh solves (default 64)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = p.parse_args(argv)
    q = args.quick
    args.batch = args.batch or (256 if q else 4096)
    args.steps = args.steps or (200 if q else 2000)
    args.peer_seconds = args.peer_seconds or (0.5 if q else 6.0)
    args.eigsh_trajectories = args.eigsh_trajectories or (8 if q else 64)
    args.repeats = 2 if q else 3
    args.peer_repeats = 1 if q else 2
    args.check_batch = 16 if q else 64
    args.check_steps = 200
    if args.batch < 1 or args.steps < 20:
        p.error("need --batch >= 1 and --steps >= 20")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    ps, note = import_pysharp()
    numba, numba_err = import_optional("numba")
    jax, jax_err = import_optional("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", True)
        import jax.numpy  # noqa: F401
    import scipy
    from scipy.sparse.linalg import LinearOperator, eigsh

    mach = machine_info()
    B, steps = args.batch, args.steps
    ckpt_every = steps // 20
    n_ckpt = steps // ckpt_every + 1
    model = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    prob = Problem(model)
    W0 = model.random_point(B, seed=1, norm=3.0)
    flops = prob.flops_per_step
    peak = mach["peak_fp64_gflops_estimate"]

    # ---- header
    print("pysharp engine benchmark: BN linear regression, GD+WD, whole trajectories")
    print(f"  setting: d={prob.d} n={prob.n} (synthetic seed 0), W0 = random_point(B, seed=1, "
          f"norm=3), lr={LR}, wd={WD}, float64, B={B}, steps={steps}"
          + ("  [--quick]" if args.quick else ""))
    print(f"  cpu: {mach['cpu']}, os.cpu_count()={mach['cores']}, "
          f"{mach['ghz']:.3f} GHz (/proc/cpuinfo), avx512f={mach['avx512f']}"
          if mach["ghz"] else f"  cpu: {mach['cpu']}, os.cpu_count()={mach['cores']}")
    if peak:
        print(f"  peak FP64 estimate: {mach['cores']} cores x {mach['ghz']:.3f} GHz x 2 FMA units "
              f"x {mach['fp64_lanes']} lanes x 2 = {peak:.1f} GFLOP/s")
    print(f"  {mach['platform']}, Python {mach['python']}")
    print(f"  pysharp {ps.__version__} build_info: {ps.build_info()}")
    if note:
        print(f"  note: {note}")
    versions = {"numpy": np.__version__, "scipy": scipy.__version__,
                "jax": jax.__version__ if jax else None,
                "numba": numba.__version__ if numba else None}
    print("  versions: " + ", ".join(f"{k} {v if v else 'not available'}"
                                     for k, v in versions.items()))
    if numba is not None:
        print(f"  numba threads: {numba.config.NUMBA_NUM_THREADS}")
    if numba_err:
        print(f"  numba: {numba_err}")
    if jax_err:
        print(f"  jax: {jax_err}")

    results = {"machine": mach, "versions": versions, "build_info": ps.build_info(),
               "setting": {"d": prob.d, "n": prob.n, "lr": LR, "wd": WD, "B": B, "steps": steps,
                           "quick": args.quick, "flops_per_traj_step_direct": flops},
               "engines": [], "checks": [], "note": note}

    def ps_run(W, n_steps, **kw):
        return ps.run_gd_wd(model, W, LR, WD, n_steps, record_every=n_steps, **kw)

    has_reduced = True
    try:
        ps_run(W0[:2], 2, sharpness_every=0, reduced=False)
    except TypeError:
        has_reduced = False

    # ---- agreement checks on a short run
    Bc, Sc = min(args.check_batch, B), args.check_steps
    Wc = W0[:Bc]
    ref = ps_run(Wc, Sc, sharpness_every=0).w
    peers = {"numpy": lambda P, W, lr, wd, s: numpy_gd_wd(P, W, lr, wd, s)}
    if numba is not None:
        peers["numba"] = make_numba(numba)
        if ps.backends()["numba"]["available"]:  # pysharp's own fallback, the same engine
            peers["pysharp backend=numba"] = lambda P, W, lr, wd, s: ps.run_gd_wd(
                model, W, lr, wd, s, record_every=s, sharpness_every=0, backend="numba").w
    if jax is not None:
        peers["jax"] = make_jax(jax, prob, LR, WD)
    print(f"\nAgreement of the final iterate with pysharp run_gd_wd (default engine) on "
          f"B={Bc}, {Sc} steps (max_b ||W_b - W_ps,b|| / ||W_ps,b||, tolerance {CHECK_TOL:g}):")
    ok_all = True
    check_rows = []
    others = {}
    if has_reduced:
        others["pysharp reduced=False (direct)"] = (
            lambda: ps_run(Wc, Sc, sharpness_every=0, reduced=False).w, CHECK_TOL)
    others["pysharp float32"] = (
        lambda: ps_run(Wc.astype(np.float32), Sc, sharpness_every=0).w, F32_TOL)
    for name, fn in peers.items():
        others[name] = (lambda fn=fn: fn(prob, Wc, LR, WD, Sc), CHECK_TOL)
    for name, (fn, tol) in others.items():
        try:
            dev = rel_dev(fn(), ref)
        except Exception as exc:  # a broken peer is reported, not fatal
            dev, err = float("nan"), f"{type(exc).__name__}: {exc}"
        else:
            err = None
        ok = bool(dev <= tol)
        ok_all &= ok or name == "pysharp float32"
        status = "ok" if ok else "*** MISMATCH: THIS ENGINE DISAGREES WITH PYSHARP ***"
        if err:
            status += f" ({err})"
        print(f"  {name:32s} {dev:10.3e}  (tol {tol:g})  {status}")
        check_rows.append({"engine": name, "max_rel_dev": dev, "tol": tol, "ok": ok,
                           "error": err})
    results["checks"] = check_rows
    dev_of = {r["engine"]: r["max_rel_dev"] for r in check_rows}

    # ---- pysharp timings
    print(f"\nTiming (pysharp: best of {args.repeats} after one warm-up; peers: a short probe "
          f"as warm-up, then best of {args.peer_repeats}) ...", flush=True)
    rows = []

    def add(name, b, s, t, extra=None):
        tps = b * s / t["best_s"]
        row = {"engine": name, "B": b, "steps": s, "best_s": t["best_s"], "times_s": t["times_s"],
               "background_load": t["load"], "traj_steps_per_s": tps,
               "equiv_gflops": tps * flops / 1e9,
               "frac_peak": tps * flops / 1e9 / peak if peak else None,
               "check_max_rel_dev": dev_of.get(name)}
        row.update(extra or {})
        rows.append(row)
        print(f"  {name:34s} {t['best_s']:8.3f} s  {fmt_rate(tps, t['load'])} traj-steps/s",
              flush=True)
        return row

    add("pysharp", B, steps, best_of(lambda: ps_run(W0, steps, sharpness_every=0),
                                     args.repeats))
    if has_reduced:
        # The direct update costs ~8x more: fewer repeats keep the run short.
        add("pysharp reduced=False (direct)", B, steps,
            best_of(lambda: ps_run(W0, steps, sharpness_every=0, reduced=False),
                    max(1, args.repeats - 1)))
    W0_32 = W0.astype(np.float32)
    add("pysharp float32", B, steps,
        best_of(lambda: ps_run(W0_32, steps, sharpness_every=0), args.repeats),
        {"dtype": "float32"})
    sharp_row = add(f"pysharp sharpness_every={ckpt_every}", B, steps,
                    best_of(lambda: ps_run(W0, steps, sharpness_every=ckpt_every),
                            args.repeats))

    # ---- peers: probe (warm-up + JIT), choose steps, best of peer_repeats
    for name, fn in peers.items():
        probe_steps = 20
        try:
            fn(prob, W0, LR, WD, probe_steps)          # warm-up / compile for this shape
            per_step = math.inf
            for _ in range(3):   # fastest of 3 probes: one stalled probe must not shrink the run
                t0 = time.perf_counter()
                fn(prob, W0, LR, WD, probe_steps)
                per_step = min(per_step, (time.perf_counter() - t0) / probe_steps)
            s = int(min(steps, max(probe_steps, args.peer_seconds / max(per_step, 1e-9))))
            s = max(probe_steps, (s // 10) * 10)
            t = best_of(lambda: fn(prob, W0, LR, WD, s), args.peer_repeats, warmup=False)
        except Exception as exc:
            print(f"  {name:34s} FAILED: {type(exc).__name__}: {exc}")
            continue
        add(name, B, s, t)

    # ---- sharpness: scipy eigsh point by point vs pysharp batched, same checkpoints
    Be = min(args.eigsh_trajectories, B)
    snaps = ps_run(W0[:Be], steps, sharpness_every=0, theta_every=ckpt_every).theta
    P = np.ascontiguousarray(snaps.reshape(-1, prob.d))     # (n_ckpt * Be, d), unit rows
    npts = P.shape[0]

    point_times = np.empty(npts)

    def eigsh_all():
        out = np.empty(npts)
        for i in range(npts):
            p = P[i]
            t0 = time.perf_counter()
            op = LinearOperator((prob.d, prob.d), dtype=np.float64,
                                matvec=lambda v, p=p: model.hvp(p, np.ravel(v)))
            out[i] = eigsh(op, k=1, which="LA", tol=1e-10, return_eigenvectors=False)[0]
            point_times[i] = time.perf_counter() - t0
        return out

    lam_eigsh = eigsh_all()                                 # also the warm-up
    t_e = best_of(eigsh_all, 1, warmup=False)
    eigsh_point_s = point_times.copy()
    t_p = best_of(lambda: ps.spherical_sharpness(model, P, k=1), args.repeats)
    res = ps.spherical_sharpness(model, P, k=1)
    lam_ps = res.eigenvalues[:, 0]
    sharp_dev = float(np.max(np.abs(lam_ps - lam_eigsh) / np.abs(lam_eigsh)))
    base_row = rows[0]
    in_run_pp = max(0.0, sharp_row["best_s"] - base_row["best_s"]) / (B * n_ckpt)
    # Median per point: robust to the scheduler stalls a loaded machine inflicts on
    # thousands of tiny calls (the mean is printed too).
    eigsh_pp = float(np.median(eigsh_point_s))
    eigsh_mean_pp = t_e["best_s"] / npts
    ps_pp = t_p["best_s"] / npts

    # ---- report
    ps_tps = base_row["traj_steps_per_s"]
    print(f"\nGD+WD trajectory throughput (float64 unless marked; B={B}; each engine's "
          f"steps shown; '!' = other processes used > {BUSY_THRESHOLD:.0%} of the CPUs "
          f"during that measurement)")
    head = ["engine", "B", "steps", "best s", "traj-steps/s", "pysharp/engine",
            "equiv GFLOP/s", "of peak", "check dev"]
    body = []
    for r in rows:
        dev = r.get("check_max_rel_dev")
        body.append([r["engine"], str(r["B"]), str(r["steps"]), f"{r['best_s']:.3f}",
                     fmt_rate(r["traj_steps_per_s"], r["background_load"]),
                     f"{ps_tps / r['traj_steps_per_s']:.2f}x",
                     f"{r['equiv_gflops']:.2f}",
                     f"{100 * r['frac_peak']:.1f}%" if r["frac_peak"] is not None else "n/a",
                     "ref" if r is base_row else ("-" if dev is None else f"{dev:.1e}")])
    print_table(head, body)
    print(f"  equiv GFLOP/s = traj-steps/s x {flops} flops, the count of the DIRECT update "
          f"(4nd + 10n + 4d: two matvecs with Xc plus vector ops), for every engine.")
    print("  pysharp's default engine may execute fewer flops than that, thanks to an exact "
          "algebraic shortcut (the reduced update in the singular basis of Xc), so its "
          "'equiv' figure is not hardware throughput; the reduced=False row is the direct "
          "update.")
    if peak:
        print(f"  'of peak' is against the estimated FP64 peak {peak:.1f} GFLOP/s.")
    print(f"  pysharp-equivalent GFLOP/s: {base_row['equiv_gflops']:.2f}"
          + (f" ({100 * base_row['frac_peak']:.1f}% of peak)" if peak else "")
          + " -- counting the direct update's flops; pysharp may execute fewer (exact "
          "algebraic shortcut).")
    print("  pysharp/engine = pysharp (default engine, float64) traj-steps/s over the row's.")
    short = [r["engine"] for r in rows if r["steps"] < steps]
    if short:
        print(f"  peers run with fewer steps than {steps} to keep the benchmark short: "
              f"{', '.join(short)} (throughput per trajectory-step is comparable).")

    r32 = next(r for r in rows if r["engine"] == "pysharp float32")
    f32_speedup = r32["traj_steps_per_s"] / ps_tps
    overhead = sharp_row["best_s"] / base_row["best_s"]
    print("\nSecondary measurements")
    print(f"  (a) pysharp float32 vs float64: {r32['best_s']:.3f} s vs {base_row['best_s']:.3f} s"
          f" -> float32 speed-up {f32_speedup:.2f}x (f32/f64 traj-steps/s); "
          "f32 final-iterate deviation on the check run "
          f"{dev_of.get('pysharp float32', float('nan')):.1e}")
    print(f"  (b) sharpness tracking: sharpness_every={ckpt_every} ({n_ckpt} checkpoints, "
          f"warm-started Lanczos) vs 0: {sharp_row['best_s']:.3f} s vs "
          f"{base_row['best_s']:.3f} s -> overhead {overhead:.2f}x the untracked run; "
          f"in-run cost {in_run_pp * 1e6:.2f} us per (trajectory, checkpoint)")
    print(f"  (c) sharpness at the same {n_ckpt} checkpoints of {Be} trajectories "
          f"({npts} points, unit theta):")
    print(f"      scipy eigsh(LinearOperator(model.hvp), k=1, which='LA', tol=1e-10), "
          f"one point at a time: {t_e['best_s']:.3f} s total{load_tag(t_e)}, "
          f"median {eigsh_pp * 1e6:.1f} us/point (mean {eigsh_mean_pp * 1e6:.1f})")
    print(f"      pysharp spherical_sharpness(model, W, k=1), one batched call: "
          f"{t_p['best_s']:.4f} s total{load_tag(t_p)}, {ps_pp * 1e6:.2f} us/point "
          f"(mean {float(np.mean(res.iterations)):.1f} Lanczos iterations, "
          f"{int(np.sum(res.converged))}/{npts} converged)")
    print(f"      ratio eigsh / spherical_sharpness per point: {eigsh_pp / ps_pp:.1f}x; "
          f"eigsh / pysharp in-run tracking: {eigsh_pp / in_run_pp:.1f}x"
          if in_run_pp > 0 else
          f"      ratio eigsh / spherical_sharpness per point: {eigsh_pp / ps_pp:.1f}x")
    print("      (the eigsh per-point cost is the median over points; ratios use it)")
    print(f"      max relative difference of the sharpness values: {sharp_dev:.1e}"
          + ("" if sharp_dev <= 1e-8 else "   *** SHARPNESS VALUES DISAGREE ***"))
    print(f"      extrapolated to all B={B} trajectories (eigsh cost is linear in points): "
          f"eigsh {eigsh_pp * n_ckpt * 1e3:.2f} ms per trajectory -> "
          f"{eigsh_pp * n_ckpt * B:.1f} s for the batch, vs "
          f"{sharp_row['best_s'] - base_row['best_s']:.2f} s added by pysharp's in-run tracking")
    loads = {r["engine"]: r["background_load"] for r in rows}
    loads["scipy eigsh"], loads["spherical_sharpness"] = t_e["load"], t_p["load"]
    busy = [k for k, v in loads.items() if v is not None and v > BUSY_THRESHOLD]
    if busy:
        worst = max(loads[k] for k in busy)
        print(f"\n*** NOTE: other processes used up to {worst:.0%} of the CPUs while timing "
              f"{', '.join(busy)}: those numbers (and the ratios built on them) are not "
              "trustworthy; rerun on a quiet machine. ***")
    results["busy_measurements"] = busy
    print(f"\ntotal wall time {time.perf_counter() - t_start:.1f} s")
    if not ok_all:
        print("\n*** WARNING: at least one engine's final iterate disagrees with pysharp beyond "
              f"{CHECK_TOL:g} relative (see the agreement block above). ***")

    results["engines"] = rows
    results["secondary"] = {
        "float32_speedup": f32_speedup,
        "sharpness_every": ckpt_every, "checkpoints": n_ckpt,
        "sharpness_tracking_overhead_ratio": overhead,
        "in_run_sharpness_s_per_point": in_run_pp,
        "eigsh_trajectories": Be, "eigsh_points": npts,
        "eigsh_s_per_point_median": eigsh_pp, "eigsh_s_per_point_mean": eigsh_mean_pp,
        "eigsh_background_load": t_e["load"], "spherical_sharpness_background_load": t_p["load"],
        "spherical_sharpness_s_per_point": ps_pp,
        "eigsh_over_spherical_sharpness": eigsh_pp / ps_pp,
        "sharpness_max_rel_diff": sharp_dev,
        "eigsh_extrapolated_batch_s": eigsh_pp * n_ckpt * B,
    }
    results["all_checks_ok"] = ok_all
    results["total_s"] = time.perf_counter() - t_start
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=float))
        print(f"wrote {args.json}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())

"""Microbenchmark of the model kernels: pysharp vs the NumPy reference vs JAX.

For each model (BN linear regression in the paper setting d=40 n=20, BN matrix
completion size=20 rank=20, the 3-D toy) and each batch size B, measures the
throughput in evaluations per second (B * calls / seconds, best of several
repeats, after a warm-up) of ``loss_and_grad`` and ``hvp`` for

1. pysharp (the compiled core),
2. the NumPy reference implementations (``pysharp.reference``),
3. JAX, ``jax.jit(jax.vmap(...))`` of ``jax.value_and_grad`` and of a
   forward-over-reverse HVP (``jax.jvp`` of the gradient), when jax imports.

Before timing, every peer's values are checked against pysharp on the same
points; a failed check prints a WARNING row (timings are still reported).
Results are ratios measured side by side in one run: absolute numbers depend
on the machine, thread counts and the load on it.

Usage (from the repository root)::

    python -m bench.kernels                 # full run, a minute or two
    python -m bench.kernels --quick         # smoke test, a few seconds
    python -m bench.kernels --batches 1,64 --dtype float32 --json out.json
"""

from __future__ import annotations

import argparse
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

#: The NumPy matrix-completion reference loops over the batch in Python with
#: np.add.at, so it is timed on at most this many rows (its cost is linear in B).
MC_REFERENCE_CAP = 64
MC_REFERENCE_CAP_QUICK = 8



# --------------------------------------------------------------------------- imports
def import_jax():
    """Return (jax, jax.numpy, None) or (None, None, reason)."""
    try:
        import jax
        import jax.numpy as jnp
    except Exception as exc:  # ImportError, or a broken jaxlib
        return None, None, f"{type(exc).__name__}: {exc}"
    jax.config.update("jax_enable_x64", True)
    return jax, jnp, None


# --------------------------------------------------------------------------- machine
def _cpuinfo() -> dict:
    info = {"model": platform.processor() or "unknown", "mhz": None, "flags": set()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    mhz = []
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key, val = key.strip(), val.strip()
        if key == "model name" and info["model"] in ("unknown", "", platform.machine()):
            info["model"] = val
        elif key == "cpu MHz":
            try:
                mhz.append(float(val))
            except ValueError:
                pass
        elif key == "flags" and not info["flags"]:
            info["flags"] = set(val.split())
    if mhz:
        info["mhz"] = sum(mhz) / len(mhz)
    return info


def machine_info() -> dict:
    cpu = _cpuinfo()
    cores = os.cpu_count() or 1
    flags = cpu["flags"]
    if "avx512f" in flags:
        isa, per_cycle = "avx512f", 16 * 2      # 8 doubles x FMA(2 flops) x 2 units
    elif "avx2" in flags and "fma" in flags:
        isa, per_cycle = "avx2+fma", 8 * 2      # 4 doubles x FMA(2 flops) x 2 units
    elif "avx2" in flags:
        isa, per_cycle = "avx2", 8 * 2
    else:
        isa, per_cycle = "sse2", 4 * 2
    peak = None
    if cpu["mhz"]:
        peak = per_cycle * cores * cpu["mhz"] * 1e-3   # GFLOP/s, FP64
    return {"cpu": cpu["model"], "cores": cores, "mhz": cpu["mhz"], "isa": isa,
            "fp64_flops_per_cycle_per_core": per_cycle, "peak_fp64_gflops_estimate": peak,
            "platform": platform.platform(), "python": platform.python_version()}


# --------------------------------------------------------------------------- timing
def throughput(fn, batch: int, target_s: float, repeats: int) -> dict:
    """Evaluations per second of ``fn`` (which evaluates ``batch`` points).

    One warm-up call (JIT compilation, first-touch allocation), a calibration
    of the number of calls per repeat so that a repeat lasts about
    ``target_s``, then the best of ``repeats`` repeats.
    """
    fn()
    one = math.inf
    for _ in range(3):   # the fastest of 3 calls, so one stalled call cannot shrink the repeats
        t0 = time.perf_counter()
        fn()
        one = min(one, time.perf_counter() - t0)
    one = max(one, 1e-7)
    calls = max(1, min(int(target_s / one), 1_000_000))
    times = []
    with LoadMonitor() as load:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append(time.perf_counter() - t0)
    best = min(times)
    return {"evals_per_s": batch * calls / best, "calls": calls, "repeats": repeats,
            "best_s": best, "repeat_s": times, "batch_timed": batch,
            "background_load": load.other}


# --------------------------------------------------------------------------- JAX models
def jax_loss(name: str, model, jnp, dtype):
    """The model's loss, written from the definitions of docs/theory.rst, as a jnp function
    of w (D,)."""
    if name == "bn_linreg":
        Xc = jnp.asarray(model.X - model.X.mean(axis=0), dtype=dtype)
        yc = model.y - model.y.mean()
        u = jnp.asarray(yc / np.linalg.norm(yc), dtype=dtype)
        scale = 2.0 * float(model.y.var())

        def loss(w):  # 2 var(y) (1 - cos(Xc w, y - mean y))
            z = Xc @ w
            return scale * (1.0 - jnp.dot(z, u) / jnp.sqrt(jnp.dot(z, z)))
        return loss

    if name == "bn_mc":
        m1, m2 = model.shape
        r = model.rank
        rows = jnp.asarray(model.rows)
        cols = jnp.asarray(model.cols)
        vals = model.values
        vc = vals - vals.mean()
        u = jnp.asarray(vc / np.linalg.norm(vc), dtype=dtype)
        scale = 2.0 * float(vals.var())

        # p_k = std(v)(s_k - mu)/sd + mean(v), as 2 var(v)(1 - cos(s - mu, v - mean v))
        def loss(w):
            U = w[: m1 * r].reshape(m1, r)
            V = w[m1 * r:].reshape(m2, r)
            s = jnp.sum(U[rows] * V[cols], axis=-1)
            sc = s - jnp.mean(s)
            return scale * (1.0 - jnp.dot(sc, u) / jnp.sqrt(jnp.dot(sc, sc)))
        return loss

    if name == "toy3d":
        c = float(model.c)

        def loss(w):  # (1 + c z^2)(x - y)^2 at (x, y, z) = w/||w||
            t = w / jnp.sqrt(jnp.dot(w, w))
            return (1.0 + c * t[2] ** 2) * (t[0] - t[1]) ** 2
        return loss

    raise KeyError(name)


def jax_kernels(jax, loss):
    lg = jax.jit(jax.vmap(jax.value_and_grad(loss)))
    grad = jax.grad(loss)
    hvp = jax.jit(jax.vmap(lambda w, v: jax.jvp(grad, (w,), (v,))[1]))
    return lg, hvp


# --------------------------------------------------------------------------- checks
def rel_err(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), np.finfo(np.float64).tiny))


def check(label: str, pairs: dict, tol: float, report: list) -> bool:
    """pairs: quantity -> (peer value, pysharp value). Appends rows to report."""
    errs = {k: rel_err(a, b) for k, (a, b) in pairs.items()}
    ok = all(e <= tol for e in errs.values())
    report.append({"check": label, "ok": ok, "tol": tol,
                   **{f"rel_err_{k}": e for k, e in errs.items()}})
    return ok


# --------------------------------------------------------------------------- formatting
def fmt_rate(x, load=None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3e}" + ("!" if load is not None and load > BUSY_THRESHOLD else "")


def fmt_ratio(a, b) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def print_table(title: str, rows: list) -> None:
    head = ["model", "B", "pysharp evals/s", "numpy evals/s", "jax evals/s",
            "pysharp/numpy", "pysharp/jax"]
    body = []
    for r in rows:
        np_cell = fmt_rate(r["numpy"], r.get("numpy_load"))
        if r["numpy"] is not None and r.get("numpy_batch", r["B"]) != r["B"]:
            np_cell += "*"
        body.append([r["model"], str(r["B"]), fmt_rate(r["pysharp"], r.get("pysharp_load")),
                     np_cell, fmt_rate(r["jax"], r.get("jax_load")),
                     fmt_ratio(r["pysharp"], r["numpy"]), fmt_ratio(r["pysharp"], r["jax"])])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    line = "  ".join(h.rjust(w) if i > 1 else h.ljust(w)
                     for i, (h, w) in enumerate(zip(head, widths)))
    print(f"\n{title}")
    print(line)
    print("-" * len(line))
    for b in body:
        print("  ".join(c.rjust(w) if i > 1 else c.ljust(w)
                        for i, (c, w) in enumerate(zip(b, widths))))


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.kernels",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="tiny repeat counts (smoke test; numbers are noisy)")
    p.add_argument("--batches", default="1,64,4096",
                   help="comma-separated batch sizes (default: 1,64,4096)")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = p.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if not args.batches or min(args.batches) < 1:
        p.error("--batches must hold positive integers")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    dtype = np.dtype(args.dtype)
    target_s, repeats = (0.002, 2) if args.quick else (0.1, 5)
    mc_cap = MC_REFERENCE_CAP_QUICK if args.quick else MC_REFERENCE_CAP
    tol = 1e-8 if dtype == np.float64 else 1e-4

    try:
        pysharp, import_note = import_pysharp()
    except ImportError as exc:
        print(f"pysharp is not usable: {exc}", file=sys.stderr)
        return 1
    from pysharp import reference as ref

    jax, jnp, jax_reason = import_jax()
    mach = machine_info()

    print("pysharp kernel microbenchmark"
          + ("  [--quick: tiny repeat counts, noisy]" if args.quick else ""))
    print(f"machine : {mach['cpu']}, {mach['cores']} cores (os.cpu_count()), "
          f"{mach['mhz']:.0f} MHz (/proc/cpuinfo), {mach['isa']}" if mach["mhz"] else
          f"machine : {mach['cpu']}, {mach['cores']} cores (os.cpu_count()), {mach['isa']}")
    print(f"platform: {mach['platform']}, Python {mach['python']}")
    print(f"pysharp : {pysharp.__version__} from {Path(pysharp.__file__).resolve().parent}")
    print(f"build   : {pysharp.build_info()}")
    if import_note:
        print(f"note    : {import_note}")
    threads_env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                               "MKL_NUM_THREADS", "XLA_FLAGS") if k in os.environ}
    print(f"threads : pysharp OpenMP max_threads {pysharp.build_info().get('max_threads')}; "
          f"env {threads_env or '(no thread variables set)'}")
    print(f"numpy   : {np.__version__}")
    jax_text = (f"{jax.__version__} ({jax.devices()[0]}, x64 enabled)" if jax
                else f"n/a ({jax_reason})")
    print(f"jax     : {jax_text}")
    print(f"dtype   : {dtype.name}; batches {args.batches}; best of {repeats} repeats of "
          f"~{target_s * 1e3:.0f} ms after a warm-up; evals/s = B * calls / seconds")

    models = [
        ("bn_linreg", "BN linreg d=40 n=20", pysharp.BNLinearRegression.synthetic(),
         lambda m: ref.BNLinearRegressionReference(m.X, m.y)),
        ("bn_mc", "BN matcomp 20x20 r=20", pysharp.BNMatrixCompletion.synthetic(),
         lambda m: ref.BNMatrixCompletionReference(m.rows, m.cols, m.values, m.shape, m.rank)),
        ("toy3d", "Toy3D c=10", pysharp.Toy3D(), lambda m: ref.Toy3DReference(m.c)),
    ]

    results, checks, tables = [], [], {"loss_and_grad": [], "hvp": []}
    warnings = []
    run_load = LoadMonitor().__enter__()
    for key, label, model, make_ref in models:
        reference = make_ref(model)
        jax_lg = jax_hvp = None
        if jax is not None:
            jax_lg, jax_hvp = jax_kernels(jax, jax_loss(key, model, jnp, dtype))
        for B in args.batches:
            W = model.random_point(B, seed=1, dtype=dtype)
            V = model.random_point(B, seed=2, dtype=dtype)
            Bref = min(B, mc_cap) if key == "bn_mc" else B
            Wr, Vr = W[:Bref], V[:Bref]

            # --- correctness, once per (model, B), before timing
            loss_p, grad_p = model.loss_and_grad(W)
            hvp_p = model.hvp(W, V)
            if not check(f"{label} B={B} numpy vs pysharp", {
                    "loss": (reference.loss(Wr), loss_p[:Bref]),
                    "grad": (reference.grad(Wr), grad_p[:Bref]),
                    "hvp": (reference.hvp(Wr, Vr), hvp_p[:Bref])}, tol, checks):
                warnings.append(checks[-1])
            if jax is not None:
                Wj, Vj = jnp.asarray(W), jnp.asarray(V)
                loss_j, grad_j = jax_lg(Wj)
                hvp_j = jax_hvp(Wj, Vj)
                if not check(f"{label} B={B} jax vs pysharp", {
                        "loss": (loss_j, loss_p), "grad": (grad_j, grad_p),
                        "hvp": (hvp_j, hvp_p)}, tol, checks):
                    warnings.append(checks[-1])

            # --- timing
            peers = {
                "loss_and_grad": {
                    "pysharp": (lambda: model.loss_and_grad(W), B),
                    "numpy": (lambda: (reference.loss(Wr), reference.grad(Wr)), Bref),
                },
                "hvp": {
                    "pysharp": (lambda: model.hvp(W, V), B),
                    "numpy": (lambda: reference.hvp(Wr, Vr), Bref),
                },
            }
            if jax is not None:
                peers["loss_and_grad"]["jax"] = (lambda: jax.block_until_ready(jax_lg(Wj)), B)
                peers["hvp"]["jax"] = (lambda: jax.block_until_ready(jax_hvp(Wj, Vj)), B)
            for op, fns in peers.items():
                row = {"model": label, "B": B, "pysharp": None, "numpy": None, "jax": None,
                       "numpy_batch": Bref}
                for backend, (fn, nb) in fns.items():
                    m = throughput(fn, nb, target_s, repeats)
                    row[backend] = m["evals_per_s"]
                    row[backend + "_load"] = m["background_load"]
                    results.append({"model": key, "label": label, "op": op, "B": B,
                                    "backend": backend, "dtype": dtype.name, **m})
                tables[op].append(row)

    run_load.__exit__(None, None, None)
    print_table("loss_and_grad: evaluations per second (higher is better)", tables["loss_and_grad"])
    print_table("hvp: evaluations per second (higher is better)", tables["hvp"])
    if any(r["numpy_batch"] != r["B"] for t in tables.values() for r in t):
        print("\n* the NumPy matrix-completion reference loops over B in Python (np.add.at per "
              f"row), so it is timed on B = min(B, {mc_cap}) rows;\n  its evals/s is that "
              "per-row rate (its cost is linear in B), not a run on the full batch.")
    print("  numpy loss_and_grad = reference.loss + reference.grad "
          "(the reference has no fused call).")
    flagged = [r for r in results if (r["background_load"] or 0) > BUSY_THRESHOLD]
    if run_load.other is not None:
        print("  background CPU load from other processes during the run: "
              f"{100 * run_load.other:.0f}% of the machine; {len(flagged)} measurement(s) taken "
              f"above {100 * BUSY_THRESHOLD:.0f}% are marked !"
              + (" -- rerun on a quiet machine before trusting them" if flagged else "")
              + (" (per-measurement load is not tracked with --quick: windows too short)"
                 if args.quick else ""))

    # --- accuracy
    print(f"\naccuracy checks (max |peer - pysharp| / max |pysharp| over the batch, tol {tol:g}):")
    for c in checks:
        errs = "  ".join(f"{k[8:]} {v:.1e}" for k, v in c.items() if k.startswith("rel_err_"))
        if not c["ok"]:
            print(f"  WARNING {c['check']}: {errs}  (exceeds tol {tol:g})")
    n_ok = sum(c["ok"] for c in checks)
    worst = max((v for c in checks for k, v in c.items() if k.startswith("rel_err_")), default=0.0)
    print(f"  {n_ok}/{len(checks)} checks within tolerance; worst relative error {worst:.1e}")

    # --- GFLOP/s for BN linreg at the largest B (4096 by default)
    flops = None
    lin = [r for r in results if r["model"] == "bn_linreg"]
    if lin:
        Bmax = max(r["B"] for r in lin)
        m = models[0][2]
        n, d = m.n, m.dim
        per_eval = {"loss_and_grad": 4 * n * d, "hvp": 8 * n * d}
        peak = mach["peak_fp64_gflops_estimate"]
        if peak and dtype == np.float32:
            peak *= 2
        flops = {"B": Bmax, "n": n, "d": d, "flops_per_eval": per_eval,
                 "peak_gflops_estimate": peak, "achieved": []}
        print(f"\nBN linreg (n={n}, d={d}) at B={Bmax}: GFLOP/s counting "
              f"~4nd = {per_eval['loss_and_grad']} flops per loss+grad (two matvecs of Xc), "
              f"~8nd = {per_eval['hvp']} per HVP")
        if peak:
            per_cycle = mach["fp64_flops_per_cycle_per_core"] * (2 if dtype == np.float32 else 1)
            print(f"  estimated peak {dtype.name}: {peak:.1f} GFLOP/s = {per_cycle} "
                  f"flops/cycle/core ({mach['isa']}: vector width x FMA x 2 units) x "
                  f"{mach['cores']} cores x {mach['mhz']:.0f} MHz  [an ESTIMATE: cpu MHz is the "
                  "current clock; vCPUs may be SMT siblings; some cores execute AVX-512 as "
                  "2 x 256-bit]")
        for op in ("loss_and_grad", "hvp"):
            for r in lin:
                if r["op"] != op or r["B"] != Bmax:
                    continue
                g = r["evals_per_s"] * per_eval[op] * 1e-9
                frac = g / peak if peak else None
                flops["achieved"].append({"op": op, "backend": r["backend"], "gflops": g,
                                          "fraction_of_peak": frac})
                star = f"  (B timed = {r['batch_timed']})" if r["batch_timed"] != Bmax else ""
                print(f"  {op:13s} {r['backend']:7s} {g:8.2f} GFLOP/s"
                      + (f"  = {100 * frac:5.1f}% of estimated peak" if frac is not None else "")
                      + star)

    if warnings:
        print(f"\n{len(warnings)} accuracy WARNING(s) above: the affected timings compare "
              "different numbers.")

    if args.json:
        out = {"machine": mach, "build_info": pysharp.build_info(),
               "pysharp_version": pysharp.__version__,
               "pysharp_path": str(Path(pysharp.__file__).resolve().parent),
               "import_note": import_note,
               "numpy_version": np.__version__, "jax_version": jax.__version__ if jax else None,
               "jax_unavailable_reason": jax_reason, "dtype": dtype.name, "batches": args.batches,
               "quick": args.quick, "target_s": target_s, "repeats": repeats,
               "mc_reference_cap": mc_cap, "background_load": run_load.other,
               "results": results, "checks": checks, "flops": flops}
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(
            out, indent=2, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU benchmark: the CUDA engine and kernels against JAX on the same GPU, and the CPU core.

Rows, float64:

- GD+WD trajectories on every workload of ``bench.suite`` (BN linreg d40 and d100, BN
  matrix completion D800 and D80, Toy3D), with batches large enough to fill a GPU;
  BN linreg d40 also with the reduced update. Peers: JAX ``jit(vmap(fori_loop))`` on the
  same GPU and pysharp's C++ core on the host's cores. A row's name ends with the path
  ``backend="cuda"`` took: the fused tiles or the generic engine (``Trajectory.meta``).
  Where it took the tiles and CuPy is installed, ``backend="cupy"`` too (the same tile
  kernels compiled by NVRTC), its final iterates first checked bit-identical to cuda's.
  With ``--tracked``, where the tiles ran, a row with sharpness every steps / 10 too (a
  sixteenth of the batch): the tiles in segments between the engine's Lanczos solves
  ("pysharp cuda") against the generic engine. Off by default: the Lanczos solves take
  minutes, which gpu_check.sh's benchmark stage does not have.
- Kernels (loss+grad, HVP) at B = 2^18 rows, host arrays in and out for both pysharp and
  JAX (the transfers are part of the call a user makes).
- Batched spherical sharpness of 2^16 BN-linreg points against JAX ``vmap(hessian)`` +
  ``eigvalsh`` on the GPU.

Accuracy first: before a rate is taken, every peer and the CUDA path are checked against
the CPU core on a short run (20 steps, before any trajectory reaches the edge of stability:
after it, different code paths part at the rate the period-two dynamics amplify rounding),
on the kernels, and on the eigenvalues; a failed check is reported and its rate dropped.

Run on a machine with an NVIDIA GPU and pysharp built with ``PYSHARP_CUDA=ON``:
``python -m bench.gpu [--quick] [--json PATH]`` (``bench/gpu_check.sh`` does it all).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from bench._common import record_check, start_benchmark
from bench.engine import Problem, rel_dev
from bench.kernels import jax_kernels, jax_loss
from bench.suite import import_jax, jax_gd_wd, trajectory_workloads

#: H200 SXM FP64 vector peak (NVIDIA data sheet: 34 TFLOP/s; 67 with FP64 tensor cores,
#: which these scalar kernels do not use).
H200_FP64_PEAK = 34e12
#: GPU batch and steps per bench.suite workload (the suite's CPU sizes are too small to
#: fill 132 multiprocessors).
GPU_SIZE = {"bn_linreg d40": (2 ** 20, 1000), "bn_linreg d100": (2 ** 16, 200),
            "bn_mc D800": (2 ** 14, 200), "bn_mc D80": (2 ** 18, 300),
            "toy3d": (2 ** 22, 1000)}
CHECK_STEPS, CHECK_ROWS, TOL = 20, 256, 1e-10


def best_time(fn, repeats: int = 2) -> float:
    fn()  # warm-up: compilation, allocation
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def gpu_size(key: str, quick: bool) -> tuple[int, int]:
    B, steps = next(v for k, v in GPU_SIZE.items() if key.startswith(k))
    return (max(B // 16, 1024), max(steps // 5, 20)) if quick else (B, steps)


def trajectory_rows(ps, jax, quick: bool, checks: list, tracked: bool = False) -> dict:
    cupy = ps.backends()["cupy"]["available"]
    rows = {}
    for key, model, jname, _, _, lr, wd, norm in trajectory_workloads(ps, quick=False):
        B, steps = gpu_size(key, quick)
        W0 = model.random_point(B, seed=1, norm=norm)
        linreg = isinstance(model, ps.BNLinearRegression)
        kw = dict(record_every=steps, sharpness_every=0)
        short = dict(record_every=CHECK_STEPS, sharpness_every=0)
        variants = [("direct", dict(reduced=False) if linreg else {})]
        if linreg and "d40" in key:
            variants.append(("reduced", dict(reduced=True)))
        sub = W0[:CHECK_ROWS]
        ref = ps.run_gd_wd(model, sub, lr, wd, CHECK_STEPS, backend="cpp",
                           **short, **variants[0][1]).w
        for name, extra in variants:
            run = ps.run_gd_wd(model, sub, lr, wd, CHECK_STEPS, backend="cuda", **short,
                               **extra)
            got, path = run.w, "tiles" if run.meta.get("tiles") else "engine"
            row = f"{key.split(' B')[0]} B{B} T{steps} {name} ({path})"
            rates = {}
            if record_check(checks, row, "cuda vs cpp", rel_dev(got, ref), TOL):
                t = best_time(lambda: ps.run_gd_wd(model, W0, lr, wd, steps, backend="cuda",
                                                   **kw, **extra), repeats=1)
                rates["pysharp cuda"] = B * steps / t
            if cupy and path == "tiles":  # the same tile kernels, compiled by NVRTC
                crun = ps.run_gd_wd(model, sub, lr, wd, CHECK_STEPS, backend="cupy", **short,
                                    **extra)
                if record_check(checks, row, "cupy vs cuda (bits)",
                                float(np.max(np.abs(crun.w - got))), 0.0):
                    t = best_time(lambda: ps.run_gd_wd(model, W0, lr, wd, steps,
                                                       backend="cupy", **kw, **extra),
                                  repeats=1)
                    rates["pysharp cupy"] = B * steps / t
            cpu_B = min(B, 4096)
            t = best_time(lambda: ps.run_gd_wd(model, W0[:cpu_B], lr, wd, steps,
                                               backend="cpp", **kw, **extra), repeats=1)
            rates[f"pysharp cpp ({os.cpu_count()} host cores)"] = cpu_B * steps / t
            if jax is not None and name == "direct":
                jrun = jax_gd_wd(jax, jax_loss(jname, model, jax.numpy, np.float64), lr, wd,
                                 np.float64)
                if record_check(checks, row, "jax gpu", rel_dev(jrun(sub, CHECK_STEPS), ref),
                                1e-8):
                    rates["jax gpu"] = B * steps / best_time(lambda: jrun(W0, steps), 1)
            rows[row] = rates
            print_row(row, rates)
            if tracked and path == "tiles" and name == "direct":
                sharp = (f"{key.split(' B')[0]} B{max(B // 16, 1)} T{steps} "
                         f"sharpness/{max(steps // 10, 1)} (tiles)")
                rows[sharp] = tracked_rates(ps, model, W0, lr, wd, steps, extra, checks, sharp)
                print_row(sharp, rows[sharp])
    return rows


def tracked_rates(ps, model, W0, lr, wd, steps: int, extra: dict, checks: list,
                  row: str) -> dict:
    """A run with sharpness every steps // 10 (records there too) of a sixteenth of W0's rows
    (the Lanczos solves would take most of a short GPU visit at full size): the tiles in
    segments between the engine's Lanczos solves against the generic engine, both
    backend="cuda" (the engine by the backend without its tiles); their sharpness first
    checked on CHECK_ROWS rows, before EoS entry."""
    import dataclasses

    from pysharp._backends import BACKENDS

    every = max(steps // 10, 1)
    kw = dict(record_every=every, sharpness_every=every, **extra)
    tiles_backend = BACKENDS["cuda"]

    def run(W, T, tiles: bool):
        BACKENDS["cuda"] = tiles_backend if tiles else dataclasses.replace(tiles_backend,
                                                                           tiles=None)
        try:
            return ps.run_gd_wd(model, W, lr, wd, T, backend="cuda", **kw)
        finally:
            BACKENDS["cuda"] = tiles_backend

    short = dict(record_every=1, sharpness_every=CHECK_STEPS // 2, **extra)
    sub = W0[:CHECK_ROWS]
    got = ps.run_gd_wd(model, sub, lr, wd, CHECK_STEPS, backend="cuda", **short).sharpness
    ref = ps.run_gd_wd(model, sub, lr, wd, CHECK_STEPS, backend="cpp", **short).sharpness
    rates = {}
    if record_check(checks, row, "cuda tiles sharpness vs cpp", rel_dev(got.T, ref.T), 1e-8):
        W0 = W0[:max(len(W0) // 16, 1)]
        B = len(W0)
        rates["pysharp cuda"] = B * steps / best_time(lambda: run(W0, steps, True), 1)
        rates["pysharp cuda engine"] = B * steps / best_time(lambda: run(W0, steps, False), 1)
    return rates


def kernel_rows(ps, jax, quick: bool, checks: list) -> dict:
    B = 2 ** 14 if quick else 2 ** 18
    lin = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    mc = ps.BNMatrixCompletion.synthetic(size=20, true_rank=2, rank=20, seed=0)
    rows = {}
    for name, model in (("bn_linreg", lin), ("bn_mc", mc), ("toy3d", ps.Toy3D(c=10.0))):
        W = model.random_point(B, seed=2, norm=2.0)
        V = np.random.default_rng(3).standard_normal(W.shape)
        g_ref, hv_ref = model.loss_and_grad(W[:4096])[1], model.hvp(W[:4096], V[:4096])
        dev = max(rel_dev(model.loss_and_grad(W[:4096], backend="cuda")[1], g_ref),
                  rel_dev(model.hvp(W[:4096], V[:4096], backend="cuda"), hv_ref))
        record_check(checks, f"kernel {name}", "cuda vs cpp", dev, 1e-12)
        lg = {"pysharp cuda": B / best_time(lambda: model.loss_and_grad(W, backend="cuda"))}
        hv = {"pysharp cuda": B / best_time(lambda: model.hvp(W, V, backend="cuda"))}
        lg["pysharp cpp"] = B / best_time(lambda: model.loss_and_grad(W, backend="cpp"), 1)
        hv["pysharp cpp"] = B / best_time(lambda: model.hvp(W, V, backend="cpp"), 1)
        if jax is not None:
            jlg, jhv = jax_kernels(jax, jax_loss(name, model, jax.numpy, np.float64))
            jnp = jax.numpy

            def run_lg():  # host array in, host array out, as the pysharp call
                return np.asarray(jlg(jnp.asarray(W))[1])

            def run_hv():
                return np.asarray(jhv(jnp.asarray(W), jnp.asarray(V)))
            dev = max(rel_dev(run_lg()[:4096], g_ref), rel_dev(run_hv()[:4096], hv_ref))
            record_check(checks, f"kernel {name}", "jax gpu", dev, 1e-8)
            lg["jax gpu"] = B / best_time(run_lg)
            hv["jax gpu"] = B / best_time(run_hv)
        for kind, rates in (("loss+grad", lg), ("hvp", hv)):
            row = f"kernel {name} {kind} B{B}"
            rows[row] = rates
            print_row(row, rates)
    return rows


def sharpness_rows(ps, jax, quick: bool, checks: list) -> dict:
    P = 2 ** 12 if quick else 2 ** 16
    lin = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    W = lin.random_point(P, seed=2, norm=2.0)
    ref = ps.spherical_sharpness(lin, W[:256], method="lanczos", backend="cpp").eigenvalues[:, 0]
    got = ps.spherical_sharpness(lin, W[:256], method="lanczos", backend="cuda").eigenvalues
    record_check(checks, "spherical_sharpness", "cuda vs cpp", rel_dev(got[:, 0], ref), 1e-9)
    rates = {"pysharp cuda": P / best_time(
        lambda: ps.spherical_sharpness(lin, W, method="lanczos", backend="cuda"))}
    rates["pysharp cpp"] = 4096 / best_time(
        lambda: ps.spherical_sharpness(lin, W[:4096], method="lanczos", backend="cpp"), 1)
    if jax is not None:
        jnp = jax.numpy
        loss = jax_loss("bn_linreg", lin, jnp, np.float64)

        @jax.jit
        def top(X):
            Xn = X / jnp.linalg.norm(X, axis=1, keepdims=True)
            return jnp.linalg.eigvalsh(jax.vmap(jax.hessian(loss))(Xn))[:, -1]
        record_check(checks, "spherical_sharpness", "jax gpu",
                     rel_dev(np.asarray(top(jnp.asarray(W[:256]))), ref), 1e-8)
        rates["jax gpu vmap(hessian)+eigvalsh"] = P / best_time(
            lambda: np.asarray(top(jnp.asarray(W))))
    row = f"spherical_sharpness d40 B{P} (points/s)"
    print_row(row, rates)
    return {row: rates}


def print_row(row: str, rates: dict) -> None:
    jax_rate = next((r for k, r in rates.items() if k.startswith("jax")), None)
    parts = []
    for name, r in rates.items():
        ratio = f" ({r / jax_rate:.2f}x jax)" if jax_rate and not name.startswith("jax") else ""
        parts.append(f"{name} {r:.3e}{ratio}")
    print(f"{row}:\n    " + "\n    ".join(parts), flush=True)


def main(argv=None) -> int:
    args, ps = start_benchmark(__doc__, argv, quick="batches / 16, steps / 5", json="figures",
                               flags=(("--tracked", "also runs with sharpness tracking, the "
                                       "tiles against the generic engine (minutes)"),))
    report = ps.backends()["cuda"]
    if not report["available"]:
        print(f"no CUDA backend: {report['reason']}")
        return 2
    import pysharp._cuda as cu
    info = cu.device_info()
    print("device:", info)
    jax = import_jax()
    if jax is not None:
        print("jax devices:", jax.devices())
    checks: list = []
    out = {"device": info, "quick": args.quick, "host_cores": os.cpu_count()}
    out["rows"] = {}
    out["rows"].update(trajectory_rows(ps, jax, args.quick, checks, args.tracked))
    for part in (kernel_rows, sharpness_rows):
        out["rows"].update(part(ps, jax, args.quick, checks))
    lin = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)  # the d40 workload's model
    flops = Problem(lin).flops_per_step
    head = next((r for k, r in out["rows"].items()
                 if k.startswith("bn_linreg d40") and " direct (" in k), {})
    if "pysharp cuda" in head:
        out["fp64_fraction_bn_linreg_d40"] = head["pysharp cuda"] * flops / H200_FP64_PEAK
        print(f"BN linreg d40 direct: {out['fp64_fraction_bn_linreg_d40']:.1%} of the H200's "
              f"FP64 vector peak (d {lin.dim})")
    out["checks"] = checks
    failed = [c for c in checks if not c["ok"]]
    for c in failed:
        print(f"CHECK FAILED: {c}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The two ceilings of the GPU at hand, measured first: FP64 GEMM and a device copy.

``python -m bench.gpu_ceilings [--json PATH] [--seconds S]``. FP64 GEMM: a square float64
matrix product (cuBLAS DGEMM through CuPy, else ``jax.numpy.dot`` at HIGHEST precision),
the rate FP64 tensor cores (DMMA) reach in practice; the trajectory kernels' "% of peak" is
taken against it. Device copy: ``dst[...] = src`` of a 1 GiB buffer, bytes read + written
per second, the HBM ceiling. Each is the best of a few timed runs after a warm-up, bounded
by ``--seconds``. Needs a GPU; prints why not and exits 2 without one.
"""

from __future__ import annotations

import argparse
import json
import time


def _best(fn, sync, seconds: float, min_runs: int = 3) -> float:
    fn()
    sync()
    best, start, runs = float("inf"), time.perf_counter(), 0
    while runs < min_runs or time.perf_counter() - start < seconds / 2:
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
        runs += 1
        if time.perf_counter() - start > seconds:
            break
    return best


def with_cupy(n: int, copy_bytes: int, seconds: float) -> dict:
    import cupy as cp
    sync = cp.cuda.get_current_stream().synchronize
    a = cp.random.default_rng(0).standard_normal((n, n))
    b = cp.random.default_rng(1).standard_normal((n, n))
    t_gemm = _best(lambda: a @ b, sync, seconds)
    src = cp.ones(copy_bytes // 8)
    dst = cp.empty_like(src)
    t_copy = _best(lambda: dst.__setitem__(Ellipsis, src), sync, seconds)
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    return {"via": f"cupy {cp.__version__}", "device": props["name"].decode(),
            "fp64_gemm_flops": 2 * n ** 3 / t_gemm, "gemm_n": n,
            "copy_bytes_per_s": 2 * src.nbytes / t_copy, "copy_bytes": int(src.nbytes)}


def with_jax(n: int, copy_bytes: int, seconds: float) -> dict:
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    dev = jax.devices("gpu")[0]
    a = jax.device_put(jnp.asarray(jax.random.normal(jax.random.PRNGKey(0), (n, n),
                                                      dtype=jnp.float64)), dev)
    b = a.T + 1.0
    out = {}
    mm = jax.jit(lambda x, y: jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST))
    t_gemm = _best(lambda: out.__setitem__("c", mm(a, b)),
                   lambda: out["c"].block_until_ready(), seconds)
    src = jax.device_put(jnp.ones(copy_bytes // 8, dtype=jnp.float64), dev)
    cp = jax.jit(lambda x: x + 0.0)  # one read, one write per element
    t_copy = _best(lambda: out.__setitem__("d", cp(src)),
                   lambda: out["d"].block_until_ready(), seconds)
    return {"via": f"jax {jax.__version__}", "device": dev.device_kind,
            "fp64_gemm_flops": 2 * n ** 3 / t_gemm, "gemm_n": n,
            "copy_bytes_per_s": 2 * src.nbytes / t_copy, "copy_bytes": int(src.nbytes)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--n", type=int, default=8192, help="GEMM size (n x n times n x n)")
    ap.add_argument("--copy-mib", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=10.0, help="time cap of each measurement")
    args = ap.parse_args(argv)
    errors = []
    for way in (with_cupy, with_jax):
        try:
            res = way(args.n, args.copy_mib << 20, args.seconds)
            break
        except Exception as exc:  # not installed, or no GPU: try the next way
            errors.append(f"{way.__name__}: {type(exc).__name__}: {exc}")
    else:
        print("no GPU ceiling could be measured:\n  " + "\n  ".join(errors))
        return 2
    print(f"{res['device']} ({res['via']}): FP64 GEMM n={res['gemm_n']} "
          f"{res['fp64_gemm_flops'] / 1e12:.1f} TFLOP/s; device copy "
          f"{res['copy_bytes_per_s'] / 1e12:.2f} TB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""GPU benchmark: the CUDA engine against JAX on the same GPU and the C++ CPU core.

BN linear regression GD+WD, d 40, n 20, float64 (issue targets: B = 2^20
trajectories x 1000 steps at >= 2e9 trajectory-steps/s, >= 20x JAX jit + vmap
+ fori_loop on the same GPU; batched spherical sharpness of 2^16 points in
under 50 ms). Accuracy is checked before any rate is printed: the CUDA final
iterates against the CPU core on a subset, to 1e-10.

Run on a machine with an NVIDIA GPU and pysharp built with PYSHARP_CUDA=ON:
``python -m bench.gpu [--quick] [--json PATH]`` (bench/gpu_check.sh does all).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bench._common import import_pysharp
from bench.engine import Problem, make_jax, rel_dev

#: H200 SXM FP64 vector peak (NVIDIA data sheet: 34 TFLOP/s; 67 with FP64 tensor cores,
#: which these scalar kernels do not use).
H200_FP64_PEAK = 34e12


def timed(fn, repeats=2):
    fn()  # warm-up: compilation, allocation
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="B = 2^16, 200 steps")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    ps, note = import_pysharp()
    if note:
        print(note)
    report = ps.backends()["cuda"]
    if not report["available"]:
        print(f"no CUDA backend: {report['reason']}")
        return 2
    import pysharp._cuda as cu
    print("device:", cu.device_info())

    model = ps.BNLinearRegression.synthetic()  # d 40, n 20
    B, steps = (2 ** 16, 200) if args.quick else (2 ** 20, 1000)
    lr, wd = 0.5, 2e-4
    W0 = model.random_point(B, seed=1, norm=3.0)
    out = {"B": B, "steps": steps, "device": cu.device_info()}

    # Accuracy first: CUDA (full and reduced) against the CPU core on 256 trajectories.
    sub = W0[:256]
    kw = dict(record_every=steps, sharpness_every=0)
    ref = ps.run_gd_wd(model, sub, lr, wd, steps, backend="cpp", reduced=False, **kw).w
    for reduced in (False, True):
        got = ps.run_gd_wd(model, sub, lr, wd, steps, backend="cuda", reduced=reduced, **kw).w
        dev = rel_dev(got, ref)
        out[f"rel_dev_cuda_{'reduced' if reduced else 'full'}"] = dev
        print(f"cuda {'reduced' if reduced else 'full   '} vs cpp (256 traj): rel dev {dev:.2e}")
        if dev > 1e-10:
            print("accuracy check failed; no rates reported")
            return 1

    prob = Problem(model)
    rates = {}
    for name, reduced in (("cuda_full", False), ("cuda_reduced", True)):
        t = timed(lambda: ps.run_gd_wd(model, W0, lr, wd, steps, backend="cuda",
                                       reduced=reduced, **kw))
        rates[name] = B * steps / t
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        jrun = make_jax(jax, prob, lr, wd)
        print("jax devices:", jax.devices())
        dev = rel_dev(jrun(prob, sub, lr, wd, steps), ref)
        out["rel_dev_jax"] = dev
        t = timed(lambda: jrun(prob, W0, lr, wd, steps))
        rates["jax_gpu"] = B * steps / t
    except Exception as exc:  # absent, or no GPU plugin
        print(f"jax: {exc}")
    cpu_B = 4096
    t = timed(lambda: ps.run_gd_wd(model, W0[:cpu_B], lr, wd, steps, backend="cpp", **kw), 1)
    rates["cpp_cpu_reduced"] = cpu_B * steps / t

    flops = prob.flops_per_step
    print(f"\nGD+WD BN linreg d40 n20 float64, B={B}, {steps} steps (trajectory-steps/s):")
    for name, r in rates.items():
        extra = ""
        if name == "cuda_full":
            extra = f"  {r * flops / H200_FP64_PEAK:.1%} of FP64 vector peak"
        if "jax_gpu" in rates and name.startswith("cuda"):
            extra += f"  {r / rates['jax_gpu']:.1f}x JAX"
        print(f"  {name:16s} {r:.3e}{extra}")
    out["rates"] = rates
    out["fp64_fraction_full"] = rates["cuda_full"] * flops / H200_FP64_PEAK

    P = model.random_point(2 ** 16, seed=2)
    ps.spherical_sharpness(model, P[:1024], backend="cuda")
    t0 = time.perf_counter()
    res = ps.spherical_sharpness(model, P, backend="cuda")
    t_sh = time.perf_counter() - t0
    chk = ps.spherical_sharpness(model, P[:256], backend="cpp")
    sdev = float(np.max(np.abs(res.eigenvalues[:256] - chk.eigenvalues) / chk.eigenvalues))
    print(f"\nspherical sharpness of 2^16 points: {t_sh * 1e3:.1f} ms "
          f"(incl. host copies); rel dev vs cpp {sdev:.1e}")
    out["sharpness_2e16_ms"] = t_sh * 1e3
    out["sharpness_rel_dev"] = sdev
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

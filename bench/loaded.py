"""Run-time compiled models against the built-ins, and what compiling and loading cost.

BN linear regression (d 40, n 20) is timed twice in one run: as the built-in
(:class:`pysharp.BNLinearRegression`, direct path) and as its own header
compiled at run time (``ps.load_model(include_dir()/pysharp/models/
bn_linear_regression.hpp, ...)``), on the direct GD+WD run (B 4096, with
spherical sharpness every 100 steps) and on the loss+grad and HVP kernels (B 4096). The two
must agree bit for bit (checked first), so the ratio is the cost of the door
alone. Then, for the example phase-retrieval header: the first compile in a
fresh cache (float64), and a cache hit in a new process (the ``load_model``
call alone, timed inside that process).

Usage (from the repository root)::

    python -m bench.loaded            # about a minute on 2 cores
    python -m bench.loaded --quick    # smaller batches, fewer repeats
    python -m bench.loaded --json out.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a script: python bench/<name>.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import BUSY_THRESHOLD, LoadMonitor, start_benchmark, timed

_REPO = Path(__file__).resolve().parent.parent
_PHASE = _REPO / "examples" / "models" / "phase_retrieval.hpp"


def main(argv=None) -> int:
    args, ps = start_benchmark(__doc__, argv, quick="B 512, 200 steps", json="rows")
    B = 512 if args.quick else 4096
    steps = 200 if args.quick else 1000
    repeats = 3 if args.quick else 7

    rows = []
    with tempfile.TemporaryDirectory() as cache:
        os.environ["PYSHARP_CACHE_DIR"] = cache
        builtin = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
        Xc = builtin._Xc
        header = ps.include_dir() / "pysharp" / "models" / "bn_linear_regression.hpp"
        loaded = ps.load_model(header, Xc=Xc, u=builtin._u, scale=builtin._scale,
                               xc_fro2=float(np.sum(Xc * Xc)))
        W = builtin.random_point(batch=B, seed=1, norm=10.0)
        V = builtin.random_point(batch=B, seed=2)

        def run(model):
            return ps.run_gd_wd(model, W, 0.5, 2e-4, steps, record_every=100,
                                sharpness_every=100, **({"reduced": False}
                                                        if model is builtin else {}))

        a, b = run(builtin), run(loaded)
        same = (np.array_equal(a.w, b.w) and np.array_equal(a.sharpness, b.sharpness)
                and np.array_equal(builtin.hvp(W, V), loaded.hvp(W, V))
                and all(np.array_equal(x, y) for x, y in zip(builtin.loss_and_grad(W),
                                                            loaded.loss_and_grad(W))))
        print(f"BN linreg d40 n20, B {B}: built-in and run-time header bit-identical: {same}")
        work = {
            f"run_gd_wd direct, {steps} steps, sharpness every 100": (
                lambda m: run(m), B * steps, "traj-steps/s"),
            "loss_and_grad": (lambda m: m.loss_and_grad(W), B, "evals/s"),
            "hvp": (lambda m: m.hvp(W, V), B, "evals/s"),
        }
        for name, (fn, units, unit) in work.items():
            tb, lb = timed(lambda: fn(builtin), repeats)
            tl, ll = timed(lambda: fn(loaded), repeats)
            busy = max(lb or 0, ll or 0) > BUSY_THRESHOLD
            row = {"workload": name, "B": B, "builtin_rate": units / tb,
                   "loaded_rate": units / tl, "loaded_over_builtin": tb / tl, "unit": unit,
                   "busy": busy}
            rows.append(row)
            print(f"  {name:48s} built-in {units / tb:10.3e}  loaded {units / tl:10.3e} "
                  f"{unit}  loaded/built-in {tb / tl:5.3f}{' !' if busy else ''}")

        X = np.random.default_rng(0).standard_normal((30, 8))
        y = np.random.default_rng(1).random(30)
        fresh = Path(cache) / "fresh"
        os.environ["PYSHARP_CACHE_DIR"] = str(fresh)
        with LoadMonitor() as mon:
            t0 = time.perf_counter()
            ps.load_model(_PHASE, X=X, y=y, c=1.0)
            first = time.perf_counter() - t0
        busy = (mon.other or 0) > BUSY_THRESHOLD
        np.savez(Path(cache) / "data.npz", X=X, y=y)
        script = ("import time, numpy as np, pysharp as ps\n"
                  f"d = np.load({str(Path(cache) / 'data.npz')!r})\n"
                  "t0 = time.perf_counter()\n"
                  f"ps.load_model({str(_PHASE)!r}, X=d['X'], y=d['y'], c=1.0)\n"
                  "print(time.perf_counter() - t0)\n")
        hits = []
        for _ in range(3):
            out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                 env=dict(os.environ), check=True)
            hits.append(float(out.stdout.strip().splitlines()[-1]))
        rows.append({"workload": "first compile (phase retrieval, float64)",
                     "seconds": first, "busy": busy})
        rows.append({"workload": "cache hit in a new process (load_model call)",
                     "seconds": min(hits)})
        print(f"  first compile of phase_retrieval.hpp (float64): {first:.1f} s"
              f"{' !' if busy else ''}; cache hit in a new process: {min(hits) * 1e3:.1f} ms "
              f"(best of 3)")
    if args.json:
        Path(args.json).write_text(json.dumps({"bit_identical": same, "rows": rows}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

"""Digests of a fixed set of trajectories: proof that a refactor left every bit in place.

Runs every built-in scale-invariant model under every engine method (the method table's
rows) on each backend that runs it, a sweep of every sweepable method, and SGD, then prints
one SHA-256 per run over all of its recorded arrays. Run it before and after a change that
should not touch the numbers and compare:

    python tools/bits.py --out before.json      # on the old tree
    python tools/bits.py --compare before.json  # on the new one: exit 1 on any difference

Digests are only comparable on one machine and build (-march=native differs between
AVX2 and AVX-512 hosts).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import warnings

import numpy as np


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        if a is None:
            h.update(b"none")
            continue
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _trajectory_digest(tr) -> str:
    return _digest(tr.w, tr.loss, tr.norm2, tr.eff_lr, tr.grad_norm, tr.top_grad,
                   tr.sharpness, tr.eos_ratio, tr.diverged_step)


def _run_one(ps, model, W0, name: str, backend: str, kw: dict):
    """One batch of the engine method called ``name``, through its public function."""
    if name == "gd_wd":
        return ps.run_gd_wd(model, W0, [0.1, 0.3, 0.6], 1e-3, backend=backend, **kw)
    if name == "pgd":
        return ps.run_pgd(model, W0, [0.05, 0.1, 0.2], backend=backend, **kw)
    if name == "pgd_adaptive":
        return ps.run_pgd(model, W0, 0.02, lr=0.2, wd=1e-3, backend=backend, **kw)
    if name == "scalar_rmsprop":
        return ps.run_scalar_rmsprop(model, W0, 0.01, 1e-3, backend=backend, **kw)
    if name == "pgd_quasi_rmsprop":
        return ps.run_pgd(model, W0, 0.02, scheduler=ps.QuasiRMSprop(0.01, 0.99),
                          backend=backend, **kw)
    raise SystemExit(f"tools/bits.py: add a run of the new method {name!r}")


def digests() -> dict[str, str]:
    import pysharp as ps
    from pysharp._engine.methods import METHODS

    models = {"bn_linreg": ps.BNLinearRegression.synthetic(d=12, n=6, seed=1),
              "bn_mc": ps.BNMatrixCompletion.synthetic(size=6, true_rank=1, rank=2, n_obs=20,
                                                       seed=1),
              "bn_two_layer": ps.BNTwoLayerNet.synthetic(n=8, d=4, width=3, seed=1),
              "toy3d": ps.Toy3D()}
    backends = ["cpp"] + (["numba"] if ps.backends()["numba"]["available"] else [])
    out: dict[str, str] = {}
    kw = dict(steps=300, record_every=10, sharpness_every=50)
    for mname, model in models.items():
        W0 = np.stack([model.random_point(seed=s, norm=3.0) for s in range(3)])
        for backend in backends:
            for name, spec in METHODS.items():
                if backend == "numba" and not spec.numba:
                    continue
                try:
                    tr = _run_one(ps, model, W0, name, backend, kw)
                except ps.BackendUnavailable:  # e.g. a model the Numba port lacks
                    continue
                out[f"{mname}/{name}/{backend}"] = _trajectory_digest(tr)
    for name, spec in METHODS.items():
        if spec.sweep:
            wd = [0.0] if not spec.uses_wd else [1e-4, 1e-3]
            ds = ps.sweep("bn_linear_regression", lr=[0.05, 0.2], wd=wd, seeds=[0, 1],
                          method=name, steps=200, progress=False)
            out[f"sweep/{name}"] = _digest(*(ds[v].values for v in sorted(ds.data_vars)))
    lin = ps.models.LinearRegression.synthetic(d=5, n=10, seed=1)
    res = ps.run_sgd(lin, np.ones((2, 5)), [0.05, 0.1], 2, 200, seed=3)
    out["sgd/linear_regression"] = _digest(res.w, res.loss)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the digests to this JSON file")
    parser.add_argument("--compare", help="compare with a JSON file of digests")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    now = digests()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(now, f, indent=1)
    if not args.compare:
        print("\n".join(f"{k}: {v}" for k, v in now.items()))
        return 0
    with open(args.compare) as f:
        before = json.load(f)
    bad = [k for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
    for k in bad:
        print(f"DIFFERS {k}: {before.get(k)} -> {now.get(k)}")
    print(f"{len(now) - len(bad)} of {len(set(before) | set(now))} runs bit-identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""SGD runner benchmark: pysharp.run_sgd against NumPy and JAX on the very same batches.

Linear regression (n 64, d 32), T trajectories of mini-batch SGD (B 8, without
replacement) with per-trajectory learning rates. The peers follow the batch
indices that pysharp draws (``sgd_batches``), so the final iterates must agree
to rounding; the agreement is checked before the rates are printed.

``python -m bench.stability [--quick]``
"""

from __future__ import annotations

import numpy as np

from bench._common import start_benchmark, timed
from bench.engine import rel_dev


def numpy_sgd(X, y, W0, lr, idx):
    """W0 (T, d), lr (T,), idx (T, steps, B): batched over trajectories, a loop over steps."""
    W = W0.copy()
    for t in range(idx.shape[1]):
        XI = X[idx[:, t]]                                   # (T, B, d)
        r = np.einsum("tbd,td->tb", XI, W) - y[idx[:, t]]   # residuals
        W -= lr[:, None] * np.einsum("tb,tbd->td", r, XI) / idx.shape[2]
    return W


def make_jax(jax):
    jnp = jax.numpy

    @jax.jit
    def run(X, y, W0, lr, idx):
        def one(w0, eta, I):
            def step(w, Ib):
                XI = X[Ib]
                return w - eta * XI.T @ (XI @ w - y[Ib]) / Ib.shape[0], None
            return jax.lax.scan(step, w0, I)[0]
        return jax.vmap(one)(W0, lr, idx)

    return lambda *a: np.asarray(run(*(jnp.asarray(x) for x in a)).block_until_ready())


def workload(ps, quick: bool = False):
    """The benchmark's problem: (model, W0 (T, d), lr (T,), batch B, steps)."""
    n, d, B = 64, 32, 8
    T, steps = (64, 500) if quick else (256, 2000)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d))
    model = ps.LinearRegression(X, X @ rng.standard_normal(d))
    W0 = rng.standard_normal((T, d))
    return model, W0, np.linspace(0.05, 0.3, T), B, steps


def flops_per_step(model, batch: int) -> int:
    """Residuals and the batch gradient, 2 B d each, then the update's 3 d."""
    d = model.X.shape[1]
    return 4 * batch * d + 3 * d


def run_pysharp(ps, model, W0, lr, B, steps):
    """pysharp.run_sgd on the workload: the final iterates (T, d)."""
    return ps.run_sgd(model, W0, lr, B, steps, seed=1, record_every=steps).w


def peers(model, W0, lr, B, steps) -> dict:
    """name -> callable giving the final iterates, on the batches pysharp draws."""
    from pysharp.sgd import sgd_batches

    X, y = model.X, model.y
    idx = np.stack([sgd_batches(len(X), B, steps, seed=1, trajectory=j)
                    for j in range(len(W0))])
    out = {"numpy": lambda: numpy_sgd(X, y, W0, lr, idx)}
    try:
        import jax
    except ImportError:
        return out
    jax.config.update("jax_enable_x64", True)
    jrun = make_jax(jax)
    out["jax"] = lambda: jrun(X, y, W0, lr, idx)
    return out


def main(argv=None) -> int:
    args, ps = start_benchmark(__doc__, argv, quick="T 64, 500 steps")
    model, W0, lr, B, steps = workload(ps, args.quick)
    (n, d), T = model.X.shape, len(W0)
    ref = run_pysharp(ps, model, W0, lr, B, steps)
    engines = peers(model, W0, lr, B, steps)
    if "jax" not in engines:
        print("jax: not installed")
    print(f"SGD, linear regression n {n} d {d}, B {B}, T {T} trajectories x {steps} steps, "
          "float64 (same batches for every engine)")
    t_ps, load = timed(lambda: run_pysharp(ps, model, W0, lr, B, steps))
    rate = T * steps / t_ps
    print(f"  pysharp  {rate:.3e} traj-steps/s" + (" !" if load and load > 0.15 else ""))
    for name, fn in engines.items():
        dev = rel_dev(fn(), ref)
        if dev > 1e-10:
            print(f"  {name}: *** disagrees with pysharp (rel dev {dev:.1e}) ***")
            return 1
        t, load = timed(fn)
        print(f"  {name:8s} {T * steps / t:.3e} traj-steps/s  pysharp / {name} = {t / t_ps:.2f}"
              f"  (rel dev {dev:.1e})" + (" !" if load and load > 0.15 else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A loss written in JAX, traced by ``ps.models.from_jax``: its speed against JAX and the built-in.

BN linear regression (d 40, n 20) written in JAX in five lines is traced into a
compiled model; ``run_gd_wd`` of it (B 4096 trajectories, GD+WD) is timed against

- JAX's own ``jit(vmap(scan))`` of the same loss and the same update
  ``w <- w - lr (grad L(w) + wd w)`` (float64, final iterates only), and
- the hand-written built-in ``ps.BNLinearRegression`` (``reduced=False``: the
  same D-dimensional arithmetic).

It also times tracing plus the first compile (fresh cache, float64) and a second
``from_jax`` of the same function and shapes with new data (a cache hit), and
checks that the three runs end at the same iterates. Then the same for the BN
two-layer tanh net (n 32, d 8, width 8) against ``ps.BNTwoLayerNet``.

Usage (from the repository root)::

    python -m bench.from_jax            # about three minutes on 2 idle cores
    python -m bench.from_jax --quick
    python -m bench.from_jax --json out.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a script: python bench/<name>.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import BUSY_THRESHOLD, start_benchmark, timed


def bn_linreg(w, X, y):
    import jax.numpy as jnp
    Xc = X - X.mean(axis=0)
    z = Xc @ w
    yc = y - y.mean()
    return 2 * jnp.var(y) * (1 - (z @ yc) / jnp.sqrt((z @ z) * (yc @ yc)))


def bn_net(w, X, y, width):
    """The BN two-layer tanh net of ps.BNTwoLayerNet, in JAX."""
    import jax.numpy as jnp
    W = w.reshape(width, X.shape[1])
    Z = X @ W.T
    Zc = Z - Z.mean(axis=0)
    Zh = Zc / jnp.sqrt((Zc * Zc).mean(axis=0))
    a = jnp.where(jnp.arange(width) % 2 == 0, 1.0, -1.0) / np.sqrt(width)
    return jnp.mean((jnp.tanh(Zh) @ a - y) ** 2)


def jax_gd_wd(loss, W, lr, wd, steps):
    """JAX's own jit(vmap(scan)) of GD+WD on ``loss(w)``: a function returning the final W."""
    import jax
    import jax.numpy as jnp
    grad = jax.grad(loss)

    def one(w):
        def step(w, _):
            return w - lr * (grad(w) + wd * w), None
        return jax.lax.scan(step, w, None, length=steps)[0]
    fn = jax.jit(jax.vmap(one))
    Wj = jnp.asarray(W)
    return lambda: fn(Wj).block_until_ready()


def main(argv=None) -> int:
    args, ps = start_benchmark(__doc__, argv, quick="B 512, 200 steps", json="rows")
    import jax
    import jax.numpy as jnp

    B = 512 if args.quick else 4096
    steps = 200 if args.quick else 1000
    repeats = 2 if args.quick else 5
    lr, wd = 0.5, 2e-4
    builtin = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    X, y = np.asarray(builtin.X), np.asarray(builtin.y)
    W = builtin.random_point(batch=B, seed=1, norm=10.0)
    rows: list[dict] = []

    with tempfile.TemporaryDirectory() as cache:
        os.environ["PYSHARP_CACHE_DIR"] = cache
        t0 = time.perf_counter()
        model = ps.models.from_jax(bn_linreg, np.ones(40), X=X, y=y, check=False, compile=True)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = ps.models.check(model, model.reference(), framework="jax", points=3)
        t_check = time.perf_counter() - t0
        rng = np.random.default_rng(5)
        t0 = time.perf_counter()
        ps.models.from_jax(bn_linreg, np.ones(40), X=rng.standard_normal((20, 40)), compile=True,
                           y=rng.standard_normal(20), check=False)
        hit = time.perf_counter() - t0
        print(f"BN linreg written in JAX (d 40, n 20): trace + first compile {first:.1f} s, "
              f"check {t_check:.1f} s ({'ok' if all(report.passed.values()) else 'FAILED'}), "
              f"same shapes new data {hit * 1e3:.0f} ms")
        rows += [{"workload": "trace + first compile (float64)", "seconds": first},
                 {"workload": "check against JAX (3 points)", "seconds": t_check},
                 {"workload": "from_jax, same shapes, new data (cache hit)", "seconds": hit}]

        # GD+WD only, as JAX's loop: the final iterates, no in-run sharpness (the default
        # would run Lanczos every steps/20 steps, work the JAX loop does not do)
        only = {"record_every": steps, "sharpness_every": 0}

        def run_traced():
            return ps.run_gd_wd(model, W, lr, wd, steps, **only)

        def run_builtin():
            return ps.run_gd_wd(builtin, W, lr, wd, steps, reduced=False, **only)

        with jax.enable_x64(True):
            Xj, yj = jnp.asarray(X), jnp.asarray(y)
            run_jax = jax_gd_wd(lambda w: bn_linreg(w, Xj, yj), W, lr, wd, steps)
            w_jax = np.asarray(run_jax())
            tj, lj = timed(run_jax, repeats)
        tr, _ = timed(lambda: ps.run_gd_wd(builtin, W, lr, wd, steps, **only),
                        repeats)
        a, b = run_traced(), run_builtin()
        agree_builtin = float(np.max(np.abs(a.w - b.w)) / np.max(np.abs(b.w)))
        agree_jax = float(np.max(np.abs(a.w - w_jax)) / np.max(np.abs(w_jax)))
        tt, lt = timed(run_traced, repeats)
        tb, lb = timed(run_builtin, repeats)
        busy = max(lj or 0.0, lt or 0.0, lb or 0.0) > BUSY_THRESHOLD
        units = B * steps
        print(f"run_gd_wd, B {B}, {steps} steps (traj-steps/s){'  ! busy machine' if busy else ''}")
        print(f"  traced from JAX      {units / tt:10.3e}")
        print(f"  JAX jit(vmap(scan))  {units / tj:10.3e}   traced / JAX      {tj / tt:5.2f}x")
        print(f"  built-in (D-dim)     {units / tb:10.3e}   traced / built-in {tb / tt:5.2f}")
        print(f"  built-in (reduced)   {units / tr:10.3e}   (its n-dim reduced dynamics: "
              "no traced model has them)")
        print(f"  final iterates: max rel diff vs built-in {agree_builtin:.1e}, "
              f"vs JAX {agree_jax:.1e}")
        rows.append({"workload": f"run_gd_wd B {B} {steps} steps", "traced_rate": units / tt,
                     "jax_rate": units / tj, "builtin_rate": units / tb,
                     "traced_over_jax": tj / tt, "traced_over_builtin": tb / tt,
                     "builtin_reduced_rate": units / tr,
                     "diff_builtin": agree_builtin, "diff_jax": agree_jax, "busy": busy})

        # The BN two-layer tanh net (n 32, d 8, width 8: D 64).
        net = ps.BNTwoLayerNet.synthetic(n=32, d=8, width=8, seed=0)
        Xn, yn = np.asarray(net.X), np.asarray(net.y)
        t0 = time.perf_counter()
        traced = ps.models.from_jax(bn_net, np.ones(64), X=Xn, y=yn, width=8, groups=8,
                                    compile=True)
        first_net = time.perf_counter() - t0
        Bn, steps_n = B // 4, steps // 2  # a net step costs ~30x a linreg step
        Wn = net.random_point(batch=Bn, seed=1)
        lr_n, wd_n = 0.05, 1e-3

        def run_net(m):
            return ps.run_gd_wd(m, Wn, lr_n, wd_n, steps_n, record_every=steps_n,
                                sharpness_every=0)
        with jax.enable_x64(True):
            Xj, yj = jnp.asarray(Xn), jnp.asarray(yn)
            run_jax = jax_gd_wd(lambda w: bn_net(w, Xj, yj, 8), Wn, lr_n, wd_n, steps_n)
            w_jax = np.asarray(run_jax())
            tj, lj = timed(run_jax, repeats)
        a, b = run_net(traced), run_net(net)
        tt, lt = timed(lambda: run_net(traced), repeats)
        tb, lb = timed(lambda: run_net(net), repeats)
        busy = max(lj or 0.0, lt or 0.0, lb or 0.0) > BUSY_THRESHOLD
        diff_b = float(np.max(np.abs(a.w - b.w)) / np.max(np.abs(b.w)))
        diff_j = float(np.max(np.abs(a.w - w_jax)) / np.max(np.abs(w_jax)))
        units = Bn * steps_n
        print(f"BN two-layer tanh net written in JAX (n 32, d 8, width 8): trace + first "
              f"compile + check {first_net:.1f} s")
        flag = "  ! busy machine" if busy else ""
        print(f"run_gd_wd, B {Bn}, {steps_n} steps (traj-steps/s){flag}")
        print(f"  traced from JAX      {units / tt:10.3e}")
        print(f"  JAX jit(vmap(scan))  {units / tj:10.3e}   traced / JAX      {tj / tt:5.2f}x")
        print(f"  built-in             {units / tb:10.3e}   traced / built-in {tb / tt:5.2f}")
        print(f"  final iterates: max rel diff vs built-in {diff_b:.1e}, vs JAX {diff_j:.1e}")
        rows.append({"workload": f"BN two-layer net run_gd_wd B {Bn} {steps_n} steps",
                     "first_compile_and_check": first_net, "traced_rate": units / tt,
                     "jax_rate": units / tj, "builtin_rate": units / tb,
                     "traced_over_jax": tj / tt, "traced_over_builtin": tb / tt,
                     "diff_builtin": diff_b, "diff_jax": diff_j, "busy": busy})
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

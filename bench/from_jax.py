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

Then issue 44's targets:

- the conv net (two 3x3 convolutions of 8 channels with BatchNorm, 8x8 inputs, 300
  samples, a linear head: D 728): GD+WD of 64 trajectories traced from JAX against JAX's
  ``jit(vmap(scan))`` of the same loss, and their final iterates compared;
- the first compile in compiler CPU time (the compiler processes' user + system time, the
  measure that does not depend on the machine's other load): a 20-line loss (LayerNorm,
  BatchNorm, softmax cross-entropy), a 30-line one (the same with self-attention) and an
  unrolled RNN of about 1000 equations, the latter
  compiled in stages (the default) and as one function;
- a 262-equation loss (the many-primitives loss of the tests) in stages and as one
  function: the kernels' speed (the compiler stops inlining the jets' arithmetic in one
  long function).

Usage (from the repository root)::

    python -m bench.from_jax            # about 25 minutes on 2 idle cores (JAX's conv net
                                        # alone about 5, the compiles about 10)
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


def conv_net(w, X, Y, c1=8, c2=8):
    """Two 3x3 convolutions with BatchNorm and ReLU, global average pooling, a linear head
    (w: K1 (c1, 1, 3, 3), K2 (c2, c1, 3, 3), A (c2, k)), softmax cross-entropy on one-hot Y."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    k = Y.shape[1]
    K1 = w[:c1 * 9].reshape(c1, 1, 3, 3)
    K2 = w[c1 * 9:c1 * 9 + c2 * c1 * 9].reshape(c2, c1, 3, 3)
    A = w[c1 * 9 + c2 * c1 * 9:].reshape(c2, k)

    def bn(h):
        mean = h.mean(axis=(0, 2, 3), keepdims=True)
        return (h - mean) / jnp.sqrt(jnp.var(h, axis=(0, 2, 3), keepdims=True) + 1e-5)
    h = jax.nn.relu(bn(lax.conv_general_dilated(X, K1, (1, 1), "SAME")))
    h = jax.nn.relu(bn(lax.conv_general_dilated(h, K2, (1, 1), "SAME")))
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(h.mean(axis=(2, 3)) @ A) * Y, axis=1))


def small_net(w, X, labels, widths=(6, 5)):
    """A loss of twenty lines as people write them: LayerNorm, BatchNorm with jnp.var, GELU,
    softmax cross-entropy on integer labels, weight normalisation."""
    import jax
    import jax.numpy as jnp
    d, (m1, m2) = X.shape[1], widths
    k = 3
    W1 = w[:m1 * d].reshape(m1, d)
    W2 = w[m1 * d:m1 * d + m2 * m1].reshape(m2, m1)
    A = w[m1 * d + m2 * m1:].reshape(k, m2)
    W1 = W1 / jnp.linalg.norm(W1)
    Z = X @ W1.T
    Z = (Z - Z.mean(-1, keepdims=True)) / jnp.sqrt(jnp.var(Z, -1, keepdims=True) + 1e-6)
    H = jax.nn.gelu(Z, approximate=False)
    Z2 = H @ W2.T
    Z2 = (Z2 - Z2.mean(0)) / jnp.sqrt(jnp.var(Z2, 0) + 1e-6)
    H2 = jnp.tanh(Z2)
    logits = H2 @ (A / jnp.sqrt(jnp.sum(A * A))).T
    logp = jax.nn.log_softmax(4.0 * logits)
    n = X.shape[0]
    ce = -jnp.mean(logp[jnp.arange(n), labels])
    penalty = 1e-3 * jnp.sum(jnp.abs(W2)) / jnp.sqrt(jnp.sum(W2 * W2))
    return ce + penalty


def thirty_lines(w, X, labels, widths=(6, 5), heads=2):
    """A loss of thirty lines: small_net's layers with a two-head self-attention block across
    the samples and a residual LayerNorm after it."""
    import jax
    import jax.numpy as jnp
    n, d = X.shape
    (m1, m2), k = widths, 3
    W1 = w[:m1 * d].reshape(m1, d)
    Wqkv = w[m1 * d:m1 * d + 3 * m1 * m1].reshape(3, m1, m1)
    W2 = w[m1 * d + 3 * m1 * m1:m1 * d + 3 * m1 * m1 + m2 * m1].reshape(m2, m1)
    A = w[m1 * d + 3 * m1 * m1 + m2 * m1:].reshape(k, m2)
    W1 = W1 / jnp.linalg.norm(W1)
    Z = X @ W1.T
    Z = (Z - Z.mean(-1, keepdims=True)) / jnp.sqrt(jnp.var(Z, -1, keepdims=True) + 1e-6)
    H = jax.nn.gelu(Z, approximate=False)
    Q, K, V = (H @ Wqkv[i].T for i in range(3))
    Qh, Kh, Vh = (M.reshape(n, heads, m1 // heads).transpose(1, 0, 2) for M in (Q, K, V))
    att = jax.nn.softmax(Qh @ Kh.transpose(0, 2, 1) / jnp.sqrt(m1 / heads), axis=-1)
    H = H + (att @ Vh).transpose(1, 0, 2).reshape(n, m1)
    H = (H - H.mean(-1, keepdims=True)) / jnp.sqrt(jnp.var(H, -1, keepdims=True) + 1e-6)
    Z2 = H @ W2.T
    Z2 = (Z2 - Z2.mean(0)) / jnp.sqrt(jnp.var(Z2, 0) + 1e-6)
    H2 = jnp.tanh(Z2)
    logits = H2 @ (A / jnp.sqrt(jnp.sum(A * A))).T
    logp = jax.nn.log_softmax(4.0 * logits)
    ce = -jnp.mean(logp[jnp.arange(n), labels])
    penalty = 1e-3 * jnp.sum(jnp.abs(W2)) / jnp.sqrt(jnp.sum(W2 * W2))
    return ce + penalty


def rnn(w, X, c, y, T):
    """An RNN unrolled in Python over T steps, a LayerNorm readout: about 20 equations a step
    in value_and_grad."""
    import jax.numpy as jnp
    h, d = c.shape[0], X.shape[2]
    u = w / jnp.sqrt(w @ w)
    Wh, Wx = u[:h * h].reshape(h, h), u[h * h:].reshape(h, d)
    state = jnp.zeros((X.shape[0], h))
    for t in range(T):
        state = jnp.tanh(state @ Wh.T + X[:, t] @ Wx.T)
    H = (state - state.mean(-1, keepdims=True)) / jnp.sqrt(jnp.var(state, -1, keepdims=True))
    return jnp.mean((H @ c - y) ** 2)


def many(w, X, y, c):
    """The many-primitives loss of tests/models/test_from_jax.py (262 equations)."""
    import jax
    import jax.numpy as jnp
    u = w / jnp.sqrt(w @ w)
    z = X @ u
    a = jnp.abs(z) + jnp.sign(z) * z + jnp.maximum(z, 0.1) - jnp.minimum(z, -0.2)
    b = jax.nn.log_softmax(z) * y + jax.nn.sigmoid(z) + jnp.tanh(z) ** 3
    M = u.reshape(2, 3)
    cat = jnp.concatenate([u[:2], u[::2], M[:, 1]])
    e = jnp.exp(-z ** 2) + jnp.log1p(z ** 2) + jnp.sqrt(1 + z ** 2) + jax.lax.rsqrt(2 + z ** 2)
    bm = jnp.einsum("bi,bj->bij", M, M).sum() + (M.T @ M).sum()
    return c * (a.sum() + b.sum() + (cat ** 2).sum() + jnp.where(z > 0, z, 0.5 * z).sum()
                + e.mean() + bm + jnp.max(z) - jnp.min(z) + jnp.clip(z, -0.5, 0.5).sum()
                + (1.0 / (1.1 + z ** 2)).sum() + jnp.sum(z ** -2))


def compiled(ps, loss, w, **data):
    """(model, compiler CPU seconds (children's user + system), wall seconds) of from_jax's
    first compile, in a fresh cache."""
    import resource

    with tempfile.TemporaryDirectory() as cache:
        os.environ["PYSHARP_CACHE_DIR"] = cache
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        model = ps.models.from_jax(loss, w, check=False, compile=True, **data)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return model, cpu, wall


def equations(model) -> int:
    """The header's equations (one comment line each)."""
    return sum(1 for line in model.source.splitlines() if line.startswith("    // ")
               and " -> " in line)


def issue_targets(ps, quick: bool, rows: list) -> None:
    """Issue 44's targets: the conv net against JAX, compile times, staged against whole."""
    import jax
    import jax.numpy as jnp

    from pysharp.models._from_jax import _header

    rng = np.random.default_rng(0)
    n, k = (60, 10) if quick else (300, 10)
    X, Y = rng.standard_normal((n, 1, 8, 8)), np.eye(k)[rng.integers(0, k, n)]
    D = 8 * 9 + 8 * 8 * 9 + 8 * k
    model, cpu, wall = compiled(ps, conv_net, np.ones(D), X=X, Y=Y)
    print(f"conv net (two 3x3 convs with BN, 8x8 inputs, {n} samples, D {D}): "
          f"{equations(model)} equations, first compile {cpu:.1f} s of compiler CPU "
          f"({wall:.1f} s wall)")
    (B, steps), lr, wd = (16, 2) if quick else (64, 4), 0.05, 1e-3
    W = rng.standard_normal((B, D))
    only = {"record_every": steps, "sharpness_every": 0}
    tt, lt = timed(lambda: ps.run_gd_wd(model, W, lr, wd, steps, **only), 2)
    w_traced = ps.run_gd_wd(model, W, lr, wd, steps, **only).w
    with jax.enable_x64(True):
        Xj, Yj = jnp.asarray(X), jnp.asarray(Y)
        run_jax = jax_gd_wd(lambda w: conv_net(w, Xj, Yj), W, lr, wd, steps)
        w_jax = np.asarray(run_jax())
        tj, lj = timed(run_jax, 1)
    diff = float(np.max(np.abs(w_traced - w_jax)) / np.max(np.abs(w_jax)))
    busy = max(lt or 0.0, lj or 0.0) > BUSY_THRESHOLD
    units = B * steps
    print(f"run_gd_wd, B {B}, {steps} steps (traj-steps/s){'  ! busy machine' if busy else ''}")
    print(f"  traced from JAX      {units / tt:10.3e}")
    print(f"  JAX jit(vmap(scan))  {units / tj:10.3e}   traced / JAX {tj / tt:5.2f}x")
    print(f"  final iterates: max rel diff {diff:.1e}")
    rows.append({"workload": f"conv net D {D} n {n} run_gd_wd B {B} {steps} steps",
                 "equations": equations(model), "compile_cpu_s": cpu, "traced_rate": units / tt,
                 "jax_rate": units / tj, "traced_over_jax": tj / tt, "diff_jax": diff,
                 "busy": busy})

    Xs, labels = rng.standard_normal((40, 8)), rng.integers(0, 3, 40)
    model, cpu, wall = compiled(ps, small_net, np.ones(6 * 8 + 5 * 6 + 3 * 5), X=Xs,
                                labels=labels)
    print(f"a 20-line loss: {equations(model)} equations, first compile {cpu:.1f} s of "
          f"compiler CPU ({wall:.1f} s wall)")
    rows.append({"workload": "first compile, a 20-line loss", "equations": equations(model),
                 "compile_cpu_s": cpu, "wall_s": wall})
    D = 6 * 8 + 3 * 6 * 6 + 5 * 6 + 3 * 5
    model, cpu, wall = compiled(ps, thirty_lines, np.ones(D), X=Xs, labels=labels)
    print(f"a 30-line loss (with attention): {equations(model)} equations, first compile "
          f"{cpu:.1f} s of compiler CPU ({wall:.1f} s wall)")
    rows.append({"workload": "first compile, a 30-line loss", "equations": equations(model),
                 "compile_cpu_s": cpu, "wall_s": wall})

    T = 12 if quick else 46
    h, d, m = 8, 4, 16
    data = dict(X=rng.standard_normal((m, T, d)), c=rng.standard_normal(h),
                y=rng.standard_normal(m), T=T)
    for staged in (True, False):
        saved = _header._STAGE_LINES
        _header._STAGE_LINES = saved if staged else 10 ** 9
        try:
            model, cpu, wall = compiled(ps, rnn, np.ones(h * h + h * d), **data)
        finally:
            _header._STAGE_LINES = saved
        how = "in stages" if staged else "as one function"
        print(f"an unrolled RNN ({T} steps): {equations(model)} equations, first compile "
              f"{how} {cpu:.1f} s of compiler CPU ({wall:.1f} s wall)")
        rows.append({"workload": f"first compile, unrolled RNN {how}",
                     "equations": equations(model), "compile_cpu_s": cpu, "wall_s": wall})

    Xm, ym = rng.standard_normal((12, 6)), rng.standard_normal(12)
    Wm, Vm = rng.standard_normal((4096, 6)), rng.standard_normal((4096, 6))
    for staged in (True, False):
        saved = _header._STAGE_LINES
        _header._STAGE_LINES = saved if staged else 10 ** 9
        try:
            model, cpu, _ = compiled(ps, many, np.ones(6), X=Xm, y=ym, c=0.7)
        finally:
            _header._STAGE_LINES = saved
        times = {name: timed(fn, 5) for name, fn in (
            ("loss_and_grad", lambda: model.loss_and_grad(Wm)),
            ("hvp", lambda: model.hvp(Wm, Vm)), ("third", lambda: model.third(Wm, Vm)))}
        busy = max(load or 0.0 for _, load in times.values()) > BUSY_THRESHOLD
        how = "in stages" if staged else "as one function"
        print(f"the {equations(model)}-equation loss {how} (compile {cpu:.1f} s CPU), B 4096: "
              + ", ".join(f"{k} {v[0] * 1e3:.1f} ms" for k, v in times.items())
              + ("  ! busy machine" if busy else ""))
        rows.append({"workload": f"{equations(model)}-equation loss {how}, B 4096",
                     "compile_cpu_s": cpu, "busy": busy,
                     **{f"{k}_ms": v[0] * 1e3 for k, v in times.items()}})


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
    issue_targets(ps, args.quick, rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

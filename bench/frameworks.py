"""pysharp inside JAX and PyTorch programs against the same loss written in each framework.

A GD + weight-decay loop, w <- w - lr (grad L(w) + wd w), on BN linear regression
(d 40, n 20), a batch of B = 4096 trajectories, 1000 steps, float64, CPU:

- JAX: the whole loop inside ``jax.jit`` (``lax.fori_loop``), each step calling
  ``pysharp.jax.loss_and_grad`` (one ``jax.ffi`` call into the compiled core per
  step; and, as a second row, the Python-callback fallback), against the same loop
  with the loss in jax.numpy and ``jax.vmap(jax.value_and_grad(loss))``.
- PyTorch: a ``torch.compile``\\ d step (fullgraph) calling ``pysharp.torch``'s
  ``loss_and_grad`` operator, looped in Python, against the same loss in torch:
  a ``torch.compile``\\ d step with ``torch.func.vmap(torch.func.grad_and_value(loss))``,
  and the eager autograd step (``loss.sum().backward()``), whichever is faster
  is the reference. The eager pysharp step is timed too.

The final iterates of each pair are checked to agree first (max relative deviation).
Compile time is excluded (one warm-up run); the best of ``--repeats`` runs counts.

Usage (from the repository root)::

    python -m bench.frameworks            # about a minute on 2 cores
    python -m bench.frameworks --quick    # 200 steps, B 1024
    python -m bench.frameworks --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

if not __package__:  # run as a script: python bench/<name>.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import BUSY_THRESHOLD, import_pysharp, timed

LR, WD = 0.05, 1e-3


def rel_dev(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def bench_jax(ps, model, W0, steps, repeats, rows):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    import pysharp.jax as psj
    from bench.kernels import jax_loss

    loss = jax_loss("bn_linreg", model, jnp, jnp.float64)  # the kernels bench's own JAX peer
    vg = jax.vmap(jax.value_and_grad(loss))

    def run(grad_fn):
        def step(_, W):
            return W - LR * (grad_fn(W) + WD * W)
        return jax.jit(lambda W: jax.lax.fori_loop(0, steps, step, W))

    theirs = run(lambda W: vg(W)[1])
    W = jnp.asarray(W0)
    t_theirs, load_t = timed(lambda: theirs(W).block_until_ready(), repeats)
    requested = psj.CALLBACK_PATH
    try:
        for path in ("ffi", "direct"):  # the FFI handlers, and the Python-callback fallback
            psj.CALLBACK_PATH = path
            ours = run(lambda W: psj.loss_and_grad(model, W)[1])
            dev = rel_dev(ours(W), theirs(W))
            t_ours, load_o = timed(lambda: ours(W).block_until_ready(), repeats)
            rows.append({"framework": "jax",
                         "ours": f"jit(fori_loop(pysharp.jax.loss_and_grad)) [{path}]",
                         "theirs": "jit(fori_loop(vmap(value_and_grad(jnp loss))))",
                         "t_ours_s": t_ours, "t_theirs_s": t_theirs, "ratio": t_theirs / t_ours,
                         "rel_dev": dev, "busy": max(load_o or 0, load_t or 0)})
    finally:
        psj.CALLBACK_PATH = requested


def bench_torch(ps, model, W0, steps, repeats, rows):
    import torch

    import pysharp.torch as pst

    torch.set_num_threads(os.cpu_count() or 1)
    X, y = torch.tensor(model.X), torch.tensor(model.y)

    def loss(w):  # one point (d,) -> scalar; batched by the callers
        z = X @ w
        zc = z - z.mean()
        p = y.std(unbiased=False) * zc / torch.sqrt((zc ** 2).mean()) + y.mean()
        return ((p - y) ** 2).mean()

    def step_ours(W):
        _, G = pst.loss_and_grad(model, W)
        return W - LR * (G + WD * W)

    vg = torch.func.vmap(torch.func.grad_and_value(loss))

    def step_func(W):
        G, _ = vg(W)
        return W - LR * (G + WD * W)

    def step_eager(W):
        W = W.detach().requires_grad_()
        z = W @ X.T
        zc = z - z.mean(-1, keepdim=True)
        p = y.std(unbiased=False) * zc / torch.sqrt((zc ** 2).mean(-1, keepdim=True)) + y.mean()
        ((p - y) ** 2).mean(-1).sum().backward()
        with torch.no_grad():
            return W - LR * (W.grad + WD * W)

    def loop(step):
        def run():
            W = torch.tensor(W0)
            for _ in range(steps):
                W = step(W)
            return W.detach()
        return run

    compiled_ours = torch.compile(step_ours, fullgraph=True)
    variants = {"ours compiled": loop(compiled_ours), "ours eager": loop(step_ours)}
    theirs = {"torch.compile(vmap(grad_and_value))": None, "eager autograd": loop(step_eager)}
    try:
        theirs["torch.compile(vmap(grad_and_value))"] = loop(torch.compile(step_func,
                                                                           fullgraph=True))
    except Exception as exc:  # pragma: no cover - depends on the torch build
        print(f"torch.compile of the torch loss failed: {exc}")
    times, results = {}, {}
    for name, fn in {**variants, **{k: v for k, v in theirs.items() if v is not None}}.items():
        try:
            results[name] = fn()
            times[name] = timed(fn, repeats)
        except Exception as exc:  # pragma: no cover
            print(f"{name}: failed ({type(exc).__name__}: {exc})")
    ref_name = min((k for k in theirs if k in times), key=lambda k: times[k][0])
    for ours_name in variants:
        if ours_name not in times:
            continue
        rows.append({"framework": "torch", "ours": f"pysharp.torch ({ours_name})",
                     "theirs": f"torch ({ref_name})",
                     "t_ours_s": times[ours_name][0], "t_theirs_s": times[ref_name][0],
                     "ratio": times[ref_name][0] / times[ours_name][0],
                     "rel_dev": rel_dev(results[ours_name], results[ref_name]),
                     "busy": max(times[ours_name][1] or 0, times[ref_name][1] or 0)})
    for name in theirs:
        if name in times and name != ref_name:
            print(f"  (torch reference not used: {name} {times[name][0]:.3f} s)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="200 steps, B 1024, 2 repeats")
    ap.add_argument("--only", choices=("jax", "torch"))
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.repeats = 200, 1024, 2
    ps, note = import_pysharp()
    if note:
        print(note)
    model = ps.BNLinearRegression.synthetic(d=40, n=20)
    W0 = model.random_point(args.batch, seed=0)
    print(f"GD+WD, BN linreg d 40 n 20, B {args.batch}, {args.steps} steps, float64, "
          f"{os.cpu_count()} cores")
    rows: list[dict] = []
    for name, fn in (("jax", bench_jax), ("torch", bench_torch)):
        if args.only and args.only != name:
            continue
        try:
            __import__(name)
        except ImportError:
            print(f"{name}: not installed, skipped")
            continue
        fn(ps, model, W0, args.steps, args.repeats, rows)
    for r in rows:
        flag = " !" if r["busy"] > BUSY_THRESHOLD else ""
        print(f"{r['framework']:6s} {r['ours']:54s} {r['t_ours_s']:8.3f} s | {r['theirs']:50s} "
              f"{r['t_theirs_s']:8.3f} s | ratio {r['ratio']:5.2f}x | rel dev "
              f"{r['rel_dev']:.1e}{flag}")
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": args.steps, "batch": args.batch,
                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real networks in XLA (``backend="jax"``): pysharp's engine against hand-written JAX.

Rows, each pysharp beside the peer a user would write instead, in one run:

- ``step``: a GD+WD step of ``run_gd_wd`` on an ``XlaModel`` against a hand-written
  ``jax.jit`` ``fori_loop`` of ``value_and_grad`` and the same update (float64), on a small
  BN CNN (two 3x3 convolutions with BN on 8x8 images, 4 classes) and on Cohen et al.'s
  fc-tanh network (3072 -> 200 -> 200 -> 10, tanh; 5000 CIFAR-shaped samples, 1000 with
  --quick). The targets: <= 1.1x.
- ``tracking``: the same run with the spherical sharpness every 100 steps (warm-started
  Lanczos), against no tracking (target: <= 1.5x).
- ``eigensolve``: one top-2 eigensolve of the small CNN's Hessian to a relative residual of
  1e-6, pysharp's Lanczos (the block run, and the single-vector run that does not look for
  multiplicity) against the issue's peers at the same tolerance: SciPy's
  ``eigsh`` over torch autograd HVPs (the reference PyTorch code's way, Cohen et al.'s
  ``gd.py``: double backward through the whole loss per product) and PyHessian's power
  iteration with deflation (top-2 by magnitude: that is what it computes), each where it
  is installed, and ``eigsh`` over jitted JAX HVPs; every answer against the dense
  Hessian's eigenvalues (D = 356), with its HVP count (target: >= 2x).
- ``batched``: 16 trajectories at 16 learning rates in one call (the default: on the CPU,
  a convolutional loss runs its rows one after another) and vmapped, against 16 runs one
  after the other, whose CPU time over wall time says how much of the cores one run
  already uses (target: >= 4x the throughput).
- ``crossover``: BN linear regression d 40, n 20, B 4096 trajectories on the compiled core
  against the same model on ``backend="jax"``.

The CPU, the load during each measurement (other processes' share, '!' above 15 %) and
the ratios are printed and, with --json, written.

Usage (from the repository root)::

    python -m bench.xla            # several minutes on 2 cores
    python -m bench.xla --quick
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a script: python bench/<name>.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import BUSY_THRESHOLD, start_benchmark, timed
from bench.engine import machine_info


def small_cnn(n: int = 64, seed: int = 0):
    """(loss, params, data) of a scale-invariant CNN: conv-BN-relu twice, mean pooling,
    a BN-normalised linear read-out, integer-label cross-entropy (D = 356)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    rng = np.random.default_rng(seed)
    X, y = rng.standard_normal((n, 1, 8, 8)), rng.integers(0, 4, n)

    def bn(z, axes):
        mu = z.mean(axes, keepdims=True)
        return (z - mu) / jnp.sqrt(((z - mu) ** 2).mean(axes, keepdims=True) + 1e-5)

    def loss(p, X, y):
        z = jax.nn.relu(bn(lax.conv_general_dilated(X, p["c1"], (1, 1), "SAME"), (0, 2, 3)))
        z = jax.nn.relu(bn(lax.conv_general_dilated(z, p["c2"], (1, 1), "SAME"), (0, 2, 3)))
        logits = bn(z.mean((2, 3)) @ p["fc"], (0,))
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(y.shape[0]), y])

    params = {"c1": 0.3 * rng.standard_normal((4, 1, 3, 3)),
              "c2": 0.3 * rng.standard_normal((8, 4, 3, 3)), "fc": rng.standard_normal((8, 4))}
    return loss, params, {"X": X, "y": y}


def fc_tanh(n: int, seed: int = 0):
    """(loss, params, data) of Cohen et al.'s fc-tanh (3072-200-200-10, tanh, square loss
    on one-hot targets; not scale-invariant: a timing workload only)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3072)) / np.sqrt(3072)
    Y = np.eye(10)[rng.integers(0, 10, n)]
    sizes = (3072, 200, 200, 10)
    params = [{"W": rng.standard_normal((a, b)) / np.sqrt(a), "b": np.zeros(b)}
              for a, b in zip(sizes[:-1], sizes[1:])]

    def loss(p, X, Y):
        h = X
        for layer in p[:-1]:
            h = jnp.tanh(h @ layer["W"] + layer["b"])
        out = h @ p[-1]["W"] + p[-1]["b"]
        return 0.5 * jnp.mean(jnp.sum((out - Y) ** 2, axis=1))

    return loss, params, {"X": X, "Y": Y}


def hand_gd_wd(loss, model, data, lr: float, wd: float):
    """The peer: jax.jit(fori_loop) of value_and_grad and w <- (1 - lr wd) w - lr g."""
    import jax
    import jax.numpy as jnp

    from pysharp._backends._jax import x64

    with x64():
        arrays = {k: jnp.asarray(v) for k, v in data.items()}
        f = jax.value_and_grad(lambda w: loss(model.unravel(w), **arrays))

        @jax.jit
        def run(w, n):
            def body(_, w):
                _, g = f(w)
                return (1 - lr * wd) * w - lr * g
            return jax.lax.fori_loop(0, n, body, w)
    return run


def _torch_cnn(params: dict, data: dict):
    """The small CNN in PyTorch (float64), the same function as :func:`small_cnn`'s loss:
    (net(params, X) -> logits, the parameters as leaf tensors, X, y)."""
    import torch  # lazy: an optional peer
    import torch.nn.functional as F

    def bn(z, dims):
        mu = z.mean(dims, keepdim=True)
        return (z - mu) / torch.sqrt(((z - mu) ** 2).mean(dims, keepdim=True) + 1e-5)

    def net(p, X):
        z = F.relu(bn(F.conv2d(X, p[0], padding=1), (0, 2, 3)))
        z = F.relu(bn(F.conv2d(z, p[1], padding=1), (0, 2, 3)))
        return bn(z.mean((2, 3)) @ p[2], (0,))

    leaves = [torch.tensor(np.asarray(params[k]), dtype=torch.float64).requires_grad_()
              for k in ("c1", "c2", "fc")]
    return net, leaves, torch.tensor(data["X"]), torch.tensor(data["y"])


def torch_hvp(params: dict, data: dict):
    """Cohen et al.'s ``compute_hvp`` (gd.py): v -> H v by autograd's double backward
    through the whole loss, as a NumPy matvec, and a counter of its calls."""
    import torch  # lazy: an optional peer
    import torch.nn.functional as F
    from torch.nn.utils import parameters_to_vector

    net, leaves, X, y = _torch_cnn(params, data)
    calls = [0]

    def matvec(v):
        calls[0] += 1
        vec = torch.tensor(np.ravel(v))
        loss = F.cross_entropy(net(leaves, X), y, reduction="sum") / X.shape[0]
        grads = torch.autograd.grad(loss, inputs=leaves, create_graph=True)
        dot = parameters_to_vector(grads).mul(vec).sum()
        grads = [g.contiguous() for g in torch.autograd.grad(dot, leaves, retain_graph=True)]
        return parameters_to_vector(grads).detach().numpy()
    return matvec, calls


def pyhessian_top2(params: dict, data: dict, tol: float):
    """PyHessian's ``hessian(...).eigenvalues(top_n=2)`` on the same CNN: power iteration
    with deflation (the two eigenvalues of largest magnitude), stopping when an
    eigenvalue changes by less than ``tol`` relative. Returns (eigenvalues, HVPs)."""
    import torch  # lazy: an optional peer
    from pyhessian import hessian

    net, leaves, X, y = _torch_cnn(params, data)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.ParameterList([torch.nn.Parameter(t.detach().clone())
                                             for t in leaves])

        def forward(self, X):
            return net(list(self.p), X)

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # its random starts, in the parameters' precision
    try:
        comp = hessian(Net(), torch.nn.CrossEntropyLoss(), data=(X, y), cuda=False)
        calls = [0]
        module = sys.modules["pyhessian.hessian"]  # the package's name is the class's
        inner = module.hessian_vector_product

        def counted(*a, **k):
            calls[0] += 1
            return inner(*a, **k)
        module.hessian_vector_product = counted
        try:
            vals, _ = comp.eigenvalues(top_n=2, tol=tol, maxIter=1000)
        finally:
            module.hessian_vector_product = inner
    finally:
        torch.set_default_dtype(previous)
    return np.asarray(vals), calls[0]


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main(argv=None) -> int:
    args, ps = start_benchmark(__doc__, argv, quick="fewer samples and steps",
                               json="results")
    import jax
    import jax.numpy as jnp
    import scipy.sparse.linalg as sla

    from pysharp._backends._jax import x64
    from pysharp._engine import LanczosOptions

    steps = 100 if args.quick else 400
    load_start = os.getloadavg()
    cpu = machine_info()["cpu"]
    rows, checks = [], []
    print(f"CPU: {cpu}, {os.cpu_count()} cores, {jax.device_count()} JAX device(s) "
          f"({jax.devices()[0].platform}); float64; load average {os.getloadavg()}")

    def report(name, ours, peer, target, better="lower", load=None):
        """better "lower": ours / peer <= target (a cost ratio); "higher": peer / ours >=
        target (a speed-up)."""
        ratio = ours / peer if better == "lower" else peer / ours
        ok = ratio <= target if better == "lower" else ratio >= target
        flag = "!" if load is not None and load > BUSY_THRESHOLD else ""
        what = "cost ratio" if better == "lower" else "speed-up  "
        print(f"{name:<46} pysharp {ours * 1e3:10.1f} ms  peer {peer * 1e3:10.1f} ms  "
              f"{what} {ratio:5.2f} (target {'<=' if better == 'lower' else '>='} {target})  "
              f"{'ok' if ok else 'MISSED'}{flag}")
        rows.append({"row": name, "pysharp_s": ours, "peer_s": peer, "ratio": ratio,
                     "target": target, "ok": bool(ok), "load": load})

    nets = [("small BN CNN (D 356, n 64)", small_cnn()),
            (f"fc-tanh (D 656,810, n {1000 if args.quick else 5000})",
             fc_tanh(1000 if args.quick else 5000))]
    for label, (loss, params, data) in nets:
        model = ps.models.from_jax(loss, params, check=False, **data)
        w0 = model.initial_point()
        lr, wd = 0.05, 5e-4
        net_steps = steps if "CNN" in label else steps // 2  # fc-tanh: 0.16 s a step
        hand = hand_gd_wd(loss, model, data, lr, wd)
        with x64():
            wj = jnp.asarray(w0)
            peer, _ = timed(lambda: hand(wj, net_steps).block_until_ready(), repeats=2)
            w_peer = np.asarray(hand(wj, net_steps))
        kw = {"lr": lr, "wd": wd, "steps": net_steps, "record_every": net_steps}
        ours, load = timed(lambda: ps.run_gd_wd(model, w0, sharpness_every=0, **kw), repeats=2)
        tr = ps.run_gd_wd(model, w0, sharpness_every=0, **kw)
        dev = float(np.max(np.abs(tr.w - w_peer)) / np.max(np.abs(w_peer)))
        checks.append({"row": f"step {label}", "rel_dev": dev, "ok": dev < 1e-10})
        report(f"GD+WD step, {label}", ours / net_steps, peer / net_steps, 1.1, load=load)
        every = 100
        tracked, load = timed(lambda: ps.run_gd_wd(model, w0, sharpness_every=every, **kw),
                              repeats=1)
        report(f"sharpness every {every} steps vs none, {label.split(' (')[0]}", tracked, ours,
               1.5, load=load)

    # one top-2 eigensolve to 1e-6 (relative residual, as ARPACK's tol), against the peers
    loss, params, data = small_cnn()
    model = ps.models.from_jax(loss, params, check=False, **data)
    w = model.initial_point()
    w = w / np.linalg.norm(w)  # the spherical eigenvalues are H(w)'s at a unit w
    dense = np.linalg.eigvalsh(model.hessian(w))[::-1]  # the oracle (D = 356)
    tol = 1e-6
    eig = {}

    def answer(name, seconds, vals, hvps, truth, load=None):
        err = float(np.max(np.abs(np.asarray(vals) - truth) / np.abs(truth)))
        eig[name] = {"s": seconds, "eigenvalues": [float(v) for v in vals], "hvps": int(hvps),
                     "rel_err": err, "load": load}
        print(f"  {name:<44} {seconds * 1e3:9.1f} ms  {hvps:4d} HVPs  rel. error {err:.1e}")

    print(f"top-2 eigenvalues of the small CNN's Hessian, dense: {dense[:2]}")
    ours, load = timed(lambda: ps.spherical_sharpness(model, w, k=2, tol=tol,
                                                      method="lanczos"), repeats=3)
    res = ps.spherical_sharpness(model, w, k=2, tol=tol, method="lanczos")
    answer("pysharp (block Lanczos, one XLA program)", ours, res.eigenvalues,
           res.iterations, dense[:2], load)
    # the single-vector run (no multiplicity): the top-2 Ritz pairs of one Krylov sequence
    single = LanczosOptions.for_dim(model.dim, 2, tol=tol).to_core()
    lz = model._core(np.dtype(np.float64), "jax").lanczos
    one_s, one_load = timed(lambda: lz(w[None], single, multiplicity=False), repeats=3)
    one = lz(w[None], single, multiplicity=False)
    answer("pysharp single-vector (multiplicity=False)", one_s, one[0][0], one[3][0],
           dense[:2], one_load)
    with x64():
        arrays = {k: jnp.asarray(v) for k, v in data.items()}
        g = jax.grad(lambda v: loss(model.unravel(v), **arrays))
        hvp = jax.jit(lambda v: jax.jvp(g, (jnp.asarray(w),), (v,))[1])
        calls = [0]

        def matvec(v):
            calls[0] += 1
            return np.asarray(hvp(jnp.asarray(v.ravel(), dtype=jnp.float64)))
        op = sla.LinearOperator((model.dim, model.dim), dtype=np.float64, matvec=matvec)
        peer, load = timed(lambda: sla.eigsh(op, k=2, which="LA", tol=tol), repeats=3)
        calls[0] = 0
        ref = np.sort(sla.eigsh(op, k=2, which="LA", tol=tol)[0])[::-1]
    answer("scipy eigsh over jitted JAX HVPs", peer, ref, calls[0], dense[:2], load)
    report("top-2 eigensolve to 1e-6 vs eigsh + JAX HVPs", ours, peer, 2.0, better="higher",
           load=load)
    if _importable("torch"):
        mv, calls = torch_hvp(model.unravel(w), data)
        op = sla.LinearOperator((model.dim, model.dim), dtype=np.float64, matvec=mv)
        peer, load = timed(lambda: sla.eigsh(op, k=2, which="LA", tol=tol), repeats=1)
        calls[0] = 0
        ref = np.sort(sla.eigsh(op, k=2, which="LA", tol=tol)[0])[::-1]
        answer("scipy eigsh over torch autograd HVPs (gd.py)", peer, ref, calls[0], dense[:2],
               load)
        report("top-2 eigensolve to 1e-6 vs eigsh + torch HVPs", ours, peer, 2.0,
               better="higher", load=load)
    else:
        print("  torch is not installed: no reference-PyTorch peer (pip install torch)")
    if _importable("pyhessian") and _importable("torch"):
        by_size = dense[np.argsort(-np.abs(dense))][:2]
        peer, load = timed(lambda: pyhessian_top2(model.unravel(w), data, tol), repeats=1)
        vals, hvps = pyhessian_top2(model.unravel(w), data, tol)
        answer("PyHessian power iteration (top-2 |lambda|)", peer, vals, hvps, by_size, load)
        report("top-2 eigensolve to 1e-6 vs PyHessian", ours, peer, 2.0, better="higher",
               load=load)
    else:
        print("  pyhessian is not installed: no PyHessian peer (pip install pyhessian)")
    dev = float(np.max(np.abs(res.eigenvalues - dense[:2]) / dense[:2]))
    checks.append({"row": "top-2 eigensolve vs dense", "rel_dev": dev, "ok": dev < 1e-6})

    # 16 trajectories at 16 learning rates: one call (rows apart on the CPU), vmapped, and
    # 16 runs one after the other
    lrs = np.geomspace(0.01, 0.5, 16)
    W = np.repeat(w[None], 16, axis=0)
    kw = {"wd": 5e-4, "steps": steps, "record_every": steps, "sharpness_every": 0}
    core = model._core(np.dtype(np.float64), "jax")
    batched, load = timed(lambda: ps.run_gd_wd(model, W, lr=lrs, **kw), repeats=1)
    # the two ways agree to rounding before the edge (after it, the largest learning
    # rates' orbits amplify an ulp: a check over 10 steps)
    short = dict(kw, steps=10, record_every=10)
    default = ps.run_gd_wd(model, W, lr=lrs, **short)
    core.__dict__["rows_apart"] = False
    try:
        vmapped, vload = timed(lambda: ps.run_gd_wd(model, W, lr=lrs, **kw), repeats=1)
        vm = ps.run_gd_wd(model, W, lr=lrs, **short)
    finally:
        del core.__dict__["rows_apart"]
    dev = float(np.max(np.abs(vm.w - default.w)) / np.max(np.abs(default.w)))
    checks.append({"row": "16 learning rates, 10 steps: vmapped vs rows apart",
                   "rel_dev": dev, "ok": dev < 1e-10})
    ps.run_gd_wd(model, w, lr=lrs[0], **kw)  # the single-row program, compiled
    cpu0, t0 = time.process_time(), time.perf_counter()
    sequential, _ = timed(lambda: [ps.run_gd_wd(model, w, lr=x, **kw) for x in lrs], repeats=1)
    cores = (time.process_time() - cpu0) / (time.perf_counter() - t0)
    print(f"  16 runs one after the other: {sequential:.2f} s, {cores:.2f} cores busy "
          f"(CPU time / wall time); vmapped: {vmapped:.2f} s")
    report("16 learning rates: one call vs 16 runs", batched, sequential, 4.0,
           better="higher", load=load)
    report("16 learning rates: vmapped vs 16 runs", vmapped, sequential, 4.0,
           better="higher", load=vload)
    for row in rows[-2:]:
        row["sequential_cores_busy"] = cores

    # where each engine wins: the compiled core vs XLA on BN linear regression
    linreg = ps.BNLinearRegression.synthetic(n=20, d=40, seed=0)
    B = 1024 if args.quick else 4096
    W = linreg.random_point(B, seed=1)
    kw = {"lr": 0.05, "wd": 1e-3, "steps": steps, "record_every": steps, "sharpness_every": 0,
          "reduced": False}
    cpp, _ = timed(lambda: ps.run_gd_wd(linreg, W, backend="cpp", **kw), repeats=2)
    xla, load = timed(lambda: ps.run_gd_wd(linreg, W, backend="jax", **kw), repeats=2)
    print(f"{'BN linreg d40 B' + str(B) + ': compiled core vs XLA':<44} cpp {cpp:.3f} s, "
          f"jax {xla:.3f} s: the compiled core is {xla / cpp:.1f}x faster"
          f"{'!' if load and load > BUSY_THRESHOLD else ''}")
    rows.append({"row": f"crossover BN linreg d40 B{B}", "cpp_s": cpp, "jax_s": xla,
                 "cpp_speedup": xla / cpp, "load": load})
    for c in checks:
        verdict = "ok" if c["ok"] else "FAILED"
        print(f"check {c['row']}: rel. deviation {c['rel_dev']:.1e} {verdict}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu, "when": time.strftime("%F %T"),
                                               "loadavg_start": load_start,
                                               "loadavg_end": os.getloadavg(),
                                               "rows": rows, "eigensolve": eig,
                                               "checks": checks}, indent=1))
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())

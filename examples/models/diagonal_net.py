"""Reference loss of diagonal_net.hpp, for ``pysharp.models.check``.

f(x; u, v) = sum_k (u_k^2 - v_k^2) x_k and L = (1/2n) sum_i (f(x_i) - y_i)^2, with
w = (u, v) of shape (2d,), in NumPy, JAX and PyTorch.

Run ``python diagonal_net.py`` to load the header, check it against each reference
whose framework is installed, and run SGD on it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HEADER = Path(__file__).with_name("diagonal_net.hpp")


def loss_numpy(w, X, y):
    d = X.shape[1]
    f = X @ (w[:d] ** 2 - w[d:] ** 2)
    return 0.5 / len(y) * np.sum((f - y) ** 2)


def loss_jax(w, X, y):
    import jax.numpy as jnp
    d = X.shape[1]
    f = jnp.asarray(X) @ (w[:d] ** 2 - w[d:] ** 2)
    return 0.5 / len(y) * jnp.sum((f - jnp.asarray(y)) ** 2)


def loss_torch(w, X, y):
    import torch
    d = X.shape[1]
    f = torch.tensor(X, dtype=w.dtype) @ (w[:d] ** 2 - w[d:] ** 2)
    return 0.5 / len(y) * torch.sum((f - torch.tensor(y, dtype=w.dtype)) ** 2)


def synthetic(n: int = 20, d: int = 40, sparsity: int = 3,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian inputs X (n, d) and targets y = X beta* of a ``sparsity``-sparse beta*
    (an over-parameterised regression: n < d, so interpolating minima form a manifold)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    beta = np.zeros(d)
    beta[:sparsity] = 1.0
    return X, X @ beta


if __name__ == "__main__":
    import importlib.util

    import pysharp as ps

    X, y = synthetic()
    model = ps.models.load_model(HEADER, X=X, y=y)
    for name, loss in (("numpy", loss_numpy), ("jax", loss_jax), ("torch", loss_torch)):
        if name != "numpy" and importlib.util.find_spec(name) is None:
            continue
        print(ps.models.check(model, lambda w, loss=loss: loss(w, X, y)), "\n")
    w0 = np.full((4, model.dim), 0.1)  # a small, balanced start
    run = ps.run_sgd(model, w0, lr=[0.005, 0.01, 0.02, 0.04], batch=5, steps=20000, seed=0)
    print("final training loss per learning rate:", run.loss[-1])

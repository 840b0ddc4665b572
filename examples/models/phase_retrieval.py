"""Reference losses of phase_retrieval.hpp, for ``pysharp.models.check``.

L(w) = (c / 2n) sum_i ((x_i . w)^2 / ||w||^2 - y_i)^2, the same formula in NumPy,
JAX and PyTorch. Each takes w of shape (d,) and returns a scalar. The NumPy one
writes ||w||^2 as ``w @ w`` (not ``np.linalg.norm``) so that it stays analytic and
``check`` can take its gradient by the complex step.

Run ``python phase_retrieval.py`` to load the header and check it against each
reference whose framework is installed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HEADER = Path(__file__).with_name("phase_retrieval.hpp")


def loss_numpy(w, X, y, c=1.0):
    q = (X @ w) ** 2 / (w @ w)
    return c / (2 * len(y)) * np.sum((q - y) ** 2)


def loss_jax(w, X, y, c=1.0):
    import jax.numpy as jnp
    q = (jnp.asarray(X) @ w) ** 2 / (w @ w)
    return c / (2 * len(y)) * jnp.sum((q - jnp.asarray(y)) ** 2)


def loss_torch(w, X, y, c=1.0):
    import torch
    q = (torch.tensor(X, dtype=w.dtype) @ w) ** 2 / (w @ w)
    return c / (2 * len(y)) * torch.sum((q - torch.tensor(y, dtype=w.dtype)) ** 2)


def synthetic(n: int = 24, d: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian measurements X (n, d) and noiseless intensities y (n,) of a random w*."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    w_star = rng.standard_normal(d)
    return X, (X @ w_star) ** 2 / (w_star @ w_star)


if __name__ == "__main__":
    import importlib.util

    import pysharp as ps

    X, y = synthetic()
    model = ps.models.load_model(HEADER, X=X, y=y, c=1.0)
    for name, loss in (("numpy", loss_numpy), ("jax", loss_jax), ("torch", loss_torch)):
        if name != "numpy" and importlib.util.find_spec(name) is None:
            continue
        print(ps.models.check(model, lambda w, loss=loss: loss(w, X, y, 1.0)), "\n")

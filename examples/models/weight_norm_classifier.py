"""Reference losses of weight_norm_classifier.hpp, for ``pysharp.models.check``.

w = (W (m x d), a (m)) flattened, W first; h_i = softplus(s (W / ||W||) x_i),
f_i = (a / ||a||) . h_i and L(w) = (1/n) sum_i log(1 + exp(-y_i f_i)). The loss is
invariant to the scale of W and of a separately: two groups, of m d and m values
(``groups=[m * d, m]``). The NumPy loss writes norms as ``sqrt(sum(v * v))`` so that
it stays analytic and ``check`` can take its gradient by the complex step.

Run ``python weight_norm_classifier.py`` to load the header and check it, per group, against
each reference whose framework is installed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HEADER = Path(__file__).with_name("weight_norm_classifier.hpp")


def loss_numpy(w, X, y, m=6, s=2.0):
    d = X.shape[1]
    W, a = w[:m * d].reshape(m, d), w[m * d:]
    h = np.log1p(np.exp(s * (X @ W.T) / np.sqrt(np.sum(W * W))))
    f = h @ a / np.sqrt(a @ a)
    return np.mean(np.log1p(np.exp(-y * f)))


def loss_jax(w, X, y, m=6, s=2.0):
    import jax.numpy as jnp
    d = X.shape[1]
    W, a = w[:m * d].reshape(m, d), w[m * d:]
    h = jnp.log1p(jnp.exp(s * (X @ W.T) / jnp.sqrt(jnp.sum(W * W))))
    f = h @ a / jnp.sqrt(a @ a)
    return jnp.mean(jnp.log1p(jnp.exp(-y * f)))


def synthetic(n: int = 40, d: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian inputs X (n, d) and labels y = sign(x . u) of a random u."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    return X, np.where(X @ rng.standard_normal(d) > 0, 1.0, -1.0)


if __name__ == "__main__":
    import importlib.util

    import pysharp as ps

    X, y = synthetic()
    model = ps.models.load_model(HEADER, X=X, y=y, m=6, s=2.0)
    print(model.group_bounds)  # [ 0 30 36]: W's 30 weights, a's 6
    for name, loss in (("numpy", loss_numpy), ("jax", loss_jax)):
        if name != "numpy" and importlib.util.find_spec(name) is None:
            continue
        print(ps.models.check(model, lambda w, loss=loss: loss(w, X, y)), "\n")

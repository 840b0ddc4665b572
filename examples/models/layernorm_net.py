"""Reference loss of layernorm_net.hpp in NumPy (the same lines run in jax.numpy)."""

import numpy as np


def loss(w, X, y, a, xp=np):
    """mean_i (a . LN(W x_i) - y_i)^2, W = w.reshape(m, d), LN over the m hidden units."""
    W = w.reshape(a.shape[0], X.shape[1])
    H = X @ W.T                                        # (n, m)
    Hc = H - H.mean(axis=1, keepdims=True)
    Hn = Hc / xp.sqrt((Hc * Hc).mean(axis=1, keepdims=True))
    return xp.mean((Hn @ a - y) ** 2)

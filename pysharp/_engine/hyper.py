"""Broadcasting of per-trajectory hyperparameters against a batch of starts."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from .validation import as_batch


def per_trajectory(value: Any, name: str, *, positive: bool = False) -> np.ndarray:
    """A scalar or 1-D array of finite reals, >= 0 (or > 0 with ``positive``); ndim kept."""
    a = np.asarray(value, dtype=np.float64)
    if a.ndim > 1:
        raise ValueError(f"{name} must be a scalar or a 1-D array (one value per trajectory), "
                         f"got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite")
    if positive and np.any(a <= 0):
        raise ValueError(f"{name} must be > 0, got {a.min()}")
    if np.any(a < 0):
        raise ValueError(f"{name} must be >= 0, got {a.min()}")
    return a


def broadcast_batch(w0: Any, dim: int, dtype: DTypeLike | None,
                    **params: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray], bool]:
    """Broadcast starts (D,) or (B, D) and 1-D hyperparameters to a common B.

    Returns (W0 (B, D), {name: (B,) array}, single) where ``single`` is True
    when everything was unbatched, so results drop the batch axis.
    """
    W0, single = as_batch(w0, dim, "w0", dtype=dtype)
    single = single and all(p.ndim == 0 for p in params.values())
    params = {k: np.atleast_1d(v) for k, v in params.items()}
    sizes = {W0.shape[0]} | {p.shape[0] for p in params.values()}
    sizes.discard(1)
    if len(sizes) > 1:
        raise ValueError("w0 rows and per-trajectory hyperparameters must have equal lengths "
                         "(or length 1); got " +
                         ", ".join([f"w0: {W0.shape[0]}"] +
                                   [f"{k}: {v.shape[0]}" for k, v in params.items()]))
    B = sizes.pop() if sizes else 1
    W0 = np.ascontiguousarray(np.broadcast_to(W0, (B, dim)))
    out = {k: np.ascontiguousarray(np.broadcast_to(v, (B,)), dtype=W0.dtype)
           for k, v in params.items()}
    return W0, out, single

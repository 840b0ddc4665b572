"""Shared pieces of the experiments: the theory's initialisation, small maths."""

from __future__ import annotations

import numpy as np


def theory_start(zeta: np.ndarray, sharpness: float, lr: float, wd: float, *,
                 margin: float = 0.98, perturbation: float = 1e-3, seed: int = 0) -> np.ndarray:
    """A GD+WD start near zeta on Gamma with effective LR margin * 2 / lambda_1(zeta).

    The direction is zeta plus a random tangent-to-sphere perturbation of size
    ``perturbation``; the norm sets eff_lr(0) = lr / ((1 - lr wd) ||w0||^2).
    """
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(zeta.shape)
    p -= (p @ zeta) * zeta
    w = zeta + perturbation * p / np.linalg.norm(p)
    eff = margin * 2.0 / sharpness
    norm2 = lr / ((1 - lr * wd) * eff)
    return w * np.sqrt(norm2) / np.linalg.norm(w)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of the last axis of a (..., D) against a vector b (D,)."""
    return (a @ b) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b))


def loglog_slope(x, y) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])

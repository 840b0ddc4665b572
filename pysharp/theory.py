"""Closed forms and bounds of the theory (Lyu, Li, Arora 2022), as functions.

All functions are vectorised over NumPy arrays; none runs a hot loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._validation import as_batch, as_real


def effective_lr(lr, wd, norm2):
    """eta_eff = lr / ((1 - lr wd) ||w||^2): GD+WD is projected GD with this LR (Lemma 3.1)."""
    return np.asarray(lr) / ((1 - np.asarray(lr) * np.asarray(wd)) * np.asarray(norm2))


def next_norm2(norm2, lr, wd, grad_norm2_w):
    """||w+||^2 = (1 - lr wd)^2 ||w||^2 + lr^2 ||grad L(w)||^2 (exact, as grad L(w) is orthogonal to w)."""
    decay = 1 - np.asarray(lr) * np.asarray(wd)
    return decay ** 2 * np.asarray(norm2) + np.asarray(lr) ** 2 * np.asarray(grad_norm2_w)


def next_effective_lr(eff_lr, lr, wd, grad_norm2_theta):
    """eta+ from 1/eta+ = (1 - lr wd)^2 (1/eta + eta ||grad L(theta)||^2) (exact)."""
    eta = np.asarray(eff_lr)
    decay = 1 - np.asarray(lr) * np.asarray(wd)
    return 1.0 / (decay ** 2 * (1.0 / eta + eta * np.asarray(grad_norm2_theta)))


def min_norm_interpolant(model) -> np.ndarray:
    """BN linear regression's limit: wt* = pinv(Xc) (y - mean y), shape (d,).

    The sharpness-reduction flow converges to the direction of this
    effective predictor (the minimum-norm interpolant on centred data).
    """
    from .models import BNLinearRegression

    if not isinstance(model, BNLinearRegression):
        raise TypeError("min_norm_interpolant is defined for BNLinearRegression")
    return np.linalg.pinv(model._Xc) @ (model.y - model.y.mean())


def smoothness_constant(model, samples: int = 64, seed: int = 0) -> float:
    """Estimate rho_2 = sup over the unit sphere of ||H(theta)||_2.

    The maximum over ``samples`` random unit points of the dense Hessian's
    spectral norm: a lower estimate of the supremum, exact only as samples
    grow. Dense Hessians cost D HVPs each, so keep D small (<= a few hundred).
    """
    thetas = model.random_point(samples, seed=seed)
    H = model.hessian(thetas)
    ev = np.linalg.eigvalsh(0.5 * (H + np.swapaxes(H, 1, 2)))
    return float(np.max(np.abs(ev)))


@dataclass
class Theorem42:
    """Quantities of Theorem 4.2 for one GD+WD run.

    If ``applicable`` (lr wd <= 1/2 and eta_eff(0) <= 1 / (pi^2 rho2 (1 - lr wd))),
    some t <= ``T0`` has ||grad L(theta_t)||^2 <= ``grad_norm2_bound`` and
    eta_eff(t) <= ``eff_lr_bound``.
    """

    rho2: float
    T0: int
    grad_norm2_bound: float
    eff_lr_bound: float
    applicable: bool

    def witness(self, trajectory) -> int:
        """First recorded step <= T0 meeting both bounds in a 1-trajectory run, -1 if none."""
        steps = np.asarray(trajectory.steps)
        g2 = np.asarray(trajectory.grad_norm).reshape(len(steps), -1)[:, 0] ** 2
        eff = np.asarray(trajectory.eff_lr).reshape(len(steps), -1)[:, 0]
        good = (steps <= self.T0) & (g2 <= self.grad_norm2_bound) & (eff <= self.eff_lr_bound)
        return int(steps[np.argmax(good)]) if good.any() else -1


def theorem_4_2(model, w0, lr: float, wd: float, *, rho2: float | None = None) -> Theorem42:
    """T0 = ceil(ln(||w0||^2 / (rho2 pi^2 lr)) / (2 lr wd)) and the bounds of Theorem 4.2.

    Parameters
    ----------
    model : ScaleInvariantModel
    w0 : array_like, shape (D,)
    lr, wd : float
        GD+WD hyperparameters, lr > 0, wd > 0.
    rho2 : float, optional
        Smoothness on the sphere; estimated by ``smoothness_constant`` if omitted.
    """
    W0, _ = as_batch(w0, model.dim, "w0", dtype=np.float64)
    lr = as_real(lr, "lr", minimum=0.0, strict=True)
    wd = as_real(wd, "wd", minimum=0.0, strict=True)
    rho2 = smoothness_constant(model) if rho2 is None else as_real(rho2, "rho2", minimum=0.0,
                                                                   strict=True)
    norm2 = float(W0[0] @ W0[0])
    decay = 1 - lr * wd
    eff0 = lr / (decay * norm2)
    applicable = lr * wd <= 0.5 and eff0 <= 1 / (math.pi ** 2 * rho2 * decay)
    T0 = max(0, math.ceil(math.log(norm2 / (rho2 * math.pi ** 2 * lr)) / (2 * lr * wd)))
    return Theorem42(rho2=rho2, T0=T0,
                     grad_norm2_bound=8 * math.pi ** 4 * rho2 ** 2 * lr * wd,
                     eff_lr_bound=2 / (math.pi ** 2 * rho2 * decay), applicable=applicable)

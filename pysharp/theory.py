"""Closed forms and bounds of the theory (Lyu, Li, Arora 2022), as functions.

All functions are vectorised over NumPy arrays; none runs a hot loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._engine.validation import as_batch, as_real
from .models import BNLinearRegression, BNMatrixCompletion, Toy3D


def effective_lr(lr, wd, norm2):
    """eta_eff = lr / ((1 - lr wd) ||w||^2): GD+WD is projected GD with this LR (Lemma 3.1).

    Examples
    --------
    >>> from pysharp import theory
    >>> round(float(theory.effective_lr(0.5, 2e-4, 100.0)), 6)  # ||w|| = 10
    0.005001
    """
    return np.asarray(lr) / ((1 - np.asarray(lr) * np.asarray(wd)) * np.asarray(norm2))


def next_norm2(norm2, lr, wd, grad_norm2_w):
    """||w+||^2 = (1 - lr wd)^2 ||w||^2 + lr^2 ||grad L(w)||^2 (exact, as grad L(w) is
    orthogonal to w)."""
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
    if not isinstance(model, BNLinearRegression):
        raise TypeError("min_norm_interpolant is defined for BNLinearRegression")
    return model.min_norm_interpolant()


def smoothness_bound(model) -> tuple[float | None, str]:
    """What is proven about rho_2 = sup over the unit sphere of ||H(theta)||_2.

    Returns
    -------
    bound : float or None
        ``inf`` where the supremum is infinite; a proven finite upper bound
        where one is known; None where neither is (then only the sampled
        lower estimate ``smoothness_constant`` is available).
    reason : str
        Why, in words.

    Notes
    -----
    BN linear regression, L = 2 var(y) (1 - cos(Xc w, y - mean y)): the Hessian
    of 1 - cos(z, u) has norm <= (2 / sqrt 3) / ||z||^2, so on the sphere
    ||H(theta)|| <= (4 / sqrt 3) var(y) ||Xc||^2 / ||Xc theta||^2. With full
    column rank (d <= n - 1) that gives rho_2 <= (4 / sqrt 3) var(y) cond(Xc)^2;
    otherwise (always when d >= n) the sphere meets null(Xc), near which
    ||H|| grows like 1 / dist^2: rho_2 is infinite. BN matrix completion:
    the sphere holds points with U = 0, where every observed score is 0 and
    sd = 0; ||H|| grows like 1 / sd^2 near them: rho_2 is infinite.
    """
    if isinstance(model, BNLinearRegression):
        sv = np.linalg.svd(model._Xc, compute_uv=False)
        d = model.dim
        rank = int(np.sum(sv > sv[0] * max(model._Xc.shape) * np.finfo(float).eps))
        if rank < d:
            return math.inf, (f"rho_2 is infinite: the centred data Xc has rank {rank} < d = {d}, "
                              "so the sphere meets null(Xc), where BN is undefined and ||H|| "
                              "grows like 1/||Xc theta||^2")
        return (4 / math.sqrt(3) * float(model.y.var()) * float(sv[0] / sv[-1]) ** 2,
                "proven: (4/sqrt 3) var(y) cond(Xc)^2 (Xc has full column rank)")
    if isinstance(model, BNMatrixCompletion):
        return math.inf, ("rho_2 is infinite: the sphere holds points with U = 0, where all "
                          "observed scores are equal (sd = 0, BN undefined) and ||H|| grows "
                          "like 1/sd^2 near them")
    if isinstance(model, Toy3D):
        return None, "finite (L is smooth on R^3 minus 0), but no closed-form bound is implemented"
    return None, f"nothing is known for {type(model).__name__}"


def smoothness_constant(model, samples: int = 64, seed: int = 0) -> float:
    """Sampled estimate of rho_2 = sup over the unit sphere of ||H(theta)||_2.

    The maximum over ``samples`` random unit points of the dense Hessian's
    spectral norm: a lower estimate of the supremum, never a bound; ``inf``
    where ``smoothness_bound`` proves the supremum infinite (BN linear
    regression with rank(Xc) < d, BN matrix completion). Dense Hessians cost
    D HVPs each, so keep D small (<= a few hundred).
    """
    if smoothness_bound(model)[0] == math.inf:
        return math.inf
    thetas = model.random_point(samples, seed=seed)
    H = model.hessian(thetas)
    ev = np.linalg.eigvalsh(0.5 * (H + np.swapaxes(H, 1, 2)))
    return float(np.max(np.abs(ev)))


@dataclass
class Theorem42:
    """Quantities of Theorem 4.2 for one GD+WD run.

    If ``applicable`` (rho2 finite, lr wd <= 1/2 and eta_eff(0) <= 1 / (pi^2 rho2 (1 - lr wd))),
    some t <= ``T0`` has ||grad L(theta_t)||^2 <= ``grad_norm2_bound`` and
    eta_eff(t) <= ``eff_lr_bound``. ``rho2_source``: "given" (the caller's),
    "proven" (``smoothness_bound``) or "sampled" (``smoothness_constant``, a
    lower estimate of the supremum: then ``applicable`` and the bounds are
    only approximate). ``reason`` says why it is or is not applicable. Where
    rho2 is infinite the theorem says nothing: T0 = 0, the bounds inf and 0.
    """

    rho2: float
    T0: int
    grad_norm2_bound: float
    eff_lr_bound: float
    applicable: bool
    reason: str = ""
    rho2_source: str = "given"

    def witness(self, trajectory) -> int:
        """First recorded step <= T0 meeting both bounds in a 1-trajectory run, -1 if none."""
        if not self.applicable:
            raise ValueError(f"Theorem 4.2 does not apply: {self.reason}")
        steps = np.asarray(trajectory.steps)
        g2 = np.asarray(trajectory.grad_norm).reshape(len(steps), -1)[:, 0] ** 2
        eff = np.asarray(trajectory.eff_lr).reshape(len(steps), -1)[:, 0]
        good = (steps <= self.T0) & (g2 <= self.grad_norm2_bound) & (eff <= self.eff_lr_bound)
        return int(steps[np.argmax(good)]) if good.any() else -1


def theorem_4_2(model, w0, lr: float, wd: float, *, rho2: float | None = None) -> Theorem42:
    """T0 = ceil(ln(||w0||^2 / (rho2 pi^2 lr)) / (2 lr wd)) and the bounds of Theorem 4.2.

    Lyu, Li & Arora (2022), Theorem 4.2: for a scale-invariant L with
    rho2 = sup_{sphere} ||H||, GD+WD with lr wd <= 1/2 and
    eta_eff(0) <= 1 / (pi^2 rho2 (1 - lr wd)) has, at some 0 <= t <= T0,
    ||grad L(theta_t)||^2 <= 8 pi^4 rho2^2 wd lr and
    eta_eff(t) <= 2 / (pi^2 rho2 (1 - lr wd)).

    Parameters
    ----------
    model : ScaleInvariantModel
    w0 : array_like, shape (D,)
    lr, wd : float
        GD+WD hyperparameters, lr > 0, wd > 0.
    rho2 : float, optional
        An upper bound of the smoothness on the sphere. Default: the proven
        bound of ``smoothness_bound`` where there is one, else the sampled
        ``smoothness_constant`` (flagged in ``rho2_source``). Where rho_2 is
        provably infinite the theorem is not applicable, whatever rho2 says.
    """
    W0, _ = as_batch(w0, model.dim, "w0", dtype=np.float64)
    lr = as_real(lr, "lr", minimum=0.0, strict=True)
    wd = as_real(wd, "wd", minimum=0.0, strict=True)
    bound, why = smoothness_bound(model)
    if bound == math.inf:
        return Theorem42(rho2=math.inf, T0=0, grad_norm2_bound=math.inf, eff_lr_bound=0.0,
                         applicable=False, reason=why,
                         rho2_source="proven" if rho2 is None else "given")
    if rho2 is not None:
        rho2, source = as_real(rho2, "rho2", minimum=0.0, strict=True), "given"
    elif bound is not None:
        rho2, source = bound, "proven"
    else:
        rho2, source = smoothness_constant(model), "sampled"
    norm2 = float(W0[0] @ W0[0])
    decay = 1 - lr * wd
    eff0 = lr / (decay * norm2)
    eff_max = 1 / (math.pi ** 2 * rho2 * decay)
    if lr * wd > 0.5:
        applicable, reason = False, f"lr wd = {lr * wd:.3g} > 1/2"
    elif eff0 > eff_max:
        applicable, reason = False, (f"eta_eff(0) = {eff0:.3g} > 1/(pi^2 rho2 (1 - lr wd)) = "
                                     f"{eff_max:.3g}")
    else:
        applicable, reason = True, "hypotheses hold"
    if source == "sampled":
        reason += f"; rho2 sampled ({why}): a lower estimate, so this is approximate"
    T0 = max(0, math.ceil(math.log(norm2 / (rho2 * math.pi ** 2 * lr)) / (2 * lr * wd)))
    return Theorem42(rho2=rho2, T0=T0,
                     grad_norm2_bound=8 * math.pi ** 4 * rho2 ** 2 * lr * wd,
                     eff_lr_bound=2 / (math.pi ** 2 * rho2 * decay), applicable=applicable,
                     reason=reason, rho2_source=source)

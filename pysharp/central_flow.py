"""The central flow: the time-averaged trajectory of GD at the Edge of Stability.

Cohen, Damian et al. (2024), "Understanding Optimization in Deep Learning with
Central Flows": at the Edge of Stability the iterates of gradient descent
oscillate (period two) along the top Hessian eigenvectors, yet their time
average follows a smooth ODE, the *central flow*. With U (D, k) the top
eigenvectors and X (k, k) >= 0 the covariance of the oscillation in that basis
(Sigma = U X U^T), the averaged gradient is grad L + 1/2 grad <H, Sigma>, and

    dw/dt = rho w - eta' [grad L(w) + 1/2 sum_ij X_ij D^3L(w)[u_i, u_j]],      (1)

t in steps. Plain GD: eta' = lr, rho = 0. GD+WD on a scale-invariant loss
(w+ = (1 - a) w - lr grad L(w), a = lr wd) is exactly plain GD with the growing
LR lr / (1 - a)^(2t+1) on u_t = w_t / (1 - a)^t; undoing the rescaling gives
(1) with rho = log(1 - a), an autonomous flow. Its time-1 map must be GD+WD's
step: with the averaged gradient frozen over the step, (1) gives
w+ = (1 - a) w - eta' (a / -rho) grad, so eta' = lr (-rho) / a
= lr (1 + a/2 + O(a^2)) (exponential-integrator matching of the decay; the
rescaling alone gives lr / (1 - a), which differs at O(a) and shifts the
steady state of the flow by a/2 relative: 2.5e-4 in ||w||^2 on BN linear
regression at lr wd = 5e-4). The edge eta' lambda_1 = 2 is then GD+WD's
linear stability edge lr lambda_1 = 2 - a up to O(a^2) (eta' lambda_1 =
(2 - a)(-rho)/a = 2 + a^2/6 + O(a^3) there); in the paper's units it is
eff_lr * S = 2 a / ((1 - a)(-rho)) = 2 + a + O(a^2) (eff_lr = lr / ((1 - a)
||w||^2), S = ||w||^2 lambda_1). Scalar RMSprop divides eta' by sqrt(nu) + eps
and carries nu, whose central flow is d nu/dt = -log(beta) (<||g||^2> - nu)
with <||g||^2> the predicted time average of ||grad L||^2 (below).

**The complementarity problem.** X keeps the preconditioned top eigenvalues
eta' lambda_i <= 2: X >= 0, the slack of the constraint >= 0, and X is zero
where the slack is positive. Differentiating lambda_i along (1),
d lambda_i / dt = <T_ii, dw/dt>, T_ij = D^3L(w)[u_i, u_j] (the cross terms by
polarisation, T_ij = (D^3L[u_i + u_j, .] - D^3L[u_i - u_j, .]) / 4), so the
slack is affine in X:

    s_ij(X) = gamma (2 delta_ij - eta' M_ij) - eta' dM_ij/dt
            = C_ij + eta'^2 / 2 <T_ij, sum_kl X_kl T_kl>,   M = U^T H U,        (2)

C = gamma (2 I - eta' M) - eta' rho <T, w> + eta'^2 <T, grad L>. The relaxation
gamma (``relax``, per step) is a Baumgarte term: on the edge (eta' lambda = 2)
it vanishes and (2) is the exact central-flow condition; off the edge it
lets lambda_i approach 2 / eta' as exp(-gamma t) instead of asking for the
derivative to vanish, so integration errors never accumulate and a start at
or slightly past the edge is pulled onto it. Below the edge by more than one
step's worth of sharpening, X = 0 and (1) is gradient flow exactly.
(2) is the gradient of the convex quadratic
q(X) = <C, X> + eta'^2 / 4 ||sum X_ij T_ij||^2, so X = argmin_{X >= 0} q: for
eigenvalues apart from each other X is diagonal and the problem is a small
linear complementarity problem, solved exactly by enumerating active sets; a
cluster of eigenvalues within ``cluster_tol`` of each other at the edge gets
a full PSD block, solved by accelerated projected gradient on the cone.

**Predictions.** The time average of any smooth f along the oscillation is
f(w) + 1/2 <U^T (Hess f) U, X>: the loss L + 1/2 <M, X>, ||w||^2 + tr X, and
||grad L||^2 + <U^T H^2 U, X> + sum_ij X_ij <T_ij, grad L>.

**Order 2 (the period-two correction).** The flow above is the leading
order in the oscillation's amplitude; X itself is O(lr wd) for GD+WD. At EoS
GD oscillates as w_bar +- h (period two, X = h h^T rank one), and the exact
averages over the two steps carry the even Taylor terms of every order. With
k = 1, h = sqrt(X) u, P = D^4L[u, u, u, u] and R = D^5L[u, u, u, u, .] (finite
differences of the exact third-order kernel along u, step 1e-3 at the unit
point), ``order=2`` keeps the next terms, all O(X) relative to the first:

- the averaged gradient gains X^2 R / 24 (the drift of (1) is the gradient of
  the average 1/2 (L(w + h) + L(w - h)) at fixed h);
- the edge is the curvature of the period-two orbit, eta' (lambda_1 + P X / 6)
  = 2 (GD+WD's orbit obeys lr (H h + D^4L[h, h, h] / 6) = (2 - a) h exactly up
  to fifth order): lambda_1 at the central point sits at (2 - eta' P X / 6) / eta';
- the predicted loss gains P X^2 / 24 (||w||^2 has no fourth derivative).

On BN linear regression (d 20, n 12, lr 0.5, wd 1e-3), GD+WD's steady state
is an exact period-two orbit. Against it order 1 errs by 6.1e-4 in the
averaged loss (the P X^2 / 24 term) and 1.2e-3 in ||w||^2 (the edge's P X / 6
shift: GD's mean point sits at eff_lr * S = 2.003); order 2 by 4e-7 and 1.2e-6,
the O(X^2) left. Order 2 needs k_max = 1 (the fourth moment of an oscillation
along several directions is not fixed by X) and method "gd" or "gd_wd".

The integrator is a Python loop over adaptive Dormand-Prince steps (the
tableau of ``pysharp.flow``); every evaluation is one dense Hessian, one
eigendecomposition and one batched third-order call, so it suits D up to a few
hundred. Gradient flow has rates eta' lambda_i <= 2 per step, so steps stay
around one GD step or shorter (explicit stability), whatever the tolerance.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from ._backends import resolve
from ._dormand_prince import B4 as _B4
from ._dormand_prince import B5 as _B5
from ._dormand_prince import A as _A
from ._engine.methods import METHODS
from ._engine.validation import as_batch, as_positive_int, as_real
from .models import ScaleInvariantModel, TwoLayerNet
from .models._square_loss import SquareLossModel

#: The engine methods the method table gives a central flow, and "gd" (gd_wd with wd = 0).
_METHODS = (*(name for name, m in METHODS.items() if m.central_flow), "gd")


@dataclass
class CentralState:
    """The central flow's field at one point.

    ``velocity`` dw/dt (D,) (with d nu/dt appended for scalar RMSprop),
    ``U`` the top eigenvectors (D, k), ``eigenvalues`` lambda_i(H(w)) (k,),
    ``sharpness`` eta' lambda_i (k,), ``X`` (k, k) the oscillation covariance
    in the basis U, ``loss`` L(w), ``grad`` grad L(w) (D,), ``grad2_pred`` the
    predicted time average of ||grad L||^2, ``eta`` the preconditioned LR eta',
    ``loss4`` the fourth-order term D^4L[u, u, u, u] X^2 / 24 of the predicted
    loss (``order=2``; 0 at order 1).
    """

    velocity: np.ndarray
    U: np.ndarray
    eigenvalues: np.ndarray
    sharpness: np.ndarray
    X: np.ndarray
    loss: float
    grad: np.ndarray
    grad2_pred: float
    eta: float
    loss4: float = 0.0

    @property
    def loss_pred(self) -> float:
        """Predicted time-averaged loss L(w) + 1/2 <U^T H U, X> (+ ``loss4`` at order 2)."""
        return float(self.loss + 0.5 * np.sum(self.eigenvalues * np.diag(self.X)) + self.loss4)


@dataclass
class CentralFlowSolution:
    """Result of ``CentralFlow.integrate``, recorded at ``t`` (K,) in steps.

    ``w`` (K, D); ``loss`` L(w) and ``loss_pred`` (K,) (the predicted time
    average); ``norm2`` ||w||^2 and ``norm2_pred`` ||w||^2 + tr X (K,);
    ``sharpness`` (K, k) the effective-LR-scaled top eigenvalues eta' lambda_i
    (eff_lr x spherical sharpness for GD+WD: the edge is 2); ``X`` (K, k, k);
    ``U`` (K, D, k) the eigenvectors X refers to; ``nu`` (K,) scalar RMSprop's
    second moment (None otherwise); ``grad_norm2_pred`` (K,) the predicted
    time average of ||grad L||^2; ``success``, ``message``, ``n_steps``
    (accepted integrator steps).
    """

    t: np.ndarray
    w: np.ndarray
    loss: np.ndarray
    loss_pred: np.ndarray
    norm2: np.ndarray
    norm2_pred: np.ndarray
    sharpness: np.ndarray
    X: np.ndarray
    U: np.ndarray = field(repr=False)
    nu: np.ndarray | None
    grad_norm2_pred: np.ndarray
    success: bool
    message: str
    n_steps: int

    @property
    def eos(self) -> np.ndarray:
        """(K,) bool: the oscillation is on (tr X > 0)."""
        return np.trace(self.X, axis1=1, axis2=2) > 0

    def predict(self, f, hessian) -> np.ndarray:
        """Predicted time average f(w) + 1/2 <U^T (Hess f) U, X> at every record, (K,).

        Parameters
        ----------
        f : callable
            f(w (D,)) -> float.
        hessian : callable
            hessian(w (D,), V (D, k)) -> (Hess f)(w) V, shape (D, k).
        """
        out = np.empty(len(self.t))
        for i, (w, U, X) in enumerate(zip(self.w, self.U, self.X)):
            out[i] = float(f(w)) + 0.5 * np.sum((U.T @ np.asarray(hessian(w, U))) * X)
        return out


class CentralFlow:
    """The central flow of GD, GD+WD or scalar RMSprop on a model.

    Parameters
    ----------
    model : ScaleInvariantModel or TwoLayerNet
        Needs exact HVPs and third-order contractions. TwoLayerNet (not scale
        invariant) takes ``method="gd"`` only.
    method : {"gd_wd", "gd", "scalar_rmsprop"}
        "gd" is "gd_wd" with wd = 0. Scalar RMSprop follows
        ``pysharp.run_scalar_rmsprop`` (its nu starts at (1 - beta) ||grad L(w0)||^2).
    lr : float
        Learning rate, > 0.
    wd : float
        Weight decay, >= 0, lr wd < 1 (must be 0 for "gd").
    k_max : int
        Number of top eigenvalues the oscillation may occupy.
    beta, eps : float
        Scalar RMSprop's decay and epsilon (as in ``run_scalar_rmsprop``).
    relax : float
        gamma, the rate (per step) at which the constraint pulls a preconditioned
        eigenvalue above or just below 2 back to the edge (see the module notes).
    cluster_tol : float
        Eigenvalues within this (in eta' lambda) of the largest and of the edge
        share a full PSD block of X; the others get diagonal entries.
    order : {1, 2}
        1: the central flow (leading order in the oscillation). 2: with the
        period-two fourth-order terms (see the module notes); needs k_max = 1
        and method "gd" or "gd_wd".
    """

    def __init__(self, model, method: str = "gd_wd", *, lr: float, wd: float = 0.0,
                 k_max: int = 4, beta: float = 0.99, eps: float = 1e-12, relax: float = 1.0,
                 cluster_tol: float = 1e-2, order: int = 1) -> None:
        if not isinstance(model, (ScaleInvariantModel, SquareLossModel)):
            raise TypeError(f"model must be a pysharp model, got {type(model).__name__}")
        if method not in _METHODS:
            raise ValueError(f"method must be one of {', '.join(_METHODS)}, got {method!r}")
        self.lr = as_real(lr, "lr", minimum=0.0, strict=True)
        self.wd = as_real(wd, "wd", minimum=0.0)
        if method == "gd" and self.wd != 0:
            raise ValueError("method 'gd' has no weight decay: use wd = 0 or method 'gd_wd'")
        if self.lr * self.wd >= 1:
            raise ValueError("lr * wd must be < 1 (the decay factor 1 - lr wd must stay positive)")
        if isinstance(model, SquareLossModel):
            if not isinstance(model, TwoLayerNet) and not hasattr(model._core(np.float64), "third"):
                raise TypeError(f"{type(model).__name__} has no third-order kernel")
            if method != "gd":
                raise ValueError(f"{type(model).__name__} is not scale invariant: only method "
                                 "'gd' has a central flow here")
        self.model = model
        self.method = method
        self.k_max = as_positive_int(k_max, "k_max")
        if self.k_max > model.dim:
            raise ValueError(f"k_max must be <= D = {model.dim}, got {self.k_max}")
        self.beta = as_real(beta, "beta", minimum=0.0)
        if self.beta >= 1 or (method == "scalar_rmsprop" and self.beta == 0):
            raise ValueError(f"beta must lie in (0, 1), got {beta}")
        self.eps = as_real(eps, "eps", minimum=0.0)
        self.relax = as_real(relax, "relax", minimum=0.0, strict=True)
        self.cluster_tol = as_real(cluster_tol, "cluster_tol", minimum=0.0)
        if isinstance(order, bool) or order not in (1, 2):
            raise ValueError(f"order must be 1 or 2, got {order!r}")
        if order == 2 and (self.k_max != 1 or method == "scalar_rmsprop"):
            raise ValueError("order 2 needs k_max = 1 and method 'gd' or 'gd_wd'")
        self.order = int(order)
        a = self.lr * self.wd
        self._rho = np.log1p(-a)             # the decay rate log(1 - a) per step
        # eta' before RMSprop's preconditioner: the time-1 map of (1) with the gradient
        # frozen is GD+WD's step (module notes).
        self._eta = self.lr * (-self._rho / a if a > 0 else 1.0)
        self._scale_invariant = isinstance(model, ScaleInvariantModel)
        if self._scale_invariant:
            self._core = model._core(np.float64, resolve("auto", np.zeros(1), model=model))
        else:
            self._core = model._core(np.float64)

    # -- kernels ------------------------------------------------------------------
    def _kernels(self, w: np.ndarray, V_dirs) -> tuple:
        """L, grad L (D,), H (D, D) at w and D^3L(w)[v, v] for the rows of V_dirs(U).

        Calls the float64 kernel object directly (the public methods validate
        and rescale on every call, which dominates at this size). Scale-invariant
        models are evaluated at the unit point theta = w / ||w|| and scaled back:
        grad L(w) = grad L(theta) / r, H(w) = H(theta) / r^2, D^3L(w) = D^3L(theta) / r^3.
        """
        r = 1.0
        if self._scale_invariant:
            r = float(np.sqrt(w @ w))
            w = w / r
        W = w[None]
        loss, G, ok = self._core.loss_grad(W)
        H, ok2 = self._core.hessian(W)
        if not (ok[0] and ok2[0]):
            raise ValueError(f"the loss is undefined at w ({self.model._undefined_reason})"
                             if self._scale_invariant else "the loss is undefined at w")
        H = H[0]
        evals, evecs = np.linalg.eigh(0.5 * (H + H.T))
        lam = evals[::-1][: self.k_max] / r ** 2
        U = np.ascontiguousarray(evecs[:, ::-1][:, : self.k_max])
        V = np.ascontiguousarray(V_dirs(U, lam))
        T3, ok3 = self._core.third(np.ascontiguousarray(np.repeat(W, len(V), axis=0)), V)
        if not np.all(ok3):
            raise ValueError("the third-order contraction is undefined at w")
        return float(loss[0]), G[0] / r, H / r ** 2, lam, U, T3 / r ** 3

    # -- the field --------------------------------------------------------------
    def state(self, y) -> CentralState:
        """The flow's field and X at a point ``y``: w (D,), or (w, nu) (D + 1,) for RMSprop."""
        y = np.asarray(y, dtype=np.float64)
        D = self.model.dim
        w = y[:D]
        k = self.k_max
        eta = self._eta
        if self.method == "scalar_rmsprop":
            nu = max(float(y[D]), 0.0)
            eta = eta / (np.sqrt(nu) + self.eps)
        pairs: list = []
        cluster: list = []

        def directions(U, lam):
            # Indices sharing a PSD block: within cluster_tol of the top and of the edge.
            sharp = eta * lam
            cluster[:] = [i for i in range(k) if sharp[0] - sharp[i] <= self.cluster_tol
                          and sharp[i] >= 2 - self.cluster_tol]
            pairs[:] = [(i, i) for i in range(k)] + list(itertools.combinations(cluster, 2))
            dirs = [U[:, i] for i in range(k)]
            for i, j in pairs[k:]:
                dirs += [U[:, i] + U[:, j], U[:, i] - U[:, j]]
            return np.array(dirs)

        loss, g, H, lam, U, T3 = self._kernels(w, directions)
        sharp = eta * lam
        T = {(i, i): T3[i] for i in range(k)}
        for n, (i, j) in enumerate(pairs[k:]):
            T[(i, j)] = 0.25 * (T3[k + 2 * n] - T3[k + 2 * n + 1])
        # Variables: X_ii for every i, sqrt(2) X_ij for the cluster pairs (isometric svec).
        G = np.array([T[p] if p[0] == p[1] else np.sqrt(2.0) * T[p] for p in pairs])  # (m, D)
        drift = self._rho * (G @ w) - eta * (G @ g)      # <T, dw/dt> at X = 0 (svec), nu fixed
        target = np.zeros(len(pairs))
        target[:k] = self.relax * (2.0 - sharp)
        c = target - eta * drift
        Q = 0.5 * eta ** 2 * (G @ G.T)
        if self.method == "scalar_rmsprop":
            c, Q = self._rmsprop_terms(c, Q, G, g, lam, U, H, eta, nu, pairs)
        drift4, loss4 = 0.0, 0.0
        if self.order == 2:
            P, R = self._fourth(w, U[:, 0])
            # The edge eta (lambda + P X / 6) = 2 adds -relax eta P / 6 to the slack's slope,
            # the drift's X^2 R / 24 adds eta^2 <T, R> / 24 X^2.
            x = np.array([_quadratic_root(c[0], Q[0, 0] - self.relax * eta * P / 6.0,
                                          eta ** 2 * (G[0] @ R) / 24.0)])
            drift4, loss4 = x[0] ** 2 * R / 24.0, float(P * x[0] ** 2 / 24.0)
        else:
            x = self._solve(c, Q, pairs, cluster)
        X = np.zeros((k, k))
        for (i, j), v in zip(pairs, x):
            X[i, j] = X[j, i] = v if i == j else v / np.sqrt(2.0)
        v = self._rho * w - eta * (g + 0.5 * (G.T @ x) + drift4)
        HU = H @ U
        grad2 = float(g @ g + np.sum((HU.T @ HU) * X) + (G @ g) @ x)
        if self.method == "scalar_rmsprop":
            v = np.append(v, -np.log(self.beta) * (grad2 - nu))
        return CentralState(v, U, lam, sharp, X, float(loss), g, grad2, eta, loss4)

    def _fourth(self, w: np.ndarray, u: np.ndarray) -> tuple[float, np.ndarray]:
        """P = D^4L(w)[u, u, u, u] and R = D^5L(w)[u, u, u, u, .] (D,).

        Central differences (step 1e-3 at the unit point for scale-invariant
        models, where every derivative is O(1)) of the exact D^3L[u, u] at
        w and w +- 1e-3 u: truncation O(1e-6) relative, rounding O(1e-10).
        """
        r = float(np.sqrt(w @ w)) if self._scale_invariant else 1.0
        th = w / r
        e = 1e-3
        T3, ok = self._core.third(np.ascontiguousarray([th + e * u, th, th - e * u]),
                                  np.ascontiguousarray(np.repeat(u[None], 3, axis=0)))
        if not np.all(ok):
            raise ValueError("the third-order contraction is undefined near w")
        P = float(u @ (T3[0] - T3[2])) / (2 * e)
        R = (T3[0] - 2 * T3[1] + T3[2]) / e ** 2
        return P / r ** 4, R / r ** 5

    def _rmsprop_terms(self, c, Q, G, g, lam, U, H, eta, nu, pairs):
        """Add the effect of d nu/dt on the preconditioned eigenvalues to (c, Q).

        eta' = eta0 / (sqrt(nu) + eps) changes at d eta'/dt = -kappa nu',
        kappa = eta' / (2 sqrt(nu) (sqrt(nu) + eps)), with nu' = -log(beta)
        (<||g||^2>(X) - nu) affine in X, so d(eta' lambda_i)/dt loses
        lambda_i kappa nu'(X) and the slack gains it. The added linear part is
        not symmetric: the problem is then an LCP rather than a QP, and
        ``_solve`` treats it as one.
        """
        kappa = eta / (2.0 * np.sqrt(max(nu, 1e-300)) * (np.sqrt(nu) + self.eps))
        cb = -np.log(self.beta)
        # The slack of eta' lambda_i gains lambda_i kappa nu'(x), nu'(x) = cb (g2_0 + p . x - nu)
        # with <||g||^2>(x) = g2_0 + p . x in svec coordinates.
        HU = H @ U
        p = np.array([(HU[:, i] @ HU[:, j]) * (1.0 if i == j else np.sqrt(2.0)) for i, j in pairs])
        p = p + G @ g
        g2_0 = float(g @ g)
        mvec = np.array([lam[i] if i == j else 0.0 for i, j in pairs])
        c = c + kappa * cb * mvec * (g2_0 - nu)
        Q = Q + kappa * cb * np.outer(mvec, p)
        return c, Q

    @staticmethod
    def _solve(c: np.ndarray, Q: np.ndarray, pairs, cluster) -> np.ndarray:
        """x >= 0 (svec of X on its cone) with s = c + Q x >= 0 and x . s = 0.

        Diagonal variables: enumeration of active sets (exact, the smallest set
        that works). Off-diagonal (cluster) variables: projected gradient on the
        PSD cone of the cluster block, started there.
        """
        k = sum(1 for i, j in pairs if i == j)
        m = len(pairs)
        diag = np.arange(k)
        x = np.zeros(m)
        if np.all(c[:k] >= 0):
            pass
        else:
            best = None
            for r in range(1, k + 1):
                for J in itertools.combinations(range(k), r):
                    J = list(J)
                    xj = np.linalg.lstsq(Q[np.ix_(J, J)], -c[J], rcond=1e-13)[0]
                    if np.any(xj < -1e-12 * max(1.0, np.max(np.abs(xj)))):
                        continue
                    xt = np.zeros(k)
                    xt[J] = np.maximum(xj, 0.0)
                    s = c[:k] + Q[:k, :k] @ xt
                    if np.all(s >= -1e-10 * max(1.0, np.max(np.abs(c[:k])))):
                        best = xt
                        break
                if best is not None:
                    break
            if best is None:
                raise CentralFlowError("the complementarity problem has no solution "
                                       "(the constraint cannot be kept)")
            x[diag] = best
        if m == k:
            return x
        # Cluster block: accelerated projected gradient on PSD x nonnegative orthant.
        if not np.allclose(Q, Q.T, rtol=1e-12, atol=1e-14 * np.max(np.abs(Q))):
            raise CentralFlowError("eigenvalue clusters are not supported with scalar RMSprop")
        pos = {p: n for n, p in enumerate(pairs)}
        L = max(np.linalg.eigvalsh(Q)[-1], 1e-300)

        def project(z):
            out = np.maximum(z, 0.0)
            B = np.zeros((len(cluster), len(cluster)))
            for a, i in enumerate(cluster):
                for b, j in enumerate(cluster):
                    n = pos[(min(i, j), max(i, j))]
                    B[a, b] = z[n] if i == j else z[n] / np.sqrt(2.0)
            ev, V = np.linalg.eigh(B)
            B = (V * np.maximum(ev, 0.0)) @ V.T
            for a, i in enumerate(cluster):
                for b, j in enumerate(cluster):
                    if a <= b:
                        n = pos[(i, j)]
                        out[n] = B[a, b] if i == j else np.sqrt(2.0) * B[a, b]
            return out

        y, t = x.copy(), 1.0
        scale = max(1e-300, np.max(np.abs(c)))
        for _ in range(5000):
            x_new = project(y - (c + Q @ y) / L)
            t_new = 0.5 * (1 + np.sqrt(1 + 4 * t * t))
            y = x_new + (t - 1) / t_new * (x_new - x)
            if np.max(np.abs(x_new - x)) * L <= 1e-14 * scale:
                return x_new
            if (c + Q @ x_new) @ (x_new - x) > 0:  # restart
                y, t_new = x_new.copy(), 1.0
            x, t = x_new, t_new
        return x

    # -- integration ------------------------------------------------------------
    def initial_state(self, w0) -> np.ndarray:
        """The integration variable at w0: w0 (D,), or (w0, nu0) for scalar RMSprop."""
        W, single = as_batch(w0, self.model.dim, "w0", dtype=np.float64)
        if not single:
            raise ValueError("w0 must be a single point of shape (D,)")
        w = W[0].copy()
        if not np.all(np.isfinite(w)):
            raise ValueError("w0 must be finite")
        if isinstance(self.model, ScaleInvariantModel) and not np.any(w):
            raise ValueError("w0 is the zero vector")
        if self.method != "scalar_rmsprop":
            return w
        g = self.model.grad(w)
        return np.append(w, (1.0 - self.beta) * float(g @ g))

    def integrate(self, w0, steps: float, *, substeps: int | None = None,
                  max_step: float | None = None, record_every: float = 1.0,
                  rtol: float = 1e-9, atol: float = 1e-12, max_steps: int = 1_000_000,
                  nu0: float | None = None) -> CentralFlowSolution:
        """Integrate the central flow from w0 over ``steps`` GD steps.

        Adaptive Dormand-Prince 5(4) that lands on every record time.

        Parameters
        ----------
        w0 : array_like, (D,)
            Start (for GD+WD compare with the two-step average of the iterates
            when starting at the edge, see ``compare_to_central``).
        steps : float
            Final time in GD steps, > 0.
        substeps : int, optional
            At least this many integrator steps per GD step: max_step =
            1 / substeps. Give ``substeps`` or ``max_step``, not both.
        max_step : float, optional
            Largest step, in GD steps (default 2). Gradient flow has rates up
            to 2 per step at the edge, so explicit stability keeps the
            adaptive step near 1.6 at most anyway: the cap only stops a
            step-size controller from overshooting into instability.
        record_every : float
            Record interval in steps; the integrator lands on every record time.
        rtol, atol : float
            Local error tolerances.
        max_steps : int
            Give up (``success`` False) after this many accepted steps.
        nu0 : float, optional
            Scalar RMSprop's initial second moment (default (1 - beta) ||grad L(w0)||^2,
            as the engine).

        Returns
        -------
        CentralFlowSolution
            On a failure ``success`` is False, ``message`` says why and the
            solution holds the records so far.
        """
        steps = as_real(steps, "steps", minimum=0.0, strict=True)
        if substeps is not None and max_step is not None:
            raise ValueError("give substeps or max_step, not both (max_step = 1 / substeps)")
        if substeps is not None:
            max_step = 1.0 / as_positive_int(substeps, "substeps")
        max_step = as_real(2.0 if max_step is None else max_step, "max_step", minimum=0.0,
                           strict=True)
        record_every = as_real(record_every, "record_every", minimum=0.0, strict=True)
        rtol = as_real(rtol, "rtol", minimum=0.0, strict=True)
        atol = as_real(atol, "atol", minimum=0.0, strict=True)
        max_steps = as_positive_int(max_steps, "max_steps")
        y = self.initial_state(w0)
        if nu0 is not None:
            if self.method != "scalar_rmsprop":
                raise ValueError("nu0 is scalar RMSprop's only")
            y[-1] = as_real(nu0, "nu0", minimum=0.0, strict=True)
        D = self.model.dim
        h_max = max_step
        n_rec = int(np.floor(steps / record_every + 1e-9))
        rec_times = [record_every * i for i in range(n_rec + 1)]
        if rec_times[-1] < steps - 1e-9 * steps:
            rec_times.append(steps)
        recs: list = []

        def record(t, y, st):
            recs.append((t, y.copy(), st))

        st = self.state(y)
        record(0.0, y, st)
        t, h, n_acc = 0.0, min(h_max, 0.1), 0
        f = st.velocity
        nxt = 1
        success, message = True, "reached steps"
        while nxt < len(rec_times):
            if n_acc >= max_steps:
                success, message = False, f"max_steps = {max_steps} reached at t = {t:.6g}"
                break
            h = min(h, h_max, rec_times[nxt] - t)
            try:
                k = [f]
                for i in range(1, 6):
                    k.append(self.state(y + h * sum(a * kk for a, kk in zip(_A[i], k))).velocity)
                y5 = y + h * sum(b * kk for b, kk in zip(_B5, k))
                st5 = self.state(y5)
                k.append(st5.velocity)
            except (CentralFlowError, ValueError, np.linalg.LinAlgError) as exc:
                success, message = False, f"at t = {t:.6g}: {exc}"
                break
            err = h * sum((b5 - b4) * kk for b5, b4, kk in zip(_B5, _B4, k))
            scale = atol + rtol * np.maximum(np.abs(y), np.abs(y5))
            err_norm = float(np.sqrt(np.mean((err / scale) ** 2)))
            if not np.isfinite(err_norm):
                success, message = False, f"non-finite field at t = {t:.6g}"
                break
            if err_norm <= 1.0:
                t += h
                y, f, st = y5, st5.velocity, st5
                n_acc += 1
                if abs(t - rec_times[nxt]) <= 1e-9 * max(1.0, t):
                    t = rec_times[nxt]
                    record(t, y, st)
                    nxt += 1
            factor = 0.9 * err_norm ** -0.2 if err_norm > 0 else 5.0
            h *= min(5.0, max(0.2, factor))
            if h < 1e-12 * max(1.0, t):
                success, message = False, f"step size underflow at t = {t:.6g}"
                break
        return self._solution(recs, D, success, message, n_acc)

    def _solution(self, recs, D, success, message, n_acc) -> CentralFlowSolution:
        t = np.array([r[0] for r in recs])
        Y = np.array([r[1] for r in recs])
        sts = [r[2] for r in recs]
        W = Y[:, :D]
        X = np.array([s.X for s in sts])
        norm2 = np.sum(W * W, axis=1)
        return CentralFlowSolution(
            t=t, w=W, loss=np.array([s.loss for s in sts]),
            loss_pred=np.array([s.loss_pred for s in sts]),
            norm2=norm2, norm2_pred=norm2 + np.trace(X, axis1=1, axis2=2),
            sharpness=np.array([s.sharpness for s in sts]), X=X,
            U=np.array([s.U for s in sts]),
            nu=Y[:, D] if self.method == "scalar_rmsprop" else None,
            grad_norm2_pred=np.array([s.grad2_pred for s in sts]),
            success=success, message=message, n_steps=n_acc)


class CentralFlowError(RuntimeError):
    """The central flow's complementarity problem failed."""


def _quadratic_root(c: float, q1: float, q2: float) -> float:
    """Order 2's one-direction complementarity problem: X >= 0, s = c + q1 X + q2 X^2 >= 0, X s = 0.

    X = 0 when c >= 0, else the smallest positive root (q2 X^2 is a small
    correction to q1 X > 0, so the root continues order 1's -c / q1).
    """
    if c >= 0:
        return 0.0
    disc = q1 * q1 - 4.0 * q2 * c
    den = q1 + np.sqrt(disc) if disc >= 0 else -1.0
    if den <= 0:
        raise CentralFlowError("the complementarity problem has no solution "
                               "(the constraint cannot be kept)")
    return float(-2.0 * c / den)


@dataclass
class CentralComparison:
    """Time averages of a run against the central flow's predictions.

    At the flow's records ``steps`` (K,) (trajectory steps, t0 + t): ``loss_avg``
    and ``norm2_avg`` the run's averages over the ``window`` steps centred
    there (steps s - window/2 .. s + window/2, the two ends at half weight),
    ``loss_pred`` and ``norm2_pred`` the flow's predictions,
    ``loss_rel_error`` and ``norm2_rel_error`` |avg - pred| / |avg| (all (K,)).
    """

    steps: np.ndarray
    loss_avg: np.ndarray
    loss_pred: np.ndarray
    norm2_avg: np.ndarray
    norm2_pred: np.ndarray
    window: int

    @property
    def loss_rel_error(self) -> np.ndarray:
        return np.abs(self.loss_avg - self.loss_pred) / np.abs(self.loss_avg)

    @property
    def norm2_rel_error(self) -> np.ndarray:
        return np.abs(self.norm2_avg - self.norm2_pred) / np.abs(self.norm2_avg)

    @property
    def max_loss_error(self) -> float:
        return float(np.max(self.loss_rel_error)) if self.steps.size else float("nan")

    @property
    def max_norm2_error(self) -> float:
        return float(np.max(self.norm2_rel_error)) if self.steps.size else float("nan")


def compare_to_central(trajectory, sol: CentralFlowSolution, *, t0: int = 0, window: int = 200,
                       index: int = 0) -> CentralComparison:
    """Windowed time averages of a run's loss and ||w||^2 against the central flow.

    Parameters
    ----------
    trajectory : Trajectory
        A run recorded every step (``record_every=1``).
    sol : CentralFlowSolution
        The flow, started at trajectory step ``t0`` (its t = 0), with integer
        record times.
    t0 : int
        Trajectory step of the flow's start.
    window : int
        Averaging window in steps, even (a whole number of period-two cycles).
        The average at step s weighs steps s - window/2 + 1 .. s + window/2 - 1
        by 1 and the two ends by 1/2: centred on s exactly, with window/2
        steps of each parity.
    index : int
        Which trajectory of a batched run.

    Returns
    -------
    CentralComparison
        Over the flow's records whose whole window lies inside the run.
    """
    window = as_positive_int(window, "window")
    if window % 2:
        raise ValueError(f"window must be even (whole period-two cycles), got {window}")
    steps = np.asarray(trajectory.steps)
    if len(steps) < 2 or np.any(np.diff(steps) != 1):
        raise ValueError("the trajectory must be recorded every step (record_every=1)")
    t0 = as_positive_int(t0, "t0", minimum=0)
    loss = trajectory.loss if trajectory.loss.ndim == 1 else trajectory.loss[:, index]
    norm2 = trajectory.norm2 if trajectory.norm2.ndim == 1 else trajectory.norm2[:, index]
    at = t0 + np.asarray(sol.t)
    if np.any(np.abs(at - np.round(at)) > 1e-9):
        raise ValueError("the flow's record times must be whole steps")
    at = np.round(at).astype(np.int64)
    lo, hi = at - window // 2, at + window // 2
    keep = (lo >= steps[0]) & (hi <= steps[-1])
    i0, i1 = lo[keep] - steps[0], hi[keep] - steps[0]

    def average(x):
        c = np.concatenate([[0.0], np.cumsum(x)])
        return (c[i1 + 1] - c[i0] - 0.5 * (x[i0] + x[i1])) / window

    return CentralComparison(
        steps=at[keep], loss_avg=average(loss), loss_pred=np.asarray(sol.loss_pred)[keep],
        norm2_avg=average(norm2), norm2_pred=np.asarray(sol.norm2_pred)[keep], window=window)


def central_start(trajectory, step: int, *, index: int = 0) -> np.ndarray:
    """The mean point of a period-two run at ``step``, to start the central flow there.

    (w_{s-1} + 2 w_s + w_{s+1}) / 4: removes the alternating part
    (-1)^t h_t up to its second difference (the two-step average
    (w_s + w_{s+1}) / 2 is centred at s + 1/2 and keeps h_s - h_{s+1}).

    Parameters
    ----------
    trajectory : Trajectory
        A run recorded every step with directions (``record_every=1``,
        ``theta_every=1``), covering steps s - 1 .. s + 1.
    step : int
        The step s.
    index : int
        Which trajectory of a batched run.

    Returns
    -------
    ndarray, shape (D,)
    """
    step = as_positive_int(step, "step")
    if trajectory.theta is None:
        raise ValueError("the trajectory has no directions: run it with theta_every=1")
    ts, rs = list(np.asarray(trajectory.theta_steps)), list(np.asarray(trajectory.steps))
    need = (step - 1, step, step + 1)
    if not all(s in ts and s in rs for s in need):
        raise ValueError(f"the trajectory must record steps {need[0]}..{need[2]} (with "
                         "record_every=1 and theta_every=1)")
    w = []
    for s in need:
        th, n2 = trajectory.theta[ts.index(s)], trajectory.norm2[rs.index(s)]
        if th.ndim == 2:
            th, n2 = th[index], n2[index]
        w.append(th * np.sqrt(n2))
    return 0.25 * (w[0] + 2 * w[1] + w[2])

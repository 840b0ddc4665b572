"""Linear stability of SGD at interpolating minima, and input smoothness.

docs/theory.rst, section "SGD linear stability" (Wu et al. 2018; Ma & Ying,
NeurIPS 2021). At an interpolating W* of L = (1/2n) sum_i (f(x_i; W) - y_i)^2
let a_i = grad_W f(x_i; W*), H_i = a_i a_i^T, H = mean_i H_i and
Sigma = mean_i H_i^2 - H^2. Linearised SGD with learning rate eta and batch
size B is x_{t+1} = (I - eta H_{I_t}) x_t, H_I = (1/B) sum_{i in I} H_i, and

    E (I - eta H_I)^2 = (I - eta H)^2 + eta^2 kappa Sigma,
    kappa = (n - B) / (B (n - 1)) without replacement, 1 / B with.

A minimum is linearly stable (second moment) iff the spectral radius of
T_2(M) = E_I (I - eta H_I) M (I - eta H_I) is <= 1. Every stability verdict
here rests on that exact number. Around it, from strongest to weakest:

- sufficient: lambda_max((I - eta H)^2 + eta^2 kappa Sigma) <= 1 (the "vector
  criterion": E ||x_{t+1}||^2 <= lambda_max(...) E ||x_t||^2);
- necessary: a <= 2/eta (the mean obeys I - eta H).

Wu et al.'s pair a <= 2/eta, s <= 1/(eta sqrt(kappa)) is necessary for the
sufficient criterion, not for stability: a stable minimum can violate the s
bound (common near the edge of stability: 15% of Gaussian n = 7, D = 3, B = 3
problems at 0.99 of their critical eta). When D = 1 (or all a_i parallel) the
sufficient criterion is exact: T_2 is the number (1 - eta a)^2 + eta^2 kappa s^2;
the pair is then necessary, still not sufficient.

Everything here is computed from the per-sample Jacobian A = [a_1; ...; a_n]
(n, D), never from a D x D second-moment matrix when D is large:

- ``sharpness_nonuniformity``: a = lambda_max(H), s = sqrt(lambda_max(Sigma));
- ``second_moment_operator``: the exact T_2 on symmetric matrices and its
  spectral radius; ``is_linearly_stable``;
- ``stability_conditions``: the verdict rho(T_2) <= 1 with the sufficient
  criterion, the necessary a <= 2/eta and Wu et al.'s pair, each named for what it is;
- ``critical_lr``: the exact largest stable eta (rho(T_2) = 1, by root finding)
  per batch size, or the sufficient criterion's;
- ``stability_boundary``: the closed-form (a, s) curve of the sufficient
  criterion in one direction, for plots;
- ``moment_growth``: Monte Carlo k-th moment growth of linearised SGD, in the core;
- ``lyapunov_exponent``: the almost-sure growth rate of linearised SGD (the top
  Lyapunov exponent of its random matrix product), which rho(T_2) <= 1 bounds by 0
  but which can be < 0 where rho(T_2) > 1: the minimum then attracts almost every
  run while the second moment grows;
- ``gradient_moment_ratio``: (1/n) sum_i ||a_i||_{2k}^{2k} / (2 D (2B)^(k-1) / eta^k);
- ``input_smoothness``: g_W, g_x and the first-layer inequality
  ||grad_x f|| <= ||W1||_2 ||grad_W1 f||_F / ||x||.

The models are ``LinearRegression``, ``TwoLayerNet`` (``pysharp.models``),
``BNLinearRegression`` (through its ``per_sample_jacobians``; a_i = grad_w p_i) and any JAX
network on the square loss (``pysharp.models.square_loss_from_jax``), whose k outputs per
sample make H_i = J_i^T J_i with J_i (k, D) the Jacobian of sample i: everything above holds
with the k rows of J_i in place of a_i (Sigma = mean_i H_i^2 - H^2, H_i^2 =
J_i^T (J_i J_i^T) J_i), the Jacobian held as the (n k, D) matrix of those rows,
sample-major. Such a model's Jacobians come from ``vmap(jacrev)`` over chunks of samples;
what needs the dense (n k, D) matrix refuses in words when it cannot fit, and
``sharpness_nonuniformity(method="lanczos")`` never forms it.

Stability is decided on the range of H (the span of the a_i): along its null
space x_t never moves, so T_2 has the eigenvalue 1 there whatever eta and B.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._backends import core_only
from ._engine.loader import core
from ._engine.memory import available_memory
from ._engine.validation import as_batch, as_float_array, as_positive_int, as_real
from .models import BNLinearRegression
from .models._kinds import require_sample_jacobians
from .models._xla_square_loss import XlaSquareLossModel
from .sharpness import lanczos

__all__ = ["StabilityQuantities", "SecondMomentOperator", "MomentGrowth", "StabilityConditions",
           "InputSmoothness", "LyapunovExponent", "per_sample_gradients", "kappa",
           "sharpness_nonuniformity", "second_moment_operator", "is_linearly_stable",
           "moment_growth", "lyapunov_exponent",
           "stability_conditions", "critical_lr", "gradient_moment_ratio", "input_smoothness",
           "stability_boundary"]


# --------------------------------------------------------------------------- inputs
def _check_model(model) -> None:
    require_sample_jacobians(model, "model")


def _backend(model, backend: str, what: str) -> None:
    """Refuses a model without per-sample Jacobians, then a backend that cannot run ``what``:
    the compiled core runs the algebra; a JAX model's Jacobians come from XLA."""
    require_sample_jacobians(model, what)
    if model.jacobians_by == "xla":
        if backend not in ("auto", "jax"):
            raise ValueError(f"{what}: a square_loss_from_jax model's Jacobians are computed "
                             f"by XLA; backend must be 'auto' or 'jax', got {backend!r}")
        return
    core_only(backend, what)


def _outputs(model) -> int:
    """k, the outputs per sample (1 but for a JAX model with vector outputs)."""
    return model.outputs


def per_sample_gradients(model, w, *, backend: str = "auto") -> np.ndarray:
    """a_i = grad_W f(x_i; w) for every training sample: (n, D) or (B, n, D), float64.

    For ``BNLinearRegression``, f is the BN prediction p_i with full-batch statistics.
    For a ``square_loss_from_jax`` model with k outputs (Y of shape (n, k)), the
    Jacobians J_i: (n, k, D) or (B, n, k, D), computed by XLA over chunks of samples and
    refused (MemoryError, in words) when the dense array cannot fit; ``backend``
    "auto" or "jax" there. Core only (``backend`` "auto" or "cpp") otherwise, as every
    function of this module.
    """
    _backend(model, backend, "per_sample_gradients")
    W, single = as_batch(w, model.dim, "w", dtype=np.float64)
    A = model.param_gradients(W)
    return A[0] if single else A


def _rows(model, W: np.ndarray) -> np.ndarray:
    """The Jacobian rows of points W (B, D): (B, n k, D), sample-major (k = 1: (B, n, D))."""
    return model.jacobian_rows(W)


def _point(model, w) -> np.ndarray:
    """Validated single point (D,) float64 and its Jacobian rows (n k, D)."""
    _check_model(model)
    W, single = as_batch(w, model.dim, "w", dtype=np.float64)
    if not single:
        raise ValueError(f"w must be a single point of shape ({model.dim},), got {np.shape(w)}")
    return _rows(model, W)[0]


def _blocks(A: np.ndarray, k: int) -> np.ndarray:
    """The per-sample Gram blocks J_i J_i^T (n, k, k) of rows A (n k, D)."""
    J = A.reshape(A.shape[0] // k, k, A.shape[1])
    return np.einsum("ikd,ild->ikl", J, J)


def _block_apply(G: np.ndarray, U: np.ndarray) -> np.ndarray:
    """blockdiag(G_1, ..., G_n) U for U (n k,) or (n k, m)."""
    n, k, _ = G.shape
    return np.einsum("ikl,il...->ik...", G, U.reshape((n, k) + U.shape[1:])).reshape(U.shape)


def _lr(lr) -> float:
    return as_real(lr, "lr", minimum=0.0, strict=True)


def _batch(batch, n: int, replacement) -> tuple[int, bool]:
    if not isinstance(replacement, (bool, np.bool_)):
        raise TypeError(f"replacement must be a bool, got {type(replacement).__name__}")
    batch = as_positive_int(batch, "batch")
    if not replacement and batch > n:
        raise ValueError(f"batch must be <= n = {n} without replacement, got {batch}")
    return batch, bool(replacement)


def kappa(n: int, batch: int, replacement: bool = False) -> float:
    """Noise factor of the batch Hessian: E H_I^2 = H^2 + kappa Sigma.

    (n - B) / (B (n - 1)) without replacement (0 for B = n; 1 for n = 1), 1 / B with.
    """
    n = as_positive_int(n, "n")
    batch, replacement = _batch(batch, n, replacement)
    if replacement:
        return 1.0 / batch
    return 1.0 if n == 1 else (n - batch) / (batch * (n - 1))


def _range_basis(A: np.ndarray, rtol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates of the a_i in an orthonormal basis of their span: (n, r), basis (D, r)."""
    U, S, Vt = np.linalg.svd(A, full_matrices=False)
    r = int(np.sum(S > rtol * max(S[0], np.finfo(float).tiny))) if S.size else 0
    return U[:, :r] * S[:r], Vt[:r].T


# ------------------------------------------------------------ sharpness, non-uniformity
@dataclass
class StabilityQuantities:
    """Sharpness a = lambda_max(H) and non-uniformity s = sqrt(lambda_max(Sigma)).

    Scalars for one point, (B,) arrays for a batch. Diagnostics: ``trace_h``
    tr(H) (the flatness of Ma & Ying), ``rank`` of H (numerical), ``method``
    used, ``converged`` and ``residuals`` (||A v - lambda v|| of the top
    eigenvectors of H and Sigma, (..., 2)), ``n`` and ``dim``.
    """

    sharpness: np.ndarray
    nonuniformity: np.ndarray
    trace_h: np.ndarray
    rank: np.ndarray
    residuals: np.ndarray
    converged: np.ndarray
    method: str
    n: int
    dim: int


def _top_dense(M: np.ndarray) -> tuple[float, np.ndarray]:
    evals, evecs = np.linalg.eigh(0.5 * (M + M.T))
    return float(evals[-1]), evecs[:, -1]


def _sharp_nonuni_one(A: np.ndarray, method: str, tol: float, seed: int, k: int = 1):
    """A: the Jacobian rows (n k, D), sample-major; k = 1 is the scalar case a_i."""
    n, D = A.shape[0] // k, A.shape[1]
    if k == 1:
        sq = np.einsum("ij,ij->i", A, A)  # ||a_i||^2

        def weigh(U):  # blockdiag(J_i J_i^T) U
            return (sq * U.T).T
    else:
        sq = _blocks(A, k)

        def weigh(U):
            return _block_apply(sq, U)

    def h_mv(v):
        return A.T @ (A @ v) / n

    def s_mv(v):
        return A.T @ weigh(A @ v) / n - h_mv(h_mv(v))

    if method == "dense":
        H = A.T @ A / n
        a, va = _top_dense(H)
        S = ((A.T * sq) @ A if k == 1 else A.T @ weigh(A)) / n - H @ H
        s2, vs = _top_dense(S)
        conv = True
    elif method == "gram":
        # Nonzero spectra through the n k x n k Gram matrix G = A A^T: H = A^T A / n ~ G / n,
        # Sigma = A^T M A with M = blockdiag(J_i J_i^T)/n - G/n^2 ~ G^(1/2) M G^(1/2)
        # (k = 1: blockdiag(J_i J_i^T) = diag(||a_i||^2)).
        G = A @ A.T
        g, U = np.linalg.eigh(0.5 * (G + G.T))
        g = np.clip(g, 0.0, None)
        Gh = (U * np.sqrt(g)) @ U.T
        a = float(g[-1]) / n
        va = A.T @ U[:, -1]
        M = (np.diag(sq) if k == 1 else weigh(np.eye(n * k))) / n - G / n**2
        s2, c = _top_dense(Gh @ M @ Gh)
        # v = A^T G^(-1/2) c spans the eigenvector; G^(-1/2) on the range only.
        ginv = np.where(g > g[-1] * 1e-12, 1.0 / np.sqrt(np.where(g > 0, g, 1.0)), 0.0)
        vs = A.T @ ((U * ginv) @ (U.T @ c))
        conv = True
    else:  # lanczos
        rh = lanczos(h_mv, D, 1, tol=tol, seed=seed)
        rs = lanczos(s_mv, D, 1, tol=tol, seed=seed + 1)
        a, va, s2, vs = (float(rh.eigenvalues[0]), rh.eigenvectors[0],
                         float(rs.eigenvalues[0]), rs.eigenvectors[0])
        conv = bool(rh.converged and rs.converged)
    nrm = lambda v: v / max(np.linalg.norm(v), np.finfo(float).tiny)  # noqa: E731
    va, vs = nrm(va), nrm(vs)
    res = np.array([np.linalg.norm(h_mv(va) - a * va), np.linalg.norm(s_mv(vs) - s2 * vs)])
    s_A = np.linalg.svd(A, compute_uv=False)
    rank = int(np.sum(s_A > 1e-10 * max(s_A[0], np.finfo(float).tiny))) if s_A.size else 0
    trace = float(sq.sum() / n) if k == 1 else float(np.einsum("ij,ij->", A, A) / n)
    return a, np.sqrt(max(s2, 0.0)), trace, rank, res, conv


def _sharp_nonuni_chunked(model: XlaSquareLossModel, w: np.ndarray, tol: float, seed: int):
    """Lanczos on H and Sigma through one or two chunked passes over the data per product,
    the Jacobian never formed whole (rank not computed: -1)."""
    D = model.dim

    def h_mv(v):
        return model.gauss_newton_hvp(w, v)

    def s_mv(v):
        h, s = model.stability_products(w, v)
        return s[0] - model.gauss_newton_hvp(w, h[0])

    rh = lanczos(h_mv, D, 1, tol=tol, seed=seed)
    rs = lanczos(s_mv, D, 1, tol=tol, seed=seed + 1)
    a, va, s2, vs = (float(rh.eigenvalues[0]), rh.eigenvectors[0],
                     float(rs.eigenvalues[0]), rs.eigenvectors[0])
    nrm = lambda v: v / max(np.linalg.norm(v), np.finfo(float).tiny)  # noqa: E731
    va, vs = nrm(va), nrm(vs)
    res = np.array([np.linalg.norm(h_mv(va) - a * va), np.linalg.norm(s_mv(vs) - s2 * vs)])
    trace = model.jacobian_moment(w, 1)
    return a, np.sqrt(max(s2, 0.0)), trace, -1, res, bool(rh.converged and rs.converged)


def _jacobian_fits(model) -> bool:
    """Whether a JAX model's dense Jacobian takes at most a quarter of the free memory."""
    room = available_memory()
    return room is None or model.jacobian_bytes() <= room // 4


def sharpness_nonuniformity(model, w, *, method: str = "auto", tol: float = 1e-10,
                            seed: int = 0, backend: str = "auto") -> StabilityQuantities:
    """Sharpness lambda_max(H) and non-uniformity sqrt(lambda_max(Sigma)) at w.

    H = mean_i a_i a_i^T is the Hessian of L = (1/2n) sum (f - y)^2 at an
    interpolating w (the Gauss-Newton matrix elsewhere); Sigma = mean_i H_i^2 - H^2.

    Parameters
    ----------
    model : LinearRegression, TwoLayerNet, BNLinearRegression or square_loss_from_jax model
    w : array_like, shape (D,) or (B, D)
    method : {"auto", "dense", "gram", "lanczos"}
        "dense": eigh of the D x D matrices (small D only). "gram": the same
        nonzero spectra from n x n matrices built on the Gram matrix A A^T,
        exact, O(n^2 D) -- the choice when n is small and D large. "lanczos":
        matrix-free Lanczos (the core's recurrence) on products with H and
        Sigma built from the a_i, O(n D) per product -- when both n and D
        are large. "auto": dense for D <= 128, else gram for n <= 2048, else lanczos.
        For a ``square_loss_from_jax`` model with k outputs n counts the n k Jacobian
        rows, and "lanczos" never forms the Jacobian: each product is one or two passes
        of ``vmap(jacrev)`` over chunks of samples (the choice for FashionMNIST-sized
        data; ``rank`` is then -1, not computed); "auto" picks it when the dense (n k, D)
        Jacobian would take more than a quarter of the free memory.
    tol : float
        Lanczos residual tolerance.
    seed : int
        Key of the Lanczos start vectors.
    backend : {"auto", "cpp"}
        Core only: the compiled core runs this call; other backends are refused
        with a message.

    Returns
    -------
    StabilityQuantities
    """
    _backend(model, backend, "sharpness_nonuniformity")
    if method not in ("auto", "dense", "gram", "lanczos"):
        raise ValueError(f"method must be 'auto', 'dense', 'gram' or 'lanczos', got {method!r}")
    tol = as_real(tol, "tol", minimum=0.0, strict=True)
    seed = as_positive_int(seed, "seed", minimum=0)
    W, single = as_batch(w, model.dim, "w", dtype=np.float64)
    k = _outputs(model)
    if model.jacobians_by == "xla" and (
            method == "lanczos" or (method == "auto" and not _jacobian_fits(model))):
        rows = [_sharp_nonuni_chunked(model, x, tol, seed) for x in W]
        n, D, method = model.n, model.dim, "lanczos"
    else:
        A_all = _rows(model, W)
        n, D = A_all.shape[1] // k, A_all.shape[2]
        if method == "auto":
            method = "dense" if D <= 128 else ("gram" if n * k <= 2048 else "lanczos")
        rows = [_sharp_nonuni_one(A, method, tol, seed, k) for A in A_all]
    a, s, tr, rank, res, conv = (np.array(c) for c in zip(*rows))
    out = StabilityQuantities(a, s, tr, rank, res, conv.astype(bool), method, n, D)
    if single:
        out = StabilityQuantities(float(a[0]), float(s[0]), float(tr[0]), int(rank[0]), res[0],
                                  bool(conv[0]), method, n, D)
    return out


# ------------------------------------------------------------------- exact T_2
#: Largest r (r + 1) / 2 for which T_2 is diagonalised densely (r = rank of H; r <= 44).
_DENSE_MAX = 1000


def _sym_embedding(r: int) -> np.ndarray:
    """Orthonormal basis of symmetric r x r matrices as row-major vec columns: (r^2, r(r+1)/2)."""
    i, j = np.triu_indices(r)
    S = np.zeros((r * r, i.size))
    cols = np.arange(i.size)
    val = np.where(i == j, 1.0, np.sqrt(0.5))
    S[i * r + j, cols] = val
    S[j * r + i, cols] = val
    return S


class _T2Parts:
    """T_2 = I - eta L + eta^2 [(1 - kappa) Q_H + kappa Q_I] on symmetric r x r matrices.

    L(M) = H M + M H, Q_H(M) = H M H, Q_I(M) = mean_i (c_i^T M c_i) c_i c_i^T, as
    (m, m) matrices in the orthonormal basis ``S`` (m = r(r+1)/2); all symmetric,
    as T_2 is self-adjoint in the Frobenius product. With k outputs per sample (C of
    n k rows, sample-major) Q_I(M) = mean_i H_i M H_i, H_i = C_i^T C_i.
    """

    def __init__(self, C: np.ndarray, k: int = 1):
        n, r = C.shape[0] // k, C.shape[1]
        H = C.T @ C / n
        eye = np.eye(r)
        self.S = _sym_embedding(r)
        self.L = self.S.T @ (np.kron(H, eye) + np.kron(eye, H)) @ self.S
        self.QH = self.S.T @ np.kron(H, H) @ self.S
        if k == 1:
            K = np.einsum("ni,nj->nij", C, C).reshape(n, r * r)  # rows vec(c_i c_i^T)
            KS = K @ self.S
            self.QI = KS.T @ KS / n
        else:
            C3 = C.reshape(n, k, r)
            K = np.einsum("nci,ncj->nij", C3, C3).reshape(n, r * r)  # rows vec(H_i)
            # sum_i kron(H_i, H_i)[(a, c), (b, d)] = sum_i H_i[a, b] H_i[c, d]
            Q = (K.T @ K / n).reshape(r, r, r, r).transpose(0, 2, 1, 3).reshape(r * r, r * r)
            self.QI = self.S.T @ Q @ self.S

    def matrix(self, lr: float, kap: float) -> np.ndarray:
        Q = (1 - kap) * self.QH + kap * self.QI
        T = np.eye(self.L.shape[0]) - lr * self.L + lr**2 * Q
        return 0.5 * (T + T.T)

    def radius(self, lr: float, kap: float) -> float:
        ev = np.linalg.eigvalsh(self.matrix(lr, kap))
        return float(max(abs(ev[0]), abs(ev[-1])))


def _apply_t2(C: np.ndarray, M: np.ndarray, lr: float, kap: float, k: int = 1) -> np.ndarray:
    n = C.shape[0] // k
    H = C.T @ C / n
    if k == 1:
        q = np.einsum("ij,jk,ik->i", C, M, C)  # a_i^T M a_i
        S = (C.T * q) @ C / n
    else:  # mean_i C_i^T (C_i M C_i^T) C_i
        C3 = C.reshape(n, k, C.shape[1])
        P = np.einsum("icr,rs,ids->icd", C3, M, C3)
        S = np.einsum("icr,icd,ids->rs", C3, P, C3) / n
    return M - lr * (H @ M + M @ H) + lr**2 * ((1 - kap) * H @ M @ H + kap * S)


def _power_radius(C: np.ndarray, lr: float, kap: float, tol: float, max_iter: int,
                  k: int = 1):
    """Power iteration from the identity: (rho, unit eigenmatrix, iterations, converged)."""
    r = C.shape[1]
    M = np.eye(r) / np.sqrt(r)
    rho_old, conv, it, rho = np.inf, False, 0, 0.0
    for it in range(1, max_iter + 1):  # noqa: B007 - it is returned: the iterations run
        TM = _apply_t2(C, M, lr, kap, k)
        rho = float(np.sum(TM * M))  # Rayleigh quotient, ||M||_F = 1
        nrm = np.linalg.norm(TM)
        if not np.isfinite(nrm) or nrm == 0:
            rho, conv = (0.0, True) if nrm == 0 else (np.inf, False)
            break
        M = TM / nrm
        if (abs(rho - rho_old) <= tol * max(abs(rho), 1e-300)
                and abs(nrm - rho) <= np.sqrt(tol) * rho):
            conv = True
            break
        rho_old = rho
    return rho, 0.5 * (M + M.T), it, conv


@dataclass
class SecondMomentOperator:
    """The exact second-moment operator of linearised SGD on the range of H.

    T_2(M) = E_I (I - eta H_I) M (I - eta H_I)
    = M - eta (H M + M H) + eta^2 [(1 - kappa) H M H + kappa mean_i H_i M H_i],
    the expectation over batches taken exactly (the kappa identity), acting on
    symmetric r x r matrices in an orthonormal basis ``basis`` (D, r) of the
    span of the a_i (r = rank of H). On the null space of H linearised SGD
    does not move, which adds the eigenvalue 1 (``null_dim`` = D - r directions).

    T_2 preserves the cone of PSD matrices and is self-adjoint in the
    Frobenius product, so its spectral radius (``spectral_radius``, on the
    range; 0 when r = 0) is its top eigenvalue, with a PSD eigenmatrix
    (``eigenmatrix``, unit Frobenius norm). Linearised SGD's second moment
    stays bounded iff spectral_radius <= 1: the exact stability verdict.

    With k outputs per sample (a ``square_loss_from_jax`` model, ``outputs`` = k)
    mean_i H_i M H_i with H_i = J_i^T J_i, and ``coords`` holds the n k rows of the J_i
    in the range basis, sample-major; ``n`` counts samples.
    """

    lr: float
    batch: int
    replacement: bool
    kappa: float
    n: int
    dim: int
    basis: np.ndarray
    coords: np.ndarray
    spectral_radius: float
    eigenmatrix: np.ndarray
    iterations: int
    converged: bool
    method: str
    outputs: int = 1

    @property
    def null_dim(self) -> int:
        return self.dim - self.basis.shape[1]

    @property
    def rank(self) -> int:
        return self.basis.shape[1]

    def apply(self, M: np.ndarray) -> np.ndarray:
        """T_2(M) for symmetric M: (r, r) in the range basis, or (D, D) in full space."""
        M = np.asarray(M, dtype=np.float64)
        if M.shape == (self.rank, self.rank):
            return _apply_t2(self.coords, M, self.lr, self.kappa, self.outputs)
        if M.shape == (self.dim, self.dim):
            return _apply_t2(self.coords @ self.basis.T, M, self.lr, self.kappa, self.outputs)
        raise ValueError(f"M must be ({self.rank}, {self.rank}) or ({self.dim}, {self.dim}), "
                         f"got {M.shape}")

    def matrix(self) -> np.ndarray:
        """T_2 as an (r^2, r^2) matrix on row-major vec(M) (small r only)."""
        r = self.rank
        cols = [_apply_t2(self.coords, np.eye(r * r)[j].reshape(r, r), self.lr, self.kappa,
                          self.outputs).ravel() for j in range(r * r)]
        return np.array(cols).T

    def expected_square(self) -> np.ndarray:
        """E_I (I - eta H_I)^2 = (I - eta H)^2 + eta^2 kappa Sigma, (D, D) in full space."""
        A = self.coords @ self.basis.T
        n, eta = self.n, self.lr
        Sigma = _sigma(A, self.outputs)
        H = A.T @ A / n
        I = np.eye(self.dim)
        return (I - eta * H) @ (I - eta * H) + eta**2 * self.kappa * Sigma


def second_moment_operator(model, w, lr, batch, *, replacement: bool = False,
                           method: str = "auto", tol: float = 1e-12,
                           max_iter: int = 100_000, backend: str = "auto") -> SecondMomentOperator:
    """The exact T_2 of linearised SGD at w and its spectral radius.

    Parameters
    ----------
    model : LinearRegression, TwoLayerNet or BNLinearRegression
    w : array_like, shape (D,)
        The minimum (an interpolating point; elsewhere the Gauss-Newton linearisation).
    lr : float
        Learning rate eta > 0.
    batch : int
        Batch size B (<= n without replacement).
    replacement : bool
        Sampling scheme (default: without replacement).
    method : {"auto", "dense", "power"}
        "dense": all eigenvalues of T_2 on the r(r+1)/2 symmetric matrices
        (symmetric eigensolver, O(r^6)): exact to rounding, the choice up to
        r ~ 44. "power": power iteration on r x r matrices, O(n r^2) per step,
        with a Rayleigh-quotient stopping rule (relative change < tol); slow
        when T_2's top two eigenvalues are close. "auto": dense when
        r(r+1)/2 <= 1000, else power.
    tol, max_iter
        Power-iteration stopping rule and cap.
    backend : {"auto", "cpp"}
        Core only: the compiled core runs this call; other backends are refused
        with a message.

    Returns
    -------
    SecondMomentOperator
        ``.spectral_radius`` on the range of H, ``.apply``, ``.matrix``,
        ``.expected_square``.
    """
    _backend(model, backend, "second_moment_operator")
    A = _point(model, w)
    k = _outputs(model)
    n, D = A.shape[0] // k, A.shape[1]
    lr = _lr(lr)
    batch, replacement = _batch(batch, n, replacement)
    if method not in ("auto", "power", "dense"):
        raise ValueError(f"method must be 'auto', 'power' or 'dense', got {method!r}")
    tol = as_real(tol, "tol", minimum=0.0, strict=True)
    max_iter = as_positive_int(max_iter, "max_iter")
    C, Q = _range_basis(A)
    r = C.shape[1]
    if method == "auto":
        method = "dense" if r * (r + 1) // 2 <= _DENSE_MAX else "power"
    kap = kappa(n, batch, replacement)
    op = SecondMomentOperator(lr, batch, replacement, kap, n, D, Q, C,
                              0.0, np.zeros((r, r)), 0, True, method, k)
    if r == 0:
        return op
    if method == "dense":
        parts = _T2Parts(C, k)
        evals, evecs = np.linalg.eigh(parts.matrix(lr, kap))
        j = 0 if abs(evals[0]) > abs(evals[-1]) else -1
        M = (parts.S @ evecs[:, j]).reshape(r, r)
        M = 0.5 * (M + M.T) * (1 if np.trace(M) >= 0 else -1)
        op.spectral_radius, op.eigenmatrix = float(abs(evals[j])), M / np.linalg.norm(M)
        op.iterations, op.converged = 1, True
        return op
    rho, M, it, conv = _power_radius(C, lr, kap, tol, max_iter, k)
    op.spectral_radius, op.eigenmatrix, op.iterations, op.converged = rho, M, it, conv
    return op


def is_linearly_stable(model, w, lr, batch, *, replacement: bool = False, order: int = 2,
                       n_runs: int = 2048, steps: int = 300, seed: int = 0,
                       backend: str = "auto") -> bool:
    """Whether linearised SGD's order-k moment stays bounded at w.

    order = 2: exactly, spectral_radius(T_2) <= 1 (1 + 1e-9). Other orders:
    the Monte Carlo estimate of ``moment_growth`` (rate <= 1 within its
    confidence interval), with ``n_runs``, ``steps`` and ``seed``. Core only
    (``backend`` "auto" or "cpp").
    """
    _backend(model, backend, "is_linearly_stable")
    order = as_positive_int(order, "order")
    if order == 2:
        op = second_moment_operator(model, w, lr, batch, replacement=replacement)
        return bool(op.spectral_radius <= 1 + 1e-9)
    mg = moment_growth(model, w, lr, batch, order=order, replacement=replacement,
                       n_runs=n_runs, steps=steps, seed=seed)
    return bool(mg.ci[0] <= 1.0)


# ------------------------------------------------------------------- Monte Carlo
#: The batch sampler's stream (engine/sgd.hpp, kBatchStream), for the NumPy port below.
_BATCH_STREAM = np.uint64(0x5BD1E995)


def _mix64(x: np.ndarray) -> np.ndarray:
    """engine/rng.hpp's mix64 on uint64 arrays (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _batch_bits(seed: int, runs: np.ndarray, t: int, B: int) -> np.ndarray:
    """hash4(seed ^ kBatchStream, run, t, j) for every run and slot j: (runs, B) uint64."""
    base = _mix64(np.array([seed], dtype=np.uint64) ^ _BATCH_STREAM)
    h = _mix64(base ^ runs.astype(np.uint64))
    h = _mix64(h ^ np.uint64(t))
    return _mix64(h[:, None] ^ np.arange(B, dtype=np.uint64)[None, :])


def _uniform_index(bits: np.ndarray, m) -> np.ndarray:
    """engine/sgd.hpp's uniform_index: floor(u m), u in (0, 1) from the top 53 bits."""
    u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)
    k = (u * m).astype(np.int64)
    return np.minimum(k, np.asarray(m) - 1)


def _linear_sgd(C: np.ndarray, k: int, X: np.ndarray, lr: float, B: int, replacement: bool,
                seed: int, t0: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Linearised SGD x <- x - (lr/B) sum_{i in I_t} H_i x of runs X (R, r) for steps
    t0 .. t0 + steps - 1, renormalised every step: (unit states, log growth (R,)).

    k = 1: the compiled core's ``linear_sgd`` (rows c_i, H_i = c_i c_i^T). k > 1 (rows of
    the J_i, sample-major, H_i = C_i^T C_i): the same recurrence in NumPy over the same
    batches (a port of engine/sgd.hpp's draw_batch: run r's batch t keyed by (seed, r, t),
    the permutation of sampling without replacement reset at t0 as the core resets it).
    """
    if k == 1:
        return core().linear_sgd(C, X, lr, B, replacement, seed, 0, t0, steps)
    n, r = C.shape[0] // k, C.shape[1]
    C3 = C.reshape(n, k, r)
    R = X.shape[0]
    runs = np.arange(R)
    X = np.array(X, dtype=np.float64)
    nrm = np.linalg.norm(X, axis=1)
    logg = np.where(nrm > 0, -np.log(np.where(nrm > 0, nrm, 1.0)), -np.inf)
    dead = ~(nrm > 0)
    X = X / np.where(nrm > 0, nrm, 1.0)[:, None]
    perm = np.tile(np.arange(n), (R, 1))
    c = lr / B
    for t in range(t0, t0 + steps):
        bits = _batch_bits(seed, runs, t, B)
        if replacement:
            idx = _uniform_index(bits, n)
        else:
            idx = np.empty((R, B), dtype=np.int64)
            for j in range(B):
                pick = j + _uniform_index(bits[:, j], n - j)
                a, b = perm[runs, j].copy(), perm[runs, pick]
                perm[runs, j], perm[runs, pick] = b, a
                idx[:, j] = perm[:, j]
        Cb = C3[idx]  # (R, B, k, r)
        U = np.einsum("abkr,ar->abk", Cb, X)
        Y = X - c * np.einsum("abkr,abk->ar", Cb, U)
        nrm = np.linalg.norm(Y, axis=1)
        newly = ~dead & ~(nrm > 0)
        dead |= newly
        logg = np.where(dead, -np.inf, logg + np.log(np.where(nrm > 0, nrm, 1.0)))
        X = np.where(dead[:, None], X, Y / np.where(nrm > 0, nrm, 1.0)[:, None])
    return X, logg


@dataclass
class MomentGrowth:
    """Monte Carlo growth factor per step of E ||x_t||^k for linearised SGD.

    ``rate`` estimates lim (E ||x_t||^k)^(1/t); for k = 2 that is the
    spectral radius of T_2. ``ci`` a confidence interval (``level``) from
    batch means over the measured steps. ``log_moment`` (records,) the
    estimate of log E ||x_t||^k / ||x_0||^k at ``steps``. ``burn_in`` steps
    were skipped before measuring.
    """

    rate: float
    ci: tuple
    level: float
    order: int
    n_runs: int
    burn_in: int
    steps: np.ndarray
    log_moment: np.ndarray
    meta: dict = field(default_factory=dict)


def _log_mean_exp(x: np.ndarray) -> float:
    m = np.max(x)
    if not np.isfinite(m):
        return float(m)
    return float(m + np.log(np.mean(np.exp(x - m))))


def moment_growth(model, w, lr, batch, *, order: int = 2, replacement: bool = False,
                  n_runs: int = 2048, steps: int = 300, burn_in: int | None = None,
                  resample_every: int = 1, subspace: str = "range", level: float = 0.95,
                  seed: int = 0, backend: str = "auto") -> MomentGrowth:
    """Monte Carlo k-th moment growth rate of linearised SGD at w, batched in the core.

    Linearised SGD x_{t+1} = (I - eta H_{I_t}) x_t runs for ``n_runs``
    particles at once in the core (counter-based batches: any thread count
    gives the same bits). A plain average of ||x_t||^k over independent runs
    is carried by ever rarer runs as t grows (the products are log-normal
    like), so it underestimates fast growth; instead, every
    ``resample_every`` steps the particles are reweighted by their growth
    ||x_{t+s}||^k / ||x_t||^k and resampled in proportion (a Feynman-Kac
    particle system, the standard estimator of moment Lyapunov exponents).
    The mean weight of each round estimates that round's growth of
    E ||x_t||^k; for k = 2 the rate converges to T_2's spectral radius.

    Parameters
    ----------
    model, w, lr, batch, replacement
        As in ``second_moment_operator``.
    order : int
        k >= 1.
    n_runs, steps : int
        Particles and steps.
    burn_in : int, optional
        Steps before measuring (default steps // 4), for the transient from x_0 ~ N(0, I).
    resample_every : int
        Steps between resampling rounds.
    subspace : {"range", "full"}
        "range" (default) runs in the span of the a_i, where the k = 2 rate is
        T_2's spectral radius; "full" runs in R^D, where the null space of H
        keeps ||x_t|| from decaying (rate -> max(1, ...)).
    level : float
        Confidence level in (0, 1).
    seed : int
        Key of the batches and of the resampling.
    backend : {"auto", "cpp"}
        Core only: the compiled core runs this call; other backends are refused
        with a message.

    Returns
    -------
    MomentGrowth
    """
    _backend(model, backend, "moment_growth")
    A = _point(model, w)
    k_out = _outputs(model)
    n = A.shape[0] // k_out
    lr = _lr(lr)
    batch, replacement = _batch(batch, n, replacement)
    order = as_positive_int(order, "order")
    n_runs = as_positive_int(n_runs, "n_runs", minimum=2)
    steps = as_positive_int(steps, "steps")
    s = as_positive_int(resample_every, "resample_every")
    burn_in = steps // 4 if burn_in is None else as_positive_int(burn_in, "burn_in", minimum=0)
    if burn_in + 2 * s > steps:
        raise ValueError(f"burn_in must leave at least two resampling rounds before steps = "
                         f"{steps}, got burn_in = {burn_in}")
    if subspace not in ("range", "full"):
        raise ValueError(f"subspace must be 'range' or 'full', got {subspace!r}")
    level = as_real(level, "level", minimum=0.0, strict=True)
    if level >= 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    seed = as_positive_int(seed, "seed", minimum=0)
    C = np.ascontiguousarray(_range_basis(A)[0] if subspace == "range" else A)
    if C.shape[1] == 0:
        return MomentGrowth(0.0, (0.0, 0.0), level, order, n_runs, burn_in,
                            np.array([0, steps]), np.array([0.0, -np.inf]))
    rng = np.random.default_rng([seed, 0x5A3])
    X = rng.standard_normal((n_runs, C.shape[1]))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    t, rec, logm, rounds = 0, [0], [0.0], []
    while t < steps:
        h = min(s, steps - t)
        X, g = _linear_sgd(C, k_out, X, lr, batch, replacement, seed, t, h)
        logw = order * g
        lm = _log_mean_exp(logw)
        t += h
        rec.append(t)
        logm.append(logm[-1] + lm)
        if t - h >= burn_in:
            rounds.append((lm, h))
        if not np.isfinite(lm):  # every particle collapsed to 0 (or overflowed)
            break
        p = np.exp(logw - np.max(logw))
        c = np.cumsum(p)
        idx = np.searchsorted(c, (rng.random() + np.arange(n_runs)) / n_runs * c[-1], side="right")
        X = X[np.minimum(idx, n_runs - 1)]
    lms = np.array([r[0] for r in rounds])
    hs = np.array([r[1] for r in rounds], dtype=float)
    if lms.size == 0 or not np.all(np.isfinite(lms)):
        rate = 0.0 if lms.size and np.any(lms == -np.inf) else np.nan
        return MomentGrowth(rate, (rate, rate), level, order, n_runs, burn_in, np.array(rec),
                            np.array(logm), {"subspace": subspace, "dim": int(C.shape[1])})
    log_rate = lms.sum() / hs.sum()
    # Batch means over consecutive rounds for the interval (rounds are correlated).
    nb = int(min(20, max(2, lms.size // 5)))
    blocks = np.array_split(np.arange(lms.size), nb)
    means = np.array([lms[b].sum() / hs[b].sum() for b in blocks])
    from scipy.stats import t as student_t

    half = student_t.ppf((1 + level) / 2, nb - 1) * means.std(ddof=1) / np.sqrt(nb)
    return MomentGrowth(float(np.exp(log_rate)),
                        (float(np.exp(log_rate - half)), float(np.exp(log_rate + half))),
                        level, order, n_runs, burn_in, np.array(rec), np.array(logm),
                        {"subspace": subspace, "dim": int(C.shape[1]), "blocks": nb,
                         "resample_every": s})


@dataclass
class LyapunovExponent:
    """Almost-sure growth rate per step of linearised SGD: the top Lyapunov exponent.

    ``exponent`` estimates gamma = lim (1/t) log ||x_t|| (natural log, per step), which
    holds for almost every run and almost every start in the range of H
    (Furstenberg-Kesten); gamma < 0: almost every run of linearised SGD converges
    to the minimum, gamma > 0: almost every run leaves it. ``stderr`` its standard
    error over the ``runs`` independent runs (each run's own estimate ``per_run``,
    (runs,), over the ``steps`` - ``burn_in`` measured steps). ``moment_bound`` is
    log(rho(T_2)) / 2, which gamma never exceeds (Jensen: E log ||x|| <= log E ||x||^2 / 2);
    the two notions differ exactly when gamma < 0 < moment_bound: the second moment
    grows, carried by ever rarer runs, while almost every run converges. ``dim`` the
    rank of H (the range the runs live in); ``seed`` the key of the batches.
    """

    exponent: float
    stderr: float
    moment_bound: float
    runs: int
    steps: int
    burn_in: int
    dim: int
    seed: int
    per_run: np.ndarray = field(repr=False)

    @property
    def converges(self) -> bool:
        """Whether almost every run converges: exponent + 3 stderr < 0."""
        return bool(self.exponent + 3 * self.stderr < 0)


def lyapunov_exponent(model, w, lr, batch, *, replacement: bool = False, runs: int = 32,
                      steps: int = 20_000, burn_in: int | None = None, seed: int = 0,
                      backend: str = "auto") -> LyapunovExponent:
    """Top Lyapunov exponent of linearised SGD at w: the almost-sure notion of stability.

    The product of random matrices (I - eta H_{I_t}) ... (I - eta H_{I_1}) applied to a
    random unit start in the span of the a_i, renormalised at every step (in the core,
    batches keyed by (seed, run, step): any thread count gives the same bits); the sum of
    the logarithms of the renormalisations over the measured steps, divided by their
    number, is each run's estimate, and their mean over ``runs`` independent runs the
    exponent, with the standard error of that mean.

    Second-moment stability (rho(T_2) <= 1, ``second_moment_operator``) implies
    gamma <= 0, not conversely: a minimum can have rho(T_2) > 1 while almost every run
    of linearised SGD converges to it (docs/theory.rst, "SGD linear stability").

    Parameters
    ----------
    model, w, lr, batch, replacement
        As in ``second_moment_operator``.
    runs : int
        Independent runs (>= 2), for the standard error.
    steps : int
        Steps per run, ``burn_in`` included.
    burn_in : int, optional
        Steps skipped before measuring, while the direction forgets the start
        (default steps // 10).
    seed : int
        Key of the batches and of the starts.
    backend : {"auto", "cpp"}
        Core only.

    Returns
    -------
    LyapunovExponent
        ``exponent`` per step with ``stderr``; ``moment_bound`` = log(rho(T_2)) / 2.
        Where H = 0 (rank 0) nothing moves and the exponent is -inf; a run that
        lands exactly on 0 (e.g. B = n, eta = 1/a for a rank-one H) makes it -inf too.
    """
    _backend(model, backend, "lyapunov_exponent")
    A = _point(model, w)
    k_out = _outputs(model)
    n = A.shape[0] // k_out
    lr = _lr(lr)
    batch, replacement = _batch(batch, n, replacement)
    runs = as_positive_int(runs, "runs", minimum=2)
    steps = as_positive_int(steps, "steps", minimum=2)
    burn_in = steps // 10 if burn_in is None else as_positive_int(burn_in, "burn_in", minimum=0)
    if burn_in >= steps:
        raise ValueError(f"burn_in must be < steps = {steps}, got {burn_in}")
    seed = as_positive_int(seed, "seed", minimum=0)
    C = np.ascontiguousarray(_range_basis(A)[0])
    r = C.shape[1]
    op = second_moment_operator(model, w, lr, batch, replacement=replacement)
    bound = float(np.log(op.spectral_radius)) / 2 if op.spectral_radius > 0 else -np.inf
    if r == 0:
        return LyapunovExponent(-np.inf, 0.0, bound, runs, steps, burn_in, 0, seed,
                                np.full(runs, -np.inf))
    X = np.random.default_rng([seed, 0x1A9]).standard_normal((runs, r))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    if burn_in:
        X, _ = _linear_sgd(C, k_out, X, lr, batch, replacement, seed, 0, burn_in)
    _, logg = _linear_sgd(C, k_out, X, lr, batch, replacement, seed, burn_in, steps - burn_in)
    per_run = np.asarray(logg, dtype=np.float64) / (steps - burn_in)
    if not np.all(np.isfinite(per_run)):
        return LyapunovExponent(float(np.min(per_run)), 0.0, bound, runs, steps, burn_in, r,
                                seed, per_run)
    return LyapunovExponent(float(per_run.mean()), float(per_run.std(ddof=1) / np.sqrt(runs)),
                            bound, runs, steps, burn_in, r, seed, per_run)


# ------------------------------------------------- verdict, conditions, critical lr
def _sigma(C: np.ndarray, k: int = 1) -> np.ndarray:
    """Sigma = mean_i H_i^2 - H^2 from the Jacobian rows C (n k, r), sample-major."""
    n = C.shape[0] // k
    H = C.T @ C / n
    if k == 1:
        sq = np.einsum("ij,ij->i", C, C)
        return (C.T * sq) @ C / n - H @ H
    return C.T @ _block_apply(_blocks(C, k), C) / n - H @ H


def _expected_square_top(C: np.ndarray, lr: float, kap: float, k: int = 1) -> float:
    """lambda_max((I - eta H)^2 + eta^2 kappa Sigma) on the range of H (0 when r = 0)."""
    n, r = C.shape[0] // k, C.shape[1]
    if r == 0:
        return 0.0
    H = C.T @ C / n
    Sigma = _sigma(C, k)
    P = np.eye(r) - lr * H
    return float(np.linalg.eigvalsh(P @ P + lr**2 * kap * Sigma)[-1])


@dataclass
class StabilityConditions:
    """The linear-stability verdict at a minimum, and the conditions around it.

    ``stable``: spectral_radius(T_2) <= 1, the exact criterion (``spectral_radius``,
    on the range of H). Around it, each named for what it is:

    - ``sufficient``: ``vector_criterion`` = lambda_max((I - eta H)^2 +
      eta^2 kappa Sigma) (on the range of H) <= 1. Implies ``stable``.
    - ``sharpness_ok``: a <= ``sharpness_bound`` = 2/eta. Necessary for ``stable``.
    - ``nonuniformity_ok``: s <= ``nonuniformity_bound`` = 1/(eta sqrt(kappa))
      (inf for kappa = 0). With ``sharpness_ok`` it forms Wu et al.'s pair
      (``wu_pair``), necessary for ``sufficient`` but NOT for ``stable``: a
      minimum with spectral_radius < 1 can violate it.

    So sufficient => stable => sharpness_ok, and sufficient => wu_pair. When
    D = 1 (all a_i parallel) sufficient == stable, and the pair is necessary
    but still not sufficient.
    """

    lr: float
    batch: int
    kappa: float
    sharpness: float
    nonuniformity: float
    sharpness_bound: float
    nonuniformity_bound: float
    spectral_radius: float
    vector_criterion: float
    stable: bool
    sufficient: bool
    sharpness_ok: bool
    nonuniformity_ok: bool

    @property
    def wu_pair(self) -> bool:
        """Wu et al.'s pair a <= 2/eta, s <= 1/(eta sqrt(kappa)): necessary for ``sufficient``
        only."""
        return self.sharpness_ok and self.nonuniformity_ok


def stability_conditions(model, w, lr, batch, *, replacement: bool = False,
                         quantities: StabilityQuantities | None = None,
                         rtol: float = 1e-9, backend: str = "auto") -> StabilityConditions:
    """The exact stability verdict rho(T_2) <= 1 at a single point w, and its conditions.

    Parameters
    ----------
    model : LinearRegression, TwoLayerNet or BNLinearRegression
    w : array_like, shape (D,)
    lr : float
        Learning rate eta > 0.
    batch : int
        Batch size B.
    replacement : bool
        Sampling scheme (default: without replacement).
    quantities : StabilityQuantities, optional
        A ``sharpness_nonuniformity`` result at w, to reuse.
    rtol : float
        Slack of every comparison (rounding of the eigenvalues): x <= bound (1 + rtol).
    backend : {"auto", "cpp"}
        Core only: the compiled core runs this call; other backends are refused
        with a message.

    Returns
    -------
    StabilityConditions
        ``stable`` rests on ``second_moment_operator`` (dense T_2 up to rank 44).
    """
    _backend(model, backend, "stability_conditions")
    lr = _lr(lr)
    batch, replacement = _batch(batch, model.n, replacement)
    rtol = as_real(rtol, "rtol", minimum=0.0)
    q = quantities if quantities is not None else sharpness_nonuniformity(model, w)
    if np.ndim(q.sharpness) != 0:
        raise ValueError("stability_conditions takes a single point w")
    op = second_moment_operator(model, w, lr, batch, replacement=replacement)
    k = op.kappa
    a_max = 2.0 / lr
    s_max = np.inf if k == 0 else float(1.0 / (lr * np.sqrt(k)))
    vec = _expected_square_top(op.coords, lr, k, op.outputs)
    return StabilityConditions(lr, batch, k, q.sharpness, q.nonuniformity, a_max, s_max,
                               op.spectral_radius, vec,
                               bool(op.spectral_radius <= 1 + rtol), bool(vec <= 1 + rtol),
                               bool(q.sharpness <= a_max * (1 + rtol)),
                               bool(q.nonuniformity <= s_max * (1 + rtol)))


def critical_lr(model, w, batch, *, replacement: bool = False, criterion: str = "exact",
                xtol: float = 1e-12, backend: str = "auto"):
    """The largest learning rate at which the minimum w is linearly stable, per batch size.

    "exact": the eta with spectral_radius(T_2) = 1, found by root finding
    (Brent's method). rho(T_2) is convex in eta (the top eigenvalue of
    I - eta L + eta^2 Q, Q PSD), equals 1 at eta = 0 and decreases from there,
    so {eta : rho(T_2) <= 1} = (0, eta*] and the root is unique; eta* <= 2/a.
    "sufficient": the eta with lambda_max((I - eta H)^2 + eta^2 kappa Sigma) = 1
    on the range of H (convex in eta likewise), a lower bound of the exact one.

    Parameters
    ----------
    model : LinearRegression, TwoLayerNet or BNLinearRegression
    w : array_like, shape (D,)
    batch : int or array_like of int, shape (K,)
        Batch size(s) B.
    replacement : bool
        Sampling scheme (default: without replacement).
    criterion : {"exact", "sufficient"}
    xtol : float
        Relative tolerance of the root.
    backend : {"auto", "cpp"}
        Core only: the compiled core runs this call; other backends are refused
        with a message.

    Returns
    -------
    float or ndarray, shape (K,)
        eta*, one per batch size; inf where H = 0. B = n without replacement
        (kappa = 0) gives 2/a.
    """
    _backend(model, backend, "critical_lr")
    A = _point(model, w)
    k_out = _outputs(model)
    n = A.shape[0] // k_out
    if criterion not in ("exact", "sufficient"):
        raise ValueError(f"criterion must be 'exact' or 'sufficient', got {criterion!r}")
    xtol = as_real(xtol, "xtol", minimum=0.0, strict=True)
    single = np.ndim(batch) == 0
    batches = [_batch(b, n, replacement)[0] for b in np.atleast_1d(batch).tolist()]
    C = _range_basis(A)[0]
    r = C.shape[1]
    out = np.full(len(batches), np.inf)
    if r > 0:
        from scipy.optimize import brentq

        hi = 2.0 * n / np.linalg.svd(C, compute_uv=False)[0] ** 2  # 2 / a
        parts = (_T2Parts(C, k_out) if criterion == "exact" and r * (r + 1) // 2 <= _DENSE_MAX
                 else None)
        for j, B in enumerate(batches):
            kap = kappa(n, B, replacement)
            if criterion == "sufficient":
                def f(lr, kap=kap):
                    return _expected_square_top(C, lr, kap, k_out) - 1.0
            elif parts is not None:
                def f(lr, kap=kap):
                    return parts.radius(lr, kap) - 1.0
            else:
                def f(lr, kap=kap):
                    return _power_radius(C, lr, kap, 1e-14, 1_000_000, k_out)[0] - 1.0
            if f(hi) <= 0:  # the root is 2/a itself (kappa = 0)
                out[j] = hi
                continue
            lo = 0.5 * hi
            while f(lo) >= 0:  # below eta* rho < 1 (convexity); halve until there
                lo *= 0.5
                if lo < 1e-12 * hi:
                    raise RuntimeError("critical_lr: no stable learning rate found above "
                                       f"{lo:.3e} (H nearly singular on its range?)")
            out[j] = brentq(f, lo, hi, xtol=xtol * lo, rtol=max(xtol, 4 * np.finfo(float).eps))
    return float(out[0]) if single else out


def stability_boundary(lr: float, batch: int, n: int, *, replacement: bool = False,
                       points: int = 200) -> dict:
    """The sufficient criterion's closed-form curve in the (a, s) plane, for plotting.

    Returns the curve (1 - eta a)^2 + eta^2 kappa s^2 = 1 (``a``, ``s`` arrays):
    the vector criterion lambda_max((I - eta H)^2 + eta^2 kappa Sigma) <= 1
    evaluated along one direction shared by the top eigenvectors of H and Sigma.
    It is NOT the exact stability boundary (rho(T_2) = 1 depends on more than
    a and s: for a_i = (2, 0), (0.5, +-1), B = 1 the curve gives eta = 0.5414,
    the exact critical eta is 0.5565; use ``critical_lr``); it is exact when
    D = 1 (all a_i parallel). Also returns ``a_max`` = 2/eta (a <= a_max is necessary for
    stability) and ``s_max`` = 1/(eta sqrt(kappa)) (s <= s_max is necessary for
    the sufficient criterion only), and ``kappa``.
    """
    lr = _lr(lr)
    n = as_positive_int(n, "n")
    points = as_positive_int(points, "points", minimum=2)
    k = kappa(n, batch, replacement)
    a = np.linspace(0.0, 2.0 / lr, points)
    s = (np.sqrt(np.clip(1 - (1 - lr * a) ** 2, 0, None) / k) / lr if k > 0
         else np.full(points, np.inf))
    return {"a_max": 2.0 / lr, "s_max": np.inf if k == 0 else np.sqrt(1 / k) / lr, "kappa": k,
            "a": a, "s": s, "criterion": "sufficient, one direction"}


def gradient_moment_ratio(model, w, lr, batch, *, k: int = 1, backend: str = "auto") -> np.ndarray:
    """Ma & Ying's moment bound at a minimum, as a ratio (<= 1 where it holds).

    (1/n) sum_i ||a_i||_{2k}^{2k} / (2 D (2B)^(k-1) / eta^k), with ||.||_{2k}
    the vector 2k-norm and D the number of parameters (Ma & Ying, Theorem 2:
    it holds at minima linearly stable of order k). k = 1 is vacuous beside
    a <= 2/eta: its ratio is eta tr(H) / (2D) <= eta a / 2; k >= 2 bound the
    higher moments, the paper's contribution. w (D,) or (B, D): returns a
    float or a (B,) array. Core only (``backend`` "auto" or "cpp").

    For a ``square_loss_from_jax`` model with k_out outputs the moment is entrywise over
    the Jacobian, (1/n) sum_i sum_{c, d} J_i[c, d]^(2k), computed over chunks of samples
    (any n). For k = 1 that is tr(H) and the bound still follows from a <= 2/eta
    (tr(H) <= D a); Ma & Ying prove the k >= 2 bounds for scalar outputs only.
    """
    _backend(model, backend, "gradient_moment_ratio")
    lr = _lr(lr)
    k = as_positive_int(k, "k")
    batch = as_positive_int(batch, "batch")
    if model.jacobians_by == "xla":  # over chunks of samples, any n
        W, single = as_batch(w, model.dim, "w", dtype=np.float64)
        moment = np.array([model.jacobian_moment(x, k) for x in W])
        moment = moment[0] if single else moment
    else:
        A = per_sample_gradients(model, w)
        moment = np.mean(np.sum(A ** (2 * k), axis=-1), axis=-1)
    bound = 2.0 * model.dim * (2.0 * batch) ** (k - 1) / lr**k
    ratio = moment / bound
    return float(ratio) if np.ndim(ratio) == 0 else ratio


# ------------------------------------------------------------------ input smoothness
@dataclass
class InputSmoothness:
    """g_W = [(1/n) sum_i ||grad_W f(x_i)||_{2k}^{2k}]^(1/2k) and g_x likewise with grad_x f.

    Floats for one point, (B,) arrays for a batch. For first-layer models,
    per sample (…, n): ``grad_x_norm`` ||grad_x f(x_i)||_2, ``bound``
    ||W1||_2 ||grad_W1 f(x_i)||_F / ||x_i|| and ``holds`` grad_x_norm <= bound
    (Ma & Ying, Proposition 2); None for BNLinearRegression and for a model without a
    first layer (a loaded square-loss model).
    """

    g_W: np.ndarray
    g_x: np.ndarray
    k: int
    grad_x_norm: np.ndarray | None
    bound: np.ndarray | None
    holds: np.ndarray | None

    @property
    def all_hold(self) -> bool | None:
        return None if self.holds is None else bool(np.all(self.holds))


def input_smoothness(model, w, X=None, *, k: int = 1, backend: str = "auto") -> InputSmoothness:
    """g_W, g_x and the multiplicative-structure check at w on inputs X.

    Parameters
    ----------
    model : SquareLossModel, BNLinearRegression or square_loss_from_jax model
        A model without a first layer (``has_first_layer`` False: a loaded
        square-loss model, a JAX network) gets the moments without the bound. For a
        JAX network with k outputs the moments are entrywise over the Jacobians
        J_i (k, D) and d f / dx (k, ``*x.shape``), computed over chunks of samples.
    w : array_like, shape (D,) or (B, D)
    X : array_like, shape (N, d), optional
        Inputs to evaluate on (default: the training inputs). For
        BNLinearRegression only the training inputs (its statistics are theirs).
    k : int
        Moment order: the 2k-norms and 1/2k root of the definitions.
    backend : {"auto", "cpp"}
        Core only: the compiled core runs this call; other backends are refused
        with a message.

    Returns
    -------
    InputSmoothness
    """
    _backend(model, backend, "input_smoothness")
    k = as_positive_int(k, "k")
    W, single = as_batch(w, model.dim, "w", dtype=np.float64)
    lhs = rhs = holds = None  # the first-layer bound, for models with a first layer
    if model.jacobians_by == "xla":
        m = model if X is None else model.with_data(X)
        g_W = np.array([m.jacobian_moment(x, k) for x in W]) ** (1 / (2 * k))
        g_x = np.array([m.input_moment(x, k) for x in W]) ** (1 / (2 * k))
        if single:
            return InputSmoothness(float(g_W[0]), float(g_x[0]), k, None, None, None)
        return InputSmoothness(g_W, g_x, k, None, None, None)
    if isinstance(model, BNLinearRegression):
        if X is not None:
            raise ValueError("X: BNLinearRegression evaluates on its training inputs only")
        _, A, GX = model.per_sample_jacobians(W)
    else:
        if X is not None:
            X = as_float_array(X, "X", np.float64)
            if X.ndim != 2 or X.shape[1] != model.input_dim or X.shape[0] < 1:
                raise ValueError(f"X must have shape (N, {model.input_dim}), got {X.shape}")
            m = model.with_data(X)
        else:
            m, X = model, model.X
        _, A, GX = m.jacobians(W)
        if model.has_first_layer:
            W1, sl = m.first_layer(W)
            w1_norm = np.linalg.norm(W1, ord=2, axis=(-2, -1))  # (B,)
            x_norm = np.linalg.norm(X, axis=1)  # (N,)
            lhs = np.linalg.norm(GX, axis=-1)
            g1 = np.linalg.norm(A[..., sl], axis=-1)
            with np.errstate(divide="ignore", invalid="ignore"):
                rhs = w1_norm[:, None] * g1 / x_norm[None, :]
            rhs = np.where(x_norm[None, :] > 0, rhs, np.inf)
            holds = lhs <= rhs * (1 + 1e-10) + 1e-300
    g_W = np.mean(np.sum(A ** (2 * k), axis=-1), axis=-1) ** (1 / (2 * k))
    g_x = np.mean(np.sum(GX ** (2 * k), axis=-1), axis=-1) ** (1 / (2 * k))
    if single:
        return InputSmoothness(float(g_W[0]), float(g_x[0]), k,
                               None if lhs is None else lhs[0], None if rhs is None else rhs[0],
                               None if holds is None else holds[0])
    return InputSmoothness(g_W, g_x, k, lhs, rhs, holds)

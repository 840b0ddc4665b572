"""Hessian spectra on exact HVPs: full spectra, traces, spectral densities, loss slices.

Every function takes one point (D,) or a batch (B, D) and computes in float64.
By default the Hessian of a scale-invariant model is the spherical one,
H(w / ||w||) = ||w||^2 H(w) (docs/theory.rst, "Scale invariance"), so results depend on the
direction of w only; ``spherical=False`` gives H(w) itself. Square-loss models
(:class:`pysharp.LinearRegression`, :class:`pysharp.TwoLayerNet`) have no sphere:
their Hessian is H(w). ``weight_decay=lam`` adds lam I, the Hessian of the
training objective L + (lam / 2) ||.||^2, at the point analysed.

The random estimators (``hessian_trace``, ``spectral_density``) draw Rademacher
probes from the counter-based RNG keyed by (seed, probe, entry): probe p is the
same vector at every point of a batch, so a point's result does not depend on
the batch it is in, and differences between points (along a trajectory, say)
carry no independent probe noise.

Which function to use:

- ``hessian_spectrum``: every eigenvalue (and eigenvector), exact, from the dense
  Hessian (D HVPs a point). Small D (up to a few thousand).
- ``hessian_trace``: tr H with a standard error. Exact when D <= n_probes,
  else Hutch++ on the exact HVP.
- ``spectral_density``: stochastic Lanczos quadrature (SLQ), the whole density
  from n_probes x steps HVPs a point; with steps >= D it is exact up to the
  probes' weights.
- ``loss_slice``: the loss on a 1-D or 2-D grid through w, for pictures.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._backends import resolve
from ._engine.loader import core
from ._engine.validation import as_batch, as_float_array, as_positive_int, as_real
from .models import ScaleInvariantModel, SquareLossModel
from .sharpness import spherical_sharpness

__all__ = ["Spectrum", "TraceEstimate", "SpectralDensity", "LossSlice", "hessian_spectrum",
           "hessian_trace", "spectral_density", "loss_slice", "rademacher"]

# Streams of the counter-based RNG (csrc/include/pysharp/engine/rng.hpp), one per
# kind of probe. _SLQ_STREAM is kSlqStream of engine/slq.hpp.
_SLQ_STREAM = 0x534C51  # "SLQ"
_HUTCH_STREAM = 0x485554  # "HUT": plain Hutchinson probes
_SKETCH_STREAM = 0x485053  # "HPS": Hutch++ range sketch
_RESID_STREAM = 0x485052  # "HPR": Hutch++ residual probes
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


# -- results --------------------------------------------------------------------
@dataclass
class Spectrum:
    """Every eigenvalue of the Hessian at each point.

    ``eigenvalues`` (B, D) descending; ``eigenvectors`` (B, D, D) with row i the
    unit eigenvector of eigenvalue i (sign: largest-magnitude entry positive),
    or None when not requested. Leading B dropped for a single point.
    """

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray | None


@dataclass
class TraceEstimate:
    """tr H per point: ``estimate`` (B,), ``stderr`` (B,) (0 when exact),
    ``method`` ("exact", "hutchinson" or "hutch++"), ``matvecs`` (HVPs a point)."""

    estimate: np.ndarray
    stderr: np.ndarray
    method: str
    matvecs: int


@dataclass
class SpectralDensity:
    """Stochastic Lanczos quadrature of the spectral density (1/D) sum_i delta(t - lambda_i).

    ``grid`` (G,); ``density`` (B, G), the Gaussian-broadened quadrature
    (1/P) sum_p sum_j weights[p, j] N(t; nodes[p, j], sigma^2), which integrates
    to 1 (up to the mass outside a user grid). ``nodes`` and ``weights``
    (B, P, steps): per probe the Gauss quadrature, nodes ascending, weights
    summing to 1; a probe whose Krylov space closed after k < steps Lanczos steps
    (``count`` (B, P) = k; its quadrature is then exact) repeats its largest node
    with weight 0 in the remaining slots. ``sigma`` the broadening.
    For any polynomial f of degree < 2 count, (1/P) sum_p sum_j weights f(nodes)
    is the unbiased estimate (1/P) sum_p z_p^T f(H) z_p / D of tr f(H) / D.
    """

    grid: np.ndarray
    density: np.ndarray
    nodes: np.ndarray
    weights: np.ndarray
    count: np.ndarray
    sigma: float

    def moments(self, order: int) -> np.ndarray:
        """Quadrature estimates of tr(H^j) / D for j = 0..order, shape (B, order + 1)."""
        order = as_positive_int(order, "order", minimum=0)
        powers = self.nodes[..., None] ** np.arange(order + 1)
        return np.einsum("...pj,...pjk->...k", self.weights, powers) / self.nodes.shape[-2]


@dataclass
class LossSlice:
    """The loss on the grid w + a u (+ b v).

    ``a`` (A,) and ``b`` (Bg,) or None the coordinates; ``loss`` (A,) or (A, Bg);
    ``directions`` (1 or 2, D) the rows u (and v).
    """

    a: np.ndarray
    b: np.ndarray | None
    loss: np.ndarray
    directions: np.ndarray


# -- probes ---------------------------------------------------------------------
def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on uint64 arrays (wrapping arithmetic), as rng.hpp."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def rademacher(seed: int, n: int, dim: int, *, stream: int = _SLQ_STREAM,
               first: int = 0) -> np.ndarray:
    """Rademacher probes of the counter-based RNG, shape (n, dim), entries +-1.

    Row r is probe ``first + r`` of ``stream``: entry i is +1 when the top bit of
    hash4(seed, stream, probe, i) is set (``rademacher`` in engine/slq.hpp), so
    the default stream gives exactly the probes of :func:`spectral_density`.
    """
    seed = _as_seed(seed)
    n = as_positive_int(n, "n", minimum=0)
    dim = as_positive_int(dim, "dim")
    key = _mix64(_mix64(np.full(1, seed, np.uint64)) ^ np.uint64(stream))
    counter = np.arange(first, first + n, dtype=np.uint64)[:, None]
    index = np.arange(dim, dtype=np.uint64)[None, :]
    bits = _mix64(_mix64(key ^ counter) ^ index)
    return np.where(bits >> np.uint64(63), 1.0, -1.0)


# -- shared validation ----------------------------------------------------------
def _as_seed(seed) -> int:
    seed = as_positive_int(seed, "seed", minimum=0)
    if seed > int(_M64):
        raise ValueError(f"seed must be < 2**64, got {seed}")
    return seed


def _check_model(model) -> None:
    if not isinstance(model, (ScaleInvariantModel, SquareLossModel)):
        raise TypeError(f"model must be a pysharp model, got {type(model).__name__}")


def _spherical(model, spherical) -> bool:
    invariant = isinstance(model, ScaleInvariantModel)
    if spherical is None:
        return invariant
    if not isinstance(spherical, (bool, np.bool_)):
        raise TypeError(f"spherical must be True, False or None, got {type(spherical).__name__}")
    if spherical and not invariant:
        raise ValueError(f"spherical=True needs a scale-invariant model; {type(model).__name__} "
                         "is not defined up to scale: pass spherical=False")
    return bool(spherical)


def _points(model, w, spherical: bool) -> tuple[np.ndarray, np.ndarray, bool]:
    """Validated float64 points the kernels run at, the factor (B,) that turns
    their Hessian into the one asked for, and whether w was a single point."""
    if isinstance(model, ScaleInvariantModel):
        W, single = model._batch(w)
        Ws, e = model._unit_scale(W.astype(np.float64))
        # H(w) = 2^(-2e) H(Ws); H(w/||w||) = ||Ws||^2 H(Ws).
        factor = np.einsum("bi,bi->b", Ws, Ws) if spherical else np.ldexp(1.0, -2 * e)
        return Ws, factor, single
    W, single = as_batch(w, model.dim, "w", dtype=np.float64)
    return W, np.ones(W.shape[0]), single


def _hvp(model, W: np.ndarray, V: np.ndarray, backend: str) -> np.ndarray:
    """H(W[b]) V[b] for rows b, one kernel call. W comes from ``_points`` (validated,
    rescaled) and V are probes of entries O(1): the model's checks and rescaling
    are skipped."""
    W, V = np.ascontiguousarray(W), np.ascontiguousarray(V, dtype=np.float64)
    if isinstance(model, ScaleInvariantModel):
        out, ok = model._core(np.float64, backend).hvp(W, V)
        model._checked(ok)
        return np.asarray(out, dtype=np.float64)
    return np.asarray(model._core(np.float64).hvp(W, V)[0], dtype=np.float64)


def _backend(model, backend: str, w) -> str:
    if isinstance(model, ScaleInvariantModel):
        return resolve(backend, w, model=model)
    if backend not in ("auto", "cpp"):
        raise ValueError(f"backend must be 'auto' or 'cpp' for {type(model).__name__}, "
                         f"got {backend!r}")
    core()  # a clear ImportError when the extension is missing
    return "cpp"


def _drop(x, single: bool):
    return x[0] if single and x is not None else x


# -- exact spectrum -------------------------------------------------------------
def hessian_spectrum(model, w, *, spherical: bool | None = None, eigenvectors: bool = False,
                     weight_decay: float = 0.0, backend: str = "auto") -> Spectrum:
    """Every eigenvalue of the Hessian, exact: dense Hessian from D HVPs, batched eigh.

    Parameters
    ----------
    model : ScaleInvariantModel or SquareLossModel
    w : array_like, shape (D,) or (B, D)
    spherical : bool, optional
        True (the default for scale-invariant models): H(w / ||w||).
        False (the default, and only choice, for square-loss models): H(w).
    eigenvectors : bool
        Also return the unit eigenvectors (B, D, D memory).
    weight_decay : float
        lam >= 0 added to every eigenvalue (the Hessian of L + lam/2 ||.||^2).
    backend : str
        Kernel backend of a scale-invariant model (see :func:`pysharp.backends`).

    Returns
    -------
    Spectrum
        eigenvalues (B, D) descending (largest algebraic first), eigenvectors
        (B, D, D) rows or None; (D,) and (D, D) for a single point.

    Notes
    -----
    Costs D HVPs, D^2 memory and an O(D^3) eigh per point. For large D use
    :func:`pysharp.spherical_sharpness` (top-k by Lanczos) or
    :func:`spectral_density`.
    """
    _check_model(model)
    spherical = _spherical(model, spherical)
    lam = as_real(weight_decay, "weight_decay", minimum=0.0)
    if not isinstance(eigenvectors, (bool, np.bool_)):
        raise TypeError("eigenvectors must be a bool")
    backend = _backend(model, backend, w)
    W, factor, single = _points(model, w, spherical)
    if isinstance(model, ScaleInvariantModel):  # W is validated and rescaled: call the kernel
        H, ok = model._core(np.float64, backend).hessian(W)
        model._checked(ok)
    else:
        H = model._core(np.float64).hessian(W)[0]
    H = np.asarray(H, dtype=np.float64)
    H = 0.5 * (H + np.swapaxes(H, 1, 2)) * factor[:, None, None]
    if not eigenvectors:
        evals = np.linalg.eigvalsh(H)[:, ::-1] + lam
        return Spectrum(_drop(np.ascontiguousarray(evals), single), None)
    evals, evecs = np.linalg.eigh(H)
    evals = np.ascontiguousarray(evals[:, ::-1]) + lam
    evecs = np.ascontiguousarray(np.swapaxes(evecs[:, :, ::-1], 1, 2))
    sign = np.sign(np.take_along_axis(evecs, np.abs(evecs).argmax(-1)[..., None], -1))
    evecs *= np.where(sign == 0, 1.0, sign)
    return Spectrum(_drop(evals, single), _drop(evecs, single))


# -- trace ----------------------------------------------------------------------
def _quadratic_forms(model, W, Z, backend) -> np.ndarray:
    """z^T H(W[b]) z for every point b and every row z of Z (B, P, D) or (P, D):
    shape (B, P), one kernel call on B * P rows."""
    B, D = W.shape
    Z = np.broadcast_to(Z, (B,) + Z.shape[-2:])
    P = Z.shape[1]
    HZ = _hvp(model, np.repeat(W, P, axis=0), Z.reshape(B * P, D), backend).reshape(B, P, D)
    return np.einsum("bpi,bpi->bp", Z, HZ)


def _stderr(s: np.ndarray, magnitude: np.ndarray, D: int) -> np.ndarray:
    """Standard error of the mean of the probe terms s (B, n), floored by the
    rounding error of the terms (D eps of their magnitude), so that an exact
    sketch or a flat spectrum gives no zero stderr beside a rounded estimate."""
    sample = s.std(axis=1, ddof=1) / np.sqrt(s.shape[1])
    return np.hypot(sample, 4 * D * np.finfo(np.float64).eps * magnitude)


def hessian_trace(model, w, *, n_probes: int = 64, seed: int = 0,
                  spherical: bool | None = None, method: str = "auto",
                  weight_decay: float = 0.0, backend: str = "auto") -> TraceEstimate:
    """tr H with a standard error, from ``n_probes`` exact HVPs a point.

    Parameters
    ----------
    model, w, spherical, weight_decay, backend
        As in :func:`hessian_spectrum`; weight decay adds lam D exactly.
    n_probes : int
        HVPs per point.
    seed : int
        Key of the Rademacher probes (the same probes at every point).
    method : {"auto", "exact", "hutchinson", "hutch++"}
        "exact": sum of e_i^T H e_i over the D basis vectors (D HVPs, stderr 0).
        "hutchinson": mean of z^T H z over n_probes Rademacher probes z.
        "hutch++" (Meyer, Musco, Musco & Woodruff 2021): n_probes // 3 HVPs
        sketch the range of H, the trace of H on the sketch Q is taken exactly
        (n_probes // 3 HVPs) and the rest, tr((I - QQ^T) H (I - QQ^T)), by
        Hutchinson with the remaining probes. Unbiased; far lower variance
        when a few eigenvalues dominate ||H||_F, as in the low-rank Hessians of
        BN models; up to sqrt(3) higher stderr on a flat spectrum.
        "auto": "exact" when D <= n_probes, else "hutch++" (n_probes >= 6),
        else "hutchinson".

    Returns
    -------
    TraceEstimate
        estimate (B,) and stderr (B,) (scalars for a single point): the sample
        standard deviation of the probe terms over sqrt(their number), with a
        floor at their rounding error. The true trace lies within 3 stderr in
        about 99% of seeds.
    """
    _check_model(model)
    spherical = _spherical(model, spherical)
    n_probes = as_positive_int(n_probes, "n_probes")
    seed = _as_seed(seed)
    lam = as_real(weight_decay, "weight_decay", minimum=0.0)
    methods = ("auto", "exact", "hutchinson", "hutch++")
    if method not in methods:
        raise ValueError(f"method must be one of {', '.join(map(repr, methods))}, got {method!r}")
    D = model.dim
    if method == "auto":
        method = "exact" if D <= n_probes else "hutch++" if n_probes >= 6 else "hutchinson"
    if method == "hutchinson" and n_probes < 2:
        raise ValueError("n_probes must be >= 2 for a Hutchinson stderr")
    if method == "hutch++" and n_probes < 6:
        raise ValueError("n_probes must be >= 6 for Hutch++ (a third sketch, a third residual)")
    backend = _backend(model, backend, w)
    W, factor, single = _points(model, w, spherical)
    B = W.shape[0]
    if method == "exact":
        est = _quadratic_forms(model, W, np.eye(D), backend).sum(axis=1)
        err = np.zeros(B)
        matvecs = D
    elif method == "hutchinson":
        s = _quadratic_forms(model, W, rademacher(seed, n_probes, D, stream=_HUTCH_STREAM),
                             backend)
        est, err = s.mean(axis=1), _stderr(s, np.abs(s).mean(axis=1), D)
        matvecs = n_probes
    else:
        k = n_probes // 3
        r = n_probes - 2 * k
        S = rademacher(seed, k, D, stream=_SKETCH_STREAM)
        Y = _hvp(model, np.repeat(W, k, axis=0), np.tile(S, (B, 1)), backend).reshape(B, k, D)
        Q = np.linalg.qr(np.swapaxes(Y, 1, 2))[0]  # (B, D, k) orthonormal columns
        t = _quadratic_forms(model, W, np.swapaxes(Q, 1, 2), backend)
        G = rademacher(seed, r, D, stream=_RESID_STREAM)
        G = G[None] - (Q @ (np.swapaxes(Q, 1, 2) @ G.T)).transpose(0, 2, 1)  # (I - QQ^T) g
        s = _quadratic_forms(model, W, G, backend)
        est = t.sum(axis=1) + s.mean(axis=1)
        err = _stderr(s, np.abs(t).sum(axis=1) + np.abs(s).mean(axis=1), D)
        matvecs = n_probes
    est = est * factor + lam * D
    err = err * factor
    return TraceEstimate(_drop(est, single), _drop(err, single), method, matvecs)


# -- spectral density -----------------------------------------------------------
def _slq_numpy(model, W, n_probes, steps, seed, backend) -> dict:
    """The SLQ of engine/slq.hpp in NumPy: B * P Lanczos runs advanced together,
    one HVP kernel call on (B * P, D) rows per step. Fallback and test oracle."""
    B, D = W.shape
    P = n_probes
    N = B * P
    Ww = np.repeat(W, P, axis=0)
    Q = np.zeros((steps + 1, N, D))
    Q[0] = np.tile(rademacher(seed, P, D), (B, 1)) / np.sqrt(D)
    alpha = np.zeros((N, steps))
    beta = np.zeros((N, steps))
    count = np.full(N, steps)
    active = np.ones(N, dtype=bool)
    for j in range(steps):
        z = _hvp(model, Ww, Q[j], backend)
        a = np.einsum("ni,ni->n", Q[j], z)
        z -= a[:, None] * Q[j]
        if j > 0:
            z -= beta[:, j - 1, None] * Q[j - 1]
        for _ in range(2):
            z -= np.einsum("kn,kni->ni", np.einsum("kni,ni->kn", Q[:j + 1], z), Q[:j + 1])
        b = np.linalg.norm(z, axis=1)
        scale = np.abs(a) + (beta[:, j - 1] if j > 0 else 0.0)
        stop = active & (b <= 1e-12 * np.where(scale > 0, scale, 1.0))
        count[stop] = j + 1
        a, b = np.where(active, a, 0.0), np.where(active & ~stop, b, 0.0)
        active &= ~stop
        alpha[:, j], beta[:, j] = a, b
        Q[j + 1] = z / np.where(b > 0, b, np.inf)[:, None]
    nodes = np.zeros((N, steps))
    weights = np.zeros((N, steps))
    for k in np.unique(count):  # runs grouped by length: one batched eigh each
        rows = np.flatnonzero(count == k)
        T = np.zeros((rows.size, k, k))
        idx = np.arange(k)
        T[:, idx, idx] = alpha[rows, :k]
        T[:, idx[:-1], idx[1:]] = T[:, idx[1:], idx[:-1]] = beta[rows, :k - 1]
        theta, U = np.linalg.eigh(T)
        nodes[rows, :k] = theta
        nodes[rows, k:] = theta[:, -1:]
        weights[rows, :k] = U[:, 0, :] ** 2
    shape = (B, P, steps)
    return {"alpha": alpha.reshape(shape), "beta": beta.reshape(shape),
            "nodes": nodes.reshape(shape), "weights": weights.reshape(shape),
            "count": count.reshape(B, P), "ok": np.ones(B, dtype=np.uint8)}


def _broadened(grid: np.ndarray, x: np.ndarray, wt: np.ndarray, sigma: float) -> np.ndarray:
    """sum_j wt[b, j] N(grid; x[b, j], sigma^2), shape (B, G).

    Each Gaussian of positive weight is evaluated only on the grid points within
    9 sigma of its centre (the tail beyond holds 2e-19 of its mass) and
    accumulated with one bincount: cost (nodes x window), not (nodes x G).
    """
    B, G = x.shape[0], grid.size
    point, j = np.nonzero(wt > 0)
    x, wt = x[point, j], wt[point, j]
    lo = np.searchsorted(grid, x - 9 * sigma)
    hi = np.searchsorted(grid, x + 9 * sigma, side="right")
    K = int((hi - lo).max(initial=0))
    out = np.zeros(B * G)
    chunk = max(1, 4_000_000 // max(K, 1))  # nodes a pass: bounded temporaries
    for n0 in range(0, x.size if K else 0, chunk):
        sl = slice(n0, n0 + chunk)
        idx = lo[sl, None] + np.arange(K)
        t = (grid[np.minimum(idx, G - 1)] - x[sl, None]) / sigma
        vals = np.where(idx < hi[sl, None], wt[sl, None] * np.exp(-0.5 * t * t), 0.0)
        flat = np.minimum(idx, G - 1) + (point[sl] * G)[:, None]
        out += np.bincount(flat.ravel(), vals.ravel(), minlength=B * G)
    return out.reshape(B, G) / (sigma * np.sqrt(2 * np.pi))


def _model_core(model):
    if isinstance(model, ScaleInvariantModel):
        return model._core(np.float64, "cpp")
    return model._core(np.float64)


def spectral_density(model, w, *, n_probes: int = 16, steps: int = 80, seed: int = 0,
                     grid=None, sigma: float | None = None, spherical: bool | None = None,
                     weight_decay: float = 0.0, backend: str = "auto") -> SpectralDensity:
    """Spectral density of the Hessian by stochastic Lanczos quadrature (SLQ).

    Per point and probe, ``steps`` Lanczos steps with full reorthogonalisation
    on the exact HVP from a normalised Rademacher probe; the tridiagonal's
    eigenvalues and squared first eigenvector components are the Gauss nodes and
    weights. With the compiled core the whole batch of points x probes runs in
    one C++ call (SIMD lanes, OpenMP).

    Parameters
    ----------
    model, w, spherical, weight_decay
        As in :func:`hessian_spectrum`; weight decay shifts the nodes by lam.
    n_probes : int
        Probes P a point (the same probes at every point).
    steps : int
        Lanczos steps, capped at D; with steps = D every probe's quadrature is
        its exact spectral measure (the nodes are H's eigenvalues).
    seed : int
        Key of the probes (:func:`rademacher`).
    grid : array_like, shape (G,), optional
        Where to evaluate the density; default 501 points spanning every node
        of the batch with 6 sigma to spare on each side (spacing ~0.2 sigma).
    sigma : float, optional
        Width of the Gaussian broadening; default 1% of the batch's node range
        (or 1e-3 max(1, |node|) when every node coincides).
    backend : str
        "auto"/"cpp": the C++ SLQ; "numba"/"numpy": the same recurrence in NumPy
        on that backend's HVP (one kernel call per Lanczos step).

    Returns
    -------
    SpectralDensity
        grid (G,), density (B, G), nodes, weights (B, P, steps), count (B, P);
        leading B dropped for a single point.
    """
    _check_model(model)
    spherical = _spherical(model, spherical)
    n_probes = as_positive_int(n_probes, "n_probes")
    steps = min(as_positive_int(steps, "steps"), model.dim)
    seed = _as_seed(seed)
    lam = as_real(weight_decay, "weight_decay", minimum=0.0)
    if sigma is not None:
        sigma = as_real(sigma, "sigma", minimum=0.0, strict=True)
    if grid is not None:
        grid = as_float_array(grid, "grid", np.float64)
        if grid.ndim != 1 or grid.size < 2 or np.any(np.diff(grid) <= 0):
            raise ValueError("grid must be 1-D, increasing, with at least 2 points")
    backend = _backend(model, backend, w)
    W, factor, single = _points(model, w, spherical)
    if backend == "cpp":
        module = getattr(model, "_kernel_module", None) or core()  # a loaded model's own
        r = module.slq(_model_core(model), W, n_probes, steps, seed)
    else:
        r = _slq_numpy(model, W, n_probes, steps, seed, backend)
    if not np.all(r["ok"]):
        raise ValueError(f"w[{int(np.argmin(r['ok']))}]: the Hessian is undefined there")
    nodes = r["nodes"] * factor[:, None, None] + lam
    weights = r["weights"]
    if sigma is None:
        span = float(nodes.max() - nodes.min())
        sigma = 0.01 * span if span > 0 else 1e-3 * max(1.0, float(np.abs(nodes).max()))
    if grid is None:
        grid = np.linspace(nodes.min() - 6 * sigma, nodes.max() + 6 * sigma, 501)
    density = _broadened(grid, nodes.reshape(W.shape[0], -1), weights.reshape(W.shape[0], -1),
                         sigma) / n_probes
    return SpectralDensity(grid, _drop(density, single), _drop(nodes, single),
                           _drop(weights, single), _drop(r["count"], single), sigma)


# -- pictures -------------------------------------------------------------------
def loss_slice(model, w, directions=None, grid=None, *, backend: str = "auto") -> LossSlice:
    """The loss on a 1-D or 2-D grid of points w + a u (+ b v), one batched call.

    Parameters
    ----------
    model : ScaleInvariantModel or SquareLossModel
    w : array_like, shape (D,)
        The centre of the slice.
    directions : array_like, shape (D,), (1, D) or (2, D), optional
        u (and v), used as given. Default: the unit top two eigenvectors of
        H(w) (a 2-D slice; ``directions=spectrum.eigenvectors[:1]`` gives 1-D).
    grid : array_like, shape (A,), or a pair of them, optional
        The coefficients a (and b); one array serves both axes. Default 41
        points in [-||w|| / 2, ||w|| / 2].
    backend : str
        Kernel backend of a scale-invariant model.

    Returns
    -------
    LossSlice
        a (A,), b (Bg,) or None, loss (A,) or (A, Bg) with loss[i, j] at
        w + a[i] u + b[j] v, directions (1 or 2, D).
    """
    _check_model(model)
    w0, single = as_batch(w, model.dim, "w", dtype=np.float64)
    if not single:
        raise ValueError(f"w must be a single point of shape ({model.dim},), got {w0.shape}")
    w0 = w0[0]
    if directions is None:
        if isinstance(model, ScaleInvariantModel) and model.dim > 512:
            U = spherical_sharpness(model, w0, k=min(2, model.dim), backend=backend).eigenvectors
        else:
            U = hessian_spectrum(model, w0, spherical=False, eigenvectors=True,
                                 backend=backend).eigenvectors[:2]
    else:
        U = as_float_array(directions, "directions", np.float64)
        U = U[None] if U.ndim == 1 else U
        if U.ndim != 2 or U.shape[0] not in (1, 2) or U.shape[1] != model.dim:
            raise ValueError(f"directions must have shape ({model.dim},), (1, {model.dim}) or "
                             f"(2, {model.dim}), got {np.shape(directions)}")
    if grid is None:
        axes = [np.linspace(-0.5, 0.5, 41) * np.linalg.norm(w0)] * U.shape[0]
    else:
        pair = isinstance(grid, (tuple, list)) and len(grid) == 2 and np.ndim(grid[0]) == 1
        if pair and U.shape[0] == 1:
            raise ValueError("grid is a pair of axes but there is one direction")
        axes = [as_float_array(g, "grid", np.float64) for g in grid] if pair else \
            [as_float_array(grid, "grid", np.float64)] * U.shape[0]
        for g in axes:
            if g.ndim != 1 or g.size < 1:
                raise ValueError(f"grid must be 1-D (or a pair of 1-D arrays), got shape {g.shape}")
    coef = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)  # (A[, Bg], k)
    points = w0 + coef.reshape(-1, U.shape[0]) @ U
    if isinstance(model, ScaleInvariantModel):
        zero = ~np.any(points != 0, axis=1)
        if np.any(zero):
            at = coef.reshape(-1, U.shape[0])[int(np.argmax(zero))]
            raise ValueError(f"grid: the point at coefficients {tuple(at)} is w + ... = 0, "
                             "where the loss is undefined")
        loss = model.loss(points, backend=backend)
    else:
        loss = model.loss(points)
    loss = np.asarray(loss, dtype=np.float64).reshape(coef.shape[:-1])
    return LossSlice(axes[0], axes[1] if U.shape[0] == 2 else None, loss, U)

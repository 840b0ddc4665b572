"""Spherical sharpness and general Lanczos eigen-solves, on the C++ recurrence."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._backends import core_only, resolve
from ._engine import LanczosOptions
from ._engine.loader import core
from ._engine.validation import as_batch, as_positive_int, as_real
from .models import ScaleInvariantModel
from .models._kinds import require_scale_invariant

_WHICH = ("LA", "SA")


@dataclass
class EigenResult:
    """Extreme algebraic eigenpairs, with multiplicity.

    ``eigenvalues`` (..., k) descending for ``which="LA"`` (the largest),
    ascending for ``"SA"`` (the smallest); ``eigenvectors`` (..., k, D)
    orthonormal rows, sign fixed so the largest-magnitude entry is positive;
    ``residuals`` (..., k) true residual norms ||A v - lambda v||;
    ``iterations`` (Krylov steps, summed over the locking runs for k > 1) and
    ``converged`` per problem.
    """

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    residuals: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray


def _check_which(which) -> bool:
    """True for the smallest eigenvalues."""
    if which not in _WHICH:
        raise ValueError(f"which must be 'LA' (largest) or 'SA' (smallest), got {which!r}")
    return which == "SA"


def spherical_sharpness(model: ScaleInvariantModel, w, k: int = 1, *, which: str = "LA",
                        tol: float = 1e-10, max_iter: int | None = None, method: str = "auto",
                        start=None, seed: int = 0, backend: str = "auto",
                        multiplicity: bool = True) -> EigenResult:
    """Top-k (or bottom-k) eigenpairs of the Hessian on the unit sphere, H(w/||w||) = ||w||^2 H(w).

    Eigenvalues are returned with multiplicity: a repeated eigenvalue fills as
    many slots as its multiplicity (up to k).

    Parameters
    ----------
    model : ScaleInvariantModel
    w : array_like, shape (D,) or (B, D)
        Points (any norm; the result is that of w / ||w||).
    k : int
        Number of eigenpairs, 1 <= k <= D.
    which : {"LA", "SA"}
        "LA": the k largest algebraic eigenvalues (not largest magnitude),
        descending; "SA": the k smallest, ascending.
    tol : float
        Relative residual tolerance. k = 1: Lanczos stops when the top Ritz
        value's residual estimate is below tol * |largest Ritz value|. k > 1:
        ``converged`` means every returned pair's true residual is below
        tol * (largest |Ritz value|) and a check run on the orthogonal
        complement of the k pairs found nothing beyond the k-th value.
    max_iter : int, optional
        Krylov dimension cap of one Lanczos run (default min(D, max(128, 4k))).
    method : {"auto", "lanczos", "dense"}
        "lanczos": batched Lanczos with full reorthogonalisation on the exact HVP,
        in C++; for k > 1 the k pairs are locked and Lanczos re-run on their
        orthogonal complement until nothing is missed (a single Krylov sequence
        sees a multiple eigenvalue once), which costs one to k + 1 extra
        single-pair runs. "dense": numpy.linalg.eigh of the dense Hessian (D HVPs
        a point). "auto": dense for D <= 16 or the "numpy" backend, else Lanczos.
    start : array_like, shape (D,) or (B, D), optional
        Warm start for Lanczos, e.g. a previous top eigenvector.
    seed : int
        Key of the random start vectors.
    backend : str
        See :mod:`pysharp.backends`; "numpy" offers the dense method only.
    multiplicity : bool
        False lets the XLA backend ("jax") solve k > 1 with one Krylov sequence instead
        of its block run (22 HVPs against 32 for the top two of a small CNN): do not use
        it where a top eigenvalue may be repeated, which one sequence sees once. The
        other backends always return multiplicity and ignore it.

    Returns
    -------
    EigenResult
        Leading shapes follow ``w``: eigenvalues (k,) or (B, k), eigenvectors
        (k, D) or (B, k, D).

    Examples
    --------
    >>> import pysharp as ps
    >>> model = ps.BNLinearRegression.synthetic(d=40, n=20)
    >>> w = model.random_point(seed=0, norm=10.0)
    >>> round(float(ps.spherical_sharpness(model, w).eigenvalues[0]), 4)
    3.9781
    >>> ps.spherical_sharpness(model, [w, 2 * w], k=3).eigenvalues.shape  # scale-free
    (2, 3)
    """
    require_scale_invariant(model, "spherical_sharpness",
                            "use pysharp.hessian_spectrum(model, w) for its Hessian's eigenvalues")
    W, single = model._batch(w)
    W = model._unit_scale(W)[0]  # the result depends on the direction only
    D = model.dim
    k = as_positive_int(k, "k")
    if k > D:
        raise ValueError(f"k must be <= D = {D}, got {k}")
    smallest = _check_which(which)
    tol = as_real(tol, "tol", minimum=0.0, strict=True)
    if method not in ("auto", "lanczos", "dense"):
        raise ValueError(f"method must be 'auto', 'lanczos' or 'dense', got {method!r}")
    if method == "auto":
        method = "dense" if D <= 16 or backend == "numpy" else "lanczos"
    backend = resolve(backend, w, trajectories=method == "lanczos", model=model)
    norm2 = np.einsum("bi,bi->b", W, W)
    if method == "dense":
        H = model.hessian(W, backend=backend)
        evals, evecs = np.linalg.eigh(0.5 * (H + np.swapaxes(H, 1, 2)))
        order = slice(None, k) if smallest else slice(None, -k - 1, -1)
        evals = evals[:, order]
        evecs = np.swapaxes(evecs[:, :, order], 1, 2).copy()
        # the largest entry of a unit vector is never 0
        evecs *= np.sign(np.take_along_axis(evecs, np.abs(evecs).argmax(-1)[..., None], -1))
        resid = np.linalg.norm(np.einsum("bij,bkj->bki", H, evecs) - evals[..., None] * evecs,
                               axis=-1)
        iters = np.full(W.shape[0], D, dtype=np.int32)
        conv = np.ones(W.shape[0], dtype=bool)
    else:
        options = LanczosOptions.for_dim(D, k, max_iter, tol=tol, smallest=smallest,
                                         seed=as_positive_int(seed, "seed", minimum=0))
        S = None if start is None else np.broadcast_to(
            as_batch(start, D, "start", dtype=W.dtype)[0], W.shape).copy()
        single_sequence = {} if multiplicity or backend != "jax" else {"multiplicity": False}
        evals, evecs, resid, iters, conv, ok = model._core(W.dtype, backend).lanczos(
            W, options.to_core(), S, **single_sequence)
        model._checked(ok)
        conv = conv.astype(bool)
    res = EigenResult(evals * norm2[:, None], evecs, resid * norm2[:, None], iters, conv)
    if single:
        res = EigenResult(res.eigenvalues[0], res.eigenvectors[0], res.residuals[0],
                          res.iterations[0], res.converged[0])
    return res


def _to_numpy(x) -> np.ndarray:
    """Accept NumPy, CuPy (``.get()``) and torch (``.detach().cpu()``) results."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    elif hasattr(x, "get") and not isinstance(x, np.ndarray):
        x = x.get()
    return np.asarray(x, dtype=np.float64).reshape(-1)


def lanczos(matvec: Callable, dim: int, k: int = 1, *, which: str = "LA", tol: float = 1e-10,
            max_iter: int | None = None, start=None, seed: int = 0,
            backend: str = "auto") -> EigenResult:
    """Extreme algebraic eigenpairs of a symmetric operator given by ``matvec``.

    The same C++ Lanczos (full reorthogonalisation; for k > 1 locking and
    complement runs, so repeated eigenvalues come with multiplicity) as
    ``spherical_sharpness``, calling back into Python for each product.

    Parameters
    ----------
    matvec : callable
        ``matvec(x) -> A x`` for x a float64 NumPy array of shape (dim,); it may
        return a NumPy, CuPy or torch array. A must be symmetric.
    dim : int
        Dimension of the operator.
    k, which, tol, max_iter, start, seed
        As in ``spherical_sharpness``.
    backend : {"auto", "cpp"}
        Core only: the compiled core runs this call; other backends are refused
        with a message.

    Returns
    -------
    EigenResult
        eigenvalues (k,), eigenvectors (k, dim), residuals (k,).

    Notes
    -----
    For operators already in pysharp, prefer ``spherical_sharpness``: it runs
    with the GIL released and batched over points.
    """
    core_only(backend, "lanczos")
    if not callable(matvec):
        raise TypeError("matvec must be callable")
    dim = as_positive_int(dim, "dim")
    k = as_positive_int(k, "k")
    if k > dim:
        raise ValueError(f"k must be <= dim = {dim}, got {k}")
    smallest = _check_which(which)
    tol = as_real(tol, "tol", minimum=0.0, strict=True)
    options = LanczosOptions.for_dim(dim, k, max_iter, tol=tol, smallest=smallest,
                                     seed=as_positive_int(seed, "seed", minimum=0))
    x0 = None if start is None else as_batch(start, dim, "start", dtype=np.float64)[0][0]
    evals, evecs, resid, iters, conv = core().lanczos_callable(
        lambda x: _to_numpy(matvec(x)), dim, options.to_core(), x0)
    return EigenResult(evals, evecs, resid, np.int32(iters), bool(conv))

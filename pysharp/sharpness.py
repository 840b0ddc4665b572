"""Spherical sharpness and general Lanczos eigen-solves, on the C++ recurrence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ._backend import core
from ._dispatch import resolve
from ._validation import as_batch, as_positive_int, as_real
from .models import ScaleInvariantModel


@dataclass
class EigenResult:
    """Largest algebraic eigenpairs.

    ``eigenvalues`` (..., k) descending; ``eigenvectors`` (..., k, D) unit rows,
    sign fixed so the largest-magnitude entry is positive; ``residuals``
    (..., k) true residual norms ||A v - lambda v||; ``iterations`` and
    ``converged`` per problem.
    """

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    residuals: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray


def _iteration_limits(dim: int, k: int, max_iter) -> tuple[int, int]:
    cap = min(dim, 1024)
    if max_iter is None:
        max_iter = min(cap, max(128, 4 * k))
    max_iter = as_positive_int(max_iter, "max_iter")
    if not k <= max_iter <= cap:
        raise ValueError(f"max_iter must be in [k, min(dim, 1024)] = [{k}, {cap}], got {max_iter}")
    # Never trust a residual estimate from a tiny Krylov space.
    return max_iter, min(max_iter, max(2 * k + 2, 8))


def spherical_sharpness(model: ScaleInvariantModel, w, k: int = 1, *, tol: float = 1e-10,
                        max_iter: int | None = None, method: str = "auto", start=None,
                        seed: int = 0, backend: str = "auto") -> EigenResult:
    """Top-k eigenpairs of the Hessian on the unit sphere, H(w/||w||) = ||w||^2 H(w).

    Parameters
    ----------
    model : ScaleInvariantModel
    w : array_like, shape (D,) or (B, D)
        Points (any norm; the result is that of w / ||w||).
    k : int
        Number of largest algebraic eigenvalues (not largest magnitude).
    tol : float
        Lanczos stops when every wanted Ritz value's residual estimate is below
        tol * |largest Ritz value|.
    max_iter : int, optional
        Krylov dimension cap (default min(D, max(128, 4k))).
    method : {"auto", "lanczos", "dense"}
        "lanczos": batched Lanczos with full reorthogonalisation on the exact HVP,
        in C++. "dense": numpy.linalg.eigh of the dense Hessian (D HVPs a point;
        small D only, and the way to resolve exactly repeated eigenvalues for
        k > 1, which single-vector Lanczos returns once). "auto": dense for
        D <= 16, else Lanczos.
    start : array_like, shape (D,) or (B, D), optional
        Warm start for Lanczos, e.g. a previous top eigenvector.
    seed : int
        Key of the random start vectors.
    backend : str
        See :mod:`pysharp.backends`; "numpy" offers the dense method only.

    Returns
    -------
    EigenResult
        Leading shapes follow ``w``: eigenvalues (k,) or (B, k).
    """
    if not isinstance(model, ScaleInvariantModel):
        raise TypeError(f"model must be a pysharp model, got {type(model).__name__}")
    W, single = model._batch(w)
    W = model._unit_scale(W)[0]  # the result depends on the direction only
    D = model.dim
    k = as_positive_int(k, "k")
    if k > D:
        raise ValueError(f"k must be <= D = {D}, got {k}")
    tol = as_real(tol, "tol", minimum=0.0, strict=True)
    if method not in ("auto", "lanczos", "dense"):
        raise ValueError(f"method must be 'auto', 'lanczos' or 'dense', got {method!r}")
    if method == "auto":
        method = "dense" if D <= 16 or backend == "numpy" else "lanczos"
    backend = resolve(backend, w, trajectories=method == "lanczos")
    norm2 = np.einsum("bi,bi->b", W, W)
    if method == "dense":
        H = model.hessian(W, backend=backend)
        evals, evecs = np.linalg.eigh(0.5 * (H + np.swapaxes(H, 1, 2)))
        evals = evals[:, ::-1][:, :k]
        evecs = np.swapaxes(evecs[:, :, ::-1][:, :, :k], 1, 2).copy()
        sign = np.sign(np.take_along_axis(evecs, np.abs(evecs).argmax(-1)[..., None], -1))
        evecs *= np.where(sign == 0, 1, sign)
        resid = np.linalg.norm(np.einsum("bij,bkj->bki", H, evecs) - evals[..., None] * evecs,
                               axis=-1)
        iters = np.full(W.shape[0], D, dtype=np.int32)
        conv = np.ones(W.shape[0], dtype=bool)
    else:
        max_iter, min_iter = _iteration_limits(D, k, max_iter)
        S = None if start is None else np.broadcast_to(
            as_batch(start, D, "start", dtype=W.dtype)[0], W.shape).copy()
        evals, evecs, resid, iters, conv, ok = model._core(W.dtype, backend).lanczos(
            W, k, max_iter, min_iter, tol, as_positive_int(seed, "seed", minimum=0), S)
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


def lanczos(matvec: Callable, dim: int, k: int = 1, *, tol: float = 1e-10,
            max_iter: int | None = None, start=None, seed: int = 0) -> EigenResult:
    """Largest algebraic eigenpairs of a symmetric operator given by ``matvec``.

    The same C++ Lanczos recurrence (full reorthogonalisation) as
    ``spherical_sharpness``, calling back into Python for each product.

    Parameters
    ----------
    matvec : callable
        ``matvec(x) -> A x`` for x a float64 NumPy array of shape (dim,); it may
        return a NumPy, CuPy or torch array. A must be symmetric.
    dim : int
        Dimension of the operator.
    k, tol, max_iter, start, seed
        As in ``spherical_sharpness``.

    Returns
    -------
    EigenResult
        eigenvalues (k,), eigenvectors (k, dim), residuals (k,).

    Notes
    -----
    For operators already in pysharp, prefer ``spherical_sharpness``: it runs
    with the GIL released and batched over points.
    """
    if not callable(matvec):
        raise TypeError("matvec must be callable")
    dim = as_positive_int(dim, "dim")
    k = as_positive_int(k, "k")
    if k > dim:
        raise ValueError(f"k must be <= dim = {dim}, got {k}")
    tol = as_real(tol, "tol", minimum=0.0, strict=True)
    max_iter, min_iter = _iteration_limits(dim, k, max_iter)
    x0 = None if start is None else as_batch(start, dim, "start", dtype=np.float64)[0][0]
    evals, evecs, resid, iters, conv = core().lanczos_callable(
        lambda x: _to_numpy(matvec(x)), dim, k, max_iter, min_iter, tol,
        as_positive_int(seed, "seed", minimum=0), x0)
    return EigenResult(evals, evecs, resid, np.int32(iters), bool(conv))

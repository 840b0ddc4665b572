"""The typed interface to the trajectory engine and Lanczos of every backend.

One definition of what a ``run`` or ``lanczos`` call into a backend carries:
``Method``, :class:`LanczosOptions` and :class:`EngineConfig` (built from the
caller's ``RunOptions``, ``options.py``). Backends
receive them by field name (``to_core()`` gives the plain dict the compiled
modules read, refusing unknown or missing fields), so the C++ core, the CUDA
module and the Numba port cannot disagree on an argument's position, and the
Lanczos defaults live here only.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from .methods import METHODS, method_spec
from .validation import as_positive_int

#: Krylov dimension cap of one Lanczos run: kLanczosMaxIter in engine/lanczos.hpp
#: (the compiled core refuses more; tests check the two agree).
LANCZOS_MAX_ITER = 1024
#: Default Krylov dimension of the engine's in-run sharpness (k = 1).
IN_RUN_MAX_ITER = 128


#: Update rules of the engine, one member per row of the method table
#: (``pysharp._engine.methods.METHODS``; the values are those of engine/methods.hpp's
#: ``enum class Method``, which the same table generates).
Method = enum.IntEnum("Method",  # type: ignore[misc]  # members from the table, no literal
                      {m.name.upper(): m.code for m in METHODS.values()}, module=__name__)


def _named(cls: type[Method], name: str) -> Method:
    """The trajectory engine's method called ``name`` ("gd_wd", "pgd", ...)."""
    code = method_spec(name, engine="trajectory").code
    assert code is not None  # every row the trajectory engine runs has its enumerator
    return cls(code)


Method.named = classmethod(_named)  # type: ignore[attr-defined]  # not seen by mypy: no literal


@dataclass(frozen=True)
class LanczosOptions:
    """Options of one Lanczos solve (per point), as engine/lanczos.hpp defines them.

    Attributes
    ----------
    k : int
        Eigenpairs wanted, 1 <= k <= dim.
    max_iter : int
        Krylov dimension cap of one run, k <= max_iter <= min(dim, LANCZOS_MAX_ITER).
    min_iter : int
        Iterations before the residual test is trusted; from then on the compiled core,
        CUDA and Numba test every other iteration (and at max_iter), so a run may take one
        step more than it needs; the XLA backend tests every iteration.
    tol : float
        Relative residual tolerance.
    seed : int
        Keys the random starts (counter-based: independent of batch layout).
    smallest : bool
        The k smallest algebraic eigenvalues instead of the largest.
    """

    k: int = 1
    max_iter: int = IN_RUN_MAX_ITER
    min_iter: int = 8
    tol: float = 1e-10
    seed: int = 0
    smallest: bool = False

    @classmethod
    def for_dim(cls, dim: int, k: int = 1, max_iter: int | None = None, *,
                default_max_iter: int | None = None, name: str = "max_iter",
                **kw: Any) -> LanczosOptions:
        """Options for a dim-dimensional operator, ``max_iter`` validated and defaulted.

        The default Krylov dimension is min(dim, cap, ``default_max_iter`` or
        max(128, 4k)); the minimum before trusting a residual, max(2k + 2, 8).
        """
        cap = min(dim, LANCZOS_MAX_ITER)
        if max_iter is None:
            max_iter = min(cap, default_max_iter or max(IN_RUN_MAX_ITER, 4 * k))
        max_iter = as_positive_int(max_iter, name)
        if not k <= max_iter <= cap:
            raise ValueError(f"{name} must be in [k, min(dim, {LANCZOS_MAX_ITER})] = "
                             f"[{k}, {cap}], got {max_iter}")
        # Never trust a residual estimate from a tiny Krylov space.
        return cls(k=k, max_iter=max_iter, min_iter=min(max_iter, max(2 * k + 2, 8)), **kw)

    def to_core(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EngineConfig:
    """Everything a ``run`` call of a backend needs besides the batch (w0, lr, wd, offset).

    Attributes mirror ``struct EngineConfig`` in engine/trajectory.hpp; ``reduced``
    picks BN linear regression's exact reduced update.
    """

    method: Method
    steps: int
    record_every: int = 1
    sharpness_every: int = 0
    theta_every: int = 0
    jitter: float = 0.0
    seed: int = 0
    rms_beta: float = 0.99
    rms_eps: float = 1e-12
    qr_kappa: float = 0.0
    top_k: int = 0
    reduced: bool = False
    lanczos: LanczosOptions = field(default_factory=LanczosOptions)

    def to_core(self) -> dict:
        out = asdict(self)
        out["method"] = int(self.method)
        return out

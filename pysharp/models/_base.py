"""The interface every scale-invariant model offers, over the compiled core."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._backends import BACKENDS, model_kernels, resolve
from .._engine.validation import (
    as_batch,
    as_float_array,
    as_positive_int,
    check_finite,
    check_nonzero_rows,
    keeps_array_type,
    safe_rows,
)
from ._compiler import include_dir


def bn_training_data(X, y) -> tuple[np.ndarray, np.ndarray]:
    """Own float64 copies of the (X (n, d), y (n,)) of a model with batch statistics.

    Copies, so the model can freeze them without aliasing the caller's arrays.
    Raises ValueError naming the argument unless X is 2-D with n >= 2 samples and
    d >= 1 columns and y has one target per sample.
    """
    X = as_float_array(X, "X", np.float64).copy()
    y = as_float_array(y, "y", np.float64).copy()
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n, d), got shape {X.shape}")
    if y.shape != (X.shape[0],):
        raise ValueError(f"y must have shape ({X.shape[0]},) to match X, got {y.shape}")
    if X.shape[0] < 2:
        raise ValueError(f"need n >= 2 samples for batch statistics, got n = {X.shape[0]}")
    if X.shape[1] < 1:
        raise ValueError("X must have at least one column")
    return X, y


#: 2^E bounds on a datum a model's loss grows in proportion to (the BN models' 2 var(targets),
#: Toy3D's c, the squared targets of BNTwoLayerNet). Inside [2^-E, 2^E] the loss, its
#: derivatives at a unit-norm w and the squared norms of the Hessian-vector products that
#: Lanczos forms (sharpness, spectra, the engine) stay normal floats, with room for badly
#: conditioned data: the core's Lanczos gave false eigenvalues, or a false "undefined",
#: from about 2^+-500 in float64 and 2^+-60 in float32.
_SAFE_DATA_EXP = {np.dtype(np.float64): 400, np.dtype(np.float32): 40}


def unit_scaled(a: np.ndarray) -> tuple[np.ndarray, int]:
    """(a / 2^e, e) with max |a / 2^e| in [0.5, 1) (e = 0 for an all-zero a).

    Exact (a power of two changes no mantissa) but for entries 2^-1074 times smaller
    than the largest, which become 0. Data the models normalise away (X under BN)
    reach the kernels like this, so that no sum of squares over- or underflows.
    """
    peak = float(np.max(np.abs(a), initial=0.0))
    e = int(np.frexp(peak)[1]) if peak > 0 else 0
    with np.errstate(under="ignore"):
        return (np.ldexp(a, -e) if e else a), e


def check_data_range(log2_value: float, dtype, what: str, remedy: str, *,
                     lower: bool = True) -> None:
    """ValueError unless 2^-E <= value <= 2^E (E = _SAFE_DATA_EXP[dtype]; no lower bound
    unless ``lower``), for a datum ``what`` (its name in the message) of log2 ``log2_value``
    that the loss grows with."""
    dtype = np.dtype(dtype)
    E = _SAFE_DATA_EXP[dtype]
    if -E <= log2_value <= E or (not lower and log2_value < E):
        return
    big = log2_value > E
    raise ValueError(
        f"{what} = 2^{log2_value:.1f} (about 1e{log2_value * np.log10(2):+.0f}) is "
        f"{'above' if big else 'below'} 2^{E if big else -E}: the {dtype.name} loss, which "
        f"grows with it, its derivatives and Lanczos's squared norms of Hessian-vector products "
        f"would {'overflow' if big else 'underflow'}; {remedy}")


@dataclasses.dataclass(frozen=True)
class BNTargets:
    """What a BN model keeps of its targets t (n,), exact at any scale of t."""

    u: np.ndarray  #: (t - mean t) / ||t - mean t||, (n,)
    scale: float   #: 2 var(t), the loss's factor
    mean: float
    std: float


def bn_targets(t: np.ndarray, name: str) -> BNTargets:
    """The statistics of non-constant targets ``t``, computed on t / 2^e (so neither the
    centred norm nor the variance over- or underflows) and scaled back exactly. A ValueError
    naming ``t`` where 2 var(t) is outside [2^-400, 2^400] (_SAFE_DATA_EXP): the loss
    2 var(t) (1 - cos), its derivatives or a Lanczos solve would leave float64's range."""
    ts, e = unit_scaled(t)
    var = float(ts.var())
    check_data_range(float(np.log2(2 * var)) + 2 * e, np.float64, f"2 var({name})",
                     f"multiply {name} by a constant (the loss scales as its square)")
    tc = ts - ts.mean()
    return BNTargets(tc / np.linalg.norm(tc), float(np.ldexp(2 * var, 2 * e)),
                     float(np.ldexp(ts.mean(), e)), float(np.ldexp(np.sqrt(var), e)))


def check_scale_fits(scale: float, dtype, name: str) -> None:
    """The float32 kernels hold 2 var(``name``) = ``scale`` (checked for float64 when the
    model was built) in float32: refuse it where it would leave that range."""
    if np.dtype(dtype) != np.float64:
        check_data_range(float(np.log2(scale)), dtype, f"2 var({name})",
                         f"evaluate in float64 (pass float64 w) or rescale {name}")


def _scale_rows(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """x[b] *= 2^k[b] for each row b, in place (x must be an array we own); returns x.

    Correctly rounded, as np.ldexp: a product with the exact factor 2^k rounds
    the same way. It is a plain multiply where 2^k is a normal float64, and
    ldexp (several times slower) only otherwise. In place because a fresh
    result array costs more in page faults than the multiply itself.
    """
    k = np.asarray(k)
    shape = (-1,) + (1,) * (x.ndim - 1)
    if k.size and -1021 <= k.min() and k.max() <= 1023:
        return np.multiply(x, np.ldexp(1.0, k).reshape(shape), out=x)
    return np.ldexp(x, k.reshape(shape), out=x)


class ScaleInvariantModel(abc.ABC):
    """A scale-invariant loss L(w) = L(c w), c > 0, with batched kernels.

    Every method takes ``w`` of shape (D,) or (B, D), float64 or float32
    (integers become float64); the computation runs in that precision and
    results have the matching leading shape: ``loss`` gives () or (B,), the
    vector-valued methods give (D,) or (B, D). ``backend`` picks the
    implementation (see :func:`pysharp.backends`; "numba" and "numpy" compute
    in float64 and return the input's dtype).
    """

    #: Human-readable cause of an undefined loss, used in error messages.
    _undefined_reason = "the loss is undefined"
    #: Whether the compiled engine has an exact reduced update for this model
    #: (``run_gd_wd(..., reduced=True)``).
    _has_reduced_engine = False
    #: The built-in's C++ struct: (its header under ``pysharp/models/`` of
    #: :func:`pysharp.include_dir`, the name its ``PYSHARP_MODEL`` declares).
    _declared_as: tuple[str, str] | None = None
    #: The backends with an adapter for this model (``pysharp._backends.BACKENDS``): the
    #: compiled modules call ``_make_core``, Numba ``_numba_params``, NumPy ``_reference``.
    #: The dispatch refuses any other backend, naming these; the first is the suggestion.
    _backends: tuple[str, ...] = ("cpp", "cuda", "cupy", "numba", "jax", "numpy")
    #: Why a backend is missing from ``_backends``, for the refusal (optional).
    _backends_why = ""

    def __init__(self) -> None:
        self._cores: dict[np.dtype, Any] = {}

    # -- what subclasses provide ------------------------------------------------
    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Number of parameters D."""

    @abc.abstractmethod
    def _make_core(self, suffix: str, module: Any) -> Any:
        """Build the model object of ``module`` (``pysharp._core`` or ``pysharp._cuda``,
        which share one interface) for dtype suffix '_f64' or '_f32'."""

    def _tile_kernel(self, module: Any) -> Callable | None:
        """The fused GD+WD tile run of this model in ``module`` (``pysharp._cuda``, or
        ``pysharp._core``'s emulation): ``f(W0, lr, wd, steps, record_every)``, the tuple of
        ``_tile_bn_linreg_gd_wd``; None where no tile covers the model (the default)."""
        return None

    def _numba_params(self) -> tuple:
        """The model tuple of ``_backends._numba_kernels.params`` (where ``_backends`` lists
        "numba")."""
        raise NotImplementedError

    def _reference(self) -> Any:
        """The NumPy oracle of ``pysharp.reference`` for this model (where ``_backends``
        lists "numpy" or "numba")."""
        raise NotImplementedError

    def _jax_loss(self) -> tuple[Callable, Any, np.ndarray | None]:
        """(loss(w (D,), data) -> scalar in JAX, data, group index per coordinate or None):
        what the XLA backend (``_backends._jax``) differentiates. A built-in's is its NumPy
        oracle's loss (``pysharp.reference``, written against either array namespace) run
        by JAX, its data baked in."""
        ref = self._reference()
        bounds = getattr(self, "group_bounds", None)
        groups = None if bounds is None or len(bounds) <= 2 else \
            np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
        return (lambda w, data: ref.loss(w[None])[0]), (), groups

    @abc.abstractmethod
    def spec(self) -> dict:
        """Plain-data description from which the model can be rebuilt."""

    # -- plumbing ---------------------------------------------------------------
    def _declaration(self) -> tuple[Path, str, tuple[Path, ...]]:
        """(header, struct name, extra include folders) of the model's C++ struct: what
        a module compiled at run time for this model (pysharp.jax's FFI handlers)
        instantiates. Its ``_core(dtype).model_address`` is an instance of it."""
        if self._declared_as is None:
            raise NotImplementedError(f"{type(self).__name__} declares no C++ header")
        header, name = self._declared_as
        return include_dir() / "pysharp" / "models" / header, name, ()

    def _core(self, dtype: np.dtype, backend: str = "cpp") -> Any:
        """The kernel object of a resolved backend, built once per (dtype, backend)."""
        dtype = np.dtype(dtype)
        key = (dtype, backend)
        if key not in self._cores:
            self._cores[key] = model_kernels(self, dtype, backend)
        return self._cores[key]

    def _batch(self, w, name: str = "w", checked: bool = True) -> tuple[np.ndarray, bool]:
        """(B, D) finite array and whether ``w`` was one point. ``checked=False``
        (the kernels) leaves the finiteness and nonzero-row checks to ``_evaluate``,
        which makes them only where the compiled core's own pass over the rows
        could not vouch for them."""
        W, single = as_batch(w, self.dim, name, finite=checked)
        if checked:
            check_nonzero_rows(W, name)
        return W, single

    def _pair(self, w, v) -> tuple[np.ndarray, np.ndarray, tuple[bool, bool]]:
        W, single_w = self._batch(w, checked=False)
        V, single_v = as_batch(v, self.dim, "v", dtype=W.dtype, finite=False)
        if W.shape[0] != V.shape[0]:
            if W.shape[0] == 1:
                W = np.repeat(W, V.shape[0], axis=0)
            elif V.shape[0] == 1:
                V = np.repeat(V, W.shape[0], axis=0)
            else:
                raise ValueError(f"w has {W.shape[0]} rows but v has {V.shape[0]}; "
                                 "they must match or one of them must be a single vector")
        return W, V, (single_w, single_v)

    @staticmethod
    def _unit_scale(W: np.ndarray, name: str | None = None,
                    nonzero: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Rows rescaled by 2^-e to max |entry| in [0.5, 1), and the exponents e (B,).

        Scale invariance makes the loss of the rescaled rows exact, and
        derivatives scale back as powers of 2^-e, so kernels never form a
        squared norm that overflows or underflows although the result is an
        ordinary float. Power-of-two factors (applied with ldexp, never as a
        float that could itself overflow) make the round trip exact.

        Rows whose squared norms all lie well inside the dtype's range are
        returned as they are (e = 0): scaling them would change no bit of any
        kernel's result (every operation is homogeneous in w and stays normal),
        and one pass over W replaces the copies. With ``name``, that pass also
        stands for the nonzero-row check (unless ``nonzero`` is False) that a
        caller skipped (``_batch(..., checked=False)``).
        """
        if W.shape[0] and safe_rows(W).all():  # NaN and inf fail too
            return W, np.zeros(W.shape[0], dtype=np.int64)
        if name is not None and nonzero:
            check_nonzero_rows(W, name)
        peak = np.max(np.abs(W), axis=1).astype(np.float64)
        e = np.where(peak > 0, np.frexp(peak)[1], 0)
        scaled = _scale_rows(W.astype(np.float64), -e)
        return np.ascontiguousarray(scaled.astype(W.dtype, copy=False)), e

    @staticmethod
    def _scaled_back(x: np.ndarray, e: np.ndarray, power: int) -> np.ndarray:
        """x * 2^(-e power) per row, in place (x is a fresh kernel output), exactly unless
        the result leaves the dtype's range."""
        if not e.any():
            return x
        with np.errstate(over="ignore", under="ignore"):
            return _scale_rows(x, -e * power)

    def _checked(self, ok: np.ndarray) -> None:
        if not np.all(ok):
            raise ValueError(f"w[{int(np.argmin(ok))}]: {self._undefined_reason}")

    @staticmethod
    def _shape(x: np.ndarray, single: bool) -> np.ndarray:
        return x[0] if single else x

    # -- the kernels ------------------------------------------------------------
    def _evaluate(self, backend: str, kernel: str, powers: tuple, W: np.ndarray,
                  V: np.ndarray | None = None, single_w: bool = False,
                  single_v: bool = False) -> list[np.ndarray]:
        """Outputs of ``kernel`` on the rows of W (and V), checked and exact at any norm.

        ``powers`` holds, per output, (p, q) such that the output scales as
        ||w||^-p ||v||^q. Rows are handed to the kernel as they are; rows whose
        norms could over- or underflow are rescaled by powers of two (exact) and
        the outputs scaled back. The compiled core finds such rows itself (ok
        code 2, cpu/batched.hpp), so the common case costs no pass over W here:
        a row it accepts has a finite squared norm, so finite entries, which
        is why W and V arrive unchecked (``_batch(checked=False)``). Every
        other case (a row the core refused, the other backends) checks
        finiteness before rescaling; ``single_w`` and ``single_v`` say whether w
        and v were one vector each, so that an error names the index in the
        caller's array.
        """
        core = self._core(W.dtype, backend)
        args = (W,) if V is None else (W, V)
        if BACKENDS[backend].checks_rows:
            *outs, ok = getattr(core, kernel)(*args)
            if ok.max(initial=0) < 2:
                self._checked(ok)
                return outs
        check_finite(W[0] if single_w else W, "w")
        if V is not None:
            check_finite(V[0] if single_v else V, "v")
        Ws, ew = self._unit_scale(W, "w")
        Vs, ev = (None, 0) if V is None else self._unit_scale(V, "v", nonzero=False)
        *outs, ok = getattr(core, kernel)(*((Ws,) if V is None else (Ws, Vs)))
        self._checked(ok)
        # w = Ws 2^ew, v = Vs 2^ev: the output carries 2^-(p ew - q ev).
        return [self._scaled_back(out, p * ew - q * ev, 1) for out, (p, q) in zip(outs, powers)]

    @keeps_array_type
    def loss_and_grad(self, w, *, backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """Loss L(w) and gradient grad L(w).

        Returns
        -------
        loss : ndarray, shape () or (B,)
        grad : ndarray, shape (D,) or (B, D)
        """
        backend = resolve(backend, w, model=self)
        W, single = self._batch(w, checked=False)
        loss, G = self._evaluate(backend, "loss_grad", ((0, 0), (1, 0)), W, single_w=single)
        return self._shape(loss, single), self._shape(G, single)

    @keeps_array_type
    def loss(self, w, *, backend: str = "auto") -> np.ndarray:
        """Loss L(w), shape () or (B,)."""
        return self.loss_and_grad(w, backend=backend)[0]

    @keeps_array_type
    def grad(self, w, *, backend: str = "auto") -> np.ndarray:
        """Gradient grad L(w), shape of ``w``. Orthogonal to w (scale invariance)."""
        return self.loss_and_grad(w, backend=backend)[1]

    def _directional(self, w, v, kernel: str, power: int, backend: str) -> np.ndarray:
        """A derivative of order power + 1 contracted with v ``power`` times."""
        backend = resolve(backend, w, v, model=self)
        W, V, (single_w, single_v) = self._pair(w, v)
        (out,) = self._evaluate(backend, kernel, ((power + 1, power),), W, V, single_w, single_v)
        return self._shape(out, single_w and single_v)

    @keeps_array_type
    def hvp(self, w, v, *, backend: str = "auto") -> np.ndarray:
        """Hessian-vector product H(w) v, exact (forward-mode jets, no finite step).

        ``v`` is (D,) or (B, D); a single vector broadcasts against a batch.
        """
        return self._directional(w, v, "hvp", 1, backend)

    @keeps_array_type
    def third(self, w, v, *, backend: str = "auto") -> np.ndarray:
        """Third-order contraction D^3L(w)[v, v]: the vector d/dt H(w + t v) v at t = 0.

        With v the unit top eigenvector of H(w) this is grad lambda_1(w), the
        driving term of the sharpness-reduction flow.
        """
        return self._directional(w, v, "third", 2, backend)

    @keeps_array_type
    def hessian(self, w, *, backend: str = "auto") -> np.ndarray:
        """Dense Hessian, shape (D, D) or (B, D, D), from D HVPs per point.

        Costs D HVPs and D^2 memory per point: for D beyond a few thousand use
        ``hvp`` with an iterative eigensolver instead.
        """
        backend = resolve(backend, w, model=self)
        W, single = self._batch(w, checked=False)
        (H,) = self._evaluate(backend, "hessian", ((2, 0),), W, single_w=single)
        return self._shape(H, single)

    def random_point(self, batch: int | None = None, *, seed: int = 0, norm: float = 1.0,
                     dtype=np.float64) -> np.ndarray:
        """Gaussian random parameters rescaled to ``norm``, shape (D,) or (batch, D).

        Drawn from a stream of its own, so ``random_point(seed=0)`` is not the
        ground truth of a ``synthetic(seed=0)`` model.
        """
        rng = np.random.default_rng([as_positive_int(seed, "seed", minimum=0), 0x5EED])
        n = 1 if batch is None else as_positive_int(batch, "batch")
        w = rng.standard_normal((n, self.dim))
        w *= norm / np.linalg.norm(w, axis=1, keepdims=True)
        w = w.astype(dtype)
        return w[0] if batch is None else w

    def __repr__(self) -> str:
        params = [f"{k}={v!r}" for k, v in self.spec().items() if k != "model" and np.isscalar(v)]
        return f"{type(self).__name__}({', '.join(params + [f'dim={self.dim}'])})"

"""Input checks shared by the public API; they run before any kernel, except that the
kernel API (models/_base.py) leaves finiteness to the compiled core's own pass over the
rows and checks only the rows the core refused."""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np
from numpy.typing import DTypeLike

FLOAT_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))

# Squared row norms for which kernels run on the rows as they are: every
# intermediate (up to fourth powers of ||w|| and of 1/||w||) stays a normal float,
# so rescaling by a power of two would change no bit of the results. The compiled
# core checks the same bounds itself (_core.SAFE_NORM2, core/config.hpp's SafeNorm2; a
# test keeps them equal); outside them kernels and engine evaluate at w 2^-e.
SAFE_NORM2 = {np.dtype(np.float64): (2.0 ** -300, 2.0 ** 300),
              np.dtype(np.float32): (2.0 ** -24, 2.0 ** 24)}


def safe_rows(W: np.ndarray) -> np.ndarray:
    """(B,) bool: which rows of W (B, D) have their squared norm (summed in float64) inside
    ``SAFE_NORM2``; False for NaN, inf and zero rows."""
    lo, hi = SAFE_NORM2[W.dtype]
    n2 = np.einsum("ij,ij->i", W, W, dtype=np.float64)
    return (n2 > lo) & (n2 < hi)


def rows_in_safe_range(W: np.ndarray) -> bool:
    """Whether every row of W (B, D) has its squared norm inside ``SAFE_NORM2`` (or is
    zero, which every path flags as undefined): where a path without power-of-two
    rescaling (the reduced BN-linreg engine, the GPU tiles) may start."""
    return bool(np.all(safe_rows(W) | ~W.any(axis=1)))


def as_float_array(x: Any, name: str, dtype: DTypeLike | None = None, *,
                   finite: bool = True) -> np.ndarray:
    """Return ``x`` as a C-contiguous float32/float64 array, or raise.

    Integers are converted to float64 (or to ``dtype``); booleans, complex and
    object arrays are rejected. Non-finite entries raise ValueError, unless
    ``finite=False``: then the caller must call ``check_finite`` before the
    values are used (the kernels do, in ``models/_base.py``).
    """
    if hasattr(x, "__cuda_array_interface__"):
        # GPU arrays are validated (and, for now, computed on) as host copies.
        if not hasattr(x, "get"):
            raise TypeError(f"{name}: GPU arrays other than CuPy's are not supported; "
                            "pass a NumPy or CuPy array")
        x = x.get()
    a = host_view(x, name)
    if a.dtype.kind == "b" or a.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be a real floating or integer array, got dtype {a.dtype}")
    if dtype is None:
        dtype = a.dtype if a.dtype in FLOAT_DTYPES else np.dtype(np.float64)
    a = np.ascontiguousarray(a, dtype=dtype)
    if finite:
        check_finite(a, name)
    if _intake_hook is not None:
        _intake_hook(name, a)
    return a


#: Test hook: when set, called as ``_intake_hook(name, array)`` with every array
#: ``as_float_array`` hands on (the buffer the kernels read), so tests can check with
#: ``np.shares_memory`` that an input was read in place.
_intake_hook: Callable[[str, np.ndarray], None] | None = None


def host_view(x: Any, name: str = "x") -> np.ndarray:
    """``x`` as a NumPy array, in place where possible.

    NumPy arrays pass through. Other objects that export DLPack on the CPU (a
    ``jax.Array``, a CPU ``torch.Tensor``, ...) are read through
    ``np.from_dlpack``: the result is a view of the caller's buffer with its
    dtype and strides (read-only where the exporter says so), never a converted
    copy. A torch tensor that requires grad is read through ``detach()`` (the
    values only; nothing is recorded on the autograd tape). Anything else goes
    through ``np.asarray``.
    """
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__") and not isinstance(x, (str, bytes)):
        if getattr(x, "requires_grad", False) and hasattr(x, "detach"):
            x = x.detach()
        try:
            return np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError, ValueError) as exc:
            # A dtype NumPy lacks (bfloat16), a device NumPy cannot read, ...
            try:
                return np.asarray(x)
            except Exception:
                raise TypeError(f"{name}: cannot read this {type(x).__name__} as a NumPy "
                                f"array ({exc})") from exc
    return np.asarray(x)


def _array_library(x: Any) -> str | None:
    """"torch", "jax" or "cupy" for an array of that library, else None (NumPy, lists)."""
    if isinstance(x, np.ndarray):
        return None
    root = type(x).__module__.partition(".")[0]
    if root in ("jax", "jaxlib"):
        return "jax"
    return root if root in ("torch", "cupy") else None


def like_input(template: Any, out: Any) -> Any:
    """``out`` (an array, or a tuple of them, from a kernel) as arrays of ``template``'s
    library: a torch tensor for a torch input (sharing the NumPy result's memory), a JAX
    array for a JAX input, a CuPy array for a CuPy input; unchanged for anything else.
    Dtypes are kept."""
    library = _array_library(template)
    if library is None:
        return out
    if isinstance(out, tuple):
        return tuple(like_input(template, o) for o in out)
    if not isinstance(out, (np.ndarray, np.generic)):
        return out
    out = np.asarray(out)
    if library == "torch":
        import torch
        return torch.from_numpy(out if out.flags.writeable else out.copy())
    if library == "jax":
        import jax.numpy as jnp
        return jnp.asarray(out)
    import cupy
    return cupy.asarray(out)


_Kernel = TypeVar("_Kernel", bound=Callable[..., Any])


def keeps_array_type(method: _Kernel) -> _Kernel:
    """Decorator of a kernel method ``f(self, w, ...)``: its results come back in the
    library of ``w`` (:func:`like_input`), so a torch or JAX caller gets its own type."""

    @functools.wraps(method)
    def wrapper(self: Any, w: Any, *args: Any, **kwargs: Any) -> Any:
        return like_input(w, method(self, w, *args, **kwargs))

    return cast(_Kernel, wrapper)


def check_finite(a: np.ndarray, name: str) -> None:
    """Raise ValueError naming the first non-finite entry of ``a``."""
    if not np.all(np.isfinite(a)):
        bad = np.argwhere(~np.isfinite(a))[0]
        raise ValueError(f"{name} has a non-finite entry at index {tuple(int(i) for i in bad)}")


def as_batch(w: Any, dim: int, name: str = "w", dtype: DTypeLike | None = None, *,
             finite: bool = True) -> tuple[np.ndarray, bool]:
    """Validate parameters of shape (D,) or (B, D) (``finite`` as in ``as_float_array``).

    Returns
    -------
    batch : ndarray, shape (B, D)
        C-contiguous float32 or float64 (float64 for integer input).
    was_single : bool
        True when ``w`` was (D,), so results drop the batch axis.
    """
    a = as_float_array(w, name, dtype, finite=finite)
    if a.ndim == 1 and a.shape[0] == dim:
        return a[None, :], True
    if a.ndim == 2 and a.shape[1] == dim and a.shape[0] >= 1:
        return a, False
    raise ValueError(f"{name} must have shape ({dim},) or (B, {dim}) with B >= 1, got {a.shape}")


def check_nonzero_rows(w: np.ndarray, name: str = "w") -> None:
    """Scale-invariant losses are undefined at w = 0."""
    zero = ~np.any(w != 0, axis=-1)
    if np.any(zero):
        raise ValueError(f"{name}[{int(np.argmax(zero))}] is the zero vector; "
                         "a scale-invariant loss is undefined at w = 0")


def as_positive_int(x: Any, name: str, minimum: int = 1) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(x).__name__}")
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    return int(x)


def check_record_every(record_every: int, steps: int) -> None:
    """Refuse a record spacing beyond the run, which would record step 0 alone."""
    if steps and record_every > steps:
        raise ValueError(f"record_every = {record_every} is larger than steps = {steps}: only "
                         "step 0 would be recorded; choose record_every <= steps")


def as_real(x: Any, name: str, *, minimum: float | None = None,
            strict: bool = False) -> float:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    v = float(x)
    if not np.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if minimum is not None and (v <= minimum if strict else v < minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum}, got {v}")
    return v

"""Which implementation runs a call: dispatch and the fallback backends.

Every public kernel, sharpness and trajectory call takes
``backend="auto" | "cpp" | "cuda" | "cupy" | "numba" | "numpy"``:

- ``cpp``: the compiled C++ core ``pysharp._core`` (OpenMP over the batch).
- ``cuda``: the CUDA kernels of ``pysharp._cuda``, built when ``PYSHARP_CUDA`` is on.
- ``cupy``: the same kernel source (engine, Lanczos and the fused tiles) compiled by
  NVRTC at first use and launched through CuPy (``pip install "pysharp[cupy]"``, no nvcc);
  CuPy arrays stay on the device. Not BN linear regression's reduced engine. Not yet run on
  a device (:mod:`pysharp._backends._cupy`).
- ``numba``: ``numba.njit(parallel=True)`` ports of the C++ kernels and engine
  for the scale-invariant models, the CPU fallback when the extension is not
  built. float64 only: a float32 call is refused (BackendUnavailable), as are
  the square-loss models and SGD, which need the compiled core.
- ``numpy``: the readable reference oracles of :mod:`pysharp.reference`;
  kernels only (loss, gradient, HVP, third order, Hessian), no trajectories.

``auto`` picks ``cuda`` then ``cupy`` for arrays that live on a GPU (anything with
``__cuda_array_interface__``), and ``cpp``, then ``numba``, then ``numpy`` otherwise.

Core-only calls (SGD, the SGD stability analysis, Lanczos on a Python operator,
the square-loss models) take ``backend="auto" | "cpp"`` and refuse the others
with a message saying so (:func:`core_only`).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from .._engine import loader
from . import _jax  # imports JAX itself only when the backend is used
from ._errors import BackendUnavailable
from ._fallback import NumbaCore, NumpyCore


def _probe_cpp() -> str | None:
    return loader._import_error


def _probe_cuda() -> str | None:
    try:
        cuda = importlib.import_module("pysharp._cuda")
    except ImportError as exc:
        return (f"pysharp was built without its CUDA module ({exc}); rebuild with "
                "PYSHARP_CUDA=ON on a machine with nvcc")
    return cuda.device_error() or None


def _probe_cupy() -> str | None:
    from . import _cupy  # lazy: probing the backend is when CuPy's absence may show
    return _cupy.unavailable_reason()


def _probe_jax() -> str | None:
    return _jax.probe()


def _jax_core(model, dtype):
    loss, data, groups = model._jax_loss()
    return _jax.JaxCore(loss, data, model.dim, dtype, groups)


def _probe_numba() -> str | None:
    if importlib.util.find_spec("numba") is None:
        return "numba is not installed (pip install 'pysharp[numba]')"
    return None


def _suffix(dtype) -> str:
    return "_f64" if np.dtype(dtype) == np.float64 else "_f32"


@dataclass(frozen=True)
class Backend:
    """One backend: what it runs, and how it builds a model's kernel object.

    Attributes
    ----------
    name : str
        What ``backend=`` takes.
    probe : callable
        ``probe() -> None`` when the backend can run here, else the reason it cannot.
    trajectories : bool
        It runs the trajectory engine and Lanczos (else kernels only).
    gpu : bool
        It works on device arrays: "auto" picks it for arrays with
        ``__cuda_array_interface__``.
    reduced : bool
        It runs BN linear regression's reduced (singular-basis) engine.
    tiles : callable or None
        ``tiles()``: the module whose fused GD+WD tiles it runs where they apply
        (``_backends._tiles``), or None.
    checks_rows : bool
        Its kernels flag the rows whose magnitude needs the exact power-of-two rescaling
        (``ok`` >= 2), so the Python layer skips its own pass over the rows.
    kernels : callable
        ``kernels(model, dtype)``: the model's kernel object on this backend, through the
        model's adapter (``_make_core`` of a compiled module, ``_numba_params`` and
        ``_reference`` of the fallbacks). Only called for a model whose ``_backends``
        lists this backend.
    """

    name: str
    probe: Callable[[], str | None]
    trajectories: bool
    gpu: bool
    kernels: Callable[[Any, np.dtype], Any]
    reduced: bool = False
    checks_rows: bool = False
    tiles: Callable[[], Any] | None = None


def _cupy_module():
    from . import _cupy  # lazy: CuPy is imported only when the backend is used
    return _cupy.module()


#: Every backend, in the order ``pysharp.backends()`` reports them.
BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("cpp", _probe_cpp, trajectories=True, gpu=False, reduced=True, checks_rows=True,
            kernels=lambda m, dtype: m._make_core(_suffix(dtype), loader.core())),
    Backend("cuda", _probe_cuda, trajectories=True, gpu=True, reduced=True,
            kernels=lambda m, dtype: m._make_core(_suffix(dtype),
                                                  importlib.import_module("pysharp._cuda")),
            tiles=lambda: importlib.import_module("pysharp._cuda")),
    # direct engine only: the reduced BN-linreg engine is not ported (_cupy refuses it)
    Backend("cupy", _probe_cupy, trajectories=True, gpu=True, reduced=False,
            kernels=lambda m, dtype: m._make_core(_suffix(dtype), _cupy_module()),
            tiles=_cupy_module),
    Backend("numba", _probe_numba, trajectories=True, gpu=False,
            kernels=lambda m, dtype: NumbaCore(m._numba_params(), dtype, m._reference())),
    # XLA: kernels by JAX's autodiff, Lanczos and the engine jitted (_backends/_jax.py); the
    # models written in JAX (XlaModel) run here, a built-in only when asked or as a last resort
    Backend("jax", _probe_jax, trajectories=True, gpu=False, kernels=_jax_core),
    Backend("numpy", lambda: None, trajectories=False, gpu=False,
            kernels=lambda m, dtype: NumpyCore(m._reference(), m.dim, dtype)),
)}
NAMES = tuple(BACKENDS)
_ENGINE = tuple(name for name, b in BACKENDS.items() if b.trajectories)


@cache
def _probe(name: str) -> str | None:
    """None when ``name`` can run here, else the reason it cannot."""
    if name not in BACKENDS:
        raise ValueError(name)
    return BACKENDS[name].probe()


def model_kernels(model, dtype, backend: str) -> Any:
    """``model``'s kernel object on a resolved ``backend``: the one place where a backend
    without an adapter for the model (its class's ``_backends``) is refused."""
    if backend not in model._backends:
        name = type(model).__name__
        why = model._backends_why
        raise BackendUnavailable(
            f"the {backend} backend has no {name} port{f' ({why})' if why else ''}: {name} "
            f"runs on {', '.join(repr(b) for b in model._backends)} only; use "
            f"backend={model._backends[0]!r}")
    return BACKENDS[backend].kernels(model, np.dtype(dtype))


def backends() -> dict[str, dict]:
    """Availability of every backend on this machine.

    Returns
    -------
    dict
        name -> {"available": bool, "reason": str or None, "trajectories": bool};
        ``reason`` says why a backend is missing, ``trajectories`` whether it
        runs the trajectory engine and Lanczos (all but ``numpy``).
    """
    out = {}
    for name, b in BACKENDS.items():
        reason = _probe(name)
        out[name] = {"available": reason is None, "reason": reason,
                     "trajectories": b.trajectories}
    return out


def on_gpu(x) -> bool:
    return hasattr(x, "__cuda_array_interface__")


def resolve(backend: str, *arrays, trajectories: bool = False, model=None) -> str:
    """The concrete backend for a call on ``arrays``, or a clear error.

    Parameters
    ----------
    backend : str
        "auto" or one of ``NAMES``.
    arrays
        The call's array inputs; GPU arrays steer "auto" to the GPU backends.
    trajectories : bool
        True for calls that need the engine (trajectories, Lanczos).
    model : optional
        The model of the call: "auto" then picks among its backends (``model._backends``,
        in its order), so a model written in JAX runs on "jax" and a built-in on the
        compiled core.
    """
    if not isinstance(backend, str) or backend not in ("auto",) + NAMES:
        raise ValueError(f"backend must be 'auto' or one of {', '.join(NAMES)}, got {backend!r}")
    wanted = _ENGINE if trajectories else NAMES
    if backend == "auto":
        gpu = any(on_gpu(a) for a in arrays)
        names = NAMES if model is None else model._backends
        # a model written in JAX runs in XLA wherever its arrays live
        order = tuple(n for n in names if BACKENDS[n].gpu == gpu or n == names[0] == "jax")
        for name in order:
            if name in wanted and _probe(name) is None:
                return name
        reasons = "; ".join(f"{n}: {_probe(n)}" for n in order if n in wanted)
        where = "GPU arrays" if gpu else "this call"
        raise BackendUnavailable(f"no backend can run {where} here ({reasons})")
    if backend not in wanted:
        raise ValueError(f"backend {backend!r} offers kernels only, not trajectories or "
                         f"Lanczos; use one of {', '.join(_ENGINE)}")
    reason = _probe(backend)
    if reason is not None:
        raise BackendUnavailable(f"backend {backend!r} is not available: {reason}")
    return backend


def core_only(backend: str, what: str) -> str:
    """Resolve the ``backend`` argument of a call that only the compiled core runs.

    Parameters
    ----------
    backend : str
        "auto" or "cpp"; any other backend name is refused.
    what : str
        The call, for the messages (e.g. "run_sgd").

    Returns
    -------
    str
        "cpp".

    Raises
    ------
    ValueError
        For a backend name that is not "auto" or "cpp" (a known one is named as
        having no implementation of ``what``).
    BackendUnavailable
        When the compiled core is not built here.
    """
    if not isinstance(backend, str) or backend not in ("auto",) + NAMES:
        raise ValueError(f"backend must be 'auto' or one of {', '.join(NAMES)}, got {backend!r}")
    if backend not in ("auto", "cpp"):
        raise ValueError(f"{what} runs in the compiled core only (backend='cpp'); the "
                         f"{backend!r} backend has no implementation of it")
    reason = _probe("cpp")
    if reason is not None:
        raise BackendUnavailable(f"{what} needs the compiled core, which is not available: "
                                 f"{reason}")
    return "cpp"

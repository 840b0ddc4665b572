"""Which implementation runs a call: dispatch and the fallback backends.

Every public kernel, sharpness and trajectory call takes
``backend="auto" | "cpp" | "cuda" | "cupy" | "numba" | "numpy"``:

- ``cpp``: the compiled C++ core ``pysharp._core`` (OpenMP over the batch).
- ``cuda``: the CUDA kernels of ``pysharp._cuda``, built when ``PYSHARP_CUDA`` is on.
- ``cupy``: the same kernel source compiled at run time by ``cupy.RawModule``.
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
from functools import cache

from .. import _backend

NAMES = ("cpp", "cuda", "cupy", "numba", "numpy")
_ENGINE = ("cpp", "cuda", "cupy", "numba")  # backends that run trajectories and Lanczos


class BackendUnavailable(ImportError):
    """The requested backend cannot run here; the message says why."""


@cache
def _probe(name: str) -> str | None:
    """None when ``name`` can run here, else the reason it cannot."""
    if name == "cpp":
        return _backend._import_error
    if name == "numpy":
        return None
    if name == "numba":
        if importlib.util.find_spec("numba") is None:
            return "numba is not installed (pip install 'pysharp[numba]')"
        return None
    if name == "cuda":
        try:
            cuda = importlib.import_module("pysharp._cuda")
        except ImportError as exc:
            return (f"pysharp was built without its CUDA module ({exc}); rebuild with "
                    "PYSHARP_CUDA=ON on a machine with nvcc")
        return cuda.device_error() or None
    if name == "cupy":
        from . import _cupy  # lazy: probing the backend is when CuPy's absence may show
        return _cupy.unavailable_reason()
    raise ValueError(name)


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
    for name in NAMES:
        reason = _probe(name)
        out[name] = {"available": reason is None, "reason": reason,
                     "trajectories": name in _ENGINE}
    return out


def on_gpu(x) -> bool:
    return hasattr(x, "__cuda_array_interface__")


def resolve(backend: str, *arrays, trajectories: bool = False) -> str:
    """The concrete backend for a call on ``arrays``, or a clear error.

    Parameters
    ----------
    backend : str
        "auto" or one of ``NAMES``.
    arrays
        The call's array inputs; GPU arrays steer "auto" to the GPU backends.
    trajectories : bool
        True for calls that need the engine (trajectories, Lanczos).
    """
    if not isinstance(backend, str) or backend not in ("auto",) + NAMES:
        raise ValueError(f"backend must be 'auto' or one of {', '.join(NAMES)}, got {backend!r}")
    wanted = _ENGINE if trajectories else NAMES
    if backend == "auto":
        gpu = any(on_gpu(a) for a in arrays)
        order = ("cuda", "cupy") if gpu else ("cpp", "numba", "numpy")
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

"""Loads the compiled core, or explains why it is missing."""

from __future__ import annotations

import importlib
import multiprocessing
import os
from types import ModuleType

_core: ModuleType | None
_import_error: str | None

# libgomp's idle threads spin this many times before they sleep (its default, 300,000, is
# milliseconds on recent x86). On cores that other work shares, spinning threads take the
# time the working ones need: `pysharp reproduce central-flow --quick` took 290 s with two
# threads and 15 s with one beside two CPU-bound processes (2-core Xeon); with this spin,
# 14 s. libgomp reads its environment once, when it is loaded, so this is set before the
# core is imported, and never over the user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT.
GOMP_SPINCOUNT = 1000


def _share_the_cores() -> None:
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(GOMP_SPINCOUNT)
    # A worker process (a ProcessPoolExecutor's, Dask's) shares the machine with its sibling
    # workers: one thread each unless the pool says otherwise (pysharp sweep --workers N
    # gives each cores // N through OMP_NUM_THREADS).
    if multiprocessing.parent_process() is not None and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"


_share_the_cores()
try:
    _core = importlib.import_module("pysharp._core")
    _import_error = None
except ImportError as exc:  # a source checkout that was never built, or a broken build
    _core = None
    _import_error = (
        f"the compiled extension pysharp._core could not be imported ({exc}). "
        "Install pysharp with `pip install .` from the repository root so that "
        "CMake builds it."
    )


def core() -> ModuleType:
    """Return the compiled module ``pysharp._core``.

    Raises
    ------
    ImportError
        With the reason and the command that builds it, when the extension is absent.
    """
    if _core is None:
        raise ImportError(_import_error)
    return _core


def build_info() -> dict:
    """How the compiled core was built: OpenMP, CUDA, native tuning, compiler."""
    if _core is None:
        return {"available": False, "reason": _import_error}
    info = dict(_core.build_info())
    info["available"] = True
    info["max_threads"] = _core.max_threads()
    return info

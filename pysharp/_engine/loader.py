"""Loads the compiled core, or explains why it is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

_core: ModuleType | None
_import_error: str | None

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

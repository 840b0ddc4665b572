"""CuPy backend: the kernel source under csrc/ compiled at run time by cupy.RawModule."""

from __future__ import annotations

import importlib.util


def unavailable_reason() -> str | None:
    """None when CuPy and a CUDA device are present, else why not."""
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed (pip install 'pysharp[cupy]', e.g. cupy-cuda12x)"
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device, broken install
        return f"cupy cannot reach a CUDA device ({exc})"
    if n == 0:
        return "cupy sees no CUDA device"
    return None

"""CuPy backend (cupy.RawModule over csrc/cuda/kernels.cuh): not built yet."""

from __future__ import annotations


def unavailable_reason() -> str | None:
    """None when the CuPy backend can run here, else why not.

    Launching csrc/cuda/kernels.cuh through cupy.RawModule needs a GPU to
    develop and test against, which the project has not had yet; until then
    this backend reports itself missing rather than pretend.
    """
    return ("the CuPy RawModule backend is not implemented yet; build with "
            "PYSHARP_CUDA=ON and use backend='cuda'")

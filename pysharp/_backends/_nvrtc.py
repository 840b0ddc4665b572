"""Compile CUDA source with NVRTC (no nvcc): the CuPy backend's compiler, checked in CI.

NVRTC comes from PyPI (``pip install "pysharp[cupy]"``: cuda-bindings, nvidia-cuda-nvrtc and
nvidia-cuda-cccl, whose libcu++ headers stand in for the C++ standard library that NVRTC
lacks; see csrc/include/pysharp/core/std.hpp). Nothing here needs a GPU: a cubin for any
architecture NVRTC knows is produced on a CPU machine.

The kernels of csrc/cuda are templates; a compilation names the instantiations it wants
(``name_expressions``, e.g. ``"pysharp::cuda::loss_grad_kernel<pysharp::Toy3D<double>,
double>"``) and gets back each one's mangled name, which a module loader (cupy.RawModule,
cuModuleGetFunction) looks up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # pysharp/

# The language of the nvcc build (CMakeLists.txt: CUDA_STANDARD 17). NVRTC has no
# --expt-relaxed-constexpr; -default-device makes unannotated functions device code, and
# libcu++'s constexpr functions are __host__ __device__ already.
BASE_OPTIONS = ("-std=c++17", "-default-device")

#: Standard headers that a device-reachable file may include directly: under NVRTC each one
#: is a stand-in that includes pysharp/core/std.hpp, the one place that maps the std names
#: used to libcu++ (so a name missing there fails with NVRTC's own message).
STD_STAND_INS = ("cmath", "cstddef", "cstdint", "type_traits", "utility")


class NvrtcError(RuntimeError):
    """NVRTC is missing, or a compilation failed (``log`` holds NVRTC's messages)."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message + (f"\n{log}" if log else ""))
        self.log = log


@dataclass
class Compiled:
    """The result of :func:`compile_cuda`."""

    cubin: bytes
    arch: str
    log: str
    seconds: float
    #: name expression -> mangled (lowered) kernel name
    lowered: dict[str, str] = field(default_factory=dict)


def unavailable_reason() -> str | None:
    """None when NVRTC and the libcu++ headers can be used here, else why not."""
    try:
        _nvrtc()
        cccl_include_dir()
    except NvrtcError as exc:
        return str(exc)
    return None


@lru_cache(maxsize=1)
def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise NvrtcError(f"cuda-bindings is not installed ({exc}); "
                         "pip install 'pysharp[cupy]' brings it and NVRTC") from None
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the shared library itself is missing or broken
        raise NvrtcError(f"the NVRTC library could not be loaded ({exc}); "
                         "pip install nvidia-cuda-nvrtc") from None
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"nvrtcVersion failed: {err}")
    return nvrtc


def version() -> tuple[int, int]:
    """NVRTC's (major, minor)."""
    _, major, minor = _nvrtc().nvrtcVersion()
    return int(major), int(minor)


@lru_cache(maxsize=1)
def cccl_include_dir() -> Path:
    """The folder holding ``cuda/std/...`` (libcu++), from the nvidia-cuda-cccl wheel or a CTK."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory
        found = find_nvidia_header_directory("cccl")
    except Exception:  # cuda-pathfinder absent or too old: look in the wheel's layout
        found = None
    candidates = [Path(found)] if found else []
    try:
        import nvidia
        for root in nvidia.__path__:
            candidates += [Path(root) / "cu13" / "include" / "cccl",
                           Path(root) / "cuda_cccl" / "include"]
    except ImportError:
        pass
    for c in candidates:
        if (c / "cuda" / "std" / "type_traits").is_file():
            return c
    raise NvrtcError("libcu++ headers (cuda/std/type_traits) not found; "
                     "pip install nvidia-cuda-cccl")


def source_include_dirs() -> list[Path]:
    """pysharp's headers for device code: ``pysharp/...`` and ``cuda/kernels.cuh``.

    Installed: ``pysharp/include`` and ``pysharp/include/_bind``; in a source checkout,
    the repository's ``csrc/include`` and ``csrc``.
    """
    installed = _PACKAGE / "include"
    if (installed / "_bind" / "cuda" / "kernels.cuh").is_file():
        return [installed, installed / "_bind"]
    source = _PACKAGE.parent / "csrc"
    if (source / "cuda" / "kernels.cuh").is_file():
        return [source / "include", source]
    raise NvrtcError(f"pysharp's CUDA sources are missing (looked in {installed} and {source}); "
                     "reinstall pysharp with `pip install .`")


def _check(result, what: str, prog=None):
    err = result[0]
    nvrtc = _nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = _log(prog) if prog is not None else ""
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise NvrtcError(f"{what} failed: {msg.decode(errors='replace')}", log)
    return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)


def _log(prog) -> str:
    nvrtc = _nvrtc()
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\x00").decode(errors="replace")


def compile_cuda(source: str, *, arch: str = "sm_90", name: str = "pysharp.cu",
                 name_expressions: tuple[str, ...] | list[str] = (),
                 include_dirs: list[Path] | None = None,
                 options: tuple[str, ...] | list[str] = ()) -> Compiled:
    """Compile ``source`` to a cubin for ``arch`` (``"sm_80"``, ``"sm_90"``, ...).

    ``include_dirs`` defaults to pysharp's own (:func:`source_include_dirs`); libcu++'s is
    always added. Raises :class:`NvrtcError` with NVRTC's log when the compilation fails.
    """
    nvrtc = _nvrtc()
    dirs = list(include_dirs) if include_dirs is not None else source_include_dirs()
    dirs.append(cccl_include_dir())
    opts = [*BASE_OPTIONS, f"--gpu-architecture={arch}", *(f"-I{d}" for d in dirs), *options]
    stand_in = b'#include "pysharp/core/std.hpp"\n'
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), len(STD_STAND_INS),
                                           [stand_in] * len(STD_STAND_INS),
                                           [h.encode() for h in STD_STAND_INS]),
                  "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            _check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression")
        t0 = time.perf_counter()
        encoded = [o.encode() for o in opts]
        _check(nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded),
               f"NVRTC compilation of {name} for {arch}", prog)
        seconds = time.perf_counter() - t0
        log = _log(prog)
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        lowered = {}
        for expr in name_expressions:
            low = _check(nvrtc.nvrtcGetLoweredName(prog, expr.encode()), "nvrtcGetLoweredName")
            lowered[expr] = low.decode() if isinstance(low, bytes) else str(low)
        return Compiled(cubin=bytes(cubin), arch=arch, log=log, seconds=seconds, lowered=lowered)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)

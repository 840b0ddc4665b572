"""The CUDA engine's kernel sources and instantiations, for NVRTC (CuPy backend, CI, bench).

One place that says which kernels of csrc/cuda/kernels.cuh a model and precision use, in the
form NVRTC wants: the source text of a translation unit and the name expressions of its
template instantiations. It mirrors what csrc/cuda/executor.cuh instantiates for each model of
csrc/builtin_models.hpp and precision (tests/backends/test_nvrtc.py checks the two agree).
"""

from __future__ import annotations

import re
from pathlib import Path

#: csrc/ of a source checkout (None in an installed wheel, which ships no csrc/cuda/executor.cuh).
CSRC = Path(__file__).resolve().parents[2] / "csrc"

#: Real type of each precision suffix of pysharp._cuda's classes.
REAL = {"f64": "double", "f32": "float"}

#: Models whose reduced (spectral) trajectory kernel exists (module::has_reduced).
REDUCED = ("BNLinearRegression",)

KERNELS_SOURCE = '#include "cuda/kernels.cuh"\n'


def kernel_names(model: str, prec: str, namespace: str = "pysharp::") -> dict[str, str]:
    """Short kernel name -> NVRTC name expression, for one model and precision.

    ``namespace``: where the model's struct template lives (``"::"`` for a loaded model's,
    declared at global scope as its generated unit of ``pysharp.models.load_model`` needs).
    """
    real = REAL[prec]
    m = f"{namespace}{model}<{real}>"
    names = {
        "loss_grad": f"pysharp::cuda::loss_grad_kernel<{m}, {real}>",
        "hvp": f"pysharp::cuda::directional_kernel<1, {m}, {real}>",
        "third": f"pysharp::cuda::directional_kernel<2, {m}, {real}>",
        "hessian": f"pysharp::cuda::hessian_kernel<{m}, {real}>",
        "lanczos": f"pysharp::cuda::lanczos_kernel<{m}, {real}>",
        "trajectory": f"pysharp::cuda::trajectory_kernel<{m}, {real}>",
    }
    if model in REDUCED:
        names["spectral_trajectory"] = f"pysharp::cuda::spectral_trajectory_kernel<{real}>"
    return names


def loaded_source(header: Path) -> str:
    """The translation unit of a loaded model's engine kernels: its header, then the kernels
    (instantiated on it through :func:`kernel_names` with ``namespace="::"``)."""
    return f'#include "{header}"\n' + KERNELS_SOURCE


#: A translation unit of csrc/cuda/tile_kernels.cuh: the fused tiles the CuPy backend launches.
TILES_SOURCE = '#include "cuda/tile_kernels.cuh"\n'

#: (d, n) of the BN linear regression tile kernels compiled for a device: the instantiations
#: of csrc/cuda/tile_kernels.cu and pysharp._cuda._TILE_BN_LINREG_SHAPES (the tests check both).
BN_LINREG_TILE_SHAPES = ((40, 20), (100, 200))


def tile_kernel_names() -> dict[str, str]:
    """Short name -> NVRTC name expression of every tile kernel the CuPy backend launches.

    A new tile kernel is one entry here and one launch in ``_cupy`` (``_launch_tile``).
    """
    names = {"toy3d": "pysharp::cuda::toy3d_gd_wd_tile_kernel",
             "bn_mc": "pysharp::cuda::bn_mc_gd_wd_tile_kernel",
             "bn_mc_warp": "pysharp::cuda::bn_mc_warp_gd_wd_tile_kernel"}
    for d, n in BN_LINREG_TILE_SHAPES:
        names[f"bn_linreg_{d}_{n}"] = f"pysharp::cuda::bn_linreg_gd_wd_tile_kernel<{d}, {n}>"
    return names


def cuda_units(models_header: Path) -> list[tuple[str, str]]:
    """(model, precision) for each model of PYSHARP_BUILTIN_MODELS in csrc/builtin_models.hpp
    and each precision: the translation units of pysharp._cuda (CMakeLists.txt reads the
    same list)."""
    text = models_header.read_text()
    start = text.index("#define PYSHARP_BUILTIN_MODELS(X)")
    end = text.find("\n#", start + 1)
    body = text[start:end if end >= 0 else len(text)]
    return [(model, prec) for model in re.findall(r"X\((\w+)\)", body) for prec in REAL]


_HOST_ONLY_RE = re.compile(r'^\s*#\s*include\s*[<"](pybind11/|cuda_runtime|cuda/executor\.cuh)',
                           re.M)


def tile_sources(cuda_dir: Path | None = None) -> list[Path]:
    """The fused tile kernels' sources: csrc/cuda/*tile*.cu and *tile*.cuh, sorted.

    Host glue (a file that includes pybind11, the CUDA runtime API or cuda/executor.cuh,
    such as a binding unit) is not a kernel source and is left out: NVRTC compiles device
    code only.
    """
    d = cuda_dir or CSRC / "cuda"
    return sorted(p for p in d.glob("*tile*") if p.suffix in (".cu", ".cuh")
                  and not _HOST_ONLY_RE.search(p.read_text()))


_INSTANTIATE_RE = re.compile(r"^\s*//\s*pysharp-instantiate:\s*(.+?)\s*$", re.M)


def declared_instantiations(source: Path) -> list[str]:
    """Name expressions a source asks NVRTC to instantiate.

    A kernel source whose kernels are templates lists each instantiation to compile on a
    line ``// pysharp-instantiate: ns::kernel<Args...>``; non-template kernels need none
    (NVRTC compiles every non-template ``__global__`` function of a source).
    """
    return _INSTANTIATE_RE.findall(source.read_text())


def source_text(source: Path) -> str:
    """A translation unit that compiles ``source`` (found on the include path by its name)."""
    return f'#include "cuda/{source.name}"\n'

"""NVRTC compiles every CUDA kernel source (the CuPy backend's path), without a GPU or nvcc.

What is compiled: csrc/cuda/kernels.cuh instantiated for every (model, precision) that
csrc/builtin_models.hpp lists, to a cubin for sm_90, and one of them for sm_80 (the engine
has no architecture-dependent code); every csrc/cuda/*tile* source for both; the tile
kernels that the CuPy backend launches, by its own table. One unit (Toy3D float64, sm_90,
~20 s) and the CuPy tile unit for sm_90 (~5 s) run in the default test set; the rest is
marked slow (30-190 s of CPU a unit: each carries the whole generic engine) and .ci/run
runs it in its own bounded step with the `nvrtc` extra (cuda-bindings, nvidia-cuda-nvrtc,
nvidia-cuda-cccl). Skipped when those are not installed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pysharp._backends import _cuda_sources as cs
from pysharp._backends import _cupy, _nvrtc

pytestmark = pytest.mark.skipif(_nvrtc.unavailable_reason() is not None,
                                reason=f"NVRTC unavailable: {_nvrtc.unavailable_reason()}")

# The repository's sources (pysharp itself may be imported from an installed wheel).
CSRC = Path(__file__).resolve().parents[2] / "csrc"
INCLUDE = [CSRC / "include", CSRC]
ARCHS = ("sm_80", "sm_90")
UNITS = cs.cuda_units(CSRC / "builtin_models.hpp")
QUICK = ("Toy3D", "f64", "sm_90")


def _is_cubin_for(cubin: bytes, arch: str) -> bool:
    # An ELF file; NVIDIA's e_flags carry the SM number (bits 8-15 for sm_xx >= 50 in
    # CUDA 12 cubins, low byte in CUDA 13's): accept either layout.
    if cubin[:4] != b"\x7fELF":
        return False
    flags = int.from_bytes(cubin[48:52], "little")
    sm = int(arch[3:])
    return sm in (flags & 0xFF, (flags >> 8) & 0xFF)


def test_units_are_the_executors():
    assert len(UNITS) == 8, UNITS
    assert {m for m, _ in UNITS} == {"BNLinearRegression", "BNMatrixCompletion",
                                     "BNTwoLayerNet", "Toy3D"}
    for model, prec in UNITS:
        assert prec in cs.REAL
        assert "trajectory" in cs.kernel_names(model, prec)


#: The one engine unit also compiled for sm_80, the cheapest (~30 s of CPU): the engine's
#: kernels hold no code that depends on the architecture (only the tiles do,
#: csrc/cuda/tile_kernels.cuh and tile/warp.hpp, compiled for both), and the other units
#: cost 50-190 s each (BN linear regression's most, with its reduced engine).
SM80_UNIT = ("Toy3D", "f64")


def _unit_params():
    # sm_90 (H100/H200) for every unit; sm_80 for SM80_UNIT
    for model, prec in UNITS:
        for arch in ARCHS:
            if arch == "sm_80" and (model, prec) != SM80_UNIT:
                continue
            marks = () if (model, prec, arch) == QUICK else (pytest.mark.slow,)
            yield pytest.param(model, prec, arch, marks=marks, id=f"{model}-{prec}-{arch}")


@pytest.mark.parametrize("model,prec,arch", list(_unit_params()))
def test_engine_unit_compiles(model, prec, arch):
    names = cs.kernel_names(model, prec)
    out = _nvrtc.compile_cuda(cs.KERNELS_SOURCE, arch=arch, name=f"{model}_{prec}.cu",
                              name_expressions=list(names.values()), include_dirs=INCLUDE)
    assert _is_cubin_for(out.cubin, arch)
    # Every requested kernel was instantiated and is in the cubin under its mangled name.
    assert set(out.lowered) == set(names.values())
    for low in out.lowered.values():
        assert low.startswith("_Z") and low.encode() in out.cubin
    print(f"{model} {prec} {arch}: {out.seconds:.1f} s, cubin {len(out.cubin)} B")


def test_the_cupy_backend_launches_what_is_compiled():
    # backend="cupy" compiles each engine unit with a subset of the name expressions that
    # test_engine_unit_compiles compiles, from the same source: so those compilations cover it
    for model, prec in UNITS:
        source, names, extra_dirs = _cupy.unit(f"{model}_{prec}")
        assert source == cs.KERNELS_SOURCE and extra_dirs == ()
        assert set(names) == set(_cupy.ENGINE_KERNELS)
        assert names.items() <= cs.kernel_names(model, prec).items()


@pytest.mark.parametrize("arch", [pytest.param("sm_90"),
                                  pytest.param("sm_80", marks=pytest.mark.slow)])
def test_the_cupy_backends_tile_unit_compiles(arch):
    # exactly what _cupy compiles and looks up for the tiles (~5 s a compilation)
    source, names, _ = _cupy.unit(_cupy.TILES)
    out = _nvrtc.compile_cuda(source, arch=arch, name="tiles.cu",
                              name_expressions=list(names.values()), include_dirs=INCLUDE)
    assert _is_cubin_for(out.cubin, arch)
    assert set(out.lowered) == set(names.values())
    for low in out.lowered.values():
        assert low.startswith("_Z") and low.encode() in out.cubin


# The box's corners that an H100's or H200's 227 KB of shared memory per block reaches: d
# 128 up to n 160, n 200 up to d 104 (the shared memory of (120, 200) is 249 KB: it never
# runs), and the smallest d. ptxas near 255 registers is chaotic: shapes inside the box may
# spill a few bytes (8 B at (112, 192) today; (120, 176) spilled 24 B before top_grad came),
# which costs speed, not results.
@pytest.mark.parametrize("d, n", [pytest.param(13, 11), *(
    pytest.param(d, n, marks=pytest.mark.slow)
    for d, n in ((128, 128), (128, 160), (104, 200), (1, 200)))])
def test_a_bn_linreg_tile_of_any_shape_in_the_box_compiles_without_spills(d, n):
    # backend="cupy" compiles the tile for the model's own (d, n); the box's corners
    # (_cupy.BN_LINREG_TILE_MAX_D/N) must compile with no stack frame and no spill
    assert d <= _cupy.BN_LINREG_TILE_MAX_D and n <= _cupy.BN_LINREG_TILE_MAX_N
    assert _cupy.bn_linreg_tile_smem_bytes(d, n) <= 232448
    source, names, _ = _cupy.unit(_cupy.bn_linreg_unit(d, n))
    out = _nvrtc.compile_cuda(source, arch="sm_90", name="tile.cu",
                              name_expressions=list(names.values()), include_dirs=INCLUDE,
                              options=["--ptxas-options=-v"])
    assert _is_cubin_for(out.cubin, "sm_90") and set(out.lowered) == set(names.values())
    report = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                        r"(\d+) bytes spill loads", out.log)
    assert report and all(v == ("0", "0", "0") for v in report), out.log


@pytest.mark.slow
def test_a_loaded_models_unit_compiles():
    # a header of the user's (examples/models), exactly as backend="cupy" registers and
    # compiles it: the header, then the engine, instantiated on ::PhaseRetrieval<double>
    header = CSRC.parent / "examples" / "models" / "phase_retrieval.hpp"
    name = _cupy.loaded_unit(header, "PhaseRetrieval", "f64")
    source, names, extra_dirs = _cupy.unit(name)
    assert source.startswith(f'#include "{header}"') and extra_dirs == (header.parent,)
    assert set(names) == set(_cupy.ENGINE_KERNELS)
    assert all(e.endswith("::PhaseRetrieval<double>, double>") for e in names.values())
    out = _nvrtc.compile_cuda(source, arch="sm_90", name=f"{name}.cu",
                              name_expressions=list(names.values()),
                              include_dirs=[*INCLUDE, *extra_dirs])
    assert _is_cubin_for(out.cubin, "sm_90") and set(out.lowered) == set(names.values())
    for low in out.lowered.values():
        assert low.startswith("_Z") and low.encode() in out.cubin

def test_an_edited_header_is_another_unit(tmp_path):
    header = tmp_path / "phase_retrieval.hpp"
    original = (CSRC.parent / "examples" / "models" / "phase_retrieval.hpp").read_text()
    header.write_text(original)
    first = _cupy.loaded_unit(header, "PhaseRetrieval", "f64")
    assert _cupy.loaded_unit(header, "PhaseRetrieval", "f64") == first
    header.write_text(original + "// edited\n")
    edited = _cupy.loaded_unit(header, "PhaseRetrieval", "f64")
    assert edited != first and _cupy.unit(edited)[0] == _cupy.unit(first)[0]  # same path


def _tile_params():
    for src in cs.tile_sources(CSRC / "cuda"):
        for arch in ARCHS:
            yield pytest.param(src, arch, marks=pytest.mark.slow, id=f"{src.name}-{arch}")


@pytest.mark.parametrize("source,arch", list(_tile_params()))
def test_tile_source_compiles(source, arch):
    names = cs.declared_instantiations(source)
    out = _nvrtc.compile_cuda(cs.source_text(source), arch=arch, name=source.name,
                              name_expressions=names, include_dirs=INCLUDE)
    assert _is_cubin_for(out.cubin, arch)
    assert b".text." in out.cubin, f"{source.name} compiled to no kernel"


def test_a_broken_source_fails_with_nvrtcs_log():
    src = ('#include "pysharp/core/config.hpp"\n'
           "__global__ void k(double* x) { x[0] = undeclared; }\n")
    with pytest.raises(_nvrtc.NvrtcError) as info:
        _nvrtc.compile_cuda(src, arch="sm_90", name="broken.cu", include_dirs=INCLUDE)
    assert "broken.cu" in info.value.log and "undeclared" in info.value.log
    assert "sm_90" in str(info.value)


def test_std_names_come_only_from_the_shim():
    # NVRTC has no standard library: a std name that core/std.hpp does not map fails, so a
    # device-reachable header that starts using one fails here until the shim lists it.
    ok = ('#include "pysharp/core/std.hpp"\n'
          "__global__ void k(std::uint64_t* x) { x[0] = std::is_same<int, int>::value; }\n")
    assert _nvrtc.compile_cuda(ok, arch="sm_90", include_dirs=INCLUDE).cubin
    bad = ('#include "pysharp/core/std.hpp"\n'
           "__global__ void k(int* x) { x[0] = std::is_pointer<int*>::value; }\n")
    with pytest.raises(_nvrtc.NvrtcError, match="is_pointer"):
        _nvrtc.compile_cuda(bad, arch="sm_90", include_dirs=INCLUDE)


def test_a_direct_standard_include_goes_through_the_shim():
    src = ("#include <cstdint>\n#include <type_traits>\n"
           "__global__ void k(std::uint64_t* x) { x[0] = std::is_same<int, int>::value; }\n")
    assert _nvrtc.compile_cuda(src, arch="sm_90", include_dirs=INCLUDE).cubin

"""The CuPy backend (pysharp/_backends/_cupy.py): what a CPU machine can check, and the device
checks (marked gpu) that no run has executed yet.

Without a GPU: the backend says truthfully why it cannot run; every struct it passes by value
has the byte layout C++ gives it (g++ prints sizeof/offsetof; nvcc lays these plain structs
out the same on x86-64); its scratch sizes, record shapes and tile launch arithmetic equal the
C++ functions they mirror (g++, and NVRTC for the device-only header); its argument checks
refuse what pysharp._core's C++ checks refuse; its module has pysharp._cuda's tile surface.
With CuPy and a device (pytest -m gpu): the kernels, Lanczos, the engine and the tiles match
the compiled CPU core on CuPy and NumPy arrays, launches follow CuPy's current stream, and
bits equal the nvcc-built CUDA backend's where both are present.
"""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _cases import SCALE_INVARIANT

import pysharp as ps
from pysharp._backends import BACKENDS, BackendUnavailable, _cupy, _nvrtc
from pysharp._backends import _cuda_sources as cs
from pysharp._engine import EngineConfig, LanczosOptions, Method, records
from pysharp.models import REGISTRY

CSRC = Path(__file__).resolve().parents[2] / "csrc"
#: The registered built-ins that say they run on CuPy: each must have a CuPy core class.
MODELS = tuple(REGISTRY[name].cls.__name__ for name in SCALE_INVARIANT
               if "cupy" in REGISTRY[name].cls._backends)
HEADERS = ("models/toy3d", "models/bn_linear_regression", "models/bn_matrix_completion",
           "models/bn_two_layer_net", "engine/trajectory", "tile/gd_wd_io", "tile/bn_linreg",
           "tile/bn_mc", "tile/bn_mc_warp")
# the repository's sources beside the tests (not a copy of tests/ alone, as
# tools/mutation.py's scratch)
needs_sources = pytest.mark.skipif(not (CSRC / "include").is_dir(),
                                   reason="needs csrc/ and examples/ beside the tests")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None or not (CSRC / "include").is_dir(),
                               reason="needs g++ and csrc/ beside the tests")


def _run_cpp(tmp_path, body: list[str]) -> list[str]:
    """Compile and run a C++ main() over pysharp's headers; its output lines."""
    src = tmp_path / "probe.cpp"
    src.write_text("\n".join(["#include <cstddef>", "#include <cstdio>",
                              *(f'#include "pysharp/{h}.hpp"' for h in HEADERS),
                              "int main() {", *body, "}"]) + "\n")
    exe = tmp_path / "probe"
    subprocess.run(["g++", "-std=c++17", f"-I{CSRC / 'include'}", str(src), "-o", str(exe)],
                   check=True)
    return subprocess.run([str(exe)], check=True, capture_output=True,
                          text=True).stdout.splitlines()


def test_the_backend_says_why_it_cannot_run():
    reason = ps.backends()["cupy"]["reason"]
    assert reason == _cupy.unavailable_reason() == _cupy.device_reason()
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert "cupy is not installed" in reason


def test_the_backend_entry_is_truthful():
    b = BACKENDS["cupy"]
    assert b.gpu and b.trajectories and b.tiles is not None
    assert not b.reduced  # the reduced BN-linreg engine is not ported
    assert not b.checks_rows  # its kernels do not flag rows for rescaling (ok is 0 or 1)


# -- layouts and arithmetic against the C++ ----------------------------------------------------

@needs_gxx
def test_struct_layouts_match_cpp(tmp_path):
    body = []
    for name, cpp in _cupy.CPP_STRUCTS.items():
        for real in ("double", "float"):
            t = cpp.format(real=real)
            names = _cupy.struct_dtype(name).names
            offs = " ".join("%zu" for _ in names)
            args = ", ".join(f"offsetof({t}, {f})" for f in names)
            body.append(f'  std::printf("{name} {real} %zu {offs}\\n", sizeof({t}), {args});')
    for real in ("double", "float"):
        for n in (1, 2):  # the jets buffers are (order + 1) Reals each
            body.append(f'  std::printf("Jet {real} %zu {n}\\n", '
                        f'sizeof(pysharp::Jet<{real}, {n}>));')
    lines = _run_cpp(tmp_path, body)
    assert len(lines) == 2 * len(_cupy.CPP_STRUCTS) + 4
    for line in lines:
        name, real, size, *offsets = line.split()
        r = np.float64 if real == "double" else np.float32
        if name == "Jet":
            assert int(size) == (int(offsets[0]) + 1) * np.dtype(r).itemsize
            continue
        dt = _cupy.struct_dtype(name, r)
        assert dt.itemsize == int(size), (name, real)
        assert [dt.fields[f][1] for f in dt.names] == [int(o) for o in offsets], (name, real)


def _config_dict(D, **kw) -> dict:
    lz = LanczosOptions.for_dim(D, 1, kw.pop("max_iter", None), tol=1e-10, seed=0,
                                name="lanczos_max_iter")
    return EngineConfig(Method.GD_WD, steps=kw.pop("steps", 100), lanczos=lz, **kw).to_core()


def _config(D, **kw) -> np.void:
    return _cupy.engine_config(_config_dict(D, **kw), D)


SCRATCH_CASES = [(3, {}), (40, {"top_k": 3}), (80, {"top_k": 5, "max_iter": 20}),
                 (7, {"top_k": 2, "max_iter": 4})]


def _host_args(model: str, rng) -> tuple:
    """Constructor arguments of pysharp._core's (and pysharp._cuda's) class of a built-in,
    as the models pass them, with the C++ aggregate of the same sizes for the g++ probe."""
    Xc, u = rng.random((7, 5)), rng.random(7)
    return {"Toy3D": ("{1.0}", (1.0,)),
            "BNLinearRegression": ("{nullptr, nullptr, 1, 1, 7, 5}",
                                   (Xc, u, 1.0, np.ones(1), np.zeros(1), np.ones((5, 1)), 0.0)),
            "BNMatrixCompletion": ("{nullptr, nullptr, nullptr, 1, 9, 4, 3, 2}",
                                   (np.arange(9) % 4, np.arange(9) % 3, np.ones(9), 1.0, 4, 3,
                                    2)),
            "BNTwoLayerNet": ("{nullptr, nullptr, 1, 1, 6, 4, 3}",
                              (rng.random((6, 4)), rng.random(6), 3, 0))}[model]


@needs_gxx
def test_the_plan_is_the_headers_scratch_sizes(tmp_path):
    # what the CuPy backend allocates for a run and a Lanczos solve: the host core's plan,
    # against the header functions the CUDA executor sizes its buffers with
    _core = pytest.importorskip("pysharp._core")
    rng = np.random.default_rng(0)
    body = []
    for D, kw in SCRATCH_CASES:
        c = _config(D, **kw)
        body += ["  {", "    pysharp::EngineConfig c;",
                 f"    c.top_k = {int(c['top_k'])}; c.lanczos.k = 1;",
                 f"    c.lanczos.max_iter = {int(c['lanczos']['max_iter'])};",
                 f"    pysharp::BNLinearRegression<double> m{{nullptr, nullptr, 1, 1, 6, {D}}};",
                 '    std::printf("%lld %lld %lld %d\\n", pysharp::trajectory_scratch_reals('
                 f"{D}, c), pysharp::lanczos_scratch_size({D}, c.lanczos), "
                 "pysharp::FullSpaceState<pysharp::BNLinearRegression<double>, double>::"
                 "scratch_size(m), pysharp::jet_scratch_size(m));", "  }"]
    for (D, kw), line in zip(SCRATCH_CASES, _run_cpp(tmp_path, body)):
        traj, lz, state, jets = (int(x) for x in line.split())
        Xc = rng.standard_normal((6, D))
        host = _core.BNLinearRegression_f64(Xc, rng.random(6), 1.0, np.ones(1), np.zeros(1),
                                            np.ones((D, 1)), 0.0)
        config = _config_dict(D, **kw)
        plan = host.plan(4, config, lanczos=config["lanczos"])
        assert (plan["trajectory_reals"], plan["lanczos_reals"]) == (traj, lz), (D, kw)
        assert (plan["state_reals"], plan["jets"], plan["dim"]) == (state, jets, D), (D, kw)
        assert "outputs" not in host.plan(4) and "lanczos_reals" not in host.plan(4, config)


@needs_gxx
@pytest.mark.parametrize("real", [np.float64, np.float32])
def test_the_host_layout_is_the_struct_the_kernels_take(tmp_path, real):
    # every built-in the CuPy backend runs: the host core's struct (what CuPy copies to the
    # kernel argument) has the size, alignment and array offsets g++ gives the model, the
    # sizes its plan gives are the model's, and its arrays are the data in the precision
    _core = pytest.importorskip("pysharp._core")
    assert set(MODELS) <= set(_core.BUILTIN_MODELS)
    t = "double" if real == np.float64 else "float"
    rng = np.random.default_rng(0)
    cases = {m: _host_args(m, rng) for m in MODELS}
    hosts = {m: getattr(_core, f"{m}{'_f64' if real == np.float64 else '_f32'}")(*args)
             for m, (_, args) in cases.items()}
    body = []
    for m, host in hosts.items():
        arrays = [name for name, _ in host._layout["arrays"]]
        offs = "".join(" %zu" for _ in arrays)
        args = "".join(f", offsetof(pysharp::{m}<{t}>, {a})" for a in arrays)
        body.append(f"  {{ pysharp::{m}<{t}> x{cases[m][0]}; "
                    f'std::printf("{m} %zu %zu %d %d %d{offs}\\n", sizeof x, alignof(decltype(x)), '
                    f"x.dim(), x.work_size(), pysharp::n_groups(x){args}); }}")
    for line in _run_cpp(tmp_path, body):
        m, *got = line.split()
        host = hosts[m]
        layout, plan = host._layout, host.plan(0)
        size, align, dim, work, groups, *offsets = (int(v) for v in got)
        assert (layout["size"], layout["align"]) == (size, align) == (len(layout["bytes"]),
                                                                      align), m
        assert (plan["dim"], plan["work_size"], plan["groups"]) == (dim, work, groups), m
        assert [off for _, off in layout["arrays"]] == offsets, m
        for (name, _), a in zip(layout["arrays"], cases[m][1]):
            data = layout["data"][name]
            want = np.asarray(a)
            assert data.dtype == (real if want.dtype.kind == "f" else np.int32), (m, name)
            np.testing.assert_array_equal(data, want.astype(data.dtype), err_msg=f"{m} {name}")


class _FakeCupy:
    """What _CupyCore's constructor asks of CuPy, on the host: device 0, arrays whose address
    is their index among the copies plus one."""

    class cuda:
        class Device:
            id = 0

        @staticmethod
        def get_current_stream():
            return type("Stream", (), {"synchronize": staticmethod(lambda: None)})()

    def __init__(self):
        self.copies: list[np.ndarray] = []

    def asarray(self, a):
        self.copies.append(np.array(a))
        addr = len(self.copies)
        return type("Array", (), {"size": a.size, "data": type("P", (), {"ptr": addr})()})()


def test_a_builtins_device_struct_is_its_host_struct_with_device_addresses(monkeypatch):
    # the struct a CuPy core passes its kernels, built on the host: the bytes of pysharp._core's
    # struct (derived fields as the CPU core computes them) but for each array's pointer, now
    # its device copy's address; the built-in's classes are pysharp._core's, by name
    _core = pytest.importorskip("pysharp._core")
    fake = _FakeCupy()
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)
    rng = np.random.default_rng(1)
    for m in MODELS:
        args = _host_args(m, rng)[1]
        core = getattr(_cupy.module(), f"{m}_f32")(*args)
        layout = getattr(_core, f"{m}_f32")(*args)._layout
        raw = bytearray(layout["bytes"])
        for k, (name, off) in enumerate(layout["arrays"]):
            addr = len(fake.copies) - len(layout["arrays"]) + k + 1
            raw[off:off + 8] = addr.to_bytes(8, "little")
            np.testing.assert_array_equal(fake.copies[addr - 1], layout["data"][name])
        assert core._struct.tobytes() == bytes(raw), m
        assert (core.dim, core.real, core._unit()) == (core._host.dim, np.float32, f"{m}_f32")
    with pytest.raises(AttributeError):
        _ = _cupy.module().LinearRegression_f64  # a square-loss model has no device engine
    with pytest.raises(ValueError, match="observation index out of range"):
        _cupy.module().BNMatrixCompletion_f64(np.array([4]), np.array([0]), np.ones(1), 1.0,
                                              4, 3, 2)


@needs_gxx
def test_bn_mc_tile_arithmetic_matches_cpp(tmp_path):
    cases = [(D, N, smem) for D in (3, 40, 80, 200, 254, 255, 400) for N in (2, 9, 100, 160)
             for smem in (48 * 1024, 99 * 1024, 163 * 1024, 227 * 1024)]
    body = [f'  std::printf("%d %d\\n", pysharp::tile::bn_mc_thread_doubles({D}, {N}), '
            f"int(pysharp::tile::bn_mc_tile_fits({D}, {N}, {smem})));" for D, N, smem in cases]
    for (D, N, smem), line in zip(cases, _run_cpp(tmp_path, body)):
        doubles, fits = (int(v) for v in line.split())
        assert _cupy.bn_mc_thread_doubles(D, N) == doubles == (2 * D + N + 1) | 1
        assert _cupy.bn_mc_tile_fits(D, N, smem) == bool(fits), (D, N, smem)
        if fits:  # bind_tile.cu's block: whole warps of scratches, at most kTileThreads
            threads, bytes_ = _cupy.bn_mc_tile_block(D, N, smem)
            per = doubles * 8
            assert threads % 32 == 0 and 32 <= threads <= 256 and bytes_ == threads * per
            assert bytes_ <= smem and (threads == 256 or (threads + 32) * per > smem)


@needs_gxx
def test_bn_mc_warp_tile_arithmetic_matches_cpp(tmp_path):
    cases = [(D, N, smem) for D in (1, 800, 14000, 14300) for N in (1, 2, 200, 400)
             for smem in (99 * 1024, 227 * 1024)]
    body = [f'  std::printf("%lld %d\\n", pysharp::tile::bn_mc_warp_doubles({D}, {N}), '
            f"int(pysharp::tile::bn_mc_warp_tile_fits({D}, {N}, {smem})));"
            for D, N, smem in cases]
    for (D, N, smem), line in zip(cases, _run_cpp(tmp_path, body)):
        doubles, fits = (int(v) for v in line.split())
        assert _cupy.bn_mc_warp_doubles(D, N) == doubles == 2 * D + N + 1
        assert _cupy.bn_mc_warp_tile_fits(D, N, smem) == bool(fits), (D, N, smem)


def test_bn_mc_warp_block_puts_the_most_warps_on_a_multiprocessor():
    per_warp = _cupy.bn_mc_warp_doubles(800, 200) * 8  # 14416 bytes
    sm = 228 * 1024  # an H100/H200 multiprocessor's shared memory

    def resident(warps, smem):  # blocks that fit a multiprocessor, times their warps
        return sm // smem * warps

    warps, smem = _cupy.bn_mc_warp_block(800, 200, 227 * 1024, resident)
    assert smem == warps * per_warp and resident(warps, smem) == max(
        resident(w, w * per_warp) for w in range(1, 9))
    assert warps == 8 or resident(warps, smem) > resident(8, 8 * per_warp)
    # a device whose block holds 3 scratches: at most 3 warps a block
    assert _cupy.bn_mc_warp_block(800, 200, 3 * per_warp + 7, resident)[0] <= 3


def test_bn_linreg_tile_runs_in_the_spill_free_box_where_its_memory_fits():
    optin = 227 * 1024
    assert _cupy.bn_linreg_tile_fits(40, 20, optin, 90)
    assert _cupy.bn_linreg_tile_fits(13, 11, optin, 80)  # a shape of its own, any d and n
    assert _cupy.bn_linreg_tile_fits(104, 200, optin, 90)  # 221 KB
    assert not _cupy.bn_linreg_tile_fits(40, 20, optin, 75)  # no FP64 mma
    assert not _cupy.bn_linreg_tile_fits(129, 8, optin, 90)  # out of the box: it would spill
    assert not _cupy.bn_linreg_tile_fits(64, 201, optin, 90)
    assert not _cupy.bn_linreg_tile_fits(8, 1, optin, 90)  # BatchNorm needs n >= 2
    assert not _cupy.bn_linreg_tile_fits(128, 200, optin, 90)  # 272 KB of shared memory
    assert not _cupy.bn_linreg_tile_fits(100, 200, 163 * 1024, 80)  # an A100's block
    # a shape the tiles' unit holds is launched from it; any other from a unit of its own
    assert _cupy.bn_linreg_unit(40, 20) == _cupy.TILES
    source, names, _ = _cupy.unit(_cupy.bn_linreg_unit(13, 11))
    assert source == cs.TILES_SOURCE
    assert names == {"bn_linreg_13_11": "pysharp::cuda::bn_linreg_gd_wd_tile_kernel<13, 11>"}


def test_the_compiled_modules_say_which_bn_linreg_shapes_they_hold():
    _core = pytest.importorskip("pysharp._core")
    for d, n in [(40, 20), (100, 200), (13, 11), (41, 20), (8, 2)]:
        assert _core._tile_bn_linreg_fits(d, n) == ((d, n) in _core._TILE_BN_LINREG_SHAPES)


@pytest.mark.parametrize("size, rank, n_obs", [(20, 20, None), (11, 5, 12), (9, 40, 30)])
def test_bn_mc_warp_terms_are_the_cores(size, rank, n_obs):
    """The NumPy table the backend uploads is the C++ one (tile::BNMcWarpTerms) that the
    CPU emulation of the same tile runs on (tests/csrc/test_tile.py checks that one):
    D 800, a model with unseen factor rows, and rank 40 (a row over more than one pass)."""
    _core = pytest.importorskip("pysharp._core")
    m = ps.BNMatrixCompletion.synthetic(size=size, true_rank=2, rank=rank, n_obs=n_obs, seed=4)
    args = (m.rows, m.cols, m.shape[0], m.shape[1], m.rank)
    for got, want in zip(_cupy.bn_mc_warp_terms(*args), _core._tile_bn_mc_warp_terms(*args)):
        assert got.dtype == np.int32 and got.tolist() == want.tolist()


@needs_sources
@pytest.mark.skipif(_nvrtc.unavailable_reason() is not None, reason="needs NVRTC")
def test_tile_constants_match_the_kernel_header():
    # tile_kernels.cuh is device code (DeviceWarp): NVRTC evaluates its constexpr functions
    asserts = [f"static_assert(pysharp::cuda::bn_linreg_tile_smem_bytes<{d}, {n}>() == "
               f"{_cupy.bn_linreg_tile_smem_bytes(d, n)}, \"smem {d} {n}\");"
               for d, n in cs.BN_LINREG_TILE_SHAPES]
    asserts += [f"static_assert(pysharp::cuda::kTileWarps == {_cupy.TILE_WARPS}, \"warps\");",
                f"static_assert(pysharp::cuda::kTileThreads == {_cupy.TILE_THREADS}, \"thr\");",
                f"static_assert(pysharp::tile::kBnMcMaxThreadDoubles == "
                f"{_cupy.BN_MC_MAX_THREAD_DOUBLES}, \"bn_mc cap\");",
                f"static_assert(pysharp::kLanczosMaxIter == {_cupy.LANCZOS_MAX_ITER}, \"lz\");"]
    src = cs.TILES_SOURCE + '#include "pysharp/engine/lanczos.hpp"\n' + "\n".join(asserts)
    _nvrtc.compile_cuda(src, arch="sm_90", name="constants.cu",
                        include_dirs=[CSRC / "include", CSRC])
    # d 100 n 200 parks w (221 KB, over the 48 KB default: opted in); d 40 n 20 does not
    assert _cupy.bn_linreg_tile_smem_bytes(100, 200) == 221248
    assert _cupy.bn_linreg_tile_smem_bytes(40, 20) == (24 * 40 + 24) * 8


def test_launch_arithmetic():
    assert [_cupy.blocks_for(n) for n in (0, 1, 128, 129)] == [0, 1, 1, 2]
    assert _cupy.launch_chunk(10, 100, 4000) == 10 and _cupy.launch_chunk(100, 100, 4000) == 10
    assert _cupy.launch_chunk(5, 10 ** 9, 0) == 1  # never zero
    assert _cupy.persistent_blocks(10, 132, 2) == 10 and _cupy.persistent_blocks(999, 132, 2) == 264
    with pytest.raises(ValueError, match="does not fit"):
        _cupy.persistent_blocks(1, 132, 0)


def test_the_plans_outputs_are_what_run_returns():
    # shapes, dtypes and keys of every record in the plan the CuPy backend allocates from,
    # against pysharp._core's run on the same config
    _core = pytest.importorskip("pysharp._core")  # noqa: F841
    net = ps.BNTwoLayerNet.synthetic(n=6, d=3, width=2, seed=0)
    W0 = net.random_point(3, seed=1)
    host = net._core(np.dtype(np.float64))
    for kw in ({}, {"sharpness_every": 10, "theta_every": 25, "top_k": 2},
               {"sharpness_every": 0, "top_k": 2}, {"sharpness_every": 5}):
        lz = LanczosOptions.for_dim(net.dim, 1, None, tol=1e-10, seed=0, name="m")
        cfg = EngineConfig(Method.GD_WD, steps=50, record_every=5, lanczos=lz, **kw)
        ref = host.run(W0, {"lr": np.full(3, 0.1), "wd": np.full(3, 1e-3)}, cfg.to_core())
        plan = host.plan(3, cfg.to_core())
        for name, a in ref.items():
            assert plan["outputs"][name] == (a.shape, a.dtype), (name, kw)
        assert set(plan["outputs"]) - set(ref) <= {"top_eigenvalues"}
        # the keys run returns, in order: the top_k eigenvalues even with no sharpness step
        assert plan["result_names"] == list(ref), kw
        assert [r.name for r in records.RECORDS] == list(plan["outputs"])
    # no top-k solve: its record is allocated empty and left out of the result
    assert plan["outputs"]["top_eigenvalues"][0] == (0, 3, 1) and plan["top_k"] == 0


# -- argument checks, before any launch: what the C++ refuses, refused here too --------------

def _toy_engine_config(**change) -> dict:
    lz = LanczosOptions.for_dim(3, 1, None, tol=1e-10, seed=0, name="m").to_core()
    c = EngineConfig(Method.GD_WD, steps=10).to_core()
    c["lanczos"] = lz
    for k, v in change.items():
        d, key = (c["lanczos"], k[3:]) if k.startswith("lz_") else (c, k)
        if v is None:
            del d[key]
        else:
            d[key] = v
    return c


BAD_CONFIGS = [{"method": 9}, {"steps": -1}, {"record_every": 0}, {"sharpness_every": -2},
               {"theta_every": -1}, {"top_k": 1}, {"top_k": 4}, {"lz_k": 2}, {"lz_smallest": True},
               {"lz_max_iter": 4}, {"lz_max_iter": 0}, {"extra": 1}, {"seed": None},
               {"lz_tol": None}]


@pytest.mark.parametrize("change", BAD_CONFIGS, ids=lambda c: ",".join(map(str, c.items())))
def test_engine_config_refuses_what_cpp_refuses(change):
    _core = pytest.importorskip("pysharp._core")
    config = _toy_engine_config(**change)
    W0, hyper = np.ones((2, 3)), {"lr": np.full(2, 0.1), "wd": np.zeros(2)}
    with pytest.raises(ValueError) as cpp:
        _core.Toy3D_f64(1.0).run(W0, hyper, config)
    with pytest.raises(ValueError) as here:
        _cupy.engine_config(config, 3)
    assert str(here.value) == str(cpp.value)


def test_engine_config_accepts_what_cpp_accepts():
    for change in ({}, {"top_k": 3}, {"sharpness_every": 5, "lz_max_iter": 2}):
        c = _cupy.engine_config(_toy_engine_config(**change), 3)
        assert c["lanczos"]["k"] == 1 and c["steps"] == 10
        for k, v in change.items():
            assert (c["lanczos"][k[3:]] if k.startswith("lz_") else c[k]) == v


def test_reduced_is_refused_naming_the_backends_that_run_it():
    with pytest.raises(BackendUnavailable, match="backend='cuda' or 'cpp'"):
        _cupy.engine_config(_toy_engine_config(reduced=True), 3)


def test_lanczos_options_refuse_what_cpp_refuses():
    _core = pytest.importorskip("pysharp._core")
    good = LanczosOptions.for_dim(3, 2, None, tol=1e-8, seed=5).to_core()
    o = _cupy.lanczos_options(good, 3)
    assert (o["k"], o["max_iter"], o["seed"], o["tol"]) == (2, 3, 5, 1e-8)
    for change in ({"k": 0}, {"k": 4}, {"max_iter": 1}, {"max_iter": 4}, {"nope": 1}):
        bad = {**good, **change}
        with pytest.raises(ValueError) as cpp:
            _core.Toy3D_f64(1.0).lanczos(np.ones((1, 3)), bad)
        with pytest.raises(ValueError) as here:
            _cupy.lanczos_options(bad, 3)
        assert str(here.value) == str(cpp.value), change


def test_seeds_outside_64_bits_are_refused():
    # pysharp._core refuses them too, but only as a failed cast (RuntimeError)
    for seed in (-1, 2 ** 64):
        with pytest.raises(ValueError, match=r"seed must be in \[0, 2\^64\)"):
            _cupy.engine_config(_toy_engine_config(seed=seed), 3)
        with pytest.raises(ValueError, match=r"seed must be in \[0, 2\^64\)"):
            _cupy.lanczos_options({**_toy_engine_config()["lanczos"], "seed": seed}, 3)
    assert _cupy.engine_config(_toy_engine_config(seed=2 ** 64 - 1), 3)["seed"] == 2 ** 64 - 1


def test_the_bn_linreg_tile_checks_its_data_before_the_device():
    bad = [(np.ones(3), np.ones(3)), (np.ones((3, 2)), np.ones(2)), (np.ones((3, 2)),
                                                                      np.ones((3, 1)))]
    for Xc, u in bad:
        with pytest.raises(ValueError, match=r"Xc must be \(n, d\) and u \(n,\)"):
            _cupy.tile_bn_linreg_gd_wd(Xc, u, 1.0, np.ones((1, 2)), np.ones(1), np.ones(1), 1, 1)


def test_hyperparameters_are_exactly_the_methods():
    got = _cupy.hyperparameter_arrays({"eta": np.ones(4), "c": np.ones(4)}, 4, 4)
    assert list(got) == ["eta", "c"]  # Hyperparameters' field order
    with pytest.raises(ValueError, match="lacks the field 'wd'"):
        _cupy.hyperparameter_arrays({"lr": np.ones(4)}, 0, 4)
    with pytest.raises(ValueError, match="unknown field 'eta'"):
        _cupy.hyperparameter_arrays({"lr": np.ones(4), "wd": np.ones(4), "eta": 1}, 0, 4)
    with pytest.raises(ValueError, match="one entry per trajectory"):
        _cupy.hyperparameter_arrays({"lr": np.ones(3), "wd": np.ones(4)}, 0, 4)


# -- the tile surface: pysharp._cuda's, at its shapes -------------------------------------------

def test_tile_functions_have_the_cuda_modules_signatures():
    stub = (Path(ps.__file__).parent / "_cuda.pyi").read_text()
    want = {}
    for name, params in re.findall(r"^def (_tile_\w+)\(\s*(.*?)\)\s*->", stub, re.S | re.M):
        want[name] = re.findall(r"(?:^|,)\s*(\w+)\s*:", params)
    assert set(want) == {"_tile_toy3d_gd_wd", "_tile_bn_mc_gd_wd", "_tile_bn_mc_fits",
                         "_tile_bn_mc_warp_gd_wd", "_tile_bn_mc_warp_fits",
                         "_tile_bn_linreg_fits",
                         "_tile_bn_linreg_gd_wd"}
    for name, params in want.items():
        fn = getattr(_cupy._Module, name)
        assert list(inspect.signature(fn).parameters) == params, name
    shapes = re.search(r"^_TILE_BN_LINREG_SHAPES: list = (.*)$", stub, re.M).group(1)
    assert _cupy._Module._TILE_BN_LINREG_SHAPES == eval(shapes)  # a literal list of tuples


@needs_sources
def test_bn_linreg_tile_shapes_are_the_instantiated_ones():
    text = (CSRC / "cuda" / "tile_kernels.cu").read_text()
    inst = {(int(d), int(n)) for d, n in
            re.findall(r"bn_linreg_gd_wd_tile_kernel<(\d+), (\d+)>", text)}
    assert set(cs.BN_LINREG_TILE_SHAPES) == inst
    names = cs.tile_kernel_names()
    assert {f"bn_linreg_{d}_{n}" for d, n in inst} <= set(names)
    _core = pytest.importorskip("pysharp._core")
    assert set(cs.BN_LINREG_TILE_SHAPES) <= {tuple(s) for s in _core._TILE_BN_LINREG_SHAPES}


# -- models compiled at run time (load_model) ---------------------------------------------------

PHASE = CSRC.parent / "examples" / "models" / "phase_retrieval.hpp"


@pytest.fixture(scope="module")
def phase():
    pytest.importorskip("pysharp._core")
    if not PHASE.is_file():
        pytest.skip("needs examples/ beside the tests")
    rng = np.random.default_rng(0)
    X, w_star = rng.standard_normal((30, 8)), rng.standard_normal(8)
    return ps.load_model(PHASE, X=X, y=(X @ w_star) ** 2 / (w_star @ w_star), c=1.5)


def test_a_loaded_models_layout_is_the_struct_its_module_holds(phase):
    """Model._layout: the struct's bytes as the host module holds them, with each array
    field's pointer (at the offset it reports) the address of the bound array."""
    layout = phase._compiled_core(np.float64)._layout
    raw = layout["bytes"]
    assert len(raw) == layout["size"] and layout["align"] == 8
    assert layout["work_size"] == 30  # PhaseRetrieval::work_size() = n
    assert [name for name, _ in layout["arrays"]] == ["X", "y"]
    for name, offset in layout["arrays"]:
        held = int.from_bytes(raw[offset:offset + 8], "little")
        assert held == phase.fields[name].ctypes.data, name
    # n, d (ints) and c (a double) follow the two pointers, as the struct declares them
    assert np.frombuffer(raw[16:24], np.int32).tolist() == [30, 8]
    assert np.frombuffer(raw[24:32], np.float64)[0] == 1.5


def test_a_loaded_models_kernel_argument_has_device_pointers(phase):
    layout = phase._compiled_core(np.float64)._layout
    fake = {"X": 0x7F0000001000, "y": 0x7F0000002000}
    arg = _cupy.loaded_struct(layout, fake)
    assert arg.dtype.itemsize == layout["size"] and arg.dtype.alignment == layout["align"]
    got = arg.tobytes()
    for name, offset in layout["arrays"]:
        assert int.from_bytes(got[offset:offset + 8], "little") == fake[name]
    pointers = {o + k for _, o in layout["arrays"] for k in range(8)}
    assert all(got[i] == layout["bytes"][i] for i in range(len(got)) if i not in pointers)
    with pytest.raises(ValueError, match="aligned to 16"):
        _cupy.loaded_struct({**layout, "align": 16}, fake)


def test_a_loaded_model_takes_backend_cupy_by_name(phase):
    # no longer refused as a backend without a port: only the machine may lack CuPy or a GPU
    W = phase.random_point(2, seed=1)
    if _cupy.unavailable_reason() is None:
        pytest.skip("a GPU is here: the device tests cover it")
    with pytest.raises(BackendUnavailable, match="not available"):
        phase.loss_and_grad(W, backend="cupy")


# -- on a device (never run yet: the project had no GPU when this was written) ----------------

def _device():
    reason = _cupy.device_reason()
    if reason is not None:
        pytest.skip(reason)
    import cupy
    return cupy


def _cupy_core(m, dtype=np.float64):
    if "cupy" not in type(m)._backends:
        pytest.skip(f"{type(m).__name__} has no CuPy core")
    return m._make_core("_f64" if dtype == np.float64 else "_f32", _cupy.module())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernels_match_the_cpu_core_on_cupy_arrays(case, dtype):
    cp = _device()
    m = case.model
    core = _cupy_core(m, dtype)
    W = case.points(32, seed=3, dtype=dtype)
    V = case.points(32, seed=4, dtype=dtype)
    tol = 1e-10 if dtype == np.float64 else 1e-4
    dW, dV = cp.asarray(W), cp.asarray(V)
    loss, G, ok = core.loss_grad(dW)
    assert isinstance(G, cp.ndarray) and G.dtype == dtype and bool(ok.all())
    np.testing.assert_allclose(loss.get(), m.loss(W, backend="cpp"), rtol=tol, atol=0)
    np.testing.assert_allclose(G.get(), m.grad(W, backend="cpp"), rtol=tol, atol=tol)
    for kernel in ("hvp", "third"):
        out, ok = getattr(core, kernel)(dW, dV)
        assert bool(ok.all())
        ref = getattr(m, kernel)(W, V, backend="cpp")
        np.testing.assert_allclose(out.get(), ref, rtol=tol, atol=tol * np.abs(ref).max())
    H, ok = core.hessian(dW[:4])
    ref = m.hessian(W[:4], backend="cpp")
    np.testing.assert_allclose(H.get(), ref, rtol=tol, atol=tol * np.abs(ref).max())
    # NumPy in, NumPy out (what the models pass)
    loss_h, _, _ = core.loss_grad(W)
    assert isinstance(loss_h, np.ndarray) and np.array_equal(loss_h, loss.get())


@pytest.mark.gpu
def test_lanczos_and_the_engine_match_the_cpu_core(case):
    cp = _device()
    m = case.model
    core, ref = _cupy_core(m), m._core(np.dtype(np.float64), "cpp")
    W = case.points(16, seed=7)
    opts = LanczosOptions.for_dim(m.dim, min(2, m.dim), None, tol=1e-10, seed=1).to_core()
    got, want = core.lanczos(cp.asarray(W), opts), ref.lanczos(W, opts)
    np.testing.assert_allclose(got[0].get(), want[0], rtol=1e-10, atol=1e-12)
    lz = LanczosOptions.for_dim(m.dim, 1, None, tol=1e-10, seed=0, name="m")
    cfg = EngineConfig(Method.GD_WD, steps=40, record_every=4, sharpness_every=20,
                       lanczos=lz).to_core()
    hyper = {"lr": np.full(16, 1e-3), "wd": np.full(16, 1e-4)}  # small: far from EoS
    got, want = core.run(W, hyper, cfg), ref.run(W, hyper, cfg)
    assert got.keys() == want.keys()
    for k, a in want.items():
        assert isinstance(got[k], np.ndarray) and got[k].shape == a.shape, k
        np.testing.assert_allclose(got[k], a, rtol=1e-10, atol=1e-12, err_msg=k)
    dev = core.run(cp.asarray(W), {k: cp.asarray(v) for k, v in hyper.items()}, cfg)
    assert all(isinstance(a, cp.ndarray) for a in dev.values())
    assert np.array_equal(dev["w"].get(), got["w"])


@pytest.mark.gpu
def test_backend_cupy_runs_the_public_calls(toy_case):
    _device()
    m = toy_case.model
    W0 = toy_case.points(8, seed=2)
    # Toy3D GD+WD takes the tile, with sharpness (the default: every 2 steps, records every
    # 10) in segments between the device Lanczos solves
    a = ps.run_gd_wd(m, W0, 0.01, 1e-3, 50, record_every=10, backend="cupy")
    b = ps.run_gd_wd(m, W0, 0.01, 1e-3, 50, record_every=10, backend="cpp")
    assert a.meta["tiles"]
    for key in ("loss", "sharpness", "top_grad"):
        want = getattr(b, key)
        np.testing.assert_allclose(getattr(a, key), want, rtol=0,
                                   atol=1e-10 * np.max(np.abs(want)))
    s = ps.spherical_sharpness(m, W0, backend="cupy")
    np.testing.assert_allclose(s.eigenvalues, ps.spherical_sharpness(m, W0).eigenvalues,
                               rtol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["toy3d", "bn_mc", "bn_mc D800", "bn_linreg"])
def test_tiles_match_the_cpu_emulation(name):
    cp = _device()
    _core = pytest.importorskip("pysharp._core")
    if name == "toy3d":
        model = ps.Toy3D(c=10.0)
    elif name == "bn_mc":  # a thread per trajectory
        model = ps.BNMatrixCompletion.synthetic(size=10, true_rank=2, rank=4, seed=0)
    elif name == "bn_mc D800":  # a warp per trajectory
        model = ps.BNMatrixCompletion.synthetic(size=20, true_rank=2, rank=20, seed=0)
    else:
        model = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    B = 37
    W0 = np.random.default_rng(1).standard_normal((B, model.dim))
    lr, wd = np.linspace(0.02, 0.2, B), np.full(B, 1e-3)
    kernel = model._tile_kernel(_cupy.module())
    assert kernel is not None
    got = kernel(cp.asarray(W0), cp.asarray(lr), cp.asarray(wd), 200, 10)
    want = model._tile_kernel(_core)(W0, lr, wd, 200, 10)
    assert all(isinstance(a, cp.ndarray) for a in got)
    for g, w in zip(got, want):
        g = g.get()
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = np.max(np.abs(w)) if w.size else 1.0
        assert np.max(np.abs(g - w), initial=0) <= 1e-10 * scale


@pytest.mark.gpu
def test_launches_follow_cupys_current_stream(toy_case):
    cp = _device()
    core = _cupy_core(toy_case.model)
    W = toy_case.points(1 << 16, seed=5)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        dW = cp.asarray(W)
        _, G, _ = core.loss_grad(dW)
        G2 = G * 2  # queued behind the kernel on the same stream
    stream.synchronize()
    np.testing.assert_allclose(G2.get() / 2, toy_case.model.grad(W, backend="cpp"),
                               rtol=1e-12)


@pytest.mark.gpu
def test_bits_equal_the_nvcc_build(case):
    cp = _device()
    if not ps.backends()["cuda"]["available"]:
        pytest.skip(ps.backends()["cuda"]["reason"])
    m = case.model
    import pysharp._cuda as cu
    W = case.points(64, seed=6)
    a = m._make_core("_f64", cu).loss_grad(W)
    b = _cupy_core(m).loss_grad(cp.asarray(W))
    assert np.array_equal(a[1], b[1].get()) and np.array_equal(a[0], b[0].get())
    lz = LanczosOptions.for_dim(m.dim, 1, None, tol=1e-10, seed=0, name="m")
    cfg = EngineConfig(Method.GD_WD, steps=300, record_every=10, sharpness_every=50,
                       lanczos=lz).to_core()
    hyper = {"lr": np.full(64, 0.5), "wd": np.full(64, 1e-3)}  # past EoS: bits, not tolerances
    ra, rb = m._make_core("_f64", cu).run(W, hyper, cfg), _cupy_core(m).run(W, hyper, cfg)
    for k in ra:
        assert np.array_equal(ra[k], rb[k], equal_nan=True), k


@pytest.mark.gpu
def test_a_loaded_model_on_the_device_matches_its_module(phase):
    cp = _device()
    W = phase.random_point(64, seed=2)
    V = np.random.default_rng(3).standard_normal(W.shape)
    loss, G = phase.loss_and_grad(W, backend="cupy")
    want_loss, want_G = phase.loss_and_grad(W, backend="cpp")
    assert np.allclose(loss, want_loss, rtol=1e-12) and np.allclose(G, want_G, rtol=1e-11)
    assert np.allclose(phase.hvp(W, V, backend="cupy"), phase.hvp(W, V, backend="cpp"),
                       rtol=1e-10, atol=1e-12)
    core = phase._make_core("_f64", _cupy.module())
    on_device = core.loss_grad(cp.asarray(W))
    assert all(isinstance(a, cp.ndarray) for a in on_device)
    lr, wd = np.linspace(0.01, 0.1, 64), np.full(64, 1e-3)
    run = ps.run_gd_wd(phase, W, lr, wd, 50, record_every=5, sharpness_every=10,
                       backend="cupy")
    ref = ps.run_gd_wd(phase, W, lr, wd, 50, record_every=5, sharpness_every=10,
                       backend="cpp")
    assert np.max(np.abs(run.w - ref.w)) <= 1e-10 * np.max(np.abs(ref.w))
    assert np.allclose(run.sharpness, ref.sharpness, rtol=1e-8)

"""CuPy backend: the CUDA kernels compiled by NVRTC at first use, launched through CuPy.

No nvcc is needed: NVRTC (PyPI nvidia-cuda-nvrtc through cuda-bindings, see
:mod:`pysharp._backends._nvrtc`) compiles the same kernel source that ``pysharp._cuda`` is
built from (csrc/cuda/kernels.cuh, csrc/cuda/tile_kernels.cuh), for the device's own
architecture, once per (model, precision, architecture) and once for the tiles; the cubin is
cached on disk beside run-time compiled models (keyed by the sources, the kernels asked for and
NVRTC's version) and loaded with ``cupy.RawModule``.

:func:`module` looks like ``pysharp._cuda`` to the models: ``Toy3D_f64(c)`` and the other
classes take the constructor arguments of ``pysharp._cuda``'s and have its methods
``loss_grad``, ``hvp``, ``third``, ``hessian``, ``lanczos`` and ``run`` (same arguments,
checks and results), and the fused GD+WD tiles ``_tile_toy3d_gd_wd``, ``_tile_bn_mc_gd_wd``,
``_tile_bn_mc_fits``, ``_tile_bn_mc_warp_gd_wd``, ``_tile_bn_mc_warp_fits``,
``_tile_bn_linreg_gd_wd``, ``_tile_bn_linreg_fits`` and ``_TILE_BN_LINREG_SHAPES`` are those
of csrc/cuda/bind_tile.cu, except that the BN linear regression tile runs at any (d, n) of a
box (:func:`bn_linreg_tile_fits`), NVRTC compiling each new shape at first use. NumPy arrays
in give NumPy arrays out (copied to and from the device, as ``pysharp._cuda`` does); CuPy
arrays in give CuPy arrays out with no host copy. Every
launch is on CuPy's current stream, so in stream order with the caller's own work; arguments
are checked before anything is allocated or launched.

A model's core here is built from its host twin, the ``pysharp._core`` object of the same
class and arguments (a loaded model's compiled core): C++ checks the data and computes the
derived fields once, ``_layout`` gives the struct's bytes (copied with device addresses for
its arrays) and ``plan`` the size of every output and scratch buffer, so nothing here
restates a model or the engine's sizes; this backend therefore needs the compiled core.
The rest of the launch arithmetic (128 threads a block, launch chunks bounded by a quarter
of free memory; the tiles' block sizes, opt-in shared memory and persistent grids) mirrors
CudaExec (csrc/cuda/executor.cuh) and bind_tile.cu, as pure functions here; the tests check
them against the C++ where it is a function of the headers (sizes, fit tests) and against
their own statement where it is inline in bind_tile.cu (the block choices).

Not covered: BN linear regression's reduced (spectral) engine (``reduced=True`` is refused:
use ``backend="cuda"`` or ``"cpp"``) and square-loss models (built-in or loaded). A
scale-invariant model compiled at run time (``load_model``) runs its engine kernels here,
compiled by NVRTC from its header (:class:`Loaded`).

Status (issue 28): none of this has run on a device; the project had no GPU while it was
written. What a CPU machine can check is checked (tests/backends/test_cupy.py,
test_nvrtc.py): struct layouts against g++, the NVRTC compilation of every kernel launched
here, the argument checks and the launch arithmetic.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import operator
import os
import stat
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from .._engine import LANCZOS_MAX_ITER, loader, records
from .._engine.methods import HYPERPARAMETERS, METHODS
from .._engine.records import n_records
from . import _cuda_sources as cs
from . import _nvrtc
from ._errors import BackendUnavailable

THREADS = 128  # kThreads of executor.cuh
TILE_WARPS = 8  # kTileWarps of tile_kernels.cuh
TILE_THREADS = 32 * TILE_WARPS  # kTileThreads
BN_MC_MAX_THREAD_DOUBLES = 511  # kBnMcMaxThreadDoubles of tile/bn_mc.hpp

#: The engine kernels launched here (keys of ``_cuda_sources.kernel_names``): not the
#: reduced engine's ``spectral_trajectory``.
ENGINE_KERNELS = ("loss_grad", "hvp", "third", "hessian", "lanczos", "trajectory")
#: The compilation unit of the tile kernels (:func:`unit`).
TILES = "tiles"


def unavailable_reason() -> str | None:
    """None when ``backend="cupy"`` can run here, else why not (the first blocker found)."""
    if loader._import_error is not None:
        return ("the CuPy backend builds each model's struct and launch plan in the compiled "
                f"core: {loader._import_error}")
    return device_reason()


def device_reason() -> str | None:
    """None when this module's kernels can be compiled and launched here, else why not."""
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed (pip install 'pysharp[cupy]' on a machine with a GPU)"
    reason = _nvrtc.unavailable_reason()
    if reason is not None:
        return reason
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:  # no driver, or a driver too old for this CuPy
        return f"no CUDA device ({type(exc).__name__}: {exc})"
    return None


# -- the structs passed by value, laid out as C++ lays them out (tests/backends/test_cupy.py) --

#: C++ type of each struct of :func:`struct_dtype` (``{real}``: double or float).
CPP_STRUCTS = {
    "Toy3D": "pysharp::Toy3D<{real}>",
    "BNMatrixCompletion": "pysharp::BNMatrixCompletion<{real}>",
    "LanczosOptions": "pysharp::LanczosOptions",
    "EngineConfig": "pysharp::EngineConfig",
    "Hyperparameters": "pysharp::Hyperparameters<{real}>",
    "BatchRecords": "pysharp::BatchRecords<{real}>",
    "GdWdTileIO": "pysharp::tile::GdWdTileIO",
    "BNLinRegTileData": "pysharp::tile::BNLinRegTileData",
    "BNMcWarpData": "pysharp::tile::BNMcWarpData",
}

#: (name in the result dict of ``run``, field of BatchRecords), in BatchRecords' order.
RECORDS = tuple((r.name, r.field) for r in records.RECORDS)

#: The outputs of a tile run, in the order of its result tuple (bind_tile.cu's TileRun).
TILE_OUTPUTS = ("w_final", "loss", "norm2", "diverged", "diverged_step", "eff_lr",
                "grad_norm", "top_grad")


def struct_dtype(name: str, real=np.float64) -> np.dtype:
    """The numpy dtype with the layout of the C++ struct ``CPP_STRUCTS[name]`` over ``real``.

    A scalar of it (``np.zeros((), dtype)[()]``) is what CuPy passes to a kernel by value.
    """
    r = np.dtype(real)
    ptr, i4, i8, f8 = np.uint64, np.int32, np.int64, np.float64
    lanczos = [("k", i4), ("max_iter", i4), ("min_iter", i4), ("tol", f8),
               ("smallest", np.bool_), ("seed", np.uint64), ("stream", np.uint64),
               ("counter", np.uint64)]
    fields = {
        "Toy3D": [("c", r)],
        "BNMatrixCompletion": [("rows", ptr), ("cols", ptr), ("u", ptr), ("scale", r),
                               ("N", i4), ("m1", i4), ("m2", i4), ("r", i4)],
        "LanczosOptions": lanczos,
        "EngineConfig": [("method", i4), ("steps", i8), ("record_every", i8),
                         ("sharpness_every", i8), ("theta_every", i8), ("jitter", f8),
                         ("seed", np.uint64), ("rms_beta", f8), ("rms_eps", f8),
                         ("qr_kappa", f8), ("top_k", i4),
                         ("lanczos", np.dtype(lanczos, align=True))],
        "Hyperparameters": [(name, ptr) for name in HYPERPARAMETERS],
        "BatchRecords": [*((field, ptr) for _, field in RECORDS), ("groups", i4),
                         ("top_k", i4)],
        "GdWdTileIO": [*((f, ptr) for f in ("w0", "lr", "wd", "w_final", "loss", "norm2",
                                             "eff_lr", "grad_norm", "diverged",
                                             "diverged_step")),
                       ("batch", i8), ("steps", i8), ("record_every", i8), ("v1", ptr),
                       ("top_grad", ptr)],
        "BNLinRegTileData": [("xc", ptr), ("u", ptr), ("scale", f8), ("floor_coef", f8)],
        "BNMcWarpData": [("m", "BNMatrixCompletion"), ("pass_start", ptr),
                         ("term_obs", ptr), ("term_other", ptr)],
    }[name]
    # a struct member of a struct: its own layout, over double (the tiles are float64)
    fields = [(f, struct_dtype(t, np.float64) if isinstance(t, str) else t) for f, t in fields]
    return np.dtype(fields, align=True)


def _pack(name: str, real=np.float64, **fields) -> np.void:
    s = np.zeros((), dtype=struct_dtype(name, real))
    for k, v in fields.items():
        s[k] = v
    return s[()]


# -- argument checks (module_options.hpp, bind_model.hpp), before anything is launched -----------

class _Fields:
    """A dict's fields read by name, each once; :meth:`done` refuses the unread ones
    (module_options.hpp's Fields, with its messages)."""

    def __init__(self, d: Any, what: str) -> None:
        if not isinstance(d, dict):
            raise TypeError(f"{what} must be a dict, got {type(d).__name__}")
        self.d, self.what, self.read = d, what, set()

    def get(self, name: str) -> Any:
        if name not in self.d:
            raise ValueError(f"{self.what} lacks the field '{name}'")
        self.read.add(name)
        return self.d[name]

    def done(self) -> None:
        for key in self.d:
            if key not in self.read:
                raise ValueError(f"{self.what} has an unknown field '{key}'")


def _uint64(value, name: str) -> int:
    """``value`` as an int that a uint64 field holds (a random key: seed, counter), else
    ValueError naming it."""
    value = operator.index(value)
    if not 0 <= value < 2 ** 64:
        raise ValueError(f"{name} must be in [0, 2^64)")
    return value


def lanczos_options(options: dict, D: int) -> np.void:
    """The LanczosOptions struct from the dict of ``pysharp._engine.LanczosOptions.to_core()``.

    Raises
    ------
    ValueError
        For a missing or unknown field, k outside [1, D] or max_iter outside
        [k, min(D, 1024)] (the checks of module_options.hpp).
    """
    f = _Fields(options, "LanczosOptions")
    k, max_iter = operator.index(f.get("k")), operator.index(f.get("max_iter"))
    min_iter = operator.index(f.get("min_iter"))
    tol, seed, smallest = float(f.get("tol")), operator.index(f.get("seed")), f.get("smallest")
    f.done()
    if not 1 <= k <= D:
        raise ValueError("k must be in [1, D]")
    if not k <= max_iter <= min(D, LANCZOS_MAX_ITER):
        raise ValueError(f"max_iter must be in [k, min(D, {LANCZOS_MAX_ITER})]")
    seed = _uint64(seed, "seed")
    return _pack("LanczosOptions", k=k, max_iter=max_iter, min_iter=min_iter, tol=tol,
                 smallest=bool(smallest), seed=seed)


def engine_config(config: dict, D: int) -> np.void:
    """The EngineConfig struct from the dict of ``pysharp._engine.EngineConfig.to_core()``,
    with engine_config_from's checks (module_options.hpp).

    Raises
    ------
    ValueError
        For a missing or unknown field or a value the C++ refuses.
    BackendUnavailable
        For ``reduced=True``: BN linear regression's reduced engine does not run here.
    """
    f = _Fields(config, "EngineConfig")
    method = operator.index(f.get("method"))
    if method not in {m.code for m in METHODS.values()}:
        raise ValueError("unknown method")
    ints = {name: operator.index(f.get(name))
            for name in ("steps", "record_every", "sharpness_every", "theta_every")}
    if not (ints["steps"] >= 0 and ints["record_every"] >= 1 and ints["sharpness_every"] >= 0
            and ints["theta_every"] >= 0):
        raise ValueError("steps >= 0, record_every >= 1, sharpness_every >= 0, theta_every >= 0")
    reals = {name: float(f.get(name)) for name in ("jitter", "rms_beta", "rms_eps", "qr_kappa")}
    seed = operator.index(f.get("seed"))
    top_k = operator.index(f.get("top_k"))
    reduced = bool(f.get("reduced"))
    lanczos = lanczos_options(f.get("lanczos"), D)
    f.done()
    if lanczos["k"] != 1 or lanczos["smallest"]:
        raise ValueError("the engine's in-run sharpness is the top eigenvalue: LanczosOptions "
                         "k = 1, LA")
    if not (top_k == 0 or 2 <= top_k <= lanczos["max_iter"]):
        raise ValueError("top_k must be 0 (off) or in [2, lanczos max_iter]")
    seed = _uint64(seed, "seed")
    if reduced:
        raise BackendUnavailable(
            "BN linear regression's reduced engine (reduced=True) does not run on "
            "backend='cupy'; use backend='cuda' or 'cpp', or reduced=False")
    return _pack("EngineConfig", method=method, seed=seed, top_k=top_k, lanczos=lanczos,
                 **ints, **reals)


def hyperparameter_arrays(hyper: dict, method: int, B: int) -> dict[str, Any]:
    """The arrays of ``hyper`` that ``method`` reads, in Hyperparameters' field order, each
    checked to be (B,); exactly those fields (hyperparameters_from of bind_model.hpp)."""
    spec = next(m for m in METHODS.values() if m.code == method)
    f = _Fields(hyper, f"the hyperparameters of method {spec.name}")
    out = {name: f.get(name) for name in HYPERPARAMETERS if name in spec.hyper}
    f.done()
    for name, a in out.items():
        if getattr(a, "ndim", np.ndim(a)) != 1 or len(a) != B:
            raise ValueError(f"{name} must have one entry per trajectory")
    return out


# -- launch arithmetic, as pure functions (checked against the C++ in the tests) ------------------

def blocks_for(n: int) -> int:
    """Blocks of :data:`THREADS` for one thread per item (executor.cuh's blocks_for)."""
    return (n + THREADS - 1) // THREADS


def launch_chunk(B: int, bytes_each: int, free_bytes: int) -> int:
    """Trajectories per launch: bounded by a quarter of free device memory (executor.cuh)."""
    return min(B, max(1, (free_bytes // 4) // max(1, bytes_each)))


def bn_mc_thread_doubles(D: int, N: int) -> int:
    """Doubles of one BN matrix completion tile thread's scratch (tile/bn_mc.hpp)."""
    return (2 * D + N + 1) | 1


def bn_mc_tile_fits(D: int, N: int, block_smem_optin: int) -> bool:
    """Whether BN matrix completion (D coordinates, N observations) runs on its tile on a
    device whose blocks may opt in to ``block_smem_optin`` bytes (tile/bn_mc.hpp)."""
    doubles = bn_mc_thread_doubles(D, N)
    return doubles <= BN_MC_MAX_THREAD_DOUBLES and 32 * doubles * 8 <= block_smem_optin


def bn_mc_tile_block(D: int, N: int, block_smem_optin: int) -> tuple[int, int]:
    """(threads a block, dynamic shared memory bytes) of the BN matrix completion tile:
    as many warps' scratches as fit, at most :data:`TILE_THREADS` (bind_tile.cu).
    Only for a model that :func:`bn_mc_tile_fits`."""
    per_thread = bn_mc_thread_doubles(D, N) * 8
    threads = min(block_smem_optin // per_thread // 32 * 32, TILE_THREADS)
    return threads, threads * per_thread


def bn_mc_warp_doubles(D: int, N: int) -> int:
    """Doubles of one BN matrix completion warp tile's scratch: w, g, the N scores and a 0
    (tile/bn_mc_warp.hpp)."""
    return 2 * D + N + 1


def bn_mc_warp_tile_fits(D: int, N: int, block_smem_optin: int) -> bool:
    """Whether BN matrix completion (D coordinates, N observations) runs on its warp tile on
    a device whose blocks may opt in to ``block_smem_optin`` bytes (tile/bn_mc_warp.hpp)."""
    return D >= 1 and N >= 2 and bn_mc_warp_doubles(D, N) * 8 <= block_smem_optin


def bn_mc_warp_block(D: int, N: int, block_smem_optin: int, warps_per_sm) -> tuple[int, int]:
    """(warps a block, dynamic shared memory bytes) of the BN matrix completion warp tile:
    of the block sizes up to :data:`TILE_WARPS` whose scratches fit, the one that puts the
    most warps on a multiprocessor, the larger on a tie (bind_tile.cu).
    ``warps_per_sm(warps, smem)``: resident blocks of that size (the occupancy API) times
    warps. Only for a model that :func:`bn_mc_warp_tile_fits`."""
    per_warp = bn_mc_warp_doubles(D, N) * 8
    best, warps = 0, 1
    for w in range(min(block_smem_optin // per_warp, TILE_WARPS), 0, -1):
        resident = warps_per_sm(w, w * per_warp)
        if resident > best:
            best, warps = resident, w
    return warps, warps * per_warp


def bn_mc_warp_terms(rows, cols, m1: int, m2: int, r: int) -> tuple[np.ndarray, ...]:
    """(pass_start (ceil(D / 32) + 1,), obs (T,), other (T,)) int32: the BN matrix completion
    warp tile's gradient terms (tile::BNMcWarpTerms). Lane l of pass p (coordinate
    i = 32 p + l, factor row i // r: U's rows, then V's) reads terms pass_start[p] + 32 j + l:
    its row's observations in increasing order (obs: the observation, other: where the
    other factor's row begins in w), then padding (observation N, other 0) up to the pass's
    longest list. tests/backends/test_cupy.py checks it against pysharp._core's."""
    rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
    N, F, D = rows.size, m1 + m2, (m1 + m2) * r
    factor = np.concatenate([rows, m1 + cols])
    order = np.argsort(factor, kind="stable")  # by factor row, each row's k increasing
    row_obs = np.concatenate([np.arange(N)] * 2)[order]
    row_other = np.concatenate([m1 + cols, rows])[order] * r
    counts = np.bincount(factor, minlength=F)
    start = np.concatenate([[0], np.cumsum(counts)])
    passes = -(-D // 32)
    coord = np.arange(32 * passes)
    f = np.where(coord < D, coord // r, 0)
    length = np.where(coord < D, counts[f], 0).reshape(passes, 32)
    longest = length.max(axis=1)
    pass_start = np.concatenate([[0], np.cumsum(32 * longest)])
    obs = np.full(pass_start[-1], N, np.int32)
    other = np.zeros(pass_start[-1], np.int32)
    for p in range(passes):
        j = np.arange(longest[p])[:, None]
        lanes = np.arange(32)[None, :]
        live = j < length[p][None, :]
        src = (start[f[32 * p:32 * p + 32]][None, :] + j)[live]
        at = (pass_start[p] + 32 * j + lanes)[live]
        obs[at], other[at] = row_obs[src], row_other[src]
    return pass_start.astype(np.int32), obs, other


#: The (d, n) box where the BN linear regression tile compiles for sm_90 with no spill
#: (ptxas, nvcc 13: 254 registers at (128, 128), (120, 200) and (1, 200); (100, 240) and
#: (256, 40) spill). tests/backends/test_nvrtc.py checks its corners.
BN_LINREG_TILE_MAX_D, BN_LINREG_TILE_MAX_N = 128, 200


def bn_linreg_tile_fits(d: int, n: int, block_smem_optin: int, capability: int) -> bool:
    """Whether BN linear regression with d coordinates and n samples runs on its tile on a
    device of compute ``capability`` (e.g. 90) whose blocks may opt in to
    ``block_smem_optin`` bytes: FP64 mma (8.0+), (d, n) in the box (its corners compile
    without spills; tests/backends/test_nvrtc.py), and the tile's shared memory. NVRTC
    compiles the kernel for the model's own shape."""
    return (capability >= 80 and 1 <= d <= BN_LINREG_TILE_MAX_D
            and 2 <= n <= BN_LINREG_TILE_MAX_N
            and bn_linreg_tile_smem_bytes(d, n) <= block_smem_optin)


def bn_linreg_tile_smem_bytes(d: int, n: int) -> int:
    """Dynamic shared memory of the BN linear regression tile kernel at (d, n): Xc and u in
    tile layout and, when a lane cannot hold w, Z and G at once, each warp's parking area
    (tile_kernels.cuh's bn_linreg_tile_smem_bytes, tile/bn_linreg.hpp's kParkDoubles)."""
    dp, np_ = -(-d // 8) * 8, -(-n // 8) * 8
    park = 2 * (dp // 8) * 32 if 4 * (dp // 8) + 2 * (np_ // 8) > 80 else 0
    return (np_ * dp + np_ + TILE_WARPS * park) * 8


def persistent_blocks(work_blocks: int, sms: int, per_sm: int) -> int:
    """Blocks of a persistent launch: as many as are resident at once, no more than there
    is work for (bind_tile.cu). ``per_sm``: the occupancy API's answer for the launch."""
    if per_sm < 1:
        raise ValueError("the tile kernel does not fit on this device (shared memory)")
    return min(work_blocks, sms * per_sm)


# -- compilation, cached ------------------------------------------------------------------------

#: Units of loaded models registered by :class:`Loaded`: name -> (source, kernel names,
#: extra include folders).
_LOADED_UNITS: dict[str, tuple[str, dict[str, str], tuple[Path, ...]]] = {}


def unit(name: str) -> tuple[str, dict[str, str], tuple[Path, ...]]:
    """(source, short name -> NVRTC name expression, include folders beside pysharp's) of a
    compilation unit: ``"<Model>_<prec>"`` (e.g. ``"Toy3D_f64"``: :data:`ENGINE_KERNELS` of
    the model), :data:`TILES`, or a loaded model's (:func:`loaded_unit`). Exactly the kernels
    this module launches."""
    if name == TILES:
        return cs.TILES_SOURCE, cs.tile_kernel_names(), ()
    if name.startswith(f"{TILES}_bn_linreg_"):  # one shape's BN-linreg tile (bn_linreg_unit)
        d, n = (int(x) for x in name.rsplit("_", 2)[1:])
        return cs.TILES_SOURCE, {f"bn_linreg_{d}_{n}":
                                 f"pysharp::cuda::bn_linreg_gd_wd_tile_kernel<{d}, {n}>"}, ()
    if name in _LOADED_UNITS:
        return _LOADED_UNITS[name]
    model, _, prec = name.rpartition("_")
    names = cs.kernel_names(model, prec)
    return cs.KERNELS_SOURCE, {k: names[k] for k in ENGINE_KERNELS}, ()


def bn_linreg_unit(d: int, n: int) -> str:
    """The compilation unit of the BN linear regression tile at (d, n): the tiles' unit for a
    shape it holds (:data:`_cuda_sources.BN_LINREG_TILE_SHAPES`), else one of its own."""
    return TILES if (d, n) in cs.BN_LINREG_TILE_SHAPES else f"{TILES}_bn_linreg_{d}_{n}"


def loaded_unit(header: Path, model_name: str, prec: str,
                include_dirs: tuple[Path, ...] = ()) -> str:
    """Registers the engine kernels of a loaded model (``pysharp.models.load_model``) as a
    compilation unit and returns its name for :func:`unit`: the header's own text is in the
    name, so an edited header is a new unit (and a new cubin)."""
    header = Path(header)
    digest = hashlib.sha256(header.read_bytes() + repr((model_name, prec, [
        str(d) for d in include_dirs])).encode()).hexdigest()[:16]
    name = f"loaded_{model_name}_{prec}_{digest}"
    names = cs.kernel_names(model_name, prec, namespace="::")
    _LOADED_UNITS[name] = (cs.loaded_source(header), {k: names[k] for k in ENGINE_KERNELS},
                           (header.parent, *include_dirs))
    return name


def loaded_struct(layout: dict, device_arrays: dict[str, int]) -> np.void:
    """A loaded model's struct as a kernel argument: the bytes its compiled module holds
    (``Model._layout``: scalars and extents set) with each array field's pointer replaced by
    the device address in ``device_arrays`` (name -> address), as a structured scalar of
    the struct's size made of words of its alignment, so that CuPy aligns the argument as
    C++ does."""
    raw = bytearray(layout["bytes"])
    if len(raw) != layout["size"]:
        raise ValueError("the layout's bytes are not the struct's size")
    for name, offset in layout["arrays"]:
        raw[offset:offset + 8] = int(device_arrays[name]).to_bytes(8, "little")
    align = int(layout["align"])
    words = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(align)
    if words is None:
        raise ValueError(f"a model struct aligned to {align} bytes is not supported on CuPy")
    dtype = np.dtype([(f"w{i}", words) for i in range(len(raw) // align)], align=True)
    return np.frombuffer(bytes(raw), dtype=dtype)[0].copy()


def _sources_digest() -> str:
    h = hashlib.sha256()
    for root in _nvrtc.source_include_dirs():
        for p in sorted(root.rglob("*")):
            if p.suffix in (".hpp", ".cuh", ".h") and p.is_file():
                h.update(p.name.encode())
                h.update(p.read_bytes())
    h.update(repr(_nvrtc.version()).encode())
    return h.hexdigest()[:24]


def _cache_dir() -> Path:
    """<the cache root of run-time compiled models>/nvrtc, private (0700) like theirs:
    $PYSHARP_CACHE_DIR, else $XDG_CACHE_HOME/pysharp or ~/.cache/pysharp."""
    root = os.environ.get("PYSHARP_CACHE_DIR")
    if root:
        base = Path(root).expanduser()
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pysharp"
    d = base / "nvrtc"
    if not d.exists():
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        d.chmod(0o700)
    st = d.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"the NVRTC cache {d} belongs to another user or others can "
                              "write to it; set PYSHARP_CACHE_DIR to a private folder")
    return d


@cache
def _functions(unit_name: str, device: int) -> dict:
    """Short kernel name -> ``cupy.RawKernel`` on ``device``, compiled (or read from the disk
    cache) once per architecture and loaded once per device."""
    import cupy
    arch = f"sm_{cupy.cuda.Device(device).compute_capability}"
    source, names, extra_dirs = unit(unit_name)
    exprs = list(names.values())
    key = hashlib.sha256("\n".join([source, *exprs]).encode()).hexdigest()[:12]
    path = _cache_dir() / f"{unit_name}_{arch}_{_sources_digest()}_{key}.cubin"
    lowered_path = path.with_suffix(".names")
    if not (path.is_file() and lowered_path.is_file()):
        out = _nvrtc.compile_cuda(source, arch=arch, name=f"{unit_name}.cu",
                                  name_expressions=exprs,
                                  include_dirs=[*_nvrtc.source_include_dirs(), *extra_dirs])
        # names first, the cubin last, each replaced whole: a reader sees both or no cubin
        for target, data in ((lowered_path, "\n".join(out.lowered[e] for e in exprs).encode()),
                             (path, out.cubin)):
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(data)
            tmp.replace(target)
    lowered = lowered_path.read_text().split("\n")
    with cupy.cuda.Device(device):
        module = cupy.RawModule(path=str(path))
        return {short: module.get_function(low) for short, low in zip(names, lowered)}


def _fro2(Xc, real) -> float:
    """||Xc||_F^2 as executor.cuh and bind_tile.cu form it: entries in Real, summed in double,
    in order."""
    x = np.asarray(Xc, dtype=real).astype(np.float64).ravel()
    return float(np.cumsum(x * x)[-1]) if x.size else 0.0


def _on_device(arrays) -> bool:
    """Whether a call's results are CuPy arrays: some input is one (else NumPy in, NumPy out)."""
    import cupy
    return any(isinstance(a, cupy.ndarray) for a in arrays)


def _device_rows(W, dim: int, real, name: str):
    """``W`` as a C-contiguous (B, dim) CuPy array of ``real``, its shape checked first."""
    import cupy
    shape = getattr(W, "shape", None) if isinstance(W, cupy.ndarray) else np.shape(W)
    if shape is None or len(shape) != 2 or shape[1] != dim:
        raise ValueError(f"{name} must be (B, {dim}), got shape {shape}")
    return cupy.ascontiguousarray(cupy.asarray(W, dtype=real))


def _vector(a, n: int, dtype, name: str):
    """``a`` as a C-contiguous (n,) CuPy array of ``dtype``, its shape checked first."""
    import cupy
    shape = a.shape if isinstance(a, cupy.ndarray) else np.shape(a)
    if len(shape) != 1 or shape[0] != n:
        raise ValueError(f"{name} must be ({n},), got shape {tuple(shape)}")
    return cupy.ascontiguousarray(cupy.asarray(a, dtype=dtype))


def _ptr(a) -> int:
    """A CuPy array's device address, 0 (a null pointer) for None or an empty array."""
    return 0 if a is None or a.size == 0 else int(a.data.ptr)


def _host(outs, on_device: bool):
    return outs if on_device else tuple(o.get() for o in outs)


# -- the cores --------------------------------------------------------------------------------

class _CupyCore:
    """One model in one precision on the current device, described by its host twin: the
    ``pysharp._core`` object of the same class and arguments (or a loaded model's compiled
    core), whose ``_layout`` is the struct the kernels receive (its derived fields and
    checks done once, in C++; each array copied to the device and its pointer replaced) and
    whose ``plan`` sizes every output and scratch buffer."""

    def __init__(self, model: str, host: Any, real) -> None:
        import cupy
        self._cp = cupy
        self._model, self._host = model, host
        self.real = np.dtype(real)
        self._prec = "f64" if self.real == np.float64 else "f32"
        self._keep: list = []  # device arrays the struct points to
        self._device_id = cupy.cuda.Device().id  # the model's data live there
        sizes = host.plan(0)
        self.dim, self.work_size, self.groups = sizes["dim"], sizes["work_size"], sizes["groups"]
        self._jets = sizes["jets"]
        layout = host._layout
        self._struct = loaded_struct(layout, {name: self._device(layout["data"][name])
                                              for name, _ in layout["arrays"]})

    def _device(self, a) -> int:
        d = self._cp.asarray(np.ascontiguousarray(a))
        # The copy is asynchronous on the current stream; a launch on another stream later
        # would not be ordered after it. Once per model and array.
        self._cp.cuda.get_current_stream().synchronize()
        self._keep.append(d)
        return _ptr(d)

    def _launch(self, kernel: str, n: int, args: tuple) -> None:
        """``kernel`` on n threads, one per item, on the current stream; nothing for n = 0."""
        if self._cp.cuda.Device().id != self._device_id:
            raise ValueError(f"this {self._model} core holds its data on device "
                             f"{self._device_id}, not the current device")
        if n:
            fn = _functions(self._unit(), self._device_id)[kernel]
            fn((blocks_for(n),), (THREADS,), (self._struct, *args))

    def _unit(self) -> str:
        """The compilation unit of this core's kernels (:func:`unit`)."""
        return f"{self._model}_{self._prec}"

    def _rows(self, W, name: str = "W"):
        return _device_rows(W, self.dim, self.real, name)

    def loss_grad(self, W):
        """(B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)."""
        cp, dev = self._cp, _on_device((W,))
        W = self._rows(W)
        B = W.shape[0]
        loss, G = cp.empty(B, self.real), cp.empty((B, self.dim), self.real)
        work = cp.empty(B * max(1, self.work_size), self.real)
        ok = cp.empty(B, cp.uint8)
        self._launch("loss_grad", B, (W, np.int64(B), loss, G, work, ok))
        return _host((loss, G, ok), dev)

    def _directional(self, kernel: str, order: int, W, V):
        cp, dev = self._cp, _on_device((W, V))
        W, V = self._rows(W), self._rows(V, "V")
        B = W.shape[0]
        if V.shape[0] != B:
            raise ValueError("W and V must have the same shape")
        out = cp.empty((B, self.dim), self.real)
        jets = cp.empty(B * self._jets * (order + 1), self.real)
        ok = cp.empty(B, cp.uint8)
        self._launch(kernel, B, (W, V, np.int64(B), out, jets, ok))
        return _host((out, ok), dev)

    def hvp(self, W, V):
        """(B, D), (B, D) -> (H v (B, D), ok (B,))."""
        return self._directional("hvp", 1, W, V)

    def third(self, W, V):
        """(B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))."""
        return self._directional("third", 2, W, V)

    def hessian(self, W):
        """(B, D) -> (H (B, D, D), ok (B,)): one thread per (row, column), D^2 Reals of
        scratch per row besides H; for D in the thousands use ``hvp`` and Lanczos."""
        cp, dev = self._cp, _on_device((W,))
        W = self._rows(W)
        B, D = W.shape[0], self.dim
        H = cp.empty((B, D, D), self.real)
        e = cp.empty(B * D * D, self.real)
        col = cp.empty(B * D * D, self.real)
        jets = cp.empty(B * D * self._jets * 2, self.real)
        bad = cp.zeros(B, cp.uint8)
        self._launch("hessian", B * D, (W, np.int64(B), H, e, col, jets, bad))
        return _host((H, (bad == 0).astype(cp.uint8)), dev)

    def lanczos(self, W, options: dict, start=None, streams=None, counter: int = 0):
        """(B, D), LanczosOptions dict, optional starts (B, D) -> (evals (B, k), evecs (B, k, D),
        resid (B, k), iterations (B,) int32, converged (B,) uint8, ok (B,) uint8); row b's
        random start keyed by (seed, streams[b] (default b), counter)."""
        cp, dev = self._cp, _on_device((W, start))
        W = self._rows(W)
        B, D = W.shape[0], self.dim
        o = lanczos_options(options, D)
        o["counter"] = _uint64(counter, "counter")
        if start is not None:
            start = self._rows(start, "start")
            if start.shape[0] != B:
                raise ValueError("start must match W")
        if streams is not None:
            streams = _vector(streams, B, np.uint64, "streams")
        k = int(o["k"])
        evals, evecs = cp.empty((B, k), self.real), cp.empty((B, k, D), self.real)
        resid, iters = cp.empty((B, k), self.real), cp.empty(B, cp.int32)
        conv, ok = cp.empty(B, cp.uint8), cp.empty(B, cp.uint8)
        scratch = cp.empty(B * self._host.plan(B, lanczos=options)["lanczos_reals"], self.real)
        jets = cp.empty(B * self._jets * 2, self.real)
        self._launch("lanczos", B, (o, W, np.uint64(_ptr(start)), np.uint64(_ptr(streams)),
                                    np.int64(B), evals, evecs, resid, iters, conv, ok, scratch,
                                    jets))
        return _host((evals, evecs, resid, iters, conv, ok), dev)

    def run(self, w0, hyper: dict, config: dict, offset: int = 0) -> dict:
        """The trajectory engine: (B, D) starts, {name: (B,)} the method's hyperparameters,
        the EngineConfig dict, the first trajectory's index -> dict of records (the arrays
        and names of ``pysharp._cuda``'s ``run``). ``reduced=True`` is refused
        (BackendUnavailable): BN linear regression's reduced engine is not here."""
        cp = self._cp
        dev = _on_device((w0, *(hyper.values() if isinstance(hyper, dict) else ())))
        W0 = self._rows(w0, "w0")
        B, D = W0.shape[0], self.dim
        offset = operator.index(offset)
        if offset < 0:
            raise ValueError("offset must be >= 0")
        cfg = engine_config(config, D)
        plan = self._host.plan(B, config)
        hyper = {name: _vector(a, B, self.real, name)
                 for name, a in hyperparameter_arrays(hyper, int(cfg["method"]), B).items()}
        h = _pack("Hyperparameters", self.real, **{n: _ptr(a) for n, a in hyper.items()})
        outs = {name: cp.empty(shape, dtype) for name, (shape, dtype) in plan["outputs"].items()}
        rec = _pack("BatchRecords", self.real, groups=self.groups, top_k=plan["top_k"],
                    **{field: _ptr(outs[name]) for name, field in RECORDS})
        state_reals, traj_reals, jets_each = (plan["state_reals"], plan["trajectory_reals"],
                                              self._jets)
        size = self.real.itemsize
        chunk = launch_chunk(B, (state_reals + traj_reals + 2 * jets_each) * size,
                             cp.cuda.runtime.memGetInfo()[0]) if B else 0
        state = cp.empty(chunk * state_reals, self.real)
        scratch = cp.empty(chunk * traj_reals, self.real)
        jets = cp.empty(chunk * jets_each * 2, self.real)
        for first in range(0, B, max(chunk, 1)):
            count = min(chunk, B - first)
            self._launch("trajectory", count, (cfg, W0, h, np.int64(first), np.int64(count),
                                               np.int64(B), np.int64(offset), rec, state,
                                               scratch, jets))
        names = plan["result_names"]
        return dict(zip(names, _host(tuple(outs[n] for n in names), dev)))


def _observations_inside(rows: np.ndarray, cols: np.ndarray, m1: int, m2: int) -> bool:
    """Whether every observation (rows[k], cols[k]) lies in the (m1, m2) matrix (the kernels
    index the factors by them unchecked): tile/bn_mc.hpp's bn_mc_observations_inside."""
    return not rows.size or bool(rows.min() >= 0 and rows.max() < m1 and cols.min() >= 0
                                 and cols.max() < m2)


class Loaded(_CupyCore):
    """A model compiled at run time (``pysharp.models.load_model``) on the device: the engine
    kernels compiled by NVRTC from its header, its struct the one its host module holds
    with device copies of its arrays. Scale-invariant models only; no fused tile."""

    def __init__(self, model, real=np.float64) -> None:
        if model._kind != "scale_invariant":
            raise BackendUnavailable(f"a loaded {model._kind} model runs in its own compiled "
                                     "module only (backend='cpp')")
        super().__init__(model.model_name, model._compiled_core(np.dtype(real)), real)
        self._unit_name = loaded_unit(model.header, model.model_name, self._prec,
                                      model.include_dirs)

    def _unit(self) -> str:
        return self._unit_name


# -- the fused GD+WD tiles (bind_tile.cu) -------------------------------------------------------

def _device_attribute(name: str) -> int:
    import cupy
    rt = cupy.cuda.runtime
    return rt.deviceGetAttribute(getattr(rt, f"cudaDevAttr{name}"), cupy.cuda.Device().id)


def _tile_run(W0, lr, wd, steps: int, record_every: int, D: int, what: str, v1=None):
    """(whether the results stay on the device, the tile IO struct, its device inputs, the
    outputs by name): bind_tile.cu's TileRun, every argument checked before anything is
    allocated. The caller holds the inputs until it has launched: freed earlier, their
    memory could back the model's data. With v1 (B, D), top_grad is (R, B); else (0, B)."""
    import cupy as cp
    dev = _on_device((W0, lr, wd, v1))
    shape = W0.shape if isinstance(W0, cp.ndarray) else np.shape(W0)
    if len(shape) != 2 or shape[0] < 1 or shape[1] != D:
        raise ValueError(f"W0 must be (B, {what}) with B >= 1, got shape {tuple(shape)}")
    steps, record_every = operator.index(steps), operator.index(record_every)
    if steps < 0 or record_every < 1:
        raise ValueError("steps must be >= 0 and record_every >= 1")
    B, R = shape[0], n_records(steps, record_every)
    W0 = _device_rows(W0, D, np.float64, "W0")
    lr, wd = _vector(lr, B, np.float64, "lr"), _vector(wd, B, np.float64, "wd")
    if v1 is not None:
        v1 = _device_rows(v1, D, np.float64, "v1")
        if v1.shape[0] != B:
            raise ValueError("v1 must be (B, D), as W0")
    out = {"w_final": cp.empty((B, D)), "diverged": cp.empty(B, cp.uint8),
           "diverged_step": cp.empty(B, cp.int64),
           "top_grad": cp.empty((R if v1 is not None else 0, B)),
           **{name: cp.empty((R, B)) for name in ("loss", "norm2", "eff_lr", "grad_norm")}}
    io = _pack("GdWdTileIO", w0=_ptr(W0), lr=_ptr(lr), wd=_ptr(wd), batch=B, steps=steps,
               record_every=record_every, v1=_ptr(v1),
               **{name: _ptr(a) for name, a in out.items()})
    return dev, io, (W0, lr, wd, v1), out


def _launch_tile(kernel: str, args: tuple, work_blocks: int, threads: int = TILE_THREADS,
                 smem: int = 0, unit_name: str = TILES) -> None:
    """A persistent launch of the tile kernel ``kernel`` (a key of :func:`unit`'s names for
    ``unit_name``) on the current stream, ``smem`` bytes of dynamic shared memory a block
    (opted in to), as many blocks as are resident at once."""
    import cupy
    fn = _functions(unit_name, cupy.cuda.Device().id)[kernel]
    if smem:
        fn.max_dynamic_shared_size_bytes = smem
    per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr,
                                                                        threads, smem)
    blocks = persistent_blocks(work_blocks, _device_attribute("MultiProcessorCount"), per_sm)
    fn((blocks,), (threads,), args, shared_mem=smem)


def _tile_result(dev: bool, out: dict) -> tuple:
    return _host(tuple(out[name] for name in TILE_OUTPUTS), dev)


def tile_toy3d_gd_wd(c: float, W0, lr, wd, steps: int, record_every: int, v1=None) -> tuple:
    """GD+WD on Toy3D on its tile kernel: W0 (B, 3), lr and wd (B,), optional unit vectors
    v1 (B, 3) -> (w_final (B, 3), loss (R, B), norm2 (R, B), diverged (B,),
    diverged_step (B,), eff_lr (R, B), grad_norm (R, B), top_grad (R, B) = ||w|| v1 .
    grad L(w), (0, B) without v1), R = steps // record_every + 1."""
    dev, io, inputs, out = _tile_run(W0, lr, wd, steps, record_every, 3, "3", v1)
    B = int(io["batch"])
    _launch_tile("toy3d", (_pack("Toy3D", c=c), io), -(-B // TILE_THREADS))
    return _tile_result(dev, out)


def tile_bn_mc_fits(D: int, N: int) -> bool:
    """Whether BN matrix completion with D coordinates and N observations runs on its tile
    on the current device (its shared memory per block)."""
    return bn_mc_tile_fits(D, N, _device_attribute("MaxSharedMemoryPerBlockOptin"))


def _bn_mc_launch(rows, cols, u, scale: float, m1: int, m2: int, r: int, W0, lr, wd,
                  steps: int, record_every: int, v1, fits, tile: str, asks: str) -> tuple:
    """What both BN matrix completion tiles start from, every argument checked as
    bind_tile.cu checks it before anything is allocated: (rows, cols, D, N, the block's
    opt-in shared memory, the model struct, what the launch must hold until it is queued,
    then _tile_run's results). ``fits(D, N, optin)``: the tile's size test; ``tile`` and
    ``asks`` (the module's function that asks it) name them in the refusal."""
    import cupy as cp
    rows, cols, u = np.asarray(rows), np.asarray(cols), np.asarray(u, dtype=np.float64)
    if not (rows.ndim == cols.ndim == u.ndim == 1 and rows.size == u.size == cols.size
            and u.size >= 2 and m1 >= 1 and m2 >= 1 and r >= 1):
        raise ValueError("rows, cols and u must be (N,), N >= 2, and m1, m2, r >= 1")
    if not _observations_inside(rows, cols, m1, m2):
        raise ValueError("an observation lies outside the (m1, m2) matrix")
    N, D = u.size, (m1 + m2) * r
    shape = W0.shape if isinstance(W0, cp.ndarray) else np.shape(W0)
    if len(shape) != 2 or shape[1] != D:  # before the fit, as bind_tile.cu
        raise ValueError(f"W0 must be (B, (m1 + m2) r), got shape {tuple(shape)}")
    optin = _device_attribute("MaxSharedMemoryPerBlockOptin")
    if not fits(D, N, optin):
        raise ValueError(f"the model is too large for the BN matrix completion {tile} on this "
                         f"device (see {asks})")
    dev, io, inputs, out = _tile_run(W0, lr, wd, steps, record_every, D, "(m1 + m2) r", v1)
    data = [cp.asarray(a) for a in (rows.astype(np.int32), cols.astype(np.int32), u)]
    m = _pack("BNMatrixCompletion", rows=_ptr(data[0]), cols=_ptr(data[1]), u=_ptr(data[2]),
              scale=scale, N=N, m1=m1, m2=m2, r=r)
    return rows, cols, D, N, optin, m, (inputs, data), dev, io, out


def tile_bn_mc_gd_wd(rows, cols, u, scale: float, m1: int, m2: int, r: int, W0, lr, wd,
                     steps: int, record_every: int, v1=None) -> tuple:
    """GD+WD on BN matrix completion on its tile kernel (one thread per trajectory, its
    scratch in shared memory): W0 (B, (m1 + m2) r); the tuple of :func:`tile_toy3d_gd_wd`.
    Refused (ValueError) for a model that :func:`tile_bn_mc_fits` rejects."""
    _, _, D, N, optin, m, held, dev, io, out = _bn_mc_launch(
        rows, cols, u, scale, m1, m2, r, W0, lr, wd, steps, record_every, v1, bn_mc_tile_fits,
        "tile", "_tile_bn_mc_fits")
    threads, smem = bn_mc_tile_block(D, N, optin)
    _launch_tile("bn_mc", (m, io), -(-int(io["batch"]) // threads), threads, smem)
    return _tile_result(dev, out)


def tile_bn_mc_warp_fits(D: int, N: int) -> bool:
    """Whether BN matrix completion with D coordinates and N observations runs on its warp
    tile on the current device (one warp's scratch in a block's shared memory)."""
    return bn_mc_warp_tile_fits(D, N, _device_attribute("MaxSharedMemoryPerBlockOptin"))


def tile_bn_mc_warp_gd_wd(rows, cols, u, scale: float, m1: int, m2: int, r: int, W0, lr, wd,
                          steps: int, record_every: int, v1=None) -> tuple:
    """GD+WD on BN matrix completion on its warp tile kernel (one warp per trajectory, for
    models too large for :func:`tile_bn_mc_gd_wd`): W0 (B, (m1 + m2) r); the tuple of
    :func:`tile_toy3d_gd_wd`. Refused (ValueError) for a model that
    :func:`tile_bn_mc_warp_fits` rejects."""
    import cupy as cp
    rows, cols, D, N, optin, m, held, dev, io, out = _bn_mc_launch(
        rows, cols, u, scale, m1, m2, r, W0, lr, wd, steps, record_every, v1,
        bn_mc_warp_tile_fits, "warp tile", "_tile_bn_mc_warp_fits")
    terms = [cp.asarray(a) for a in bn_mc_warp_terms(rows, cols, m1, m2, r)]
    warp_data = _pack("BNMcWarpData", m=m, pass_start=_ptr(terms[0]), term_obs=_ptr(terms[1]),
                      term_other=_ptr(terms[2]))
    per_warp = bn_mc_warp_doubles(D, N) * 8
    fn = _functions(TILES, cp.cuda.Device().id)["bn_mc_warp"]
    fn.max_dynamic_shared_size_bytes = min(optin // per_warp, TILE_WARPS) * per_warp
    occupancy = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor
    warps, smem = bn_mc_warp_block(D, N, optin,
                                   lambda w, b: occupancy(fn.kernel.ptr, 32 * w, b) * w)
    _launch_tile("bn_mc_warp", (warp_data, io), -(-int(io["batch"]) // warps), 32 * warps,
                 smem)
    return _tile_result(dev, out)


def tile_bn_linreg_gd_wd(Xc, u, scale: float, W0, lr, wd, steps: int,
                         record_every: int, v1=None) -> tuple:
    """GD+WD on BN linear regression on its tile kernel (8 trajectories a warp, FP64 mma,
    compute capability 8.0+), specialised on (d, n): W0 (B, d); the tuple of
    :func:`tile_toy3d_gd_wd`. Refused (ValueError) where :func:`tile_bn_linreg_fits` says
    no."""
    Xc, u = np.asarray(Xc, dtype=np.float64), np.asarray(u, dtype=np.float64)
    if Xc.ndim != 2 or u.ndim != 1 or u.shape[0] != Xc.shape[0]:
        raise ValueError("Xc must be (n, d) and u (n,)")
    n, d = Xc.shape
    if not tile_bn_linreg_fits(d, n):
        raise ValueError(f"no tile kernel for d = {d}, n = {n} on this device: FP64 mma "
                         f"(compute capability 8.0+), d <= {BN_LINREG_TILE_MAX_D}, "
                         f"n <= {BN_LINREG_TILE_MAX_N} and its shared memory "
                         "(see _tile_bn_linreg_fits)")
    import cupy as cp
    dev, io, inputs, out = _tile_run(W0, lr, wd, steps, record_every, d, "d", v1)
    dp, np_ = -(-d // 8) * 8, -(-n // 8) * 8
    xc_pad, u_pad = np.zeros((np_, dp)), np.zeros(np_)  # tile::pack_bn_linreg
    xc_pad[:n, :d], u_pad[:n] = Xc, u
    xc_d, u_d = cp.asarray(xc_pad), cp.asarray(u_pad)
    err = d * 2.220446049250313e-16
    data = _pack("BNLinRegTileData", xc=_ptr(xc_d), u=_ptr(u_d), scale=scale,
                 floor_coef=err * err * _fro2(Xc, np.float64))
    tiles = -(-int(io["batch"]) // 8)
    _launch_tile(f"bn_linreg_{d}_{n}", (data, io), -(-tiles // TILE_WARPS),
                 smem=bn_linreg_tile_smem_bytes(d, n), unit_name=bn_linreg_unit(d, n))
    return _tile_result(dev, out)


def tile_bn_linreg_fits(d: int, n: int) -> bool:
    """Whether BN linear regression with d coordinates and n samples runs on its tile on the
    current device (:func:`bn_linreg_tile_fits`); a shape the tiles' unit does not hold is
    compiled at first use (about 5 s)."""
    import cupy as cp
    return bn_linreg_tile_fits(d, n, _device_attribute("MaxSharedMemoryPerBlockOptin"),
                               int(cp.cuda.Device().compute_capability))


class _Module:
    """Looks like ``pysharp._cuda`` to the models: ``Toy3D_f64(c)`` etc. (``_make_core``) and
    the ``_tile_*`` functions (``_tile_kernel``); ``loaded(model, real)`` for a model compiled
    at run time."""

    loaded = staticmethod(Loaded)

    _TILE_BN_LINREG_SHAPES = [tuple(s) for s in cs.BN_LINREG_TILE_SHAPES]
    _tile_toy3d_gd_wd = staticmethod(tile_toy3d_gd_wd)
    _tile_bn_mc_fits = staticmethod(tile_bn_mc_fits)
    _tile_bn_mc_gd_wd = staticmethod(tile_bn_mc_gd_wd)
    _tile_bn_mc_warp_fits = staticmethod(tile_bn_mc_warp_fits)
    _tile_bn_mc_warp_gd_wd = staticmethod(tile_bn_mc_warp_gd_wd)
    _tile_bn_linreg_gd_wd = staticmethod(tile_bn_linreg_gd_wd)
    _tile_bn_linreg_fits = staticmethod(tile_bn_linreg_fits)

    def __getattr__(self, name: str):
        model, _, prec = name.rpartition("_")
        core = loader.core()
        if prec not in cs.REAL or model not in core.BUILTIN_MODELS:
            raise AttributeError(name)
        host_class = getattr(core, name)
        real = np.float64 if prec == "f64" else np.float32

        def make(*args):
            return _CupyCore(model, host_class(*args), real)
        return make


def module() -> _Module:
    """The CuPy backend's classes and tiles, addressed as ``pysharp._cuda``'s are."""
    importlib.import_module("cupy")  # ImportError early, with cupy's own message
    return _Module()

"""CuPy backend: csrc/cuda/kernels.cuh compiled by NVRTC at first use, launched through CuPy.

No nvcc is needed: NVRTC (PyPI nvidia-cuda-nvrtc through cuda-bindings, see
:mod:`pysharp._backends._nvrtc`) compiles the same kernel source that ``pysharp._cuda`` is
built from,
for the device's own architecture, once per (model, precision, architecture); the cubin is
cached on disk beside run-time compiled models (keyed by the sources and NVRTC's version)
and loaded with ``cupy.RawModule``. The classes here take the constructor arguments of
``pysharp._core``'s and ``pysharp._cuda``'s (what the models' ``_make_core`` passes), copy
the model's data to the device once, and run the kernels on CuPy arrays: inputs (B, D) on
the device, outputs CuPy arrays, no host copies, launches on CuPy's current stream (so in
stream order with the caller's own work). The launch arithmetic (128 threads a block, one
thread per row, per-row scratch slices) mirrors CudaExec in csrc/cuda/executor.cuh.

Status (issue 28): the kernels (loss and gradient, HVP, third order, Hessian) exist here;
trajectories and Lanczos do not, and the models' public methods do not route
``backend="cupy"`` here yet (they validate on the host). None of this has run on a device:
the project had no GPU while it was written. :func:`unavailable_reason` says so.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import os
import stat
from functools import cache
from pathlib import Path

import numpy as np

from . import _cuda_sources as cs
from . import _nvrtc

THREADS = 128  # kThreads of executor.cuh

_NOT_WIRED = ("backend='cupy' is not wired into the models' methods yet (issue 28); its "
              "kernels (pysharp._backends._cupy.module()) have never run on a device")


def unavailable_reason() -> str | None:
    """None when ``backend="cupy"`` can run here, else why not (the first blocker found).

    Never None today: even with CuPy, NVRTC and a device, the models do not route to this
    backend yet (the module docstring's status).
    """
    return device_reason() or _NOT_WIRED


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


# -- the models' structs, laid out as C++ lays them out (tests/backends/test_cupy.py checks) --

def struct_dtype(model: str, real) -> np.dtype:
    """The numpy dtype with the layout of ``pysharp::<model><Real>`` (passed by value)."""
    r = np.dtype(real)
    ptr, i4 = np.uint64, np.int32
    fields = {
        "Toy3D": [("c", r)],
        "BNLinearRegression": [("Xc", ptr), ("u", ptr), ("scale", r), ("xc_fro2", r),
                               ("n", i4), ("d", i4)],
        "BNMatrixCompletion": [("rows", ptr), ("cols", ptr), ("u", ptr), ("scale", r),
                               ("N", i4), ("m1", i4), ("m2", i4), ("r", i4)],
        "BNTwoLayerNet": [("Xc", ptr), ("y", ptr), ("xc_fro2", r), ("inv_sqrt_m", r),
                          ("n", i4), ("d", i4), ("m", i4), ("act", i4)],
    }[model]
    return np.dtype(fields, align=True)


# -- compilation, cached ------------------------------------------------------------------------

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
def _functions(model: str, prec: str, device: int) -> dict:
    """Short kernel name -> cupy function on ``device``, compiled (or read from the disk
    cache) once per architecture and loaded once per device."""
    import cupy
    arch = f"sm_{cupy.cuda.Device(device).compute_capability}"
    names = cs.kernel_names(model, prec)
    path = _cache_dir() / f"{model}_{prec}_{arch}_{_sources_digest()}.cubin"
    lowered_path = path.with_suffix(".names")
    if not (path.is_file() and lowered_path.is_file()):
        out = _nvrtc.compile_cuda(cs.KERNELS_SOURCE, arch=arch, name=f"{model}_{prec}.cu",
                                  name_expressions=list(names.values()))
        # names first, the cubin last, each replaced whole: a reader sees both or no cubin
        for target, data in ((lowered_path, "\n".join(out.lowered[e] for e in names.values())
                              .encode()), (path, out.cubin)):
            tmp = target.with_suffix(f".tmp{id(out)}")
            tmp.write_bytes(data)
            tmp.replace(target)
    lowered = lowered_path.read_text().split("\n")
    with cupy.cuda.Device(device):
        module = cupy.RawModule(path=str(path))
        return {short: module.get_function(low) for short, low in zip(names, lowered)}


def _fro2(Xc, real) -> float:
    """||Xc||_F^2 as executor.cuh forms it: entries in Real, summed in double, in order."""
    x = np.asarray(Xc, dtype=real).astype(np.float64).ravel()
    return float(np.cumsum(x * x)[-1]) if x.size else 0.0


def _blocks(n: int) -> tuple[int]:
    return ((n + THREADS - 1) // THREADS,)


# -- the cores --------------------------------------------------------------------------------

class _CupyCore:
    """One model in one precision on the current device; subclasses fill ``_struct``."""

    _model = ""

    def __init__(self, real) -> None:
        import cupy
        self._cp = cupy
        self.real = np.dtype(real)
        self._prec = "f64" if self.real == np.float64 else "f32"
        self._keep: list = []  # device arrays the struct points to
        self._device_id = cupy.cuda.Device().id  # the model's data live there

    def _device(self, a, dtype) -> int:
        d = self._cp.asarray(np.ascontiguousarray(a, dtype=dtype))
        self._keep.append(d)
        return int(d.data.ptr)

    def _pack(self, **fields) -> None:
        s = np.zeros((), dtype=struct_dtype(self._model, self.real))
        for k, v in fields.items():
            s[k] = v
        self._struct = s[()]  # numpy.void: CuPy passes it by value

    def _fn(self, kernel: str):
        if self._cp.cuda.Device().id != self._device_id:
            raise ValueError(f"this {self._model} core holds its data on device "
                             f"{self._device_id}, not the current device")
        return _functions(self._model, self._prec, self._device_id)[kernel]

    def _rows(self, W):
        W = self._cp.asarray(W)
        if W.ndim != 2 or W.shape[1] != self.dim or W.dtype != self.real:
            raise ValueError(f"W must be a (B, {self.dim}) {self.real} CuPy array, "
                             f"got {W.shape} {W.dtype}")
        return self._cp.ascontiguousarray(W)

    # jet_scratch_size (models/derivatives.hpp) and work_size mirrored per model
    def jet_scratch_size(self) -> int:
        return 2 * self.dim + self.work_size

    def loss_grad(self, W):
        """(loss (B,), G (B, D), ok (B,) uint8) as CuPy arrays."""
        cp = self._cp
        W = self._rows(W)
        B = W.shape[0]
        loss = cp.empty(B, self.real)
        G = cp.empty((B, self.dim), self.real)
        work = cp.empty(B * max(1, self.work_size), self.real)
        ok = cp.empty(B, cp.uint8)
        self._fn("loss_grad")(_blocks(B), (THREADS,),
                              (self._struct, W, np.int64(B), loss, G, work, ok))
        return loss, G, ok

    def _directional(self, kernel: str, order: int, W, V):
        cp = self._cp
        W, V = self._rows(W), self._rows(V)
        B = W.shape[0]
        out = cp.empty((B, self.dim), self.real)
        jets = cp.empty(B * self.jet_scratch_size() * (order + 1), self.real)
        ok = cp.empty(B, cp.uint8)
        self._fn(kernel)(_blocks(B), (THREADS,), (self._struct, W, V, np.int64(B), out, jets, ok))
        return out, ok

    def hvp(self, W, V):
        """(H(w) v (B, D), ok (B,)) as CuPy arrays."""
        return self._directional("hvp", 1, W, V)

    def third(self, W, V):
        """(D^3L(w)[v, v] (B, D), ok (B,)) as CuPy arrays."""
        return self._directional("third", 2, W, V)

    def hessian(self, W):
        """(H (B, D, D), ok (B,)): one thread per (row, column), as CudaExec::hessian."""
        cp = self._cp
        W = self._rows(W)
        B, D = W.shape[0], self.dim
        H = cp.empty((B, D, D), self.real)
        e = cp.empty(B * D * D, self.real)
        col = cp.empty(B * D * D, self.real)
        jets = cp.empty(B * D * self.jet_scratch_size() * 2, self.real)
        bad = cp.zeros(B, cp.uint8)
        self._fn("hessian")(_blocks(B * D), (THREADS,),
                            (self._struct, W, np.int64(B), H, e, col, jets, bad))
        return H, (bad == 0).astype(cp.uint8)


class Toy3D(_CupyCore):
    _model = "Toy3D"
    dim, work_size = 3, 0

    def __init__(self, c: float, real=np.float64) -> None:
        super().__init__(real)
        self._pack(c=c)


class BNLinearRegression(_CupyCore):
    _model = "BNLinearRegression"

    def __init__(self, Xc, u, scale, *_spectral, real=np.float64) -> None:
        super().__init__(real)
        Xc = np.asarray(Xc)
        n, d = Xc.shape
        self.dim, self.work_size = d, n
        self._pack(Xc=self._device(Xc, self.real), u=self._device(u, self.real), scale=scale,
                   xc_fro2=_fro2(Xc, self.real), n=n, d=d)


class BNMatrixCompletion(_CupyCore):
    _model = "BNMatrixCompletion"

    def __init__(self, rows, cols, u, scale, m1, m2, r, real=np.float64) -> None:
        super().__init__(real)
        rows, cols = np.asarray(rows), np.asarray(cols)
        if rows.size and (rows.min() < 0 or rows.max() >= m1 or cols.min() < 0
                          or cols.max() >= m2):
            raise ValueError("observation index out of range")
        self.dim, self.work_size = (m1 + m2) * r, int(rows.size)
        self._pack(rows=self._device(rows, np.int32), cols=self._device(cols, np.int32),
                   u=self._device(u, self.real), scale=scale, N=int(rows.size), m1=m1, m2=m2,
                   r=r)


class BNTwoLayerNet(_CupyCore):
    _model = "BNTwoLayerNet"

    def __init__(self, Xc, y, width, activation, real=np.float64) -> None:
        super().__init__(real)
        Xc = np.asarray(Xc)
        n, d = Xc.shape
        self.dim, self.work_size = width * d, 2 * width * n + 2 * n + width
        self._pack(Xc=self._device(Xc, self.real), y=self._device(y, self.real),
                   xc_fro2=_fro2(Xc, self.real), inv_sqrt_m=1 / math.sqrt(width), n=n, d=d,
                   m=width, act=int(activation))


class _Module:
    """Looks like ``pysharp._cuda`` to the models' ``_make_core``: ``Toy3D_f64(c)`` etc."""

    def __getattr__(self, name: str):
        model, _, prec = name.rpartition("_")
        cls = globals().get(model)
        if prec not in cs.REAL or not (isinstance(cls, type) and issubclass(cls, _CupyCore)):
            raise AttributeError(name)
        real = np.float64 if prec == "f64" else np.float32

        def make(*args):
            return cls(*args, real=real)
        return make


def module() -> _Module:
    """The CuPy backend's classes, addressed as the compiled modules' are."""
    importlib.import_module("cupy")  # ImportError early, with cupy's own message
    return _Module()

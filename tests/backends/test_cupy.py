"""The CuPy backend (pysharp/_backends/_cupy.py): what a CPU machine can check, and the device
checks (marked gpu) that no run has executed yet.

Without a GPU: the backend says truthfully why it cannot run, and the model structs it
passes by value have the byte layout C++ gives them (g++ prints sizeof/offsetof; nvcc lays
these plain structs out the same on x86-64). With CuPy and a device (pytest -m gpu): every
kernel matches the compiled CPU core on CuPy arrays in and out, launches respect CuPy's
current stream, and bits equal the nvcc-built CUDA backend's where both are present.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import pysharp as ps
from pysharp._backends import _cupy

CSRC = Path(__file__).resolve().parents[2] / "csrc"
MODELS = ("Toy3D", "BNLinearRegression", "BNMatrixCompletion", "BNTwoLayerNet")


def test_the_backend_says_why_it_cannot_run():
    reason = ps.backends()["cupy"]["reason"]
    assert reason == _cupy.unavailable_reason() and reason
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert "cupy is not installed" in reason
    else:
        assert reason == _cupy.device_reason() or "not wired" in reason


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_struct_layouts_match_cpp(tmp_path):
    fields = {m: _cupy.struct_dtype(m, np.float64).names for m in MODELS}
    lines = ['#include <cstddef>', '#include <cstdio>',
             *(f'#include "pysharp/models/{h}.hpp"' for h in
               ("toy3d", "bn_linear_regression", "bn_matrix_completion", "bn_two_layer_net")),
             "int main() {"]
    for real in ("double", "float"):
        for m in MODELS:
            t = f"pysharp::{m}<{real}>"
            offs = " ".join('%zu' for _ in fields[m])
            args = ", ".join(f"offsetof({t}, {f})" for f in fields[m])
            # act is an enum class stored as int: offsetof works on it like any member
            lines.append(f'  std::printf("{real} {m} %zu {offs}\\n", sizeof({t}), {args});')
    lines.append("}")
    src = tmp_path / "layout.cpp"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run(["g++", "-std=c++17", f"-I{CSRC / 'include'}", str(src), "-o", str(exe)],
                   check=True)
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        real, model, size, *offsets = line.split()
        dt = _cupy.struct_dtype(model, np.float64 if real == "double" else np.float32)
        assert dt.itemsize == int(size), (real, model)
        assert [dt.fields[f][1] for f in dt.names] == [int(o) for o in offsets], (real, model)


# -- on a device (never run yet: the project had no GPU when this was written) ----------------

def _device():
    reason = _cupy.device_reason()
    if reason is not None:
        pytest.skip(reason)
    import cupy
    return cupy


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernels_match_the_cpu_core_on_cupy_arrays(case, dtype):
    cp = _device()
    m = case.model
    if type(m).__name__ not in MODELS:
        pytest.skip(f"{type(m).__name__} has no CuPy core")
    suffix = "_f64" if dtype == np.float64 else "_f32"
    core = m._make_core(suffix, _cupy.module())
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


@pytest.mark.gpu
def test_launches_follow_cupys_current_stream(toy_case):
    cp = _device()
    core = toy_case.model._make_core("_f64", _cupy.module())
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
    if type(m).__name__ not in MODELS:
        pytest.skip(f"{type(m).__name__} has no CuPy core")
    import pysharp._cuda as cu
    W = case.points(64, seed=6)
    a = m._make_core("_f64", cu).loss_grad(W)
    b = m._make_core("_f64", _cupy.module()).loss_grad(cp.asarray(W))
    assert np.array_equal(a[1], b[1].get()) and np.array_equal(a[0], b[0].get())

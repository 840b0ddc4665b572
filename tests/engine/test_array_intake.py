"""Arrays of NumPy, JAX and PyTorch reach the kernels in place (DLPack), and
``import pysharp`` loads neither JAX nor PyTorch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pysharp as ps
from pysharp._engine import validation as _validation


@pytest.fixture
def intake(monkeypatch):
    """The arrays as_float_array hands to the kernels, by argument name."""
    seen: dict[str, list[np.ndarray]] = {}
    monkeypatch.setattr(_validation, "_intake_hook",
                        lambda name, a: seen.setdefault(name, []).append(a))
    return seen


@pytest.fixture(scope="module")
def model():
    return ps.BNLinearRegression.synthetic(d=40, n=20)


def kernels(model, w, v):
    L, G = model.loss_and_grad(w)
    return L, G, model.hvp(w, v), model.third(w, v), model.hessian(w)


def check_same(model, W, V, outs):
    for a, b in zip(outs, kernels(model, W, V)):
        np.testing.assert_array_equal(a, b)


def test_numpy_in_place(model, intake):
    W, V = model.random_point(4, seed=0), model.random_point(4, seed=1)
    kernels(model, W, V)
    assert intake["w"] and all(np.shares_memory(a, W) for a in intake["w"])
    assert intake["v"] and all(np.shares_memory(a, V) for a in intake["v"])


def test_jax_in_place(model, intake):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    Wn, Vn = model.random_point(4, seed=0), model.random_point(4, seed=1)
    W, V = jnp.asarray(Wn), jnp.asarray(Vn)
    assert W.dtype == jnp.float64
    outs = kernels(model, W, V)
    for name, x in (("w", W), ("v", V)):
        assert intake[name]
        for a in intake[name]:
            assert a.ctypes.data == x.unsafe_buffer_pointer() and a.nbytes == x.nbytes
    check_same(model, Wn, Vn, outs)
    # float32 stays float32, read in place too
    intake.clear()
    W32 = jnp.asarray(Wn, jnp.float32)
    assert model.loss(W32).dtype == np.float32
    assert intake["w"][0].ctypes.data == W32.unsafe_buffer_pointer()


def test_torch_in_place(model, intake):
    torch = pytest.importorskip("torch")
    Wn, Vn = model.random_point(4, seed=0), model.random_point(4, seed=1)
    W, V = torch.from_numpy(Wn.copy()), torch.from_numpy(Vn.copy())
    outs = kernels(model, W, V)
    for name, x in (("w", W), ("v", V)):
        assert intake[name]
        for a in intake[name]:
            assert a.ctypes.data == x.data_ptr() and a.nbytes == x.numel() * x.element_size()
    check_same(model, Wn, Vn, outs)
    # a tensor that requires grad is read through detach(), still in place
    intake.clear()
    Wg = W.clone().requires_grad_()
    model.loss(Wg)
    assert intake["w"][0].ctypes.data == Wg.data_ptr()
    # a non-contiguous tensor is copied (layout), keeping its dtype
    intake.clear()
    Wt = torch.from_numpy(np.asfortranarray(Wn))
    np.testing.assert_array_equal(model.loss(Wt), model.loss(Wn))
    assert intake["w"][0].dtype == np.float64
    assert model.loss(W.float()).dtype == torch.float32
    with pytest.raises(TypeError, match="w"):
        model.loss(W.to(torch.bfloat16))


@pytest.mark.parametrize("library", ["numpy", "jax", "torch"])
def test_results_come_back_in_the_callers_array_type(model, library):
    """Every kernel returns arrays of the input's library, with the NumPy call's values and
    dtype; square-loss models too (their Jacobians included)."""
    if library == "numpy":
        convert, kind = np.asarray, (np.ndarray, np.generic)  # a single loss: a NumPy scalar
    elif library == "jax":
        jax = pytest.importorskip("jax")
        jax.config.update("jax_enable_x64", True)
        convert, kind = jax.numpy.asarray, jax.Array
    else:
        torch = pytest.importorskip("torch")
        convert, kind = (lambda a: torch.from_numpy(np.array(a))), torch.Tensor
    net = ps.TwoLayerNet.synthetic(d=3, m=4, n=5, seed=0)
    for m in (model, net):
        for dtype in (np.float64, np.float32):
            Wn = m.random_point(3, seed=0).astype(dtype)
            Vn = m.random_point(3, seed=1).astype(dtype)
            outs = kernels(m, convert(Wn), convert(Vn)) + (m.loss(convert(Wn[0])),)
            if m is net:
                outs += m.jacobians(convert(Wn)) + (m.gauss_newton_hvp(convert(Wn), Vn),)
            want = kernels(m, Wn, Vn) + (m.loss(Wn[0]),)
            if m is net:
                want += m.jacobians(Wn) + (m.gauss_newton_hvp(Wn, Vn),)
            for got, ref in zip(outs, want, strict=True):
                assert isinstance(got, kind), (type(got), library)
                assert str(got.dtype).endswith(np.dtype(dtype).name)
                np.testing.assert_array_equal(np.asarray(got), ref)


def test_import_pysharp_loads_no_framework():
    code = textwrap.dedent("""
        import sys
        import pysharp
        assert "jax" not in sys.modules and "torch" not in sys.modules, \\
            [m for m in ("jax", "torch") if m in sys.modules]
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_missing_framework_message(framework):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["{framework}"] = None  # as if not installed
        try:
            import pysharp.{framework}
        except ImportError as exc:
            assert "pip install {framework}" in str(exc), str(exc)
        else:
            raise AssertionError("no ImportError")
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("library", ["jax", "torch"])
def test_what_is_not_an_array_comes_back_as_it_is(library):
    """like_input converts arrays only: a Python number or a result object passes through."""
    from pysharp._engine.validation import like_input
    template = pytest.importorskip(library).numpy.zeros(2) if library == "jax" else \
        pytest.importorskip(library).zeros(2)
    marker = object()
    assert like_input(template, marker) is marker
    out = like_input(template, (np.ones(2), 3.5))
    assert type(out[1]) is float and not isinstance(out[0], np.ndarray)

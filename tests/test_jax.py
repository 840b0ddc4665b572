"""pysharp.jax: the kernels inside jit, vmap and grad, against the same losses in jax.numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest
from _cases import EXAMPLE_MODELS, example_module

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
jax.config.update("jax_enable_x64", True)

import pysharp as ps  # noqa: E402
import pysharp.jax as psj  # noqa: E402


@pytest.fixture(scope="module", autouse=True, params=["ffi", "direct"])
def path(request):
    """Every test on both ways of calling the kernels: the compiled FFI handlers (the
    default) and the Python callback (the fallback without a compiler)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(psj, "CALLBACK_PATH", request.param)
    yield request.param
    mp.undo()


@pytest.fixture(scope="module")
def model(path):
    return ps.BNLinearRegression.synthetic(d=40, n=20)


def bn_loss(model):
    """BN linear regression written in jax.numpy (docs/theory.rst): population BN of X w."""
    X, y = jnp.asarray(model.X), jnp.asarray(model.y)

    def loss(w):
        z = X @ w
        zc = z - z.mean()
        p = y.std() * zc / jnp.sqrt(jnp.mean(zc ** 2)) + y.mean()
        return jnp.mean((p - y) ** 2)

    return loss


def points(model, batch=5, seed=0, dtype=np.float64):
    return jnp.asarray(model.random_point(batch, seed=seed, norm=1.7).astype(dtype))


def counting(model, kernel, calls):
    """Count calls of one kernel on this model instance (the callbacks look it up by name)."""
    original = getattr(model, kernel)

    def wrapped(*args, **kw):
        calls.append(kernel)
        return original(*args, **kw)

    setattr(model, kernel, wrapped)
    return lambda: delattr(model, kernel)


_TARGET = re.compile(r"@_pysharp_jax_\w+?_(loss_and_grad|hvp|third)\b")


def kernel_calls(model, f, *args) -> list[str]:
    """The kernels one evaluation of f(*args) calls: FFI targets in the compiled program,
    or callbacks counted on the model."""
    if psj.CALLBACK_PATH == "ffi":
        assert psj._ops(model).path == "ffi"
        return _TARGET.findall(jax.jit(f).lower(*args).as_text())
    calls: list[str] = []
    undo = [counting(model, k, calls) for k in ("loss_and_grad", "hvp", "third")]
    try:
        jax.block_until_ready(f(*args))
    finally:
        for u in undo:
            u()
    return calls


def test_values_match_kernels(model):
    W = points(model)
    L, G = psj.loss_and_grad(model, W)
    L0, G0 = model.loss_and_grad(np.asarray(W))
    np.testing.assert_array_equal(np.asarray(L), L0)
    np.testing.assert_array_equal(np.asarray(G), G0)
    np.testing.assert_array_equal(np.asarray(psj.loss(model, W[0])), L0[0])
    V = points(model, seed=1)
    np.testing.assert_array_equal(np.asarray(psj.hvp(model, W, V)),
                                  model.hvp(np.asarray(W), np.asarray(V)))
    np.testing.assert_array_equal(np.asarray(psj.third(model, W, V[0])),
                                  model.third(np.asarray(W), np.asarray(V[0])))
    np.testing.assert_array_equal(np.asarray(psj.hessian(model, W)), model.hessian(np.asarray(W)))


def test_float32(model):
    W = points(model, dtype=np.float32)
    L, G = psj.loss_and_grad(model, W)
    assert L.dtype == G.dtype == jnp.float32
    L0, G0 = model.loss_and_grad(np.asarray(W))
    np.testing.assert_array_equal(np.asarray(G), G0)
    g = jax.grad(lambda w: psj.loss(model, w))(W[0])
    assert g.dtype == jnp.float32


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_batch_split_into_chunks_keeps_the_kernels_bits(model, dtype):
    # From 1024 rows BN linear regression takes its row kernel (cpu/bn_linreg_rows.hpp),
    # which the FFI handler runs in chunks on XLA's pool; 1029 rows leave a partial block.
    W = points(model, batch=1029, seed=3, dtype=dtype)
    L, G = psj.loss_and_grad(model, W)
    L0, G0 = model.loss_and_grad(np.asarray(W))
    np.testing.assert_array_equal(np.asarray(L), L0)
    np.testing.assert_array_equal(np.asarray(G), G0)


def test_grad_equals_jax_to_1e13(model):
    ref = bn_loss(model)
    for w in points(model, 4, seed=3):
        g = jax.grad(lambda w: psj.loss(model, w))(w)
        np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(ref)(w)), rtol=0, atol=1e-13)


def test_hessian_equals_jax_to_1e12(model):
    ref = bn_loss(model)
    for w in points(model, 3, seed=4):
        H = jax.hessian(lambda w: psj.loss(model, w))(w)
        np.testing.assert_allclose(np.asarray(H), np.asarray(jax.hessian(ref)(w)),
                                   rtol=0, atol=1e-12)


def test_grad_calls_gradient_kernel_and_hessian_hvp(model):
    w = points(model, 1)[0]
    assert kernel_calls(model, jax.grad(lambda w: psj.loss(model, w)), w) == ["loss_and_grad"]
    # jacfwd batches the D tangents: one HVP kernel call on a (D, D) batch
    calls = kernel_calls(model, jax.hessian(lambda w: psj.loss(model, w)), w)
    assert calls.count("hvp") == 1 and "third" not in calls


def test_jit_and_vmap(model):
    ref = bn_loss(model)
    W = points(model, 6, seed=5)
    f = jax.jit(lambda W: psj.loss_and_grad(model, W))
    L, G = f(W)
    np.testing.assert_allclose(np.asarray(L), np.asarray(jax.vmap(ref)(W)), rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.asarray(G), np.asarray(jax.vmap(jax.grad(ref))(W)), rtol=0,
                               atol=1e-13)
    # vmap over points: one kernel call on the whole batch
    vg = jax.jit(jax.vmap(jax.grad(lambda w: psj.loss(model, w))))
    assert kernel_calls(model, vg, W) == ["loss_and_grad"]
    g = vg(W)
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.vmap(jax.grad(ref))(W)), rtol=0,
                               atol=1e-13)
    # nested vmap, and vmap of hvp with an unbatched v
    out = jax.vmap(jax.vmap(lambda w: psj.loss(model, w)))(W.reshape(2, 3, -1))
    np.testing.assert_array_equal(np.asarray(out).ravel(), np.asarray(L))
    v = points(model, 1, seed=6)[0]
    hv = jax.vmap(lambda w: psj.hvp(model, w, v))(W)
    np.testing.assert_array_equal(np.asarray(hv), model.hvp(np.asarray(W), np.asarray(v)))
    # a GD + WD loop under jit
    def step(_, w):
        _, g = psj.loss_and_grad(model, w)
        return w - 0.1 * g - 0.1 * 1e-3 * w
    Wn = jax.jit(lambda W: jax.lax.fori_loop(0, 5, step, W))(W)
    Wr = np.asarray(W)
    for _ in range(5):
        Wr = Wr - 0.1 * model.grad(Wr) - 0.1 * 1e-3 * Wr
    np.testing.assert_allclose(np.asarray(Wn), Wr, rtol=0, atol=1e-14)


def test_hvp_and_third_derivatives(model):
    ref = bn_loss(model)
    w, v, t = points(model, 3, seed=7)

    def ref_hvp(w, v):
        return jax.jvp(jax.grad(ref), (w,), (v,))[1]

    np.testing.assert_allclose(np.asarray(psj.hvp(model, w, v)), np.asarray(ref_hvp(w, v)),
                               rtol=0, atol=1e-13)
    # d/dw H(w) v along t: D^3L[v, t], by polarization of the third-order kernel
    d1 = jax.jvp(lambda w: psj.hvp(model, w, v), (w,), (t,))[1]
    d2 = jax.jvp(lambda w: ref_hvp(w, v), (w,), (t,))[1]
    np.testing.assert_allclose(np.asarray(d1), np.asarray(d2), rtol=0, atol=1e-12)
    J1 = jax.jacfwd(lambda w: psj.hvp(model, w, v))(w)
    J2 = jax.jacfwd(lambda w: ref_hvp(w, v))(w)
    np.testing.assert_allclose(np.asarray(J1), np.asarray(J2), rtol=0, atol=1e-12)
    # in v: the Hessian
    np.testing.assert_allclose(np.asarray(jax.jacfwd(lambda v: psj.hvp(model, w, v))(v)),
                               np.asarray(jax.hessian(ref)(w)), rtol=0, atol=1e-12)
    # third = D^3L[v, v]; its v-derivative 2 D^3L[v, t]
    T2 = jax.jvp(lambda w: ref_hvp(w, v), (w,), (v,))[1]
    np.testing.assert_allclose(np.asarray(psj.third(model, w, v)), np.asarray(T2), rtol=0,
                               atol=1e-12)
    dv = jax.jvp(lambda v: psj.third(model, w, v), (v,), (t,))[1]
    np.testing.assert_allclose(np.asarray(dv), 2 * np.asarray(d2), rtol=0, atol=1e-12)
    with pytest.raises(NotImplementedError, match="not differentiable in w"):
        jax.jvp(lambda w: psj.third(model, w, v), (w,), (t,))


def test_jvp_of_grad_is_one_hvp_call(model):
    w, t = points(model, 2, seed=8)

    def f(w, t):
        return jax.jvp(jax.grad(lambda w: psj.loss(model, w)), (w,), (t,))[1]

    calls = kernel_calls(model, f, w, t)  # under jit the unused gradient call is dropped
    assert calls.count("hvp") == 1 and set(calls) <= {"hvp", "loss_and_grad"}
    out = f(w, t)
    np.testing.assert_allclose(np.asarray(out), model.hvp(np.asarray(w), np.asarray(t)),
                               rtol=0, atol=1e-15)


def test_input_errors(model):
    with pytest.raises(ValueError, match=r"w must have shape \(40,\) or \(B, 40\)"):
        psj.loss(model, jnp.ones(39))
    with pytest.raises(TypeError, match="float64 or float32"):
        psj.loss(model, jnp.ones(40, jnp.float16))
    with pytest.raises(TypeError, match="real floating or integer"):
        psj.loss(model, jnp.ones(40, bool))
    with pytest.raises(TypeError, match="dtype"):
        psj.hvp(model, jnp.ones(40), jnp.ones(40, jnp.float32))
    with pytest.raises(TypeError, match="pysharp model"):
        psj.loss(object(), jnp.ones(40))
    assert psj.loss(model, jnp.arange(1, 41)).dtype == jnp.float64  # integers: default float


def test_toy3d():
    model = ps.Toy3D(c=10.0)
    w = jnp.asarray(model.random_point(seed=1))
    H = jax.hessian(lambda w: psj.loss(model, w))(w)
    np.testing.assert_allclose(np.asarray(H), model.hessian(np.asarray(w)), rtol=0, atol=1e-13)


def test_loaded_model():
    pr = example_module("phase_retrieval")
    X, y = pr.synthetic()
    model = ps.load_model(EXAMPLE_MODELS / "phase_retrieval.hpp", X=X, y=y, c=1.0)
    w = jnp.asarray(model.random_point(seed=2))

    def ref(w):
        return pr.loss_jax(w, X, y, 1.0)

    g = jax.jit(jax.grad(lambda w: psj.loss(model, w)))(w)
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(ref)(w)), rtol=0, atol=1e-13)
    H = jax.hessian(lambda w: psj.loss(model, w))(w)
    np.testing.assert_allclose(np.asarray(H), np.asarray(jax.hessian(ref)(w)), rtol=0, atol=1e-12)
    W = jnp.asarray(model.random_point(4, seed=3))
    L = jax.vmap(lambda w: psj.loss(model, w))(W)
    np.testing.assert_allclose(np.asarray(L), np.asarray(jax.vmap(ref)(W)), rtol=1e-14, atol=0)


def test_an_undefined_point_is_an_error_not_a_nan(model):
    with pytest.raises(Exception, match="undefined|zero"):
        jax.block_until_ready(psj.loss_and_grad(model, jnp.zeros((2, 40))))


def test_without_a_compiler_the_kernels_fall_back_to_the_callback(monkeypatch, path):
    from pysharp.models import _compiler

    def no_compiler():
        raise _compiler.ModelCompileError("no C++ compiler (test)")

    monkeypatch.setattr(_compiler, "compiler", no_compiler)
    monkeypatch.setattr(psj, "_REGISTERED", {})
    fresh = ps.Toy3D(c=3.0)
    w = jnp.asarray(fresh.random_point(seed=0))
    if path == "ffi":
        with pytest.warns(UserWarning, match="no FFI handlers for Toy3D"):
            g = jax.grad(lambda w: psj.loss(fresh, w))(w)
        assert psj._ops(fresh).path == "direct"
    else:
        g = jax.grad(lambda w: psj.loss(fresh, w))(w)
    np.testing.assert_array_equal(np.asarray(g), fresh.grad(np.asarray(w)))


def test_points_outside_the_kernels_range_are_rescaled_exactly(model):
    # float32's safe norm range ends at 4096 (pysharp._core.SAFE_NORM2); these rows are
    # recomputed on w 2^-e, as the NumPy-facing functions do, so the values agree bit for bit.
    W = np.array(points(model, 3, seed=9, dtype=np.float32))
    W[0] *= np.float32(2.0 ** 20)
    W[2] *= np.float32(2.0 ** -30)
    V = np.array(points(model, 3, seed=10, dtype=np.float32))
    V[1] *= np.float32(2.0 ** 40)
    L, G = psj.loss_and_grad(model, jnp.asarray(W))
    L0, G0 = model.loss_and_grad(W)
    np.testing.assert_array_equal(np.asarray(L), L0)
    np.testing.assert_array_equal(np.asarray(G), G0)
    np.testing.assert_array_equal(np.asarray(psj.hvp(model, W, V)), model.hvp(W, V))
    np.testing.assert_array_equal(np.asarray(psj.third(model, W, V)), model.third(W, V))
    with pytest.raises(Exception, match="not finite|non-finite"):
        W[1, 3] = np.inf
        jax.block_until_ready(psj.loss(model, jnp.asarray(W)))

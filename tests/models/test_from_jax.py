"""pysharp.models.from_jax: losses written in JAX, traced into compiled models.

Each distinct traced function compiles once (~20 s on a quiet two-core machine); the fast
tests compile four (BN linear regression, the LayerNorm net, the BN two-layer
net with tanh and with ReLU) and share them through module fixtures.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import pysharp as ps  # noqa: E402
from pysharp.models import _compiler  # noqa: E402
from pysharp.models._check import _jax_x64  # noqa: E402

#: The traced path (the default, compile=False, runs the loss in XLA: test_jax_backend.py).
from_jax = functools.partial(ps.models.from_jax, compile=True)

ROOT = Path(__file__).resolve().parents[2]


#: One entry per Python call of bn_linreg: a trace by JAX, or an eager evaluation.
CALLS: list = []


def bn_linreg(w, X, y):
    """BN linear regression: L = 2 var(y) (1 - cos(Xc w, y - mean y))."""
    CALLS.append(None)
    Xc = X - X.mean(axis=0)
    z = Xc @ w
    yc = y - y.mean()
    return 2 * jnp.var(y) * (1 - (z @ yc) / jnp.sqrt((z @ z) * (yc @ yc)))


def bn_net(w, X, y, width, relu=False):
    """The BN two-layer net of ps.BNTwoLayerNet: BN (no affine) on each hidden unit."""
    W = w.reshape(width, X.shape[1])
    Z = X @ W.T
    Zc = Z - Z.mean(axis=0)
    Zh = Zc / jnp.sqrt((Zc * Zc).mean(axis=0))
    a = jnp.where(jnp.arange(width) % 2 == 0, 1.0, -1.0) / np.sqrt(width)
    H = jax.nn.relu(Zh) if relu else jnp.tanh(Zh)
    return jnp.mean((H @ a - y) ** 2)


def layernorm_loss():
    spec = importlib.util.spec_from_file_location("layernorm_net",
                                                  ROOT / "examples/models/layernorm_net.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda w, X, y, a: module.loss(w, X, y, a, xp=jnp)


def data(n=20, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)), rng.standard_normal(n)


def points(D, B=4, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, D)), rng.standard_normal((B, D))


def jax_derivatives(f, w, v):
    """loss, grad, H v and D^3L[v, v] of f at w along v, by JAX (float64)."""
    with _jax_x64(jax):
        x, t = jnp.asarray(w), jnp.asarray(v)
        grad = jax.grad(f)
        loss, g = jax.value_and_grad(f)(x)
        hv, d3 = jax.jvp(lambda y: jax.jvp(grad, (y,), (t,))[1], (x,), (t,))
        return float(loss), np.asarray(g), np.asarray(hv), np.asarray(d3)


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))


def assert_like_jax(model, f, W, V, loss_tol=1e-13, deriv_tol=1e-12):
    loss, grad = model.loss_and_grad(W)
    hvp, third = model.hvp(W, V), model.third(W, V)
    for b in range(W.shape[0]):
        rl, rg, rh, rd = jax_derivatives(f, W[b], V[b])
        assert abs(loss[b] - rl) <= loss_tol * abs(rl)
        assert rel(grad[b], rg) <= loss_tol
        assert rel(hvp[b], rh) <= deriv_tol
        assert rel(third[b], rd) <= deriv_tol


@pytest.fixture(scope="module")
def linreg():
    X, y = data(n=20, d=8)
    model = from_jax(bn_linreg, np.ones(8), X=X, y=y)
    return model, X, y


def test_bn_linreg_equals_jax_and_the_builtin(linreg):
    model, X, y = linreg
    assert isinstance(model, ps.models.JaxModel) and model.dim == 8
    assert model.report is not None and all(model.report.passed.values())
    W, V = points(8)
    assert_like_jax(model, lambda w: bn_linreg(w, X, y), W, V)
    builtin = ps.BNLinearRegression(X, y)
    np.testing.assert_allclose(model.loss(W), builtin.loss(W), rtol=1e-13)
    np.testing.assert_allclose(model.grad(W), builtin.grad(W), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(model.hvp(W, V), builtin.hvp(W, V), rtol=1e-11, atol=1e-13)


def test_repr_and_sweep_title_use_the_users_names(linreg):
    """The generated header names its fields after JAX's equations (c_sub_1, ...): the
    model's repr and a sweep figure's title use the loss's name and the user's keywords."""
    from pysharp.sweeps._plot import settings_text

    model, _, _ = linreg
    assert repr(model) == "JaxModel(bn_linreg<float64>: X=(20, 8), y=(20,), dim=8)"
    pytest.importorskip("xarray")
    ds = ps.sweep(model, lr=[0.1], wd=[1e-3], steps=20, progress=False)
    assert settings_text(ds).startswith("bn_linreg (from_jax), gd_wd; grid: lr 0.1")


def test_source_is_readable_cpp_of_the_documented_form(linreg):
    model, _, _ = linreg
    src = model.source
    assert src == model.header.read_text()
    assert "#include <pysharp/model.hpp>" in src and "PYSHARP_MODEL(Jax_bn_linreg" in src
    assert "template <class S>" in src and "matvec_rows(" in src and "matvec_cols(" in src
    assert "test_from_jax.py" in src  # each statement names the user's line
    assert "S* const dot_general" in src


def test_same_shapes_new_data_reuse_the_module(linreg, monkeypatch):
    """Neither the module nor the check's JAX derivatives are compiled again: the loss is
    traced once, to find that its header is the same, and the check evaluates JAX's
    derivatives at its points in one call compiled for the first model (0.3 s point by
    point; 8 ms so)."""
    model, X, y = linreg
    calls = []
    monkeypatch.setattr(_compiler, "_build", lambda *a, **k: calls.append(a))
    X2, y2 = data(n=20, d=8, seed=7)
    del CALLS[:]
    other = from_jax(bn_linreg, np.ones(8), X=X2, y=y2)
    assert calls == [] and len(CALLS) == 1
    assert other.report.ok and other.report.points == 3
    # The compiled evaluation equals JAX's point by point, to rounding.
    W, V = points(8)
    with _jax_x64(jax):
        batched = [np.asarray(a) for a in other.reference().derivatives(W, V)]
    for b in range(W.shape[0]):
        for got, want in zip(batched, jax_derivatives(lambda w: bn_linreg(w, X2, y2), W[b],
                                                      V[b])):
            np.testing.assert_allclose(got[b], want, rtol=1e-13, atol=1e-15)
    assert other.source == model.source and other.header == model.header
    W, _ = points(8)
    np.testing.assert_allclose(other.loss(W), ps.BNLinearRegression(X2, y2).loss(W),
                               rtol=1e-13)


def test_float32_data_is_warned_nan_data_named_and_a_pytree_refused(linreg, monkeypatch):
    """Data errors a user can act on, before anything is traced: float32 data of a float64
    model (JAX's default without x64) is warned about, not silently taken; a NaN is named
    by its keyword and index; parameters as a tuple get the lines that flatten them."""
    model, X, y = linreg
    monkeypatch.setattr(_compiler, "_build", lambda *a, **k: pytest.fail("compiled"))
    with pytest.warns(UserWarning, match=r"X is float32 data for a float64 model: .*"
                                         r"dtype='float32'") as caught:
        other = from_jax(bn_linreg, np.ones(8), X=X.astype(np.float32), y=y)
    assert [w.filename for w in caught] == [__file__]  # the warning names the user's line
    W, _ = points(8)
    exact = ps.BNLinearRegression(X.astype(np.float32).astype(np.float64), y)
    np.testing.assert_allclose(other.loss(W), exact.loss(W), rtol=1e-13)
    X_nan = X.copy()
    X_nan[3, 2] = np.nan
    with pytest.raises(ValueError, match=r"^X has a non-finite entry at index \(3, 2\)"):
        from_jax(bn_linreg, np.ones(8), X=X_nan, y=y)


def test_a_pytree_of_parameters_is_traced_through_its_unravel(linreg):
    # the same loss on {"head", "tail"} halves of w: the traced model of the pytree equals
    # the flat one, leaf groups become blocks, and unravel gives the pytree back
    model, X, y = linreg

    def split(p, X, y):
        return bn_linreg(jnp.concatenate([p["head"], p["tail"].ravel()]), X, y)

    params = {"head": np.ones(3), "tail": np.ones((5, 1))}
    tree = from_jax(split, params, X=X, y=y)
    W, _ = points(8, B=3, seed=4)
    np.testing.assert_allclose(tree.loss(W), model.loss(W), rtol=1e-13)
    np.testing.assert_allclose(tree.grad(W), model.grad(W), rtol=1e-12, atol=1e-15)
    back = tree.unravel(W[0])
    assert np.array_equal(np.asarray(back["tail"]).ravel(), W[0, 3:])
    with pytest.raises(ValueError, match="contiguous blocks of w in order"):
        from_jax(split, {"a": np.ones(2), "b": np.ones(4), "c": np.ones(2)}, X=X, y=y,
                 groups=[["a", "c"], "b"])


def test_run_gd_wd_equals_the_builtin_before_eos(linreg):
    model, X, y = linreg
    w0, _ = points(8, B=3, seed=3)
    kw = dict(lr=0.05, wd=0.01, steps=40, record_every=1)
    a = ps.run_gd_wd(model, w0, **kw)
    b = ps.run_gd_wd(ps.BNLinearRegression(X, y), w0, **kw)
    np.testing.assert_allclose(a.loss, b.loss, rtol=1e-10)
    np.testing.assert_allclose(a.w, b.w, rtol=1e-10, atol=1e-12)


@pytest.mark.slow  # compiles a traced header (15-30 s): run by CI's slow step
def test_layernorm_net():
    rng = np.random.default_rng(2)
    n, d, m = 16, 5, 4
    X, y, a = rng.standard_normal((n, d)), rng.standard_normal(n), rng.standard_normal(m)
    f = layernorm_loss()
    model = from_jax(f, np.ones(m * d), X=X, y=y, a=a)
    W, V = points(m * d)
    assert_like_jax(model, lambda w: f(w, X, y, a), W, V)


@pytest.mark.slow  # compiles a traced header (15-30 s): run by CI's slow step
@pytest.mark.parametrize("relu", [False, True])
def test_bn_two_layer_net(relu):
    X, y = data(n=24, d=6, seed=4)
    m = 4
    model = from_jax(bn_net, np.ones(m * 6), X=X, y=y, width=m, relu=relu, groups=m)
    W, V = points(m * 6, seed=5)
    assert_like_jax(model, lambda w: bn_net(w, X, y, m, relu), W, V)
    builtin = ps.BNTwoLayerNet(X, y, width=m, activation="relu" if relu else "tanh")
    np.testing.assert_allclose(model.loss(W), builtin.loss(W), rtol=1e-12)
    np.testing.assert_allclose(model.grad(W), builtin.grad(W), rtol=1e-10, atol=1e-13)
    if relu:
        assert "select(" in model.source


def test_unsupported_primitive_refused_before_compiling(monkeypatch):
    def build(*a, **k):  # pragma: no cover - must not run
        raise AssertionError("compiled")
    monkeypatch.setattr(_compiler, "_build", build)
    X, y = data()

    def sorted_loss(w, X, y):
        z = jnp.sort(X @ w)
        return jnp.sum(z * y) / jnp.sqrt(w @ w)
    with pytest.raises(ps.models.UnsupportedPrimitive, match=r"'sort' at .*test_from_jax\.py:\d+"
                       r".* orders values that depend on w .*lax\.sort_key_val\(t, z\)"):
        from_jax(sorted_loss, np.ones(8), X=X, y=y)

    def cond_loss(w, X, y):
        z = jax.lax.cond(w[0] > 0, lambda z: jnp.tanh(z), lambda z: z * z, X @ w)
        return jnp.sum(z * y) / jnp.sqrt(w @ w)
    with pytest.raises(ps.models.UnsupportedPrimitive, match=r"'cond' at .*test_from_jax") \
            as caught:
        from_jax(cond_loss, np.ones(8), X=X, y=y)
    # every refusal says what to do: run it untraced, or the rewrite that compiles
    message = str(caught.value)
    assert "run it untraced in XLA: from_jax(..., compile=False) (the default)" in message
    assert "jnp.where(pred, a, b)" in message


def test_a_failed_check_names_where_the_model_and_jax_part():
    """The check's failure names the equations that can part the model from JAX (a cast
    below float64 on w, a custom_jvp), with the user's lines, not only "differs"."""
    from types import SimpleNamespace

    from pysharp.models._from_jax import _parting, _suspects

    @jax.custom_jvp
    def soft(x):
        return jnp.tanh(x)
    soft.defjvp(lambda p, t: (jnp.tanh(p[0]), t[0] / (1 + p[0] ** 2)))
    X = data()[0]

    def rounded(w, X):
        return jnp.sum(soft(X @ w).astype(jnp.float32).astype(jnp.float64) ** 2)
    found = _suspects(rounded, np.ones(8), {"X": X})
    assert len(found) == 2 and all("test_from_jax.py:" in s for s in found)
    assert found[0].startswith("a custom_jvp function") and "to float32" in found[1]
    report = SimpleNamespace(passed=dict(loss=False, gradient=False, hvp=True, third=True))
    text = _parting(report, found)
    assert text.startswith("The model and JAX first part in the loss") and "compile=False" in text
    assert "translation bug" in _parting(report, [])


def test_data_only_computations_may_use_any_primitive():
    """jnp.sort of the data alone is evaluated by JAX and bound as a field (no compile)."""
    from pysharp.models._from_jax import _trace
    X, y = data()

    def sorted_data(w, X, y):
        Xs = jnp.sort(X, axis=0)
        return jnp.sum((Xs @ w) * y) ** 2 / (w @ w)
    traced = _trace(sorted_data, np.ones(8), {"X": X, "y": y}, None)
    body = traced.source.split("mask_t<S> loss_grad", 1)[1]
    assert not [line for line in body.splitlines() if line.strip().startswith("// sort")]
    sorted_fields = [v for v in traced.fields.values() if np.shape(v) == X.shape]
    assert len(sorted_fields) == 1 and np.array_equal(sorted_fields[0], np.sort(X, axis=0))


@pytest.mark.slow
def test_many_primitives():
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((12, 6)), rng.standard_normal(12)

    def grab(w, X, y, c):
        u = w / jnp.sqrt(w @ w)
        z = X @ u
        a = jnp.abs(z) + jnp.sign(z) * z + jnp.maximum(z, 0.1) - jnp.minimum(z, -0.2)
        b = jax.nn.log_softmax(z) * y + jax.nn.sigmoid(z) + jnp.tanh(z) ** 3
        M = u.reshape(2, 3)
        cat = jnp.concatenate([u[:2], u[::2], M[:, 1]])
        e = jnp.exp(-z ** 2) + jnp.log1p(z ** 2) + jnp.sqrt(1 + z ** 2) + jax.lax.rsqrt(2 + z ** 2)
        bm = jnp.einsum("bi,bj->bij", M, M).sum() + (M.T @ M).sum()
        return c * (a.sum() + b.sum() + (cat ** 2).sum() + jnp.where(z > 0, z, 0.5 * z).sum()
                    + e.mean() + bm + jnp.max(z) - jnp.min(z) + jnp.clip(z, -0.5, 0.5).sum()
                    + (1.0 / (1.1 + z ** 2)).sum() + jnp.sum(z ** -2))
    model = from_jax(grab, np.ones(6), X=X, y=y, c=0.7)
    W, V = points(6)
    assert_like_jax(model, lambda w: grab(w, X, y, 0.7), W, V, 1e-12, 1e-11)


@pytest.mark.slow  # compiles a traced header (15-30 s): run by CI's slow step
def test_sin_and_cos_to_the_third_derivative():
    """sin and cos: the jets' coupled recurrence against JAX's own derivatives."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((7, 5))

    def wave(w, X):
        z = X @ (w / jnp.sqrt(w @ w))
        return jnp.mean(jnp.sin(2.0 * z) ** 2 + jnp.cos(z) * z)
    model = from_jax(wave, np.ones(5), X=X)
    assert "sin_(" in model.source and "cos_(" in model.source
    W, V = points(5)
    assert_like_jax(model, lambda w: wave(w, X), W, V, 1e-12, 1e-11)


@pytest.mark.slow  # compiles a traced header (15-30 s): run by CI's slow step
def test_expm1_and_log1p_keep_their_accuracy_near_zero():
    """expm1 and log1p are their own functions, not exp - 1 and log(1 + x): at arguments
    of 1e-9 the latter lose half the digits, and check() refused the model."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((6, 4))

    def tiny(w, X):
        z = X @ (w / jnp.sqrt(w @ w))
        return jnp.sum(jnp.expm1(1e-9 * z) ** 2) + jnp.sum(jnp.log1p(1e-9 * z * z))
    model = from_jax(tiny, np.ones(4), X=X)
    assert "expm1_(" in model.source and "log1p_(" in model.source
    W, V = points(4)
    assert_like_jax(model, lambda w: tiny(w, X), W, V, 1e-13, 1e-12)


@pytest.mark.slow  # compiles a traced header (15-30 s): run by CI's slow step
def test_float_powers_have_jax_derivatives_wherever_jax_does():
    """x ** c for a constant c (issue 43.5): an integral c is an integer power, +-0.5 square
    roots, so relu(z) ** 2.0 at z <= 0 and r ** 2.0, z ** 3.0 at negative bases give JAX's
    loss, gradient, H v and D^3L[v, v] (they gave NaN H v, or "undefined there"); other
    exponents (1.5 here) keep exp(c log x), defined for x > 0 as JAX's derivatives are."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((9, 5))

    def powers(w, X):
        z = X @ (w / jnp.sqrt(w @ w))
        r = z - 3.0  # every base negative
        p = 1.0 + z * z
        return (jnp.sum(jax.nn.relu(z) ** 2.0) + 0.1 * jnp.sum(r ** 2.0)
                + 0.2 * jnp.sum(z ** 3.0) + jnp.sum(p ** 0.5) + 0.3 * jnp.sum(p ** 1.5)
                + 0.05 * jnp.sum(p ** -2.0))
    model = from_jax(powers, np.ones(5), X=X, check=False)
    W, V = points(5, B=6)
    z = W @ X.T
    assert (z < 0).any() and (z > 0).any()  # both sides of relu's kink
    assert_like_jax(model, lambda w: powers(w, X), W, V, 1e-12, 1e-11)
    body = model.source.split("mask_t<S> loss_grad", 1)[1]
    # p ** 1.5 alone is exp(1.5 log p); its gradient's p ** 0.5 is a square root
    assert body.count("log_(") == 1 and "sqrt_(" in body


def test_erf_atan2_cumsum_sort_scan_and_conv_translate_without_compiling():
    """Issue 44.1's remaining constructs, traced (nothing compiled; the battery in
    test_from_jax_battery.py compiles each against JAX): erf, erfc and atan2 call the header's
    functions (with using-declarations, for a plain-Real S), cumsum is a running sum, a scan
    and a fori_loop of static length unroll, a sort by data keys is the data's order as an
    integer field (numpy's stable argsort of the keys) and a gather, a convolution is loops;
    the header depends on the shapes only."""
    from pysharp.models._from_jax import _trace
    rng = np.random.default_rng(7)
    X, t, img = rng.standard_normal((6, 4)), rng.standard_normal(6), rng.standard_normal(
        (2, 1, 5, 5))

    def constructs(w, X, t, img):
        u = w / jnp.sqrt(w @ w)
        z = X @ u
        special = jnp.sum(jax.scipy.special.erf(z) + jax.lax.erfc(z) + jnp.arctan2(z, 1.0 + z))
        ordered = jnp.sum(jax.lax.sort_key_val(t, z)[1] * t) + jnp.sum(jnp.cumsum(z) ** 2)
        scanned = jax.lax.scan(lambda c, x: (jnp.tanh(c * x), c), z[0], z)[1]
        looped = jax.lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c) + c, z)
        conv = jax.lax.conv_general_dilated(img, u.reshape(1, 1, 2, 2), (1, 1), "SAME")
        return special + ordered + jnp.sum(scanned) + jnp.sum(looped) + jnp.sum(conv ** 2)
    traced = _trace(constructs, np.ones(4), dict(X=X, t=t, img=img), None)
    body = traced.source.split("mask_t<S> loss_grad", 1)[1]
    for prim in ("erf", "erfc", "atan2", "cumsum", "sort", "conv_general_dilated"):
        assert f"// {prim} ->" in body, prim
    assert "// scan" not in body and "// while" not in body
    assert body.count("tanh_(") >= 6 + 3  # the scan's 6 steps and the loop's 3
    for name in ("atan2_", "erf_", "erfc_"):
        assert f"using pysharp::{name};" in traced.source
    (order,) = [v for k, v in traced.fields.items() if k.startswith("c_sort")]
    np.testing.assert_array_equal(order, np.argsort(t, kind="stable"))
    flipped = _trace(constructs, np.ones(4), dict(X=X, t=-t, img=img), None)
    assert flipped.source == traced.source
    (order,) = [v for k, v in flipped.fields.items() if k.startswith("c_sort")]
    np.testing.assert_array_equal(order, np.argsort(-t, kind="stable"))


def jet_harness(traced, W, V, folder: Path):
    """The traced header alone (no engine, no Python module), compiled at -O1 into a program
    that evaluates loss_grad on Jet<double, 2> at w + e v: (loss (P,), gradient, H v and
    D^3L[v, v] (P, D)) of the translation at the rows of W along those of V, in a few
    seconds of compiling where a module takes tens. Plain doubles and lane blocks are the
    engine's (the slow battery compiles those)."""
    import subprocess

    body = [f'#include "{traced.struct}.hpp"', "#include <cstdio>", "#include <vector>",
            "int main() {", f"  {traced.struct}<double> m{{}};"]
    for name, value in traced.fields.items():
        a = np.asarray(value)
        if a.ndim == 0:
            body.append(f"  m.{name} = {a.item()!r};")
            continue
        kind = "int" if a.dtype.kind in "biu" else "double"
        values = ", ".join(repr(x.item()) for x in a.ravel())
        body.append(f"  static const {kind} {name}_v[] = {{{values}}};")
        body.append(f"  m.{name} = {name}_v;")
        body += [f"  m.{name}_{k} = {n};" for k, n in enumerate(a.shape)]
    D = W.shape[1]
    body += ["  using J = pysharp::Jet<double, 2>;",
             f"  std::vector<J> w({D}), g({D}), work(m.work_size() + 1);", "  J loss;",
             f"  double W[] = {{{', '.join(repr(x) for x in W.ravel().tolist())}}};",
             f"  double V[] = {{{', '.join(repr(x) for x in V.ravel().tolist())}}};",
             f"  for (int b = 0; b < {W.shape[0]}; ++b) {{",
             f"    for (int i = 0; i < {D}; ++i) {{ w[i] = J(W[b * {D} + i]); "
             f"w[i].c[1] = V[b * {D} + i]; }}",
             "    m.loss_grad(w.data(), &loss, g.data(), work.data());",
             '    std::printf("%.17g", loss.c[0]);',
             '    for (const J& x : g) std::printf(" %.17g %.17g %.17g", x.c[0], x.c[1], '
             '2 * x.c[2]);', '    std::printf("\\n");', "  }", "}"]
    (folder / f"{traced.struct}.hpp").write_text(traced.source)
    (folder / "main.cpp").write_text("\n".join(body) + "\n")
    subprocess.run([_compiler.compiler(), "-O1", "-std=gnu++17", f"-I{ps.models.include_dir()}",
                    "-o", "harness", "main.cpp"], cwd=folder, check=True)
    out = subprocess.run(["./harness"], cwd=folder, capture_output=True, text=True, check=True)
    rows = np.array([[float(x) for x in line.split()] for line in out.stdout.splitlines()])
    orders = rows[:, 1:].reshape(len(rows), D, 3)
    return rows[:, 0], orders[:, :, 0], orders[:, :, 1], orders[:, :, 2]


def test_new_constructs_equal_jax_through_their_jets(tmp_path):
    """The translations of erf, erfc, atan2, cumsum, a sort by data keys, a scan (its
    gradient a reverse scan over a cotangent that depends on w), a fori_loop and
    convolutions (strides, padding, dilations, groups), one element of an array broadcast to
    more (which read the array from that element on) and a reshape that permutes axes (a
    grouped convolution's gradient, which was read as a plain reshape), in a header long
    enough to be split into stages, evaluated on jets of the header alone: loss, gradient,
    H v and D^3L[v, v] equal JAX's to 1e-12."""
    from pysharp.models._from_jax import _trace
    rng = np.random.default_rng(8)
    X, t, xs = rng.standard_normal((6, 4)), rng.standard_normal(6), rng.standard_normal((3, 6))
    img = rng.standard_normal((2, 2, 5, 4))

    def constructs(w, X, t, xs, img):
        u = w / jnp.sqrt(w @ w)
        z = X @ u
        special = jnp.sum(jax.nn.gelu(z, approximate=False) + jax.lax.erfc(z) * t
                          + jnp.arctan2(z, 1.0 + z * z))
        ordered = jnp.sum(jax.lax.sort_key_val(t, z)[1] * t) + jnp.sum(jnp.cumsum(z) ** 2)
        h, ys = jax.lax.scan(lambda c, x: (jnp.tanh(c + x * z), jnp.sum(x * c)), z, xs)
        looped = jax.lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c) * jnp.asarray(t)[i] + c, z)
        K = jnp.concatenate([u, u[::-1]]).reshape(2, 1, 2, 2)
        conv = jax.lax.conv_general_dilated(img, K, (2, 1), ((1, 0), (0, 2)),
                                            rhs_dilation=(1, 2), feature_group_count=2)
        # grouped, of activations: its gradient permutes the kernel in a reshape
        conv2 = jax.lax.conv_general_dilated(jnp.tanh(conv), K[::-1], (1, 1), ((1, 0), (0, 1)),
                                             lhs_dilation=(1, 2), feature_group_count=2)
        return (special + ordered + jnp.sum(h * h) + jnp.sum(ys ** 2) + jnp.sum(looped ** 2)
                + jnp.sum(jnp.tanh(conv)) + jnp.sum(conv2 ** 2)
                + jnp.sum(z[2] * jnp.ones(5) * t[:5]))
    data = dict(X=X, t=t, xs=xs, img=img)
    traced = _trace(constructs, np.ones(4), data, None)
    # long enough to be compiled in stages: arrays and scalars cross from stage to stage
    assert traced.source.count("PYSHARP_JAX_STAGE PYSHARP_HD void") >= 2
    W, V = points(4, B=3, seed=9)
    loss, grad, hvp, third = jet_harness(traced, W, V, tmp_path)
    with _jax_x64(jax):  # JAX's, the three points in one compiled call (eager is slower)
        bound = ps.models._from_jax._BoundLoss(constructs, data, (4,))
        want = [np.asarray(a) for a in bound.derivatives(W, V)]
    for b in range(3):
        assert abs(loss[b] - want[0][b]) <= 1e-12 * abs(want[0][b])
        for got, ref in zip((grad[b], hvp[b], third[b]), want[1:]):
            assert rel(got, ref[b]) <= 1e-12


def test_data_exponents_stay_general():
    """An exponent from the data is not specialised (the header depends on the function and
    the shapes alone, never on the data's values): it stays exp(k log x)."""
    from pysharp.models._from_jax import _trace
    X = data()[0]

    def power(w, X, k):
        return jnp.sum((1.0 + (X @ w) ** 2 / (w @ w)) ** k)
    two = _trace(power, np.ones(8), {"X": X, "k": 2.0}, None)
    three = _trace(power, np.ones(8), {"X": X, "k": 3.0}, None)
    assert two.source == three.source and "log_(" in two.source


@pytest.mark.slow  # compiles a traced header (15-30 s): run by CI's slow step
def test_pysharp_run_and_sweep_take_a_jax_loss_file(tmp_path):
    """``pysharp run FILE.py:FUNCTION --dim D`` and ``[model] python = ...`` (issue 27.5)."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "mymodels.py").write_text(
        "import jax.numpy as jnp\n\n\n"
        "def phase(w, X, y, c):\n"
        "    q = (X @ w) ** 2 / (w @ w)\n"
        "    return 0.5 * c / X.shape[0] * jnp.sum((q - y) ** 2)\n")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((12, 5))
    w_star = rng.standard_normal(5)
    np.savez(tmp_path / "phase.npz", X=X, y=(X @ w_star) ** 2 / (w_star @ w_star))
    env = {**os.environ, "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "pysharp"]
    done = subprocess.run(cmd + ["run", "mymodels.py:phase", "--dim", "5", "--data", "phase.npz",
                                 "--param", "c=1.5", "--lr", "0.5", "--wd", "1e-3", "--steps",
                                 "300", "--sharpness-every", "50"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "pysharp-run" / "run.json").read_text())
    assert summary["model_parameters"]["python"] == "mymodels.py:phase"
    assert summary["model_parameters"]["dim"] == 5
    (tmp_path / "phase.toml").write_text(
        '[model]\npython = "mymodels.py:phase"\ndim = 5\ndata = "phase.npz"\nc = 1.5\n\n'
        '[grid]\nlr = [0.2, 0.5]\nwd = [1e-3]\n\n[run]\nsteps = 300\nsharpness_every = 50\n')
    done = subprocess.run(cmd + ["sweep", "phase.toml", "--no-progress"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "2 trajectories" in done.stdout
    bad = subprocess.run(cmd + ["run", "mymodels.py:phase", "--data", "phase.npz"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "needs --dim D" in bad.stderr


def test_norms_indexing_and_shapes_to_the_third_derivative():
    """Issue 44.1 in one model: jnp.var/jnp.std (the all-NaN constant of var's ddof guard is
    inlined, not a field the loader refuses), jax.nn.logsumexp (through is_finite),
    integer-label cross-entropy (gather; its gradient scatter-add), jnp.pad both ways (its
    gradient is a negative pad) and interior, jnp.stack (unstack), z[::-1] (rev) and
    dynamic_slice at a static and at a data index (dynamic_update_slice): loss, gradient,
    H v and D^3L[v, v] equal JAX's."""
    rng = np.random.default_rng(5)
    n, d, k = 6, 4, 3
    X, labels = rng.standard_normal((n, d)), rng.integers(0, k, n)
    start = np.array([2, 0])

    def layered(w, X, labels, start):
        W = (w / jnp.sqrt(w @ w)).reshape(k, d)  # scale-invariant, as the check asks
        Z = X @ W.T
        H = (Z - Z.mean(-1, keepdims=True)) / jnp.sqrt(jnp.var(Z, axis=-1, keepdims=True) + 1e-3)
        ce = -jnp.mean(jax.nn.log_softmax(H + 0.1 * Z)[jnp.arange(n), labels]) + jnp.sum(
            H[jnp.arange(n), labels] ** 3)
        z = Z[:, 0] / jnp.std(Z[:, 1])
        p = jnp.pad(z, (1, 2)) * jnp.arange(n + 3.0) + jnp.sum(
            jax.lax.pad(z, 0.5, [(-1, 2, 1)]) ** 2)
        s = jnp.stack([z, z[::-1] * z], axis=1)
        ds = jax.lax.dynamic_slice(z, (2,), (3,)) @ jax.lax.dynamic_slice(z, (start[0],), (3,))
        return ce + jax.nn.logsumexp(z) + 0.1 * jnp.sum(p ** 2) + jnp.sum(jnp.tanh(s)) + ds
    model = from_jax(layered, np.ones(k * d), X=X, labels=labels, start=start)
    body = model.source.split("mask_t<S> loss_grad", 1)[1]
    for prim in ("is_finite", "gather", "scatter-add", "pad", "stack", "unstack", "rev",
                 "dynamic_slice", "dynamic_update_slice"):
        assert f"// {prim} ->" in body, prim
    assert all(np.isfinite(v).all() for v in model.fields.values() if np.ndim(v))
    W, V = points(k * d, seed=6)
    assert_like_jax(model, lambda w: layered(w, X, labels, start), W, V, 1e-12, 1e-11)

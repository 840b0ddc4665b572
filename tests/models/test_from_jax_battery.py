"""A battery for from_jax's traced path (issue 44.4): one loss per construct it translates
and the classic layers, each compiled and compared with JAX's own derivatives in loss,
gradient, H v and D^3L[v, v] to 1e-12 (relative), at random points and directions.

Every case compiles a header (15-30 s of compiler time on two cores), so they are slow
tests, run by CI's slow step; tests/models/test_from_jax.py traces the same constructs
without compiling in the fast suite. The losses are scale-invariant (w normalised, or
BatchNorm after each layer with ``groups``), as from_jax's check asks.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
lax = pytest.importorskip("jax.lax")

import pysharp as ps  # noqa: E402
from pysharp.models._check import _jax_x64  # noqa: E402

from_jax = functools.partial(ps.models.from_jax, compile=True)

pytestmark = pytest.mark.slow  # each case compiles a header

TOL = 1e-12


def jax_derivatives(f, w, v):
    """loss, grad, H v and D^3L[v, v] of f at w along v, by JAX (float64)."""
    with _jax_x64(jax):
        x, t = jnp.asarray(w), jnp.asarray(v)
        loss, g = jax.value_and_grad(f)(x)
        hv, d3 = jax.jvp(lambda y: jax.jvp(jax.grad(f), (y,), (t,))[1], (x,), (t,))
        return float(loss), np.asarray(g), np.asarray(hv), np.asarray(d3)


def assert_like_jax(model, f, D: int, seed: int = 1, points: int = 3) -> None:
    """The model's loss, gradient, H v and D^3L[v, v] against JAX's at ``points`` random
    points and directions, each to TOL relative (the vectors in norm)."""
    rng = np.random.default_rng(seed)
    W, V = rng.standard_normal((points, D)), rng.standard_normal((points, D))
    loss, grad = model.loss_and_grad(W)
    hvp, third = model.hvp(W, V), model.third(W, V)
    for b in range(points):
        want = jax_derivatives(f, W[b], V[b])
        for name, got, ref in zip(("loss", "gradient", "H v", "D3L"),
                                  (loss[b], grad[b], hvp[b], third[b]), want):
            err = np.linalg.norm(np.asarray(got) - ref) / np.linalg.norm(ref)
            assert err <= TOL, (name, b, err)


def unit(w):
    return w / jnp.sqrt(w @ w)


# -- one case per construct ---------------------------------------------------------------------
def test_erf_and_erfc_exact_gelu():
    """jax.nn.gelu(approximate=False) is x (1 + erf(x / sqrt 2)) / 2 (JAX writes it with
    erfc), jax.scipy.special.erf and lax.erfc: the jets of erf_ / erfc_ against JAX."""
    rng = np.random.default_rng(10)
    X, y = rng.standard_normal((8, 5)), rng.standard_normal(8)

    def gelu_net(w, X, y):
        z = 2.0 * X @ unit(w)
        h = jax.nn.gelu(z, approximate=False)
        return jnp.mean((h + jax.scipy.special.erf(z) * y + 0.3 * lax.erfc(z - 1.0) - y) ** 2)
    model = from_jax(gelu_net, np.ones(5), X=X, y=y)
    assert "erf_(" in model.source and "erfc_(" in model.source
    assert_like_jax(model, lambda w: gelu_net(w, X, y), 5)


def test_atan2():
    rng = np.random.default_rng(11)
    X, Y = rng.standard_normal((7, 4)), rng.standard_normal((7, 4))

    def angles(w, X, Y):
        u = unit(w)
        return jnp.sum(jnp.arctan2(X @ u, Y @ u) ** 2) + jnp.sum(jnp.arctan2(X @ u, 0.5))
    model = from_jax(angles, np.ones(4), X=X, Y=Y)
    assert "atan2_(" in model.source
    assert_like_jax(model, lambda w: angles(w, X, Y), 4)


def test_cumsum_along_each_axis_and_reversed():
    rng = np.random.default_rng(12)
    X = rng.standard_normal((3, 5, 4))

    def running(w, X):
        Z = X @ unit(w)  # (3, 5)
        return (jnp.sum(jnp.cumsum(Z, axis=1) ** 2) + jnp.sum(jnp.tanh(jnp.cumsum(Z, axis=0)))
                + jnp.sum(jnp.cumsum(Z[:, ::-1], axis=1) * Z))
    model = from_jax(running, np.ones(4), X=X)
    assert "// cumsum ->" in model.source
    assert_like_jax(model, lambda w: running(w, X), 4)


def test_sort_by_data_keys():
    """lax.sort_key_val and a two-key lax.sort whose keys are data: the order is the data's,
    the values that depend on w follow it."""
    rng = np.random.default_rng(13)
    X, t = rng.standard_normal((6, 4)), rng.standard_normal(6)
    s = rng.integers(0, 2, 6).astype(float)

    def ranked(w, X, t, s):
        z = X @ unit(w)
        by_t = lax.sort_key_val(t, z)[1]
        by_st = lax.sort((s, t, jnp.tanh(z)), num_keys=2)[2]
        return jnp.sum(by_t * jnp.arange(6.0)) + jnp.sum(by_st ** 2 * jnp.arange(6.0))
    model = from_jax(ranked, np.ones(4), X=X, t=t, s=s)
    assert "// sort ->" in model.source
    assert_like_jax(model, lambda w: ranked(w, X, t, s), 4)


def test_scan_with_carry_inputs_and_outputs():
    rng = np.random.default_rng(14)
    X, xs = rng.standard_normal((5, 4)), rng.standard_normal((6, 5))

    def scanned(w, X, xs):
        z = X @ unit(w)

        def step(h, x):
            h = jnp.tanh(0.8 * h + x * z)
            return h, jnp.sum(h * x)
        h, ys = lax.scan(step, z, xs)
        back = lax.scan(lambda c, y: (c * 0.5 + y, c), 0.0, ys, reverse=True)[1]
        return jnp.sum(h ** 2) + jnp.sum(ys * back)
    model = from_jax(scanned, np.ones(4), X=X, xs=xs)
    assert "// scan ->" not in model.source  # unrolled
    assert_like_jax(model, lambda w: scanned(w, X, xs), 4)


def test_fori_loop_with_static_bounds():
    rng = np.random.default_rng(15)
    X = rng.standard_normal((5, 4))

    def looped(w, X):
        z = X @ unit(w)
        Xj = jnp.asarray(X)
        return jnp.sum(lax.fori_loop(0, 4, lambda i, c: jnp.tanh(c) * Xj[i, 0] + c, z) ** 2)
    model = from_jax(looped, np.ones(4), X=X)
    assert_like_jax(model, lambda w: looped(w, X), 4)


def test_convolutions_of_every_kind():
    """conv_general_dilated of the data by w and of w-dependent activations: 'SAME' and
    explicit negative padding, strides, input and kernel dilation, two feature groups, NHWC
    dimension numbers (and, in the gradients, the transposed convolutions of each)."""
    rng = np.random.default_rng(16)
    img = rng.standard_normal((2, 2, 6, 5))
    D = 2 * 1 * 3 * 3 + 4 * 1 * 2 * 2

    def convs(w, img):
        u = unit(w)
        K1, K2 = u[:18].reshape(2, 1, 3, 3), u[18:].reshape(4, 1, 2, 2)
        h = lax.conv_general_dilated(img, K1, (1, 1), "SAME", feature_group_count=2)
        h = jnp.tanh(h)
        g = lax.conv_general_dilated(h, K2, (2, 1), ((1, -1), (0, 2)), lhs_dilation=(1, 2),
                                     rhs_dilation=(2, 1), feature_group_count=2)
        nhwc = lax.conv_general_dilated(jnp.transpose(h, (0, 2, 3, 1)),
                                        jnp.transpose(K1, (2, 3, 1, 0)), (1, 2), "VALID",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        feature_group_count=2)
        return jnp.sum(g ** 2) + jnp.sum(jnp.tanh(nhwc))
    model = from_jax(convs, np.ones(D), img=img)
    assert "// conv_general_dilated ->" in model.source
    assert_like_jax(model, lambda w: convs(w, img), D)


# -- the classic layers -------------------------------------------------------------------------
def test_layernorm_mlp():
    rng = np.random.default_rng(20)
    n, d, m = 8, 5, 4
    X, y, a = rng.standard_normal((n, d)), rng.standard_normal(n), rng.standard_normal(m)

    def layernorm(w, X, y, a):
        Z = X @ w.reshape(m, d).T
        H = (Z - Z.mean(-1, keepdims=True)) / jnp.sqrt(jnp.var(Z, axis=-1, keepdims=True))
        return jnp.mean((jnp.tanh(H) @ a - y) ** 2)
    model = from_jax(layernorm, np.ones(m * d), X=X, y=y, a=a)
    assert_like_jax(model, lambda w: layernorm(w, X, y, a), m * d)


def test_batchnorm_with_var():
    rng = np.random.default_rng(21)
    n, d, m = 10, 4, 3
    X, y = rng.standard_normal((n, d)), rng.standard_normal(n)
    a = np.array([1.0, -1.0, 0.5])

    def batchnorm(w, X, y):
        Z = X @ w.reshape(m, d).T
        H = (Z - Z.mean(0)) / jnp.sqrt(jnp.var(Z, axis=0))
        return jnp.mean((jax.nn.relu(H) @ a - y) ** 2)
    model = from_jax(batchnorm, np.ones(m * d), X=X, y=y, groups=m)
    assert_like_jax(model, lambda w: batchnorm(w, X, y), m * d)


def test_softmax_cross_entropy_one_hot_and_integer_labels():
    rng = np.random.default_rng(22)
    n, d, k = 9, 4, 3
    X, labels = rng.standard_normal((n, d)), rng.integers(0, k, n)
    Y = np.eye(k)[labels]

    def cross_entropy(w, X, Y, labels):
        logits = 3.0 * X @ unit(w).reshape(k, d).T
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.sum(logp * Y, axis=1)) - jnp.mean(logp[jnp.arange(n), labels])
    model = from_jax(cross_entropy, np.ones(k * d), X=X, Y=Y, labels=labels)
    assert_like_jax(model, lambda w: cross_entropy(w, X, Y, labels), k * d)


def test_two_layer_conv_net_with_batchnorm():
    """3x3 convolutions with BatchNorm (batch and spatial statistics, jnp.var) and ReLU, the
    second strided, global average pooling and a fixed readout: invariant to each kernel's
    scale (two groups)."""
    rng = np.random.default_rng(23)
    n, c, k = 6, 3, 3
    X = rng.standard_normal((n, 1, 8, 8))
    Y = np.eye(k)[rng.integers(0, k, n)]
    A = rng.standard_normal((c, k))
    sizes = (c * 1 * 9, c * c * 9)

    def bn(h):
        mean = h.mean(axis=(0, 2, 3), keepdims=True)
        return (h - mean) / jnp.sqrt(jnp.var(h, axis=(0, 2, 3), keepdims=True))

    def conv_net(w, X, Y, A):
        K1, K2 = w[:sizes[0]].reshape(c, 1, 3, 3), w[sizes[0]:].reshape(c, c, 3, 3)
        h = jax.nn.relu(bn(lax.conv_general_dilated(X, K1, (1, 1), "SAME")))
        h = jax.nn.relu(bn(lax.conv_general_dilated(h, K2, (2, 2), "SAME")))
        logits = h.mean(axis=(2, 3)) @ A
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * Y, axis=1))
    D = sum(sizes)
    model = from_jax(conv_net, np.ones(D), X=X, Y=Y, A=A, groups=list(sizes))
    assert_like_jax(model, lambda w: conv_net(w, X, Y, A), D)


def test_tiny_attention_block():
    rng = np.random.default_rng(24)
    n, d = 5, 4
    X, r, y = rng.standard_normal((n, d)), rng.standard_normal(d), rng.standard_normal(n)

    def attention(w, X, r, y):
        Wq, Wk, Wv = (2.0 * unit(w)).reshape(3, d, d)
        Q, K, V = X @ Wq, X @ Wk, X @ Wv
        A = jax.nn.softmax(Q @ K.T / np.sqrt(d), axis=-1)
        H = A @ V + X
        H = (H - H.mean(-1, keepdims=True)) / jnp.sqrt(jnp.var(H, axis=-1, keepdims=True) + 1e-5)
        return jnp.mean((H @ r - y) ** 2)
    model = from_jax(attention, np.ones(3 * d * d), X=X, r=r, y=y)
    assert_like_jax(model, lambda w: attention(w, X, r, y), 3 * d * d)


def test_unrolled_rnn():
    rng = np.random.default_rng(25)
    T, h, d, n = 4, 3, 2, 5
    X, c, y = rng.standard_normal((n, T, d)), rng.standard_normal(h), rng.standard_normal(n)

    def rnn(w, X, c, y):
        u = 2.0 * unit(w)
        Wh, Wx = u[:h * h].reshape(h, h), u[h * h:].reshape(h, d)
        state = jnp.zeros((n, h))
        for t in range(T):  # unrolled in Python: straight-line code
            state = jnp.tanh(state @ Wh.T + X[:, t] @ Wx.T)
        return jnp.mean((state @ c - y) ** 2)
    D = h * h + h * d
    model = from_jax(rnn, np.ones(D), X=X, c=c, y=y)
    assert_like_jax(model, lambda w: rnn(w, X, c, y), D)


# -- the special functions on every S the engine instantiates -----------------------------------
PROBE = """\
// erf_, erfc_ and atan2_ (core/activation.hpp, core/lane_math.hpp) on every S: the loss and
// g[0] are f(w) (which = 0: erf(w0), 1: erfc(w0), 2: atan2(w0, w1)), so loss() reads the
// lane blocks' values and hvp() / third() the first and second orders of the jets of lanes.
#include <pysharp/model.hpp>

using pysharp::atan2_;
using pysharp::erf_;
using pysharp::erfc_;

template <class Real>
struct SpecialProbe {
  Real which;

  PYSHARP_HD int dim() const { return 2; }
  PYSHARP_HD int work_size() const { return 1; }

  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const {
    (void)work;
    const S f = which == Real(0) ? erf_(w[0]) : which == Real(1) ? erfc_(w[0])
                                                                  : atan2_(w[0], w[1]);
    *loss = f;
    g[0] = f;
    g[1] = S(Real(0));
    return mask_t<S>(true);
  }
};
PYSHARP_MODEL(SpecialProbe, PYSHARP_SCALAR(which))
"""


def ulps(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in units of the last place of ref."""
    return np.abs(got - ref) / np.spacing(np.abs(ref))


def test_special_functions_on_lanes_and_jets(tmp_path):
    """The values on lane blocks (<cmath> per lane) against SciPy and 120-bit mpmath over the
    whole range, tails and tiny arguments included; the jets' first and second orders
    against the closed forms erf' = 2/sqrt(pi) exp(-x^2), erf'' = -2 x erf',
    atan2' = (x dy - y dx) / r^2."""
    from scipy import special
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 120
    header = tmp_path / "special_probe.hpp"
    header.write_text(PROBE)
    erf, erfc, atan2 = (ps.load_model(header, which=float(k)) for k in range(3))
    rng = np.random.default_rng(30)
    mags = np.concatenate([10.0 ** rng.uniform(-300, 1.5, 3000), rng.uniform(0, 7, 3000)])
    x = np.concatenate([mags, -mags, [0.0, 26.5, 27.3, -6.0, 5.9]])
    W = np.stack([x, np.ones_like(x)], axis=1)
    got = erf.loss(W)
    assert (ulps(got, special.erf(x)) <= 2).all()  # SciPy's erf: within an ulp itself
    sub = rng.choice(x.size, 600, replace=False)
    for model, fn in ((erf, mpmath.erf), (erfc, mpmath.erfc)):
        ref = np.array([float(fn(mpmath.mpf(float(v)))) for v in x[sub]])
        assert ulps(model.loss(W[sub]), ref).max() <= 2.0
    tails = x[(x > 1) & (x < 26)]  # erfc down to 1e-296: relative accuracy kept
    np.testing.assert_allclose(erfc.loss(np.stack([tails, tails], 1)), special.erfc(tails),
                               rtol=1e-13)
    V = np.stack([np.full_like(x, 0.7), np.zeros_like(x)], axis=1)
    slope = 2 / np.sqrt(np.pi) * np.exp(-x * x)
    np.testing.assert_allclose(erf.hvp(W, V)[:, 0], 0.7 * slope, rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(erfc.hvp(W, V)[:, 0], -0.7 * slope, rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(erf.third(W, V)[:, 0], 0.49 * (-2 * x * slope), rtol=1e-13,
                               atol=1e-300)
    P = rng.standard_normal((400, 2)) * 10.0 ** rng.uniform(-3, 3, (400, 1))
    ref = np.array([float(mpmath.atan2(mpmath.mpf(float(a)), mpmath.mpf(float(b))))
                    for a, b in P])
    assert ulps(atan2.loss(P), ref).max() <= 1.0
    Q = rng.standard_normal((400, 2))
    (a, b), (da, db) = P.T, Q.T
    r2 = a * a + b * b
    turn = b * da - a * db
    np.testing.assert_allclose(atan2.hvp(P, Q)[:, 0], turn / r2, rtol=1e-13)
    np.testing.assert_allclose(atan2.third(P, Q)[:, 0], -2 * turn * (a * da + b * db) / r2 ** 2,
                               rtol=1e-12)

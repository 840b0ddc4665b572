"""Correctness of the model kernels: identities, oracles, closed forms, batching.

Every identity of docs/theory.rst is checked for every model in float64
and float32; the compiled kernels are compared with the NumPy oracles of
pysharp.reference and with finite differences; the closed forms of section 2
(BN linear regression, BN matrix completion, the 3-D toy) are recomputed here
independently of both. Scale invariance is also checked to the bit (powers of
two), and a model's registered sweep summaries apply only where they are defined.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from _cases import get_case, rel_err, tol
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import pysharp as ps
import pysharp._core as _core
from pysharp.models import BNLinearRegression, BNMatrixCompletion, Toy3D
from pysharp.reference import (
    BNLinearRegressionReference,
    BNMatrixCompletionReference,
    BNTwoLayerNetReference,
    Toy3DReference,
)

B = 5  # batch size of the identity checks


def unit_rows(a):
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def rowdot(a, b):
    return np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64), axis=-1)


# ======================================================================================
# Scale invariance and its consequences (docs/theory.rst, "Scale invariance")
# ======================================================================================
SCALES = [1e-3, 0.1, 0.7, 3.0, 1e3]


@pytest.mark.parametrize("c", SCALES)
def test_loss_scale_invariant(case, dtype, c):
    w = case.points(B, seed=1, dtype=dtype)
    L = case.model.loss(w)
    Lc = case.model.loss((w.astype(np.float64) * c).astype(dtype))
    assert Lc.dtype == dtype
    assert rel_err(Lc, L) < tol(dtype, 1e-13, 2e-5)


def test_grad_orthogonal_to_w(case, dtype):
    w = case.points(B, seed=2, dtype=dtype)
    g = case.model.grad(w)
    cosine = rowdot(g, w) / (np.linalg.norm(g.astype(np.float64), axis=1)
                             * np.linalg.norm(w.astype(np.float64), axis=1))
    assert np.all(np.abs(cosine) < tol(dtype, 1e-13, 1e-5)), cosine


@pytest.mark.parametrize("c", SCALES)
def test_grad_scales_as_inverse(case, dtype, c):
    w = case.points(B, seed=3, dtype=dtype)
    g = case.model.grad(w)
    gc = case.model.grad((w.astype(np.float64) * c).astype(dtype))
    assert rel_err(c * gc.astype(np.float64), g) < tol(dtype, 1e-13, 2e-5)


@pytest.mark.parametrize("c", [1e-3, 0.3, 1e3])
def test_hessian_and_third_scale(case, dtype, c):
    """H(c w) = H(w)/c^2 and D^3L(c w)[v, v] = D^3L(w)[v, v]/c^3 (homogeneity)."""
    w = case.points(2, seed=4, dtype=dtype)
    v = case.points(2, seed=5, dtype=dtype)
    wc = (w.astype(np.float64) * c).astype(dtype)
    assert rel_err(c**2 * case.model.hessian(wc).astype(np.float64),
                   case.model.hessian(w)) < tol(dtype, 1e-12, 1e-4)
    assert rel_err(c**3 * case.model.third(wc, v).astype(np.float64),
                   case.model.third(w, v)) < tol(dtype, 1e-12, 1e-4)


def test_hvp_along_w_is_minus_grad(case, dtype):
    """H(w) w = -grad L(w), from differentiating grad(c w) = grad(w)/c at c = 1."""
    w = case.points(B, seed=6, dtype=dtype)
    assert rel_err(case.model.hvp(w, w), -case.model.grad(w)) < tol(dtype, 1e-12, 1e-4)


def test_third_along_w_is_twice_grad(case, dtype):
    """D^3L(w)[w, w] = d/dc H(c w) w at c = 1 = -2 H(w) w = 2 grad L(w)."""
    w = case.points(B, seed=7, dtype=dtype)
    assert rel_err(case.model.third(w, w), 2 * case.model.grad(w)) < tol(dtype, 1e-12, 1e-4)


# ======================================================================================
# Hessian: symmetry, consistency of hvp and hessian
# ======================================================================================
def test_hvp_symmetric(case, dtype):
    w = case.points(B, seed=8, dtype=dtype)
    u = case.points(B, seed=9, dtype=dtype, norm=1.0)
    v = case.points(B, seed=10, dtype=dtype, norm=1.0)
    Hu, Hv = case.model.hvp(w, u), case.model.hvp(w, v)
    lhs, rhs = rowdot(u, Hv), rowdot(v, Hu)
    scale = np.linalg.norm(Hu.astype(np.float64), axis=1) + np.linalg.norm(
        Hv.astype(np.float64), axis=1)
    assert np.all(np.abs(lhs - rhs) <= tol(dtype, 1e-13, 1e-5) * scale), (lhs, rhs)


def test_hessian_is_stacked_hvp_and_symmetric(case, dtype):
    D = case.dim
    w = case.points(2, seed=11, dtype=dtype)
    H = case.model.hessian(w)
    assert H.shape == (2, D, D) and H.dtype == dtype
    E = np.eye(D, dtype=dtype)
    for b in range(2):
        cols = case.model.hvp(w[b], E)  # row j = H e_j = column j of H
        assert rel_err(H[b], cols.T) <= tol(dtype, 1e-14, 1e-6)
        assert rel_err(H[b], H[b].T) <= tol(dtype, 1e-13, 1e-5)
    H0 = case.model.hessian(w[0])
    assert H0.shape == (D, D)
    np.testing.assert_array_equal(H0, H[0])


# ======================================================================================
# Finite differences (float64)
# ======================================================================================
def _fd_step(w, v, rel=1e-5):
    return rel * np.linalg.norm(w, axis=-1, keepdims=True) / np.linalg.norm(v, axis=-1,
                                                                             keepdims=True)


def test_hvp_matches_central_differences_of_grad(case):
    w = case.points(B, seed=12)
    v = case.points(B, seed=13, norm=1.0)
    h = _fd_step(w, v)
    fd = (case.model.grad(w + h * v) - case.model.grad(w - h * v)) / (2 * h)
    for b in range(B):
        assert rel_err(case.model.hvp(w, v)[b], fd[b]) < 1e-7


def test_third_matches_central_differences_of_hvp(case):
    w = case.points(B, seed=14)
    v = case.points(B, seed=15, norm=1.0)
    h = _fd_step(w, v)
    fd = (case.model.hvp(w + h * v, v) - case.model.hvp(w - h * v, v)) / (2 * h)
    T = case.model.third(w, v)
    for b in range(B):
        assert rel_err(T[b], fd[b]) < 1e-6


def test_grad_matches_central_differences_of_loss(case):
    w = case.points(seed=16)
    h = 1e-5 * np.linalg.norm(w)
    E = np.eye(case.dim)
    fd = (case.model.loss(w + h * E) - case.model.loss(w - h * E)) / (2 * h)
    assert rel_err(case.model.grad(w), fd) < 1e-7


# ======================================================================================
# The compiled core against the NumPy oracle
# ======================================================================================
@pytest.mark.parametrize("kernel", ["loss", "grad", "hvp", "third"])
def test_matches_reference(case, dtype, kernel):
    w = case.points(B, seed=17, dtype=dtype)
    v = case.points(B, seed=18, dtype=dtype, norm=1.3)
    w64, v64 = w.astype(np.float64), v.astype(np.float64)
    if kernel in ("loss", "grad"):
        got, want = getattr(case.model, kernel)(w), getattr(case.ref, kernel)(w64)
    else:
        got, want = getattr(case.model, kernel)(w, v), getattr(case.ref, kernel)(w64, v64)
    assert got.dtype == dtype
    assert rel_err(got, want) < tol(dtype, 1e-12, 1e-4)


def test_loss_and_grad_agree_with_separate_calls(case, dtype):
    w = case.points(B, seed=19, dtype=dtype)
    L, G = case.model.loss_and_grad(w)
    np.testing.assert_array_equal(L, case.model.loss(w))
    np.testing.assert_array_equal(G, case.model.grad(w))


def test_float32_close_to_float64(case):
    w = case.points(B, seed=20)
    v = case.points(B, seed=21, norm=1.0)
    w32, v32 = w.astype(np.float32), v.astype(np.float32)
    m = case.model
    assert rel_err(m.loss(w32), m.loss(w32.astype(np.float64))) < 1e-5
    assert rel_err(m.grad(w32), m.grad(w32.astype(np.float64))) < 1e-4
    assert rel_err(m.hvp(w32, v32), m.hvp(w32.astype(np.float64), v32.astype(np.float64))) < 1e-4


# ======================================================================================
# Batching, broadcasting, shapes and dtypes
# ======================================================================================
def test_batched_equals_row_by_row(case, dtype):
    Bn = 7
    w = case.points(Bn, seed=22, dtype=dtype)
    v = case.points(Bn, seed=23, dtype=dtype)
    m = case.model
    L, G = m.loss_and_grad(w)
    Hv, T, H = m.hvp(w, v), m.third(w, v), m.hessian(w)
    t = tol(dtype, 1e-14, 1e-7)
    for b in range(Bn):
        assert rel_err(m.loss(w[b]), L[b]) <= t
        assert rel_err(m.grad(w[b]), G[b]) <= t
        assert rel_err(m.hvp(w[b], v[b]), Hv[b]) <= t
        assert rel_err(m.third(w[b], v[b]), T[b]) <= t
        assert rel_err(m.hessian(w[b]), H[b]) <= t
        assert rel_err(m.loss(w[b:b + 1]), L[b:b + 1]) <= t


@pytest.mark.parametrize("kernel", ["hvp", "third"])
def test_single_v_broadcasts_against_batch(case, dtype, kernel):
    Bn = 4
    f = getattr(case.model, kernel)
    W = case.points(Bn, seed=24, dtype=dtype)
    v = case.points(seed=25, dtype=dtype)
    out = f(W, v)
    assert out.shape == (Bn, case.dim)
    np.testing.assert_array_equal(out, f(W, np.tile(v, (Bn, 1))))
    # and the other way round: one w against a batch of v
    V = case.points(Bn, seed=26, dtype=dtype)
    out = f(W[0], V)
    assert out.shape == (Bn, case.dim)
    np.testing.assert_array_equal(out, f(np.tile(W[0], (Bn, 1)), V))


def test_shapes_and_dtypes(case, dtype):
    D, m = case.dim, case.model
    w1 = case.points(seed=27, dtype=dtype)
    W = case.points(3, seed=28, dtype=dtype)
    expected = {
        "loss": ((), (3,)),
        "grad": ((D,), (3, D)),
        "hvp": ((D,), (3, D)),
        "third": ((D,), (3, D)),
        "hessian": ((D, D), (3, D, D)),
    }
    for name, (single_shape, batch_shape) in expected.items():
        f = getattr(m, name)
        args1 = (w1, w1) if name in ("hvp", "third") else (w1,)
        argsB = (W, W) if name in ("hvp", "third") else (W,)
        r1, rB = f(*args1), f(*argsB)
        assert np.shape(r1) == single_shape, name
        assert np.shape(rB) == batch_shape, name
        assert np.asarray(r1).dtype == dtype and np.asarray(rB).dtype == dtype, name
        assert np.all(np.isfinite(r1)) and np.all(np.isfinite(rB)), name
    L, G = m.loss_and_grad(W)
    assert L.shape == (3,) and G.shape == (3, D)
    # a (1, D) batch keeps its batch axis
    assert m.loss(W[:1]).shape == (1,)
    assert m.grad(W[:1]).shape == (1, D)


def test_random_point(case):
    w = case.model.random_point(seed=3, norm=2.0)
    assert w.shape == (case.dim,) and w.dtype == np.float64
    assert np.isclose(np.linalg.norm(w), 2.0)
    W = case.model.random_point(4, seed=3, dtype=np.float32)
    assert W.shape == (4, case.dim) and W.dtype == np.float32
    np.testing.assert_array_equal(W, case.model.random_point(4, seed=3, dtype=np.float32))


def test_inputs_not_modified(case, dtype):
    w = case.points(3, seed=29, dtype=dtype)
    v = case.points(3, seed=30, dtype=dtype)
    w0, v0 = w.copy(), v.copy()
    case.model.loss_and_grad(w)
    case.model.hvp(w, v)
    case.model.third(w, v)
    case.model.hessian(w)
    np.testing.assert_array_equal(w, w0)
    np.testing.assert_array_equal(v, v0)


# ======================================================================================
# Determinism across thread counts (docs/conventions.rst, "Determinism")
# ======================================================================================
def test_deterministic_across_thread_counts(case):
    W = case.points(64, seed=31)
    V = case.points(64, seed=32)
    m = case.model
    before = _core.max_threads()
    results = []
    try:
        for n in (1, 2):
            _core.set_num_threads(n)
            L, G = m.loss_and_grad(W)
            results.append([L, G, m.hvp(W, V), m.third(W, V), m.hessian(W[:3]),
                            m.hvp(W.astype(np.float32), V.astype(np.float32))])
    finally:
        _core.set_num_threads(before)
    assert _core.max_threads() == before
    for a, b in zip(*results):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


def test_repeated_calls_identical(case):
    W = case.points(16, seed=33)
    V = case.points(16, seed=34)
    a, b = case.model.third(W, V), case.model.third(W, V)
    assert a.tobytes() == b.tobytes()


# ======================================================================================
# BN linear regression: closed forms (docs/theory.rst, "BN linear regression")
# ======================================================================================
def _cosine(a, b):
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b))


def test_linreg_closed_form_loss(linreg_case):
    m = linreg_case.model
    X, y = np.array(m.X), np.array(m.y)
    Xc = X - X.mean(axis=0)
    w = linreg_case.points(B, seed=40)
    closed = 2 * y.var() * (1 - _cosine(w @ Xc.T, y - y.mean()))
    assert rel_err(m.loss(w), closed) < 1e-12
    # and straight from the definition: predictions, then mean squared error
    z = w @ Xc.T
    sigma = np.linalg.norm(z, axis=1, keepdims=True) / np.sqrt(len(y))
    p = y.std() * z / sigma + y.mean()
    assert rel_err(m.loss(w), np.mean((p - y) ** 2, axis=1)) < 1e-12


def test_linreg_loss_range(linreg_case):
    """0 <= L <= 4 var(y), with the extremes at Xc w = +-(y - mean y) directions."""
    m = linreg_case.model
    w = linreg_case.points(50, seed=41)
    L = m.loss(w)
    assert np.all(L >= 0) and np.all(L <= 4 * m.y.var())


def test_linreg_effective_predictor(linreg_case, dtype):
    m = linreg_case.model
    X, y = np.array(m.X), np.array(m.y)
    Xc = X - X.mean(axis=0)
    w = linreg_case.points(B, seed=42, dtype=dtype)
    wt, bt = m.effective_predictor(w)
    assert wt.shape == (B, m.dim) and bt.shape == (B,)
    w64 = w.astype(np.float64)
    z = w64 @ Xc.T
    sigma = np.linalg.norm(z, axis=1, keepdims=True) / np.sqrt(m.n)
    want = y.std() * z / sigma + y.mean()
    got = wt.astype(np.float64) @ X.T + np.asarray(bt, np.float64)[:, None]
    assert rel_err(got, want) < tol(dtype, 1e-12, 1e-4)
    # the predictor's training MSE is the loss
    assert rel_err(np.mean((got - y) ** 2, axis=1), m.loss(w64)) < tol(dtype, 1e-11, 1e-4)
    # scale invariant
    for c in (1e-3, 7.0, 1e3):
        wt_c, bt_c = m.effective_predictor((w64 * c).astype(dtype))
        assert rel_err(wt_c, wt) < tol(dtype, 1e-13, 1e-5)
        assert rel_err(bt_c, bt) < tol(dtype, 1e-13, 1e-5)
    # single point drops the batch axis
    wt1, bt1 = m.effective_predictor(w[0])
    assert wt1.shape == (m.dim,) and np.shape(bt1) == ()
    assert rel_err(wt1, wt[0]) < tol(dtype, 1e-15, 1e-7)


def test_linreg_min_norm_interpolant_is_a_minimiser(linreg_case):
    """n <= d: wt* = pinv(Xc)(y - mean y) interpolates, so L = 0 and grad = 0 there."""
    m = linreg_case.model
    assert m.n <= m.dim
    X, y = np.array(m.X), np.array(m.y)
    Xc = X - X.mean(axis=0)
    w_star = np.linalg.pinv(Xc) @ (y - y.mean())
    assert np.allclose(Xc @ w_star, y - y.mean(), atol=1e-12)
    var = y.var()
    assert m.loss(w_star) < 1e-24 * var
    g = m.grad(w_star)
    assert np.linalg.norm(g) * np.linalg.norm(w_star) < 1e-12 * var
    # the effective predictor of the min-norm interpolant is the interpolant itself
    wt, bt = m.effective_predictor(w_star)
    assert rel_err(wt, w_star) < 1e-12
    assert rel_err(X @ wt + bt, y) < 1e-12
    # any scaling is an equally good minimiser
    assert m.loss(3.7 * w_star) < 1e-24 * var


def test_linreg_hessian_rank_at_interpolant(linreg_case):
    """At the interpolant H is PSD of rank n - 2 (docs/theory.rst,
    "The sharpness-reduction flow")."""
    m = linreg_case.model
    X, y = np.array(m.X), np.array(m.y)
    Xc = X - X.mean(axis=0)
    w_star = np.linalg.pinv(Xc) @ (y - y.mean())
    lam = np.linalg.eigvalsh(m.hessian(w_star))
    top = lam[-1]
    assert lam[0] > -1e-10 * top
    assert int(np.sum(lam > 1e-8 * top)) == m.n - 2


def test_linreg_synthetic_paper_setting(linreg_paper):
    m = linreg_paper.model
    assert m.dim == 40 and m.n == 20
    assert np.isclose(np.linalg.norm(m.w_true), 1.0)
    np.testing.assert_allclose(m.y, m.X @ m.w_true, rtol=1e-12, atol=1e-12)
    # the ground truth interpolates: zero loss in its direction
    assert m.loss(m.w_true) < 1e-24


def test_linreg_leaves_caller_arrays_alone():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((6, 4))
    y = rng.standard_normal(6)
    m = BNLinearRegression(X, y)
    w = rng.standard_normal(4)
    L = m.loss(w)
    assert X.flags.writeable and y.flags.writeable
    X[:] = 0.0  # mutating the caller's arrays must not change the model
    y[:] = 1.0
    assert m.loss(w) == L


def test_linreg_model_data_is_read_only(linreg_small):
    m = linreg_small.model
    with pytest.raises(ValueError):
        m.X[0, 0] = 1.0
    with pytest.raises(ValueError):
        m.y[0] = 1.0


def test_linreg_integer_data():
    X = np.array([[0, 1], [2, 0], [1, 3], [4, 4]])
    y = np.array([1, 2, 0, 5])
    m = BNLinearRegression(X, y)
    w = np.array([0.3, -1.1])
    mf = BNLinearRegression(X.astype(float), y.astype(float))
    assert m.loss(w) == mf.loss(w)


# ======================================================================================
# BN matrix completion
# ======================================================================================
def _mc_closed_form(model, w, rows, cols, values, stats_from_train=True):
    """L straight from the definitions of docs/theory.rst, with U V^T formed explicitly."""
    m1, m2 = model.shape
    r = model.rank
    U = w[: m1 * r].reshape(m1, r)
    V = w[m1 * r:].reshape(m2, r)
    M = U @ V.T
    s_train = M[model.rows, model.cols]
    mu, sd = s_train.mean(), s_train.std()
    p = model.values.std() * (M[rows, cols] - mu) / sd + model.values.mean()
    return np.mean((p - values) ** 2)


def test_mc_closed_form_loss_and_test_loss(mc_case):
    m = mc_case.model
    W = mc_case.points(3, seed=50)
    for w, L, Lt in zip(W, m.loss(W), m.test_loss(W)):
        assert rel_err(L, _mc_closed_form(m, w, m.rows, m.cols, m.values)) < 1e-12
        assert rel_err(Lt, _mc_closed_form(m, w, *m.test)) < 1e-12


def test_mc_test_loss_matches_reference(mc_case, dtype):
    m = mc_case.model
    w = mc_case.points(B, seed=51, dtype=dtype)
    got = m.test_loss(w)
    want = mc_case.ref.test_loss(w.astype(np.float64), *m.test)
    assert got.shape == (B,) and got.dtype == dtype
    assert rel_err(got, want) < tol(dtype, 1e-12, 1e-4)
    single = m.test_loss(w[0])
    assert np.shape(single) == ()
    assert rel_err(single, got[0]) <= tol(dtype, 1e-15, 1e-7)


def test_mc_test_loss_scale_invariant(mc_case, dtype):
    w = mc_case.points(B, seed=52, dtype=dtype)
    Lt = mc_case.model.test_loss(w)
    for c in (1e-3, 2.0, 1e3):
        assert rel_err(mc_case.model.test_loss((w.astype(np.float64) * c).astype(dtype)),
                       Lt) < tol(dtype, 1e-13, 2e-5)


def test_mc_test_loss_on_training_entries_is_training_loss(mc_case):
    m = mc_case.model
    twin = BNMatrixCompletion(m.rows, m.cols, m.values, m.shape, m.rank,
                              test=(m.rows, m.cols, m.values))
    w = mc_case.points(4, seed=53)
    assert rel_err(twin.test_loss(w), m.loss(w)) < 1e-12


def test_mc_unaffected_by_later_mutation_of_caller_values(mc_case):
    m = mc_case.model
    values = np.array(m.values, dtype=np.float64)
    twin = BNMatrixCompletion(m.rows, m.cols, values, m.shape, m.rank, test=m.test)
    w = mc_case.points(seed=54)
    L, Lt = twin.loss(w), twin.test_loss(w)
    values *= 2.0
    assert twin.loss(w) == L
    assert twin.test_loss(w) == Lt


def test_mc_factors_layout(mc_case):
    m = mc_case.model
    m1, m2 = m.shape
    r = m.rank
    w = np.arange(m.dim, dtype=float)
    U, V = m.factors(w)
    assert U.shape == (m1, r) and V.shape == (m2, r)
    np.testing.assert_array_equal(U.ravel(), w[: m1 * r])
    np.testing.assert_array_equal(V.ravel(), w[m1 * r:])
    W = np.stack([w, 2 * w])
    U, V = m.factors(W)
    assert U.shape == (2, m1, r) and V.shape == (2, m2, r)


def test_mc_truth_interpolates(mc_case):
    """Factors of the rank-2 truth, padded to rank 3, give zero loss on train and test."""
    m = mc_case.model
    Uq, s, Vt = np.linalg.svd(m.truth)
    r = m.rank
    U = Uq[:, :r] * np.sqrt(s[:r])
    V = Vt[:r].T * np.sqrt(s[:r])
    w = np.concatenate([U.ravel(), V.ravel()])
    scale = m.values.var()
    assert m.loss(w) < 1e-20 * scale
    assert m.test_loss(w) < 1e-20 * scale
    assert np.linalg.norm(m.grad(w)) * np.linalg.norm(w) < 1e-10 * scale


def test_mc_general_instance_against_reference():
    """A rectangular instance with unsorted, repeated-row observations."""
    rng = np.random.default_rng(7)
    m1, m2, r = 4, 7, 2
    flat = rng.choice(m1 * m2, size=15, replace=False)
    rows, cols = np.divmod(flat, m2)
    values = rng.standard_normal(15)
    m = BNMatrixCompletion(rows, cols, values, (m1, m2), r)
    ref = BNMatrixCompletionReference(rows, cols, values, (m1, m2), r)
    assert m.dim == (m1 + m2) * r and m.n_obs == 15
    W = rng.standard_normal((3, m.dim))
    V = rng.standard_normal((3, m.dim))
    assert rel_err(m.loss(W), ref.loss(W)) < 1e-12
    assert rel_err(m.grad(W), ref.grad(W)) < 1e-12
    assert rel_err(m.hvp(W, V), ref.hvp(W, V)) < 1e-12
    assert rel_err(m.third(W, V), ref.third(W, V)) < 1e-12


# ======================================================================================
# Toy 3-D loss: closed forms of docs/theory.rst, "The 3-D toy loss"
# ======================================================================================
PHIS = [0.0, 0.3, -0.9, 1.2, np.pi / 2 - 1e-3]


def _chart(phi):
    return np.array([np.cos(phi) / np.sqrt(2), np.cos(phi) / np.sqrt(2), np.sin(phi)])


def _chart_tangent(phi):
    return np.array([-np.sin(phi) / np.sqrt(2), -np.sin(phi) / np.sqrt(2), np.cos(phi)])


E12 = np.array([1.0, -1.0, 0.0]) / np.sqrt(2)


@pytest.mark.parametrize("c", [0.0, 1.0, 10.0])
def test_toy_closed_form_loss(c):
    toy = Toy3D(c)
    w = np.random.default_rng(60).standard_normal((20, 3)) * 3
    t = unit_rows(w)
    want = (1 + c * t[:, 2] ** 2) * (t[:, 0] - t[:, 1]) ** 2
    assert rel_err(toy.loss(w), want) < 1e-13
    assert rel_err(toy.grad(w), Toy3DReference(c).grad(w)) < 1e-12


@pytest.mark.parametrize("dtype_", [np.float64, np.float32])
def test_toy_loss_and_grad_vanish_on_gamma(dtype_):
    toy = Toy3D(10.0)
    rng = np.random.default_rng(61)
    a, b = rng.standard_normal(10), rng.standard_normal(10)
    w = np.stack([a, a, b], axis=1).astype(dtype_)
    L, G = toy.loss_and_grad(w)
    assert np.all(np.abs(L) <= 1e-30)
    assert np.all(np.abs(G) <= 1e-15)


@pytest.mark.parametrize("c", [0.0, 1.0, 10.0])
@pytest.mark.parametrize("phi", PHIS)
def test_toy_hessian_on_gamma(c, phi):
    toy = Toy3D(c)
    zeta = _chart(phi)
    z = zeta[2]
    lam1 = 4 * (1 + c * z * z)
    H = toy.hessian(zeta)
    want = 2 * (1 + c * z * z) * np.outer(E12, E12) * 2  # 2(1+cz^2)(e1-e2)(e1-e2)^T
    np.testing.assert_allclose(H, want, rtol=0, atol=1e-12 * lam1)
    lam, vecs = np.linalg.eigh(H)
    assert rel_err(lam[-1], lam1) < 1e-13
    assert abs(abs(vecs[:, -1] @ E12) - 1) < 1e-12
    np.testing.assert_allclose(lam[:2], 0, atol=1e-12 * lam1)
    # spherical sharpness at a non-unit point: ||w||^2 lambda_1(H(w))
    r = 3.3
    assert rel_err(r**2 * np.linalg.eigvalsh(toy.hessian(r * zeta))[-1], lam1) < 1e-13


def test_toy_flattest_point():
    toy = Toy3D(10.0)
    zeta = np.array([1.0, 1.0, 0.0]) / np.sqrt(2)
    lam = np.linalg.eigvalsh(toy.hessian(zeta))
    assert rel_err(lam[-1], 4.0) < 1e-14
    # it is the least sharp point of Gamma
    sharp = [np.linalg.eigvalsh(toy.hessian(_chart(p)))[-1] for p in np.linspace(-1.5, 1.5, 31)]
    assert min(sharp) >= lam[-1] * (1 - 1e-14)


@pytest.mark.parametrize("c", [1.0, 10.0])
@pytest.mark.parametrize("phi", [0.3, -0.9, 1.2])
def test_toy_third_is_grad_of_sharpness_on_gamma(c, phi):
    """grad lambda_1 = D^3L[v1, v1]; along Gamma d lambda_1/d phi = 8 c sin cos,
    and lambda_1 is homogeneous of degree -2, so grad lambda_1 . zeta = -2 lambda_1.
    The flow's G(phi) = (d lambda_1 / d phi) / lambda_1."""
    toy = Toy3D(c)
    zeta = _chart(phi)
    lam1 = 4 * (1 + c * np.sin(phi) ** 2)
    g = toy.third(zeta, E12)
    assert rel_err(g @ _chart_tangent(phi), 8 * c * np.sin(phi) * np.cos(phi)) < 1e-12
    assert rel_err(g @ zeta, -2 * lam1) < 1e-12
    G = 2 * c * np.sin(phi) * np.cos(phi) / (1 + c * np.sin(phi) ** 2)
    assert rel_err((g @ _chart_tangent(phi)) / lam1, G) < 1e-12


def test_toy_third_matches_eigenvalue_finite_difference():
    """grad lambda_1 from third() against central differences of the top eigenvalue."""
    toy = Toy3D(10.0)
    w = np.array([0.8, 0.5, -0.4])
    lam, vecs = np.linalg.eigh(toy.hessian(w))
    assert lam[-1] - lam[-2] > 1e-3 * lam[-1]  # simple top eigenvalue
    g = toy.third(w, vecs[:, -1])
    h = 1e-5
    fd = np.array([(np.linalg.eigvalsh(toy.hessian(w + h * e))[-1]
                    - np.linalg.eigvalsh(toy.hessian(w - h * e))[-1]) / (2 * h)
                   for e in np.eye(3)])
    assert rel_err(g, fd) < 1e-7


def test_toy_c_is_float():
    assert Toy3D(3).c == 3.0 and isinstance(Toy3D(3).c, float)
    assert Toy3D().c == 10.0


# ======================================================================================
# Extreme but representable scales (float range)
# ======================================================================================
# At these scales w itself and the true loss and gradient are ordinary floats
# (the gradient scales as 1/c), so a scale-invariant loss should either be
# computed correctly or refused with a ValueError -- never silently wrong.
_EXTREME = {
    # (case, dtype): scale exponents; BN-MC scores are quadratic in w, so its
    # scales are the square roots of the others'.
    ("toy3d", "float64"): (-170, 170),
    ("bn_linreg_small", "float64"): (-170, 170),
    ("bn_mc", "float64"): (-85, 85),
    ("toy3d", "float32"): (-21, 21),
    ("bn_linreg_small", "float32"): (-21, 21),
    ("bn_mc", "float32"): (-11, 11),
}
def _extreme_params():
    return [pytest.param(key, dt, e, id=f"{key}-{dt}-1e{e:+d}")
            for (key, dt), exps in _EXTREME.items() for e in exps]


@pytest.mark.parametrize("key,dt,e", _extreme_params())
def test_extreme_scale_exact_or_refused(key, dt, e):
    case = get_case(key)
    dtype = np.dtype(dt)
    w = case.points(seed=70, norm=1.0)
    L, G = case.model.loss_and_grad(w)
    c = 10.0**e
    wc = (w * c).astype(dtype)
    assert np.all(np.isfinite(wc)) and np.any(wc)
    try:
        Lc, Gc = case.model.loss_and_grad(wc)
    except ValueError as exc:
        # refusing is acceptable, but not with a false reason: w is not zero and
        # the observed scores are not all equal
        msg = str(exc)
        assert "zero" not in msg and "equal" not in msg, msg
        return
    assert rel_err(Lc, L) < tol(dtype, 1e-10, 1e-4)
    assert rel_err(c * Gc.astype(np.float64), G) < tol(dtype, 1e-10, 1e-4)


@pytest.mark.parametrize("key,dt", [
    pytest.param(k, d, id=f"{k}-{d}")
    for k in ("toy3d", "bn_linreg_small", "bn_mc") for d in ("float64", "float32")])
def test_kernels_exact_across_scales(key, dt):
    """Over the whole float range, grad, hvp and third of c w are the c^-1, c^-2, c^-3
    multiples of those at w (loss unchanged), wherever those results are representable:
    no NaN, no refusal, no silent loss of accuracy."""
    case = get_case(key)
    dtype = np.dtype(dt)
    fi = np.finfo(dtype)
    w = case.points(seed=71, norm=1.0)
    v = case.points(seed=72, norm=1.0)
    L0 = case.model.loss(w)
    base = {"grad": case.model.grad(w), "hvp": case.model.hvp(w, v),
            "third": case.model.third(w, v)}
    order = {"loss": 0, "grad": 1, "hvp": 2, "third": 3}
    base["loss"] = L0
    lo, hi = (-300, 300) if dtype == np.float64 else (-36, 36)
    exps = np.arange(lo, hi + 1)
    with np.errstate(over="ignore", under="ignore"):
        W = (w[None, :] * 10.0 ** exps[:, None].astype(np.float64)).astype(dtype)
    vc = v.astype(dtype)
    t = tol(dtype, 1e-12, 1e-4)
    bad = []
    for name, k in order.items():
        f = {"loss": case.model.loss, "grad": case.model.grad}.get(name) or (
            lambda x, f=getattr(case.model, name): f(x, vc))  # noqa: B008 - binds this name's
        with np.errstate(over="ignore", under="ignore"):
            mag = np.max(np.abs(base[name])) * 10.0 ** np.clip(-k * exps, -400, 400).astype(float)
        keep = (np.abs(k * exps) < 300) & (mag > fi.tiny * 1e6) & (mag < fi.max / 1e6)
        for e, out in zip(exps[keep], _eval_rows(f, W[keep])):
            if out is None:
                bad.append((name, int(e), "refused"))
            elif np.any(np.isnan(out)):
                bad.append((name, int(e), "nan"))
            elif rel_err(np.asarray(out, np.float64) * 10.0 ** (k * int(e)), base[name]) > t:
                bad.append((name, int(e), "inaccurate"))
    assert not bad, f"(kernel, log10 scale, failure): {bad}"


def _eval_rows(f, W):
    """f on each row of W, None where f raises ValueError for that row.

    One batched call when no row raises; otherwise the batch is bisected, so the
    number of calls grows with the number of raising runs, not with len(W).
    """
    if len(W) == 0:
        return []
    try:
        return list(np.atleast_1d(f(W)) if W.ndim == 1 else f(W))
    except ValueError:
        if len(W) == 1:
            return [None]
    h = len(W) // 2
    return _eval_rows(f, W[:h]) + _eval_rows(f, W[h:])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("pattern", ["constant", "mixed"])
@pytest.mark.parametrize("key", ["toy3d", "bn_linreg_small", "bn_mc"])
@pytest.mark.parametrize("tiny", [1e-310, 1e-320, 5e-324])
def test_subnormal_w(key, tiny, pattern):
    """A nonzero w with subnormal entries has a well-defined loss, L(w / max|w|): the kernels
    either return it (and finite derivatives) or refuse it, but never return NaN and never
    claim that w is zero."""
    case = get_case(key)
    w = np.full(case.dim, tiny)
    if pattern == "mixed":  # signs and zeros; off the Toy3D minimiser set x = y
        w[::2] *= -1
        w[1] = 0.0
    ref = w / np.max(np.abs(w))
    kernels = ["loss_and_grad", "hessian", "hvp", "third"]
    if key == "bn_linreg_small":
        kernels.append("effective_predictor")
    for kernel in kernels:
        args = (w, ref) if kernel in ("hvp", "third") else (w,)
        try:
            out = getattr(case.model, kernel)(*args)
        except ValueError as exc:
            msg = str(exc)
            if key == "bn_mc" and pattern == "constant":
                # Constant U and V make every observed score equal: the true reason.
                assert "equal" in msg, (kernel, msg)
                continue
            assert "zero" not in msg and "equal" not in msg, (kernel, msg)
            continue
        assert not (key == "bn_mc" and pattern == "constant"), "equal scores must be refused"
        outs = out if isinstance(out, tuple) else (out,)
        assert not any(np.any(np.isnan(o)) for o in outs), (kernel, outs)
        if kernel == "loss_and_grad":
            assert rel_err(out[0], case.model.loss(ref)) < 1e-12


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_hvp_small_w_zero_v(case):
    w = case.points(seed=80, norm=1.0) * 1e-160
    out = case.model.hvp(w, np.zeros(case.dim))
    assert np.all(out == 0), out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kernel, c, seed", [("hvp", 1e-160, 81), ("third", 1e-110, 83)])
def test_directional_small_w_small_v(case, kernel, c, seed):
    """H(c w)(c v) = H(w) v / c, representable (~1e160) although H(c w) is not, and
    D^3L(c w)[c v, c v] = D^3L(w)[v, v] / c (~1e110)."""
    w = case.points(seed=seed, norm=1.0)
    v = case.points(seed=seed + 1, norm=1.0)
    f = getattr(case.model, kernel)
    assert rel_err(f(c * w, c * v) * c, f(w, v)) < 1e-12


def test_hvp_third_with_badly_scaled_v(case, dtype):
    """The result is linear / quadratic in v, whatever v's magnitude."""
    w = case.points(seed=85, dtype=dtype)
    v = case.points(seed=86, norm=1.0)
    big, small = (1e150, 1e-150) if dtype == np.float64 else (1e15, 1e-15)
    for a in (big, small):
        va = (v * a).astype(dtype)
        assert rel_err(case.model.hvp(w, va).astype(np.float64) / a,
                       case.model.hvp(w, v.astype(dtype))) < tol(dtype, 1e-13, 1e-5)
    a = 1e100 if dtype == np.float64 else 1e10
    va = (v * a).astype(dtype)
    assert rel_err(case.model.third(w, va).astype(np.float64) / a**2,
                   case.model.third(w, v.astype(dtype))) < tol(dtype, 1e-13, 1e-5)


# -- exact scale invariance, broadcasting, which summaries apply -----------------------
def test_scale_invariance_is_exact_for_powers_of_two():
    model = ps.BNMatrixCompletion.synthetic(size=5, true_rank=2, rank=2, n_obs=12, seed=1)
    w = model.random_point(seed=2)
    v = np.random.default_rng(0).standard_normal(model.dim)
    for e in (300, -300):
        c = 2.0 ** e
        assert model.loss(c * w) == model.loss(w)
        assert np.array_equal(model.grad(c * w), model.grad(w) / c)
        assert np.array_equal(model.hessian(c * w), model.hessian(w) / c ** 2)
        assert np.array_equal(model.hvp(c * w, v), model.hvp(w, v) / c ** 2)
        assert np.array_equal(model.hvp(w, c * v), model.hvp(w, v) * c)
        assert np.array_equal(model.third(c * w, v), model.third(w, v) / c ** 3)
        assert np.array_equal(model.third(w, c * v), model.third(w, v) * c ** 2)


def test_single_vectors_broadcast_against_batches():
    model = ps.BNLinearRegression.synthetic(d=6, n=9, seed=2)
    W, V = model.random_point(3, seed=1), np.random.default_rng(1).standard_normal((3, 6))
    rows = np.stack([model.hvp(W[i], V[i]) for i in range(3)])
    assert np.allclose(model.hvp(W, V), rows, rtol=1e-13)
    assert np.allclose(model.hvp(W[0], V), np.stack([model.hvp(W[0], v) for v in V]), rtol=1e-13)
    assert np.allclose(model.hvp(W, V[0]), np.stack([model.hvp(w, V[0]) for w in W]), rtol=1e-13)
    assert model.hvp(W[0], V[0]).shape == (6,) and model.loss(W).shape == (3,)
    with pytest.raises(ValueError, match="3 rows but v has 2"):
        model.hvp(W, V[:2])
    P = model.random_point(4, seed=7, norm=2.5, dtype=np.float32)
    assert P.dtype == np.float32 and np.allclose(np.linalg.norm(P, axis=1), 2.5, rtol=1e-6)
    assert np.array_equal(model.random_point(seed=7), model.random_point(1, seed=7)[0])


def test_matrix_completion_sv_gap_only_when_the_truth_has_lower_rank():
    from pysharp.sweeps._compute import Settings, layout

    s = Settings(steps=10, record_every=1, sharpness_every=5, jitter=0.0, eos_tol=0.05,
                 backend="cpp")
    equal = ps.BNMatrixCompletion.synthetic(size=6, true_rank=2, rank=2, n_obs=18, seed=0)
    lower = ps.BNMatrixCompletion.synthetic(size=6, true_rank=2, rank=3, n_obs=18, seed=0)
    assert "sv_gap" not in layout(equal, s) and "sv_gap" in layout(lower, s)
    assert "test_loss" in layout(equal, s)



def test_row_scaling_by_powers_of_two_at_the_ends_of_the_exponent_range():
    """_scale_rows multiplies by 2^k exactly, whether 2^k is a normal double or not."""
    from pysharp.models._base import _scale_rows
    for k in (-1075, -1022, -1021, 1023, 1024):
        x = np.array([[0.75, -0.5], [2.0 ** -600, 3.0]])
        kk = np.array([k, -k // 2])
        want = np.ldexp(x, kk[:, None])
        np.testing.assert_array_equal(_scale_rows(x.copy(), kk), want, err_msg=f"k = {k}")


@pytest.mark.parametrize("frac, defined", [(0.75, False), (1.5, True)])
def test_bn_linreg_undefined_threshold_uses_all_of_w(frac, defined):
    """Xc w counts as zero where ||Xc w||^2 <= (d eps)^2 ||Xc||_F^2 ||w||^2, the rounding
    bound of the product. w = v + t p: v in Xc's null space with a large last coordinate
    (about half of ||v||^2), t p in its row space with ||Xc t p||^2 = frac times the bound:
    at 0.75 the point is undefined, a bound that missed w's last coordinate (half as large)
    would call it defined; at 1.5 it is defined."""
    m = BNLinearRegression.synthetic(d=40, n=20, seed=0)
    Xc = m._Xc
    _, s, Vt = np.linalg.svd(Xc)
    null = Vt[int(np.sum(s > s[0] * 1e-12)):].T
    v = null @ null[-1]  # the projection of the last basis vector on the null space
    v /= np.linalg.norm(v)
    assert v[-1] ** 2 > 0.3
    bound = (40 * np.finfo(float).eps) ** 2 * np.sum(Xc * Xc)
    w = v + np.sqrt(frac * bound) / s[0] * Vt[0]
    assert abs(np.sum((Xc @ w) ** 2) / (bound * (w @ w)) - frac) < 0.1 * frac
    if defined:
        assert np.isfinite(m.loss_and_grad(w[None])[0]).all()
    else:
        with pytest.raises(ValueError, match="undefined"):
            m.loss_and_grad(w[None])


# ======================================================================================
# Data at any scale (issue 43, item 4)
# ======================================================================================
# BN normalises X away, and the BN models' losses scale as the square of their targets'
# scale: a model given X * 10^p (and y * 10^q) must equal the NumPy oracle on well-scaled
# data (X / 2^k, y / 2^l, an exact division) times 2^(2l), or refuse the data with a
# ValueError naming it where the loss's scale leaves [2^-400, 2^400] (beyond, Lanczos's
# squared norms leave float64's range: models/_base.py, _SAFE_DATA_EXP). Never a false
# reason ("Xc @ w is zero"), never NaN or inf; the kernels and the sharpness (Lanczos).
DATA_SCALES = settings(max_examples=60, deadline=None, derandomize=True,
                       suppress_health_check=[HealthCheck.too_slow])
_LOG2_10 = float(np.log2(10.0))


def _well_scaled(a, p):
    """(a / 2^k, k), k the power of two nearest 10^p: exact, and of a's original size."""
    k = int(round(p * _LOG2_10))
    return np.ldexp(a, -k), k


def _scaled(x, p):
    with np.errstate(under="ignore", over="ignore"):
        return x * 10.0 ** p


def _like_oracle(model, ref, k2, B=3, seed=0, rtol=1e-10):
    """model's loss, grad, hvp, third and spherical sharpness (by Lanczos) at random unit
    points equal ref's (the sharpness: the top eigenvalue of ref's dense Hessian) times
    2^k2."""
    rng = np.random.default_rng(seed)
    W = unit_rows(rng.standard_normal((B, model.dim)))
    V = rng.standard_normal((B, model.dim))
    eye = np.eye(model.dim)
    top = [np.linalg.eigvalsh(ref.hvp(np.repeat(w[None], model.dim, 0), eye))[-1] for w in W]
    want = {"loss": ref.loss(W), "grad": ref.grad(W), "hvp": ref.hvp(W, V),
            "third": ref.third(W, V), "sharpness": np.array(top)}
    L, G = model.loss_and_grad(W)
    got = {"loss": L, "grad": G, "hvp": model.hvp(W, V), "third": model.third(W, V),
           "sharpness": ps.spherical_sharpness(model, W, method="lanczos").eigenvalues[:, 0]}
    for name in want:
        assert np.all(np.isfinite(got[name])), name
        assert rel_err(got[name], np.ldexp(want[name], k2)) < rtol, name


def _refused(exc, name):
    msg = str(exc)
    assert re.search(rf"\b{name}\b", msg) and "zero" not in msg and "equal" not in msg, msg


def _scale_exponent(t):
    """log2 of 2 var(t), for a t that 2 var(t) might over- or underflow."""
    e = int(np.frexp(np.max(np.abs(t)))[1])
    return float(np.log2(2 * np.ldexp(t, -e).var())) + 2 * e


@DATA_SCALES
@given(px=st.integers(-300, 300), py=st.integers(-300, 300))
@example(px=300, py=0).via("issue 43: 'Xc @ w is zero'")
@example(px=-300, py=0).via("issue 43")
@example(px=-310, py=0).via("issue 43: subnormal X")
@example(px=-318, py=0).via("subnormal X, few digits left")
@example(px=200, py=0).via("issue 43: loss inf, gradient NaN")
@example(px=0, py=-310).via("issue 43: NaN loss")
@example(px=0, py=-160).via("2 var(y) subnormal")
@example(px=0, py=60).via("2 var(y) near 2^400")
@example(px=0, py=-60)
@example(px=0, py=75).via("Lanczos: a false 'Xc @ w is zero'")
@example(px=0, py=-80).via("Lanczos: a false sharpness, flagged converged")
@example(px=0, py=200).via("2 var(y) overflows")
@example(px=-300, py=55)
def test_bn_linreg_data_at_any_scale(px, py):
    base = get_case("bn_linreg_small").model
    Xp, yp = _scaled(base.X, px), _scaled(base.y, py)
    Xs, _ = _well_scaled(Xp, px)
    ys, ky = _well_scaled(yp, py)
    log2_scale = _scale_exponent(yp)
    try:
        model = BNLinearRegression(Xp, yp)
    except ValueError as exc:
        assert not -399 < log2_scale < 399, f"refused 2 var(y) = 2^{log2_scale:.0f}: {exc}"
        _refused(exc, "y")
        return
    assert -401 < log2_scale < 401, f"accepted 2 var(y) = 2^{log2_scale:.0f}"
    _like_oracle(model, BNLinearRegressionReference(Xs, ys), 2 * ky)
    # The affine predictor: wt = std(y) w / sigma(w) scales as 2^(ky - kx), bt as 2^ky.
    kx = int(round(px * _LOG2_10))
    w = unit_rows(np.random.default_rng(1).standard_normal((2, model.dim)))
    Xc = Xs - Xs.mean(axis=0)
    wt = ys.std() * w / (np.linalg.norm(w @ Xc.T, axis=1, keepdims=True) / np.sqrt(base.n))
    bt = ys.mean() - wt @ Xs.mean(axis=0)
    with np.errstate(over="ignore", under="ignore"):
        wt_want, bt_want = np.ldexp(wt, ky - kx), np.ldexp(bt, ky)
    got_wt, got_bt = model.effective_predictor(w)
    if np.all(np.abs(wt_want) < 1e300) and np.max(np.abs(wt_want)) > 1e-290:
        assert rel_err(got_wt, wt_want) < 1e-10
    if np.max(np.abs(bt_want)) > 1e-290:
        assert rel_err(got_bt, bt_want) < 1e-10
    _, A, _ = model.per_sample_jacobians(w)  # grad_w p_i scales as 2^ky
    _, A_ref, _ = BNLinearRegression(Xs, ys).per_sample_jacobians(w)
    if np.max(np.abs(A_ref)) * 2.0 ** min(ky, 900) > 1e-290:
        assert rel_err(A, np.ldexp(A_ref, ky)) < 1e-10


@pytest.mark.parametrize("px", [300, -300, -310, 200])
def test_bn_linreg_float32_kernels_on_badly_scaled_x(px):
    """float32 kernels see the rescaled X: X * 1e300 casts to float32 without overflow."""
    base = get_case("bn_linreg_small").model
    model = BNLinearRegression(_scaled(base.X, px), base.y)
    w = unit_rows(np.random.default_rng(2).standard_normal((3, model.dim)))
    assert rel_err(model.loss(w.astype(np.float32)), base.loss(w)) < 1e-4
    assert rel_err(model.grad(w.astype(np.float32)), base.grad(w)) < 1e-4


def test_bn_linreg_targets_beyond_float32_are_refused_in_float32():
    base = get_case("bn_linreg_small").model
    model = BNLinearRegression(base.X, base.y * 1e10)  # 2 var(y) ~ 2^67: float64 only
    w = unit_rows(np.random.default_rng(3).standard_normal((2, model.dim)))
    assert rel_err(model.loss(w), base.loss(w) * 1e20) < 1e-12
    with pytest.raises(ValueError, match=r"y.*float32"):
        model.loss(w.astype(np.float32))


@pytest.mark.parametrize("reduced", [True, False])
@pytest.mark.parametrize("jx, ky", [(1000, 0), (-1000, 0), (0, 190), (0, -190), (-1000, 190)])
def test_bn_linreg_engine_at_extreme_data_scales(jx, ky, reduced):
    """GD+WD on (X 2^jx, y 2^ky) with lr 2^-2ky and wd 2^2ky is GD+WD on (X, y) to the bit:
    the loss and its gradient are 2^2ky times as large, lr wd is the same. The records (loss,
    the engine's Lanczos sharpness) are 2^2ky times the others."""
    base = get_case("bn_linreg_small").model
    model = BNLinearRegression(np.ldexp(base.X, jx), np.ldexp(base.y, ky))
    w0 = base.random_point(3, seed=4)
    kw = dict(steps=40, record_every=5, sharpness_every=10, reduced=reduced)
    a = ps.run_gd_wd(base, w0, lr=0.1, wd=0.01, **kw)
    b = ps.run_gd_wd(model, w0, lr=np.ldexp(0.1, -2 * ky), wd=np.ldexp(0.01, 2 * ky), **kw)
    assert not b.diverged.any() and np.array_equal(a.w, b.w)
    assert np.array_equal(np.ldexp(a.loss, 2 * ky), b.loss)
    assert rel_err(b.sharpness, np.ldexp(a.sharpness, 2 * ky)) < 1e-12


@DATA_SCALES
@given(pv=st.integers(-300, 300))
@example(pv=300).via("overflowed to a bare OverflowError")
@example(pv=-160).via("2 var(values) subnormal: silently inaccurate")
@example(pv=-300).via("NaN loss")
@example(pv=-310)
@example(pv=59)
@example(pv=80)
def test_bn_mc_values_at_any_scale(pv):
    base = get_case("bn_mc").model
    vp = _scaled(base.values, pv)
    test = (base.test[0], base.test[1], _scaled(base.test[2], pv))
    vs, kv = _well_scaled(vp, pv)
    log2_scale = _scale_exponent(vp)
    try:
        model = BNMatrixCompletion(base.rows, base.cols, vp, base.shape, base.rank, test=test)
    except ValueError as exc:
        assert not -399 < log2_scale < 399, f"refused 2 var = 2^{log2_scale:.0f}: {exc}"
        _refused(exc, "values")
        return
    assert -401 < log2_scale < 401, f"accepted 2 var(values) = 2^{log2_scale:.0f}"
    ref = BNMatrixCompletionReference(base.rows, base.cols, vs, base.shape, base.rank)
    _like_oracle(model, ref, 2 * kv)
    w = unit_rows(np.random.default_rng(4).standard_normal((2, model.dim)))
    want = ref.test_loss(w, test[0], test[1], np.ldexp(test[2], -kv))
    assert rel_err(model.test_loss(w), np.ldexp(want, 2 * kv)) < 1e-10


@DATA_SCALES
@given(px=st.integers(-300, 300), py=st.integers(-300, 300),
       activation=st.sampled_from(["tanh", "relu"]))
@example(px=300, py=0, activation="tanh").via("false 'X @ W_j is constant'")
@example(px=-300, py=0, activation="relu")
@example(px=-310, py=0, activation="tanh").via("subnormal X")
@example(px=200, py=0, activation="tanh")
@example(px=0, py=160, activation="tanh").via("loss inf: (f - y)^2 overflows")
@example(px=0, py=59, activation="relu")
@example(px=0, py=-310, activation="relu")
def test_bn_two_layer_net_data_at_any_scale(px, py, activation):
    """BN makes the net invariant to the scale of X; y is not normalised, so the loss
    follows y's own scale: the oracle takes X / 2^k and y as it is."""
    base = get_case("bn_two_layer_net").model
    Xp, yp = _scaled(base.X, px), _scaled(base.y, py)
    Xs, _ = _well_scaled(Xp, px)
    try:
        model = ps.BNTwoLayerNet(Xp, yp, base.width, activation)
    except ValueError as exc:
        assert np.max(np.abs(yp)) > 2.0 ** 199.5, f"refused y of max {np.max(np.abs(yp))}: {exc}"
        _refused(exc, "y")
        return
    assert np.max(np.abs(yp)) < 2.0 ** 200.5, "accepted a y whose squared residuals are huge"
    ref = BNTwoLayerNetReference(Xs, yp, base.width, activation)
    _like_oracle(model, ref, 0, rtol=1e-9)
    w = unit_rows(np.random.default_rng(5).standard_normal((2, model.dim)))
    assert rel_err(model.predict(w), ref.predictions(w)) < 1e-12


@DATA_SCALES
@given(pc=st.integers(-300, 308))
@example(pc=308).via("gradient -inf, HVP NaN")
@example(pc=120)
@example(pc=-310).via("subnormal c")
def test_toy3d_c_at_any_scale(pc):
    """Toy3D's one datum is c: the loss grows like c, so past a bound c is refused by name."""
    c = _scaled(1.0, pc)
    try:
        model = Toy3D(c)
    except ValueError as exc:
        assert c > 2.0 ** 399.5, f"refused c = {c}: {exc}"
        _refused(exc, "c")
        return
    assert c < 2.0 ** 400.5
    _like_oracle(model, Toy3DReference(c), 0)

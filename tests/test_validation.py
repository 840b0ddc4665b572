"""Bad input gets a clear ValueError/TypeError naming the argument
(docs/conventions.rst, "Errors").

Also: accepted-but-unusual input (non-contiguous views, integers) gives the same
result as the plain float array, and no call crashes the interpreter or
silently returns NaN. The helpers of pysharp._engine.validation are checked at their
boundaries: the last value accepted and the first refused.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _cases import SCALE_INVARIANT, SMALL

import pysharp as ps
from pysharp._engine.validation import (
    as_batch,
    as_float_array,
    as_positive_int,
    as_real,
    check_nonzero_rows,
)
from pysharp.models import BNLinearRegression, BNMatrixCompletion, Toy3D

W_KERNELS = ["loss", "grad", "loss_and_grad", "hessian", "hvp", "third"]


def call(model, kernel, w, v=None):
    f = getattr(model, kernel)
    if kernel in ("hvp", "third"):
        return f(w, w if v is None else v)
    return f(w)


def as_v_call(model, kernel, w, v):
    return getattr(model, kernel)(w, v)


# ======================================================================================
# w: shapes, dtypes, non-finite values, zero
# ======================================================================================
@pytest.mark.parametrize("kernel", W_KERNELS)
@pytest.mark.parametrize("shape", ["D+1", "B,D,1", "0,D", "scalar", "B,D-1", "D,D+1"])
def test_w_wrong_shape(case, kernel, shape):
    D = case.dim
    shapes = {"D+1": (D + 1,), "B,D,1": (2, D, 1), "0,D": (0, D), "scalar": (),
              "B,D-1": (2, D - 1), "D,D+1": (D, D + 1)}
    w = np.ones(shapes[shape])
    with pytest.raises(ValueError, match=rf"w must have shape \({D},\) or \(B, {D}\)"):
        call(case.model, kernel, w, np.ones(D))


@pytest.mark.parametrize("kernel", W_KERNELS)
@pytest.mark.parametrize("bad", ["complex", "bool", "object", "string", "none"])
def test_w_bad_dtype(case, kernel, bad):
    D = case.dim
    w = {"complex": np.ones(D, complex), "bool": np.ones(D, bool),
         "object": np.array([1.0] * D, dtype=object), "string": np.array(["1"] * D),
         "none": None}[bad]
    with pytest.raises(TypeError, match="w must be a real floating or integer array"):
        call(case.model, kernel, w, np.ones(D))


@pytest.mark.parametrize("kernel", W_KERNELS)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_w_non_finite(case, kernel, value, dtype):
    w = case.points(3, seed=1, dtype=dtype)
    w[1, 0] = value
    with pytest.raises(ValueError, match=r"w has a non-finite entry at index \(1, 0\)"):
        call(case.model, kernel, w)
    with pytest.raises(ValueError, match=r"w has a non-finite entry at index \(0,\)"):
        call(case.model, kernel, w[1].copy())


@pytest.mark.parametrize("kernel", W_KERNELS)
def test_w_zero(case, kernel):
    D = case.dim
    with pytest.raises(ValueError, match=r"w\[0\] is the zero vector"):
        call(case.model, kernel, np.zeros(D), np.ones(D))
    W = case.points(4, seed=2)
    W[2] = 0.0
    with pytest.raises(ValueError, match=r"w\[2\] is the zero vector"):
        call(case.model, kernel, W, np.ones(D))
    W = np.zeros((3, D), dtype=np.float32)
    W[0, 0] = -0.0
    with pytest.raises(ValueError, match=r"w\[0\] is the zero vector"):
        call(case.model, kernel, W, np.ones(D, np.float32))


def test_w_zero_in_effective_predictor_and_test_loss(linreg_small, mc_case):
    with pytest.raises(ValueError, match=r"w\[0\] is the zero vector"):
        linreg_small.model.effective_predictor(np.zeros(linreg_small.dim))
    with pytest.raises(ValueError, match=r"w\[0\] is the zero vector"):
        mc_case.model.test_loss(np.zeros(mc_case.dim))


# ======================================================================================
# v and batch sizes
# ======================================================================================
@pytest.mark.parametrize("kernel", ["hvp", "third"])
def test_v_checked(case, kernel):
    D = case.dim
    w = case.points(3, seed=3)
    m = case.model
    with pytest.raises(ValueError, match=rf"v must have shape \({D},\) or \(B, {D}\)"):
        as_v_call(m, kernel, w, np.ones(D + 1))
    with pytest.raises(ValueError, match=r"v must have shape"):
        as_v_call(m, kernel, w, np.ones((3, D, 1)))
    with pytest.raises(ValueError, match=r"v must have shape"):
        as_v_call(m, kernel, w, np.ones((0, D)))
    with pytest.raises(TypeError, match="v must be a real floating or integer array"):
        as_v_call(m, kernel, w, np.ones(D, complex))
    with pytest.raises(TypeError, match="v must be a real floating or integer array"):
        as_v_call(m, kernel, w, np.ones(D, bool))
    v = np.ones((3, D))
    v[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"v has a non-finite entry at index \(2, 1\)"):
        as_v_call(m, kernel, w, v)
    # v = 0 is fine: H 0 = 0 and D^3L[0, 0] = 0
    out = as_v_call(m, kernel, w, np.zeros(D))
    assert out.shape == (3, D) and np.all(out == 0)


@pytest.mark.parametrize("kernel", ["hvp", "third"])
def test_mismatched_batch_sizes(case, kernel):
    D = case.dim
    with pytest.raises(ValueError, match="w has 3 rows but v has 2"):
        as_v_call(case.model, kernel, case.points(3, seed=4), case.points(2, seed=5))
    with pytest.raises(ValueError, match="w has 2 rows but v has 3"):
        as_v_call(case.model, kernel, case.points(2, seed=4), case.points(3, seed=5))
    # a (1, D) batch broadcasts like a single vector
    out = as_v_call(case.model, kernel, case.points(1, seed=4), case.points(3, seed=5))
    assert out.shape == (3, D)


# ======================================================================================
# Accepted input: views, integers, other float widths
# ======================================================================================
def _views(case, dtype):
    """(label, non-contiguous view) pairs of shape (B, D) or (D,)."""
    D = case.dim
    base = case.points(8, seed=6, dtype=dtype)
    T = np.ascontiguousarray(base.T).T  # Fortran-ordered (8, D)
    big = case.points(16, seed=7, dtype=dtype)
    wide = np.concatenate([base, base], axis=1)  # row stride 2D
    return [
        ("transposed", T),
        ("row-strided", big[::2]),
        ("reversed", big[::-1]),
        ("column-strided", np.repeat(base, 2, axis=1)[:, ::2]),
        ("sliced", wide[:, :D]),
        ("1d-step", np.repeat(big[5], 3)[::3]),
    ]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_non_contiguous_input_accepted(case, dtype):
    m = case.model
    for label, w in _views(case, dtype):
        c = np.ascontiguousarray(w)
        assert np.array_equal(w, c)
        assert not w.flags.c_contiguous, label
        v = c[::-1].copy()
        v_view = v[::-1][::-1]
        for kernel in ("loss", "grad", "hessian"):
            np.testing.assert_array_equal(getattr(m, kernel)(w), getattr(m, kernel)(c),
                                          err_msg=f"{label} {kernel}")
        for kernel in ("hvp", "third"):
            np.testing.assert_array_equal(getattr(m, kernel)(w, w), getattr(m, kernel)(c, c),
                                          err_msg=f"{label} {kernel}")
            np.testing.assert_array_equal(getattr(m, kernel)(c, v_view),
                                          getattr(m, kernel)(c, v), err_msg=label)


def test_non_contiguous_v(case):
    m = case.model
    w = case.points(4, seed=8)
    V = case.points(8, seed=9)
    np.testing.assert_array_equal(m.hvp(w, V[::2]), m.hvp(w, np.ascontiguousarray(V[::2])))
    VF = np.asfortranarray(V[:4])
    np.testing.assert_array_equal(m.third(w, VF), m.third(w, np.ascontiguousarray(VF)))


@pytest.mark.parametrize("int_dtype", [np.int64, np.int32, np.int8, np.uint16])
def test_integer_w_becomes_float64(case, int_dtype):
    m = case.model
    W = (np.arange(2 * case.dim).reshape(2, case.dim) % 7 - 3).astype(int_dtype)
    if int_dtype == np.uint16:
        W = (np.arange(2 * case.dim).reshape(2, case.dim) % 7 + 1).astype(int_dtype)
    Wf = W.astype(np.float64)
    for kernel in ("loss", "grad", "hessian"):
        out = getattr(m, kernel)(W)
        assert out.dtype == np.float64, kernel
        np.testing.assert_array_equal(out, getattr(m, kernel)(Wf))
    for kernel in ("hvp", "third"):
        out = getattr(m, kernel)(W, W[::-1])
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, getattr(m, kernel)(Wf, Wf[::-1]))
    # python lists of ints too
    np.testing.assert_array_equal(m.loss(W[0].tolist()), m.loss(Wf[0]))


def test_v_follows_w_dtype(case):
    m = case.model
    w32 = case.points(2, seed=10, dtype=np.float32)
    v_int = np.ones((2, case.dim), dtype=np.int64)
    out = m.hvp(w32, v_int)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, m.hvp(w32, v_int.astype(np.float32)))
    out = m.hvp(w32, v_int.astype(np.float64))  # v is computed in w's precision
    assert out.dtype == np.float32


def test_other_float_widths_become_float64(toy_case):
    m = toy_case.model
    w = np.array([0.5, -1.0, 2.0])
    for dt in (np.float16, np.longdouble):
        out = m.grad(w.astype(dt))
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, m.grad(w.astype(dt).astype(np.float64)))


# ======================================================================================
# BN linear regression: construction and Xc w = 0
# ======================================================================================
def _data(n=6, d=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)), rng.standard_normal(n)


def test_linreg_xc_w_zero_duplicated_columns():
    """X with two equal columns: w = e0 - e1 is nonzero with Xc w = 0 exactly."""
    X, y = _data()
    X[:, 1] = X[:, 0]
    m = BNLinearRegression(X, y)
    w = np.array([1.0, -1.0, 0.0, 0.0])
    for kernel in W_KERNELS:
        with pytest.raises(ValueError, match=r"w\[0\]: Xc @ w is zero.*BatchNorm"):
            call(m, kernel, w, np.ones(4))
    W = np.array([[0.3, 0.1, 0.2, -1.0], [0.3, 0.1, 0.2, 1.0], [2.0, -2.0, 0.0, 0.0]])
    for kernel in W_KERNELS:
        with pytest.raises(ValueError, match=r"w\[2\]: Xc @ w is zero"):
            call(m, kernel, W, np.ones(4))
    with pytest.raises(ValueError, match=r"w\[0\]: Xc @ w is zero"):
        m.effective_predictor(w)
    for kernel in ("loss", "grad", "hessian"):
        assert np.all(np.isfinite(getattr(m, kernel)(W[:2])))


def test_linreg_xc_w_zero_null_space_exact():
    """d > n - 1 gives a null space: n = 2, d = 3 with X1 - X0 = (2, 2, 0) and w = (1, -1, 5)."""
    X = np.array([[1.0, 0.0, 3.0], [3.0, 2.0, 3.0]])
    m = BNLinearRegression(X, np.array([0.0, 1.0]))
    w = np.array([1.0, -1.0, 5.0])
    assert not np.any((X - X.mean(0)) @ w)
    for kernel in W_KERNELS:
        with pytest.raises(ValueError, match=r"Xc @ w is zero"):
            call(m, kernel, w, np.ones(3))


def test_linreg_xc_w_zero_numerical_null_space(linreg_small):
    m = linreg_small.model
    Xc = m.X - m.X.mean(axis=0)
    _, _, Vt = np.linalg.svd(Xc)
    w = Vt[-1]  # d = 12 > n - 1 = 7: a unit vector with Xc w = 0 up to rounding
    assert np.linalg.norm(Xc @ w) < 1e-13 * np.linalg.norm(Xc)
    with pytest.raises(ValueError, match=r"Xc @ w is zero"):
        m.loss_and_grad(w)


def test_linreg_too_few_samples():
    with pytest.raises(ValueError, match=r"n >= 2.*n = 1"):
        BNLinearRegression(np.ones((1, 3)), np.ones(1))
    with pytest.raises(ValueError, match="n >= 2"):
        BNLinearRegression(np.ones((0, 3)), np.ones(0))
    with pytest.raises(ValueError, match="n must be >= 2"):
        BNLinearRegression.synthetic(d=3, n=1)


def test_linreg_constant_targets():
    X, _ = _data()
    with pytest.raises(ValueError, match="y is constant"):
        BNLinearRegression(X, np.full(6, 2.5))


def test_linreg_equal_rows():
    _, y = _data()
    with pytest.raises(ValueError, match="all rows of X are equal"):
        BNLinearRegression(np.tile([1.0, -2.0, 3.0], (6, 1)), y)


@pytest.mark.parametrize("shape", [(6,), (6, 2, 2), ()])
def test_linreg_x_not_2d(shape):
    _, y = _data()
    with pytest.raises(ValueError, match=r"X must be 2-D"):
        BNLinearRegression(np.ones(shape), y)


def test_linreg_x_without_columns():
    with pytest.raises(ValueError, match="X must have at least one column"):
        BNLinearRegression(np.ones((6, 0)), np.arange(6.0))


@pytest.mark.parametrize("y_shape", [(5,), (7,), (6, 1), ()])
def test_linreg_y_wrong_shape(y_shape):
    X, _ = _data()
    with pytest.raises(ValueError, match=r"y must have shape \(6,\)"):
        BNLinearRegression(X, np.arange(np.prod(y_shape, dtype=int), dtype=float).reshape(y_shape))


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_linreg_non_finite_data(value):
    X, y = _data()
    Xb = X.copy()
    Xb[2, 1] = value
    with pytest.raises(ValueError, match=r"X has a non-finite entry at index \(2, 1\)"):
        BNLinearRegression(Xb, y)
    yb = y.copy()
    yb[4] = value
    with pytest.raises(ValueError, match=r"y has a non-finite entry at index \(4,\)"):
        BNLinearRegression(X, yb)


def test_linreg_bad_data_dtype():
    X, y = _data()
    with pytest.raises(TypeError, match="X must be a real"):
        BNLinearRegression(X.astype(complex), y)
    with pytest.raises(TypeError, match="y must be a real"):
        BNLinearRegression(X, y > 0)
    with pytest.raises(TypeError, match="X must be a real"):
        BNLinearRegression([["a", "b"], ["c", "d"]], [1.0, 2.0])


def test_linreg_synthetic_arguments():
    with pytest.raises(TypeError, match="d must be an integer"):
        BNLinearRegression.synthetic(d=4.0, n=3)
    with pytest.raises(ValueError, match="d must be >= 1"):
        BNLinearRegression.synthetic(d=0, n=3)


# ======================================================================================
# BN matrix completion: construction
# ======================================================================================
def _mc_data():
    rows = np.array([0, 0, 1, 2, 3, 1])
    cols = np.array([0, 2, 1, 3, 0, 3])
    values = np.array([1.0, -0.5, 2.0, 0.3, -1.2, 0.8])
    return rows, cols, values


def test_mc_valid_small_instance():
    m = BNMatrixCompletion(*_mc_data(), (4, 4), 2)
    assert m.dim == 16 and m.n_obs == 6


@pytest.mark.parametrize("which", ["rows", "cols"])
@pytest.mark.parametrize("bad", [4, 100, -1, -5])
def test_mc_index_out_of_range(which, bad):
    rows, cols, values = _mc_data()
    arr = rows if which == "rows" else cols
    arr[3] = bad
    with pytest.raises(ValueError, match=rf"{which}\[3\] = {bad} is out of range \[0, 4\)"):
        BNMatrixCompletion(rows, cols, values, (4, 4), 2)


def test_mc_index_out_of_range_rectangular():
    rows, cols, values = _mc_data()
    with pytest.raises(ValueError, match=r"rows\[3\] = 2 is out of range \[0, 2\)"):
        BNMatrixCompletion(rows, cols, values, (2, 5), 2)
    with pytest.raises(ValueError, match=r"cols\[3\] = 3 is out of range \[0, 3\)"):
        BNMatrixCompletion(rows, cols, values, (5, 3), 2)


def test_mc_huge_index_not_truncated():
    """An index beyond int32 must be rejected, not wrapped around into range."""
    rows, cols, values = _mc_data()
    rows = rows.astype(np.int64)
    rows[0] = 2**32  # wraps to 0 if cast to int32 before the range check
    with pytest.raises(ValueError, match=r"rows\[0\] = 4294967296 is out of range"):
        BNMatrixCompletion(rows, cols, values, (4, 4), 2)


def test_mc_duplicate_entries():
    rows, cols, values = _mc_data()
    rows[5], cols[5] = rows[1], cols[1]
    with pytest.raises(ValueError, match=r"entry \(0, 2\) appears more than once"):
        BNMatrixCompletion(rows, cols, values, (4, 4), 2)


def test_mc_float_indices():
    rows, cols, values = _mc_data()
    with pytest.raises(TypeError, match="rows must hold integer indices"):
        BNMatrixCompletion(rows + 0.5, cols, values, (4, 4), 2)
    with pytest.raises(TypeError, match="cols must hold integer indices"):
        BNMatrixCompletion(rows, cols.astype(float) + 0.25, values, (4, 4), 2)
    with pytest.raises(TypeError, match="rows must hold integer indices"):
        BNMatrixCompletion(rows > 0, cols, values, (4, 4), 2)
    bad = rows.astype(float)
    bad[0] = np.nan
    with pytest.raises(TypeError, match="rows must hold integer indices"):
        BNMatrixCompletion(bad, cols, values, (4, 4), 2)
    # integer-valued floats are accepted as indices
    m = BNMatrixCompletion(rows.astype(float), cols.astype(float), values, (4, 4), 2)
    ref = BNMatrixCompletion(rows, cols, values, (4, 4), 2)
    w = np.linspace(-1, 1, 16) + 0.1
    assert m.loss(w) == ref.loss(w)


def test_mc_indices_not_1d():
    rows, cols, values = _mc_data()
    with pytest.raises(ValueError, match="rows must be 1-D"):
        BNMatrixCompletion(rows.reshape(2, 3), cols, values, (4, 4), 2)
    with pytest.raises(ValueError, match="cols must be 1-D"):
        BNMatrixCompletion(rows, cols.reshape(3, 2), values, (4, 4), 2)


def test_mc_length_mismatch():
    rows, cols, values = _mc_data()
    with pytest.raises(ValueError, match="rows, cols and values must have equal lengths"):
        BNMatrixCompletion(rows, cols, values[:-1], (4, 4), 2)
    with pytest.raises(ValueError, match="rows, cols and values must have equal lengths"):
        BNMatrixCompletion(rows[:-1], cols, values, (4, 4), 2)
    with pytest.raises(ValueError, match="rows, cols and values must have equal lengths"):
        BNMatrixCompletion(rows, cols[:-2], values, (4, 4), 2)


def test_mc_constant_values():
    rows, cols, _ = _mc_data()
    with pytest.raises(ValueError, match="values are constant"):
        BNMatrixCompletion(rows, cols, np.full(6, 3.0), (4, 4), 2)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_mc_non_finite_values(value):
    rows, cols, values = _mc_data()
    values[2] = value
    with pytest.raises(ValueError, match=r"values has a non-finite entry at index \(2,\)"):
        BNMatrixCompletion(rows, cols, values, (4, 4), 2)


@pytest.mark.parametrize("rank,exc,msg", [
    (0, ValueError, "rank must be >= 1"),
    (-2, ValueError, "rank must be >= 1"),
    (2.0, TypeError, "rank must be an integer"),
    (2.5, TypeError, "rank must be an integer"),
    (True, TypeError, "rank must be an integer"),
    ("2", TypeError, "rank must be an integer"),
    (None, TypeError, "rank must be an integer"),
])
def test_mc_bad_rank(rank, exc, msg):
    with pytest.raises(exc, match=msg):
        BNMatrixCompletion(*_mc_data(), (4, 4), rank)


def test_mc_numpy_integer_rank_accepted():
    m = BNMatrixCompletion(*_mc_data(), (np.int64(4), np.int32(4)), np.int64(2))
    assert m.rank == 2 and m.shape == (4, 4) and m.dim == 16


def test_mc_too_few_observations():
    with pytest.raises(ValueError, match="N >= 2.*got 1"):
        BNMatrixCompletion([0], [1], [1.0], (4, 4), 2)
    with pytest.raises(ValueError, match="N >= 2.*got 0"):
        BNMatrixCompletion([], [], [], (4, 4), 2)


@pytest.mark.parametrize("shape,exc", [
    ((4, 0), ValueError), ((0, 4), ValueError), ((-1, 4), ValueError),
    ((4.0, 4), TypeError), (4, TypeError), (None, TypeError),
])
def test_mc_bad_shape(shape, exc):
    with pytest.raises(exc, match="shape"):
        BNMatrixCompletion(*_mc_data(), shape, 2)


@pytest.mark.parametrize("shape", [(4,), (4, 4, 4), ()])
def test_mc_shape_wrong_length(shape):
    with pytest.raises((ValueError, TypeError), match="shape"):
        BNMatrixCompletion(*_mc_data(), shape, 2)


def test_mc_bad_test_set():
    rows, cols, values = _mc_data()
    with pytest.raises(ValueError, match=r"test must be a \(rows, cols, values\) triple"):
        BNMatrixCompletion(rows, cols, values, (4, 4), 2, test=([1], [1]))
    with pytest.raises(ValueError, match=r"test rows\[0\] = 9 is out of range"):
        BNMatrixCompletion(rows, cols, values, (4, 4), 2, test=([9], [1], [0.5]))
    with pytest.raises(ValueError, match=r"test cols\[1\] = -1 is out of range"):
        BNMatrixCompletion(rows, cols, values, (4, 4), 2, test=([1, 2], [1, -1], [0.5, 1.0]))
    with pytest.raises(ValueError, match="appears more than once in test"):
        BNMatrixCompletion(rows, cols, values, (4, 4), 2, test=([2, 2], [2, 2], [0.5, 1.0]))
    with pytest.raises(ValueError, match="test must hold at least one entry"):
        BNMatrixCompletion(rows, cols, values, (4, 4), 2, test=([], [], []))
    with pytest.raises(ValueError, match="test values has a non-finite entry"):
        BNMatrixCompletion(rows, cols, values, (4, 4), 2, test=([2], [2], [np.nan]))
    with pytest.raises(ValueError, match="test rows, test cols and test values must have equal"):
        BNMatrixCompletion(rows, cols, values, (4, 4), 2, test=([2, 3], [2], [1.0]))


def test_mc_test_loss_without_held_out_set():
    m = BNMatrixCompletion(*_mc_data(), (4, 4), 2)
    with pytest.raises(ValueError, match="no held-out entries.*test="):
        m.test_loss(np.ones(16))


def _mc_w(model, U, V):
    return np.concatenate([np.asarray(U, float).ravel(), np.asarray(V, float).ravel()])


def test_mc_all_scores_equal_v_zero(mc_case):
    """V = 0 (U arbitrary, nonzero): every observed score is 0, BatchNorm is undefined."""
    m = mc_case.model
    m1, m2 = m.shape
    rng = np.random.default_rng(3)
    w = _mc_w(m, rng.standard_normal((m1, m.rank)), np.zeros((m2, m.rank)))
    for kernel in W_KERNELS + ["test_loss"]:
        with pytest.raises(ValueError, match=r"w\[0\]: all observed scores .* are equal.*"
                                             r"BatchNorm"):
            call(m, kernel, w, np.ones(m.dim))
    W = mc_case.points(3, seed=4)
    W[1] = w
    with pytest.raises(ValueError, match=r"w\[1\]: .*BatchNorm"):
        m.loss(W)
    with pytest.raises(ValueError, match=r"w\[1\]: .*BatchNorm"):
        m.test_loss(W)


def test_mc_all_scores_equal_unobserved_support():
    """U is zero on every observed row except where V vanishes: all scores are 0."""
    rows, cols, values = _mc_data()  # row 0 observed in cols 0 and 2
    m = BNMatrixCompletion(rows, cols, values, (4, 4), 2)
    U = np.zeros((4, 2))
    V = np.zeros((4, 2))
    U[0] = [1.0, 2.0]   # row 0 is observed only in cols 0, 2 ...
    V[1] = [3.0, -1.0]  # ... and col 1 only in row 1, where U = 0
    w = _mc_w(m, U, V)
    assert np.any(w)
    with pytest.raises(ValueError, match="BatchNorm"):
        m.loss_and_grad(w)


def test_mc_all_scores_equal_nonzero(mc_case):
    m = mc_case.model
    m1, m2 = m.shape
    w = _mc_w(m, np.full((m1, m.rank), 0.1), np.full((m2, m.rank), 0.3))
    U, V = m.factors(w)
    s = np.sum(U[m.rows] * V[m.cols], axis=1)
    assert np.all(s == s[0]) and s[0] != 0
    with pytest.raises(ValueError, match="BatchNorm"):
        m.loss_and_grad(w)


def test_mc_synthetic_arguments():
    with pytest.raises(ValueError, match="n_obs must be below size"):
        BNMatrixCompletion.synthetic(size=3, n_obs=9)
    with pytest.raises(ValueError, match="size must be >= 2"):
        BNMatrixCompletion.synthetic(size=1)
    with pytest.raises(ValueError, match="n_obs must be >= 2"):
        BNMatrixCompletion.synthetic(size=4, n_obs=1)
    with pytest.raises(TypeError, match="rank must be an integer"):
        BNMatrixCompletion.synthetic(size=4, rank=1.5)


# ======================================================================================
# Toy3D and model helpers
# ======================================================================================
@pytest.mark.parametrize("c,exc,msg", [
    (-1.0, ValueError, r"c must be >= 0"),
    (-1e-300, ValueError, r"c must be >= 0"),
    (np.nan, ValueError, "c must be finite"),
    (np.inf, ValueError, "c must be finite"),
    (-np.inf, ValueError, "c must be finite"),
    ("10", TypeError, "c must be a real number"),
    (True, TypeError, "c must be a real number"),
    (None, TypeError, "c must be a real number"),
    (1 + 2j, TypeError, "c must be a real number"),
    (1e308, ValueError, r"c = 2\^1023\.2 .* above 2\^400: the float64 loss.* overflow"),
    (2.0 ** 400 * (1 + 1e-9), ValueError, r"c = .* above 2\^400"),
])
def test_toy_bad_c(c, exc, msg):
    with pytest.raises(exc, match=msg):
        Toy3D(c)


def test_toy_c_bounds():
    """c up to 2^400 is taken (its derivatives stay finite); in float32 up to 2^40."""
    w = np.array([1.0, 0.3, 0.5])
    model = Toy3D(2.0 ** 400)
    assert np.all(np.isfinite(model.third(w, w))) and np.all(np.isfinite(model.hessian(w)))
    with pytest.raises(ValueError, match=r"c = 2\^400\.0 .* above 2\^40: the float32 loss"):
        model.loss(w.astype(np.float32))
    assert np.isfinite(Toy3D(2.0 ** 40).loss(w.astype(np.float32)))


def test_random_point_arguments(case):
    with pytest.raises(ValueError, match="batch must be >= 1"):
        case.model.random_point(0)
    with pytest.raises(TypeError, match="batch must be an integer"):
        case.model.random_point(2.0)


# ======================================================================================
# No crash, no silent NaN
# ======================================================================================
def test_loaded_model_refuses_empty_data():
    """A loaded model's loss over no data is NaN (phase retrieval: mean over n = 0) or a
    false "undefined there": data with an axis of length 0 is refused, naming it."""
    header = Path(__file__).resolve().parents[1] / "examples" / "models" / "phase_retrieval.hpp"
    with pytest.raises(ValueError, match=r"X is empty \(shape \(0, 8\)\): axis 0 \(n\)"):
        ps.models.load_model(header, X=np.zeros((0, 8)), y=np.zeros(0), c=1.0)
    with pytest.raises(ValueError, match=r"X is empty \(shape \(4, 0\)\): axis 1 \(d\)"):
        ps.models.load_model(header, X=np.zeros((4, 0)), y=np.zeros(4), c=1.0)


_BATTERY = textwrap.dedent(r'''
    import numpy as np
    from pysharp.models import REGISTRY
    import pysharp._core as core

    # every registered built-in scale-invariant model, small (tests/_cases.py's sizes)
    models = [REGISTRY[name].factory(**kw) for name, kw in MODELS.items()]
    import warnings
    warnings.simplefilter("ignore")
    n_err = n_ok = 0
    nans = []
    def describe(x):
        if isinstance(x, np.ndarray):
            flat = x.ravel()
            return f"array{x.shape}:{x.dtype}[{flat[0] if flat.size else ''}...]"
        return type(x).__name__
    def attempt(f, *a):
        global n_err, n_ok
        try:
            out = f(*a)
        except (ValueError, TypeError):
            n_err += 1
            return
        outs = out if isinstance(out, tuple) else (out,)
        if any(np.any(np.isnan(np.asarray(o, dtype=float))) for o in outs):
            nans.append(f"{getattr(f, '__qualname__', f)}({', '.join(map(describe, a))})")
        n_ok += 1

    for m in models:
        D = m.dim
        good = m.random_point(3, seed=1)
        odd = [np.zeros(D), np.zeros((2, D)), np.full(D, np.nan), np.full(D, np.inf),
               np.ones(D + 1), np.ones((2, D, 1)), np.ones((0, D)), np.ones(0), np.ones(()),
               np.ones(D, complex), np.ones(D, bool), np.array(["x"] * D), None, [],
               [[1.0] * D, [2.0] * (D - 1)], object(), np.ones(D, dtype=object),
               np.full(D, 1e-100), np.full(D, 1e308), np.full(D, -1e308),
               np.full(D, np.finfo(np.float32).max, np.float32),
               np.full(D, np.finfo(np.float32).tiny, np.float32),
               np.eye(D)[0], np.eye(D)[: min(D, 4)], good, good.astype(np.float32),
               np.arange(D), np.arange(2 * D).reshape(2, D)]
        for w in odd:
            for name in ("loss", "grad", "loss_and_grad", "hessian"):
                attempt(getattr(m, name), w)
            for v in (good[0], np.zeros(D), np.full(D, np.nan), np.ones((5, D)), np.ones(D + 2)):
                attempt(m.hvp, w, v)
                attempt(m.third, w, v)
        if hasattr(m, "test_loss"):
            for w in odd:
                attempt(m.test_loss, w)
        if hasattr(m, "effective_predictor"):
            for w in odd:
                attempt(m.effective_predictor, w)
        # the compiled objects themselves refuse misuse instead of crashing
        for suffix, dt in (("_f64", np.float64), ("_f32", np.float32)):
            c = m._core(dt)
            for W in (np.ones((2, D + 1), dt), np.ones(D, dt), np.ones((2, D, 1), dt)):
                attempt(c.loss_grad, W)
                attempt(c.hessian, W)
                attempt(c.hvp, W, W)
            attempt(c.hvp, np.ones((2, D), dt), np.ones((3, D), dt))
            attempt(c.third, np.ones((2, D), dt), np.ones((2, D + 1), dt))
    attempt(core.BNMatrixCompletion_f64, np.array([0, 9], np.int32), np.array([0, 1], np.int32),
            np.array([0.7, -0.7]), 1.0, 3, 3, 2)
    attempt(core.BNMatrixCompletion_f64, np.array([0, 1], np.int32), np.array([0], np.int32),
            np.array([0.7, -0.7]), 1.0, 3, 3, 2)
    attempt(core.BNLinearRegression_f64, np.ones((3, 2)), np.ones(4), 1.0)
    attempt(core.set_num_threads, 0)
    for line in nans:
        print("NAN", line)
    print("BATTERY-DONE", n_ok, n_err)
''')


def test_no_crash_and_no_nan_battery(tmp_path):
    """Odd input through every entry point, in a child interpreter (a crash would kill it).

    Subnormal and tiny (< ~1e-150) w are covered by test_models.py::test_subnormal_w and
    test_hvp_small_w_*. The child runs outside the repository, so it imports the
    installed pysharp rather than the source tree (which has no built _core)."""
    models = {name: SMALL.get(name, {}) for name in SCALE_INVARIANT}
    script = _BATTERY.replace("MODELS", repr(models))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    lines = proc.stdout.splitlines()
    assert lines and lines[-1].startswith("BATTERY-DONE"), proc.stdout[-2000:]
    _, n_ok, n_err = lines[-1].split()
    assert int(n_ok) > 0 and int(n_err) > 0
    nans = [line for line in lines if line.startswith("NAN")]
    assert not nans, "NaN returned without an error:\n" + "\n".join(nans)


def test_errors_leave_model_usable(case):
    """A refused call does not poison the cached compiled core."""
    m = case.model
    w = case.points(seed=11)
    L = m.loss(w)
    for bad in (np.zeros(case.dim), np.full(case.dim, np.nan), np.ones(case.dim + 1)):
        with pytest.raises(ValueError):
            m.loss(bad)
    assert m.loss(w) == L


def test_core_only_calls_take_backend_and_refuse_the_others():
    """SGD, the stability analysis and Lanczos on a Python operator run in the core only:
    backend="auto" / "cpp" run, any other backend is refused by name before any work."""
    from pysharp import stability
    model = ps.LinearRegression(np.eye(3)[:, :2] + 0.1, np.arange(3.0))
    w = np.zeros(2)
    same = ps.run_sgd(model, w, 0.1, 2, 20, backend="cpp")
    np.testing.assert_array_equal(same.w, ps.run_sgd(model, w, 0.1, 2, 20).w)
    calls = {
        "run_sgd": lambda b: ps.run_sgd(model, w, 0.1, 2, 20, backend=b),
        "lanczos": lambda b: ps.lanczos(lambda x: 2 * x, 4, backend=b),
        "sharpness_nonuniformity": lambda b: stability.sharpness_nonuniformity(model, w,
                                                                                backend=b),
        "second_moment_operator": lambda b: stability.second_moment_operator(model, w, 0.1, 2,
                                                                              backend=b),
        "critical_lr": lambda b: stability.critical_lr(model, w, 2, backend=b),
        "input_smoothness": lambda b: stability.input_smoothness(model, w, backend=b),
        "gradient_moment_ratio": lambda b: stability.gradient_moment_ratio(model, w, 0.1, 2,
                                                                            backend=b),
    }
    for name, call in calls.items():
        call("auto")
        for backend in ("numba", "numpy", "cuda"):
            with pytest.raises(ValueError, match=f"{name} runs in the compiled core only"):
                call(backend)
        with pytest.raises(ValueError, match="backend must be"):
            call("fortran")


def test_engine_interface_is_typed_and_read_by_field_name():
    """Backends receive EngineConfig / LanczosOptions by field name: the Python enum
    mirrors the C++ one, and a missing, unknown or misspelt field is refused."""
    from pysharp._engine import EngineConfig, LanczosOptions, Method, loader
    assert {m.name.lower(): int(m) for m in Method} == dict(loader.core().METHODS)
    model = Toy3D()
    core = model._core(np.dtype(np.float64))
    W = np.array([[1.0, 0.5, 0.2]])
    lr = np.array([0.1])
    wd = np.array([1e-3])
    good = EngineConfig(Method.GD_WD, steps=5, lanczos=LanczosOptions(max_iter=3, min_iter=3))
    hyper = {"lr": lr, "wd": wd}
    out = core.run(W, hyper, good.to_core())
    ref = ps.run_gd_wd(model, W[0], 0.1, 1e-3, 5, record_every=1, sharpness_every=0)
    np.testing.assert_array_equal(out["w"][0], ref.w)
    for broken, message in [
        ({**good.to_core(), "stpes": 5}, "unknown field 'stpes'"),
        ({k: v for k, v in good.to_core().items() if k != "jitter"}, "lacks the field 'jitter'"),
        ({**good.to_core(), "method": 9}, "unknown method"),
        ({**good.to_core(), "lanczos": {**good.lanczos.to_core(), "k": 2}},
         "k = 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            core.run(W, hyper, broken)
    # the hyperparameters by name: exactly those the method reads, one entry per trajectory
    for broken, message in [
        ({"lr": lr}, "lacks the field 'wd'"),
        ({**hyper, "c": lr}, "unknown field 'c'"),
        ({"eta": lr, "wd": wd}, "lacks the field 'lr'"),
        ({"lr": lr, "wd": np.array([1e-3, 1e-3])}, "wd must have one entry per trajectory"),
    ]:
        with pytest.raises(ValueError, match=message):
            core.run(W, broken, good.to_core())
    pgd = EngineConfig(Method.PGD, steps=5, lanczos=LanczosOptions(max_iter=3, min_iter=3))
    with pytest.raises(ValueError, match="of method pgd has an unknown field 'lr'"):
        core.run(W, {"eta": lr, "lr": lr}, pgd.to_core())
    with pytest.raises(ValueError, match="unknown method 'sgd_wd'"):
        Method.named("sgd_wd")
    with pytest.raises(ValueError, match="lanczos_max_iter must be in"):
        ps.run_gd_wd(model, W[0], 0.1, 1e-3, 5, lanczos_max_iter=4)


@pytest.mark.parametrize("scale", [1e-200, 1e200])
def test_pgd_start_of_any_norm_is_normalised_exactly(scale):
    # A squared norm that under- or overflows must not turn a valid start into a
    # zero or NaN row: the start is scaled by a power of two before normalising.
    model = ps.Toy3D(c=10.0)
    w0 = np.array([[0.6, -0.3, 0.2], [1.0, 2.0, -0.5]])
    plain = ps.run_pgd(model, w0, 0.05, 20, record_every=5, sharpness_every=0)
    far = ps.run_pgd(model, w0 * scale, 0.05, 20, record_every=5, sharpness_every=0)
    assert not far.diverged.any()
    np.testing.assert_allclose(far.w, plain.w, rtol=0, atol=1e-14)  # unit vectors
    with pytest.raises(ValueError, match=r"w0\[1\] is the zero vector"):
        ps.run_pgd(model, np.vstack([w0[:1], np.zeros((1, 3))]), 0.05, 20)


# -- the _validation helpers at their boundaries ---------------------------------------
def test_validation_boundaries():
    assert as_real(0.0, "x", minimum=0.0) == 0.0
    with pytest.raises(ValueError, match="x must be > 0.0"):
        as_real(0.0, "x", minimum=0.0, strict=True)
    with pytest.raises(ValueError, match="x must be >= 0.0"):
        as_real(-1e-300, "x", minimum=0.0)
    assert as_real(-5.0, "x") == -5.0 and isinstance(as_real(np.float32(0.5), "x"), float)
    for bad, exc in ((True, TypeError), ("1", TypeError), (math.inf, ValueError),
                     (math.nan, ValueError)):
        with pytest.raises(exc, match="x"):
            as_real(bad, "x")
    assert as_positive_int(0, "k", minimum=0) == 0 and as_positive_int(np.int64(3), "k") == 3
    for bad, exc in ((0, ValueError), (np.bool_(True), TypeError), (2.0, TypeError)):
        with pytest.raises(exc, match="k"):
            as_positive_int(bad, "k")
    b, single = as_batch([1, 2, 3], 3)
    assert b.dtype == np.float64 and b.shape == (1, 3) and single
    b, single = as_batch(np.ones((2, 3), np.float32), 3)
    assert b.dtype == np.float32 and b.shape == (2, 3) and not single
    for bad in (np.ones((0, 3)), np.ones((3, 1)), np.ones(4), np.ones((1, 1, 3))):
        with pytest.raises(ValueError, match="w must have shape"):
            as_batch(bad, 3)
    with pytest.raises(TypeError, match="y"):
        as_float_array(np.array([True]), "y")
    with pytest.raises(TypeError, match="y"):
        as_float_array(np.array([1j]), "y")
    with pytest.raises(ValueError, match=r"index \(1, 0\)"):
        as_float_array([[1.0, 2.0], [np.inf, 0.0]], "y")
    with pytest.raises(ValueError, match=r"w\[1\] is the zero vector"):
        check_nonzero_rows(np.array([[1.0, 0.0], [0.0, 0.0]]))
    check_nonzero_rows(np.array([[0.0, -1e-300]]))


def test_gpu_arrays_other_than_cupy_are_refused():
    class FakeGpu:
        __cuda_array_interface__ = {}

    with pytest.raises(TypeError, match="CuPy"):
        as_float_array(FakeGpu(), "w")


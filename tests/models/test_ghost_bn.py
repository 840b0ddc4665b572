"""Ghost batch normalisation: mini-batch SGD on BNLinearRegression (issue 7).

Each step descends L_I, the model's loss on the sub-dataset (X_I, y_I) with the
batch's own BN statistics and centring. Oracles: a NumPy batch loss/gradient
written from the formula and differentiated by hand (itself checked against
central differences), run on the engine's own batches (``sgd_batches``); and
full-batch GD+WD (``run_gd_wd``), which B = n without replacement must equal.
"""

from __future__ import annotations

import numpy as np
import pytest
from _cases import rel_err

from pysharp import run_gd_wd
from pysharp._engine import loader
from pysharp.models import BNLinearRegression
from pysharp.sgd import run_sgd, sgd_batches


def _model(n=10, d=4, seed=0, noise=0.3):
    return BNLinearRegression.synthetic(d=d, n=n, seed=seed, noise=noise)


def _w0(d, seed=1, T=None):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(d) if T is None else rng.standard_normal((T, d))


def _close(a, b, tol, floor):
    """max |a - b| <= tol max(max |b|, floor): relative, with an absolute floor for ~0 values."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    return np.max(np.abs(a - b)) <= tol * max(np.max(np.abs(b)), floor)


def np_batch_loss_grad(X, y, w, idx):
    """L_I(w) = (1/B) sum_I (p_i - y_i)^2, p = std_I(y) zhat + mean_I(y), by hand."""
    XI, yI = X[idx], y[idx]
    B = len(idx)
    Xc = XI - XI.mean(axis=0)
    yc = yI - yI.mean()
    z = Xc @ w  # centred over the batch, since Xc is
    sig = np.sqrt(np.mean(z ** 2))  # population std of z over the batch
    sy = np.sqrt(np.mean(yc ** 2))  # population std of y over the batch
    zhat = z / sig
    r = sy * zhat - yc  # p_i - y_i
    L = np.mean(r ** 2)
    v = 2.0 * sy * r / B  # dL/dzhat
    # d zhat_i / d z_j = (delta_ij - zhat_i zhat_j / B) / sig
    dz = (v - zhat * (zhat @ v) / B) / sig
    return L, Xc.T @ dz


def np_ghost_sgd(m, w0, lr, wd, idx):
    """NumPy ghost-BN SGD+WD on the given batches: (final w, diverged step or -1)."""
    w = np.array(w0, dtype=np.float64)
    for t, I in enumerate(idx):
        if len(set(I.tolist())) == 1:  # X_I w is constant: ghost BN undefined
            return w, t + 1
        w = (1 - lr * wd) * w - lr * np_batch_loss_grad(m.X, m.y, w, I)[1]
    return w, -1


# -- the batch loss itself ------------------------------------------------------------------
def test_numpy_batch_gradient_matches_central_differences():
    m = _model()
    w = _w0(m.dim)
    idx = np.array([0, 3, 4, 7, 3])  # a repeat, as with replacement
    _, g = np_batch_loss_grad(m.X, m.y, w, idx)
    h = 1e-6
    fd = np.array([(np_batch_loss_grad(m.X, m.y, w + h * e, idx)[0]
                    - np_batch_loss_grad(m.X, m.y, w - h * e, idx)[0]) / (2 * h)
                   for e in np.eye(m.dim)])
    assert rel_err(g, fd) < 1e-7


@pytest.mark.parametrize("idx", [[0, 3, 4, 7, 3], [2, 5], list(range(10))[::-1]])
def test_engine_batch_loss_is_the_loss_of_the_sub_dataset(idx):
    m = _model()
    W = _w0(m.dim, T=3)
    idx = np.array(idx)
    L, G = m.batch_loss_and_grad(W, idx)
    for k, w in enumerate(W):
        Ln, gn = np_batch_loss_grad(m.X, m.y, w, idx)
        # B = 2 fits the batch exactly (L_I = 0 up to rounding): floors on the natural scales
        gscale = m.y.var() * np.abs(m.X).max() / np.linalg.norm(w)
        assert _close(L[k], Ln, 1e-13, m.y.var()) and _close(G[k], gn, 1e-12, gscale)
        if len(set(idx.tolist())) == len(idx):  # distinct rows: a BNLinearRegression of them
            sub = BNLinearRegression(m.X[idx], m.y[idx])
            assert _close(L[k], sub.loss(w), 1e-13, m.y.var())
            assert _close(G[k], sub.grad(w), 1e-12, gscale)
    if len(idx) == m.n:  # the whole data set in any order: the full-batch loss
        Lf, Gf = m.loss_and_grad(W)
        assert rel_err(L, Lf) < 1e-13 and rel_err(G, Gf) < 1e-12


def test_batch_loss_is_scale_invariant():
    m = _model()
    w = _w0(m.dim)
    idx = np.array([1, 2, 6, 8])
    L, g = m.batch_loss_and_grad(w, idx)
    assert abs(g @ w) < 1e-14 * np.linalg.norm(g) * np.linalg.norm(w)
    for c in (1e-3, 0.37, 25.0):
        Lc, gc = m.batch_loss_and_grad(c * w, idx)
        assert rel_err(Lc, L) < 1e-14
        assert rel_err(gc, g / c) < 1e-13  # grad L_I(c w) = grad L_I(w) / c
        assert abs(gc @ w) < 1e-14 * np.linalg.norm(gc) * np.linalg.norm(w)


def test_batch_with_equal_targets_has_zero_loss_and_gradient():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((6, 3))
    y = np.array([1.0, 1.0, 1.0, 2.0, -1.0, 0.5])
    m = BNLinearRegression(X, y)
    L, g = m.batch_loss_and_grad(_w0(3), np.array([0, 1, 2]))
    assert L == 0 and not np.any(g)


def test_undefined_batch_loss_is_refused():
    m = _model()
    with pytest.raises(ValueError, match="constant over the batch"):
        m.batch_loss_and_grad(_w0(m.dim), np.array([4, 4, 4]))
    with pytest.raises(ValueError, match="batch"):
        m.batch_loss_and_grad(_w0(m.dim), np.array([4]))


# -- SGD against the oracles --------------------------------------------------------------
@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("d", [5, 11])  # gathered into lane form by columns, blocks of 4 or 8
def test_ghost_bn_sgd_matches_numpy_on_the_engine_batches(replacement, d):
    m = _model(n=12, d=d, seed=3)
    T, steps, seed = 6, 60, 7
    W0 = _w0(m.dim, T=T)
    lr = np.array([0.05, 0.2, 0.5, 1.0, 0.3, 2.0])
    B = np.array([3, 4, 6, 12, 5, 8]) if not replacement else np.array([3, 4, 6, 16, 5, 8])
    wd = np.array([1e-2, 0.0, 5e-3, 1e-2, 0.1, 2e-3])
    res = run_sgd(m, W0, lr, B, steps, wd=wd, replacement=replacement, seed=seed,
                  record_every=1)
    worst = 0.0
    for t in range(T):
        idx = sgd_batches(m.n, int(B[t]), steps, replacement=replacement, seed=seed,
                          trajectory=t)
        w, div = np_ghost_sgd(m, W0[t], lr[t], wd[t], idx)
        assert res.diverged_step[t] == div
        worst = max(worst, rel_err(res.w[t], w))
    assert worst < 1e-12, worst
    assert not res.diverged.any()
    # the records are the full-batch (full-statistics) loss of the iterates
    assert rel_err(res.loss[-1], m.loss(res.w)) < 1e-13


def test_ghost_bn_sgd_with_the_whole_data_set_is_gd_wd():
    m = _model(n=10, d=6, seed=4)
    W0 = _w0(m.dim, T=3)
    lr, wd, steps = np.array([0.1, 0.5, 1.5]), np.array([1e-2, 2e-4, 0.0]), 80
    sgd = run_sgd(m, W0, lr, m.n, steps, wd=wd, seed=5, record_every=1)
    for reduced in (False, True):
        gd = run_gd_wd(m, W0, lr, wd, steps, record_every=1, sharpness_every=0,
                       reduced=reduced)
        assert rel_err(sgd.w, gd.w) < 1e-12, reduced
        assert rel_err(sgd.loss, gd.loss) < 1e-12, reduced


def test_ghost_bn_sgd_float32_follows_float64():
    m = _model(n=12, d=5, seed=3)
    w0 = _w0(m.dim)
    a = run_sgd(m, w0, 0.2, 4, 30, wd=1e-2, seed=1)
    b = run_sgd(m, w0.astype(np.float32), 0.2, 4, 30, wd=1e-2, seed=1)
    assert b.w.dtype == np.float32
    assert rel_err(b.w, a.w) < 1e-4


def test_ghost_bn_sgd_bits_do_not_depend_on_threads_or_chunks():
    m = _model(n=16, d=6, seed=6)
    W0 = _w0(m.dim, T=8)
    lr = np.linspace(0.1, 1.0, 8)
    B = np.array([2, 3, 4, 5, 6, 8, 12, 16])
    core = loader.core()
    threads = core.max_threads()
    try:
        core.set_num_threads(1)
        a = run_sgd(m, W0, lr, B, 150, wd=1e-3, seed=4)
        core.set_num_threads(max(2, threads))
        b = run_sgd(m, W0, lr, B, 150, wd=1e-3, seed=4)
    finally:
        core.set_num_threads(threads)
    c = run_sgd(m, W0[3:], lr[3:], B[3:], 150, wd=1e-3, seed=4, first_trajectory=3)
    np.testing.assert_array_equal(a.w, b.w)
    np.testing.assert_array_equal(a.loss, b.loss)
    np.testing.assert_array_equal(a.w[3:], c.w)
    np.testing.assert_array_equal(a.loss[:, 3:], c.loss)


# -- divergence and bad input ----------------------------------------------------------------
def test_a_batch_of_one_repeated_sample_flags_divergence_and_the_rest_completes():
    m = _model(n=6, d=3, seed=8)
    W0 = _w0(m.dim, T=3)
    steps, seed = 60, 2
    # with replacement and B = 2, some batch repeats one index (probability 1/6 a step)
    res = run_sgd(m, W0, 0.3, np.array([4, 2, 3]), steps, wd=1e-2, replacement=True,
                  seed=seed, record_every=1)
    idx = sgd_batches(m.n, 2, steps, replacement=True, seed=seed, trajectory=1)
    first = next(t for t, I in enumerate(idx) if I[0] == I[1])
    assert res.diverged[1] and res.diverged_step[1] == first + 1
    w, div = np_ghost_sgd(m, W0[1], 0.3, 1e-2, idx)
    assert div == first + 1 and rel_err(res.w[1], w) < 1e-12  # frozen at the last good iterate
    assert np.isfinite(res.loss[:first + 1, 1]).all() and np.isnan(res.loss[first + 1:, 1]).all()
    for t in (0, 2):  # the others follow the oracle, divergence or not
        I = sgd_batches(m.n, int(res.batch[t]), steps, replacement=True, seed=seed, trajectory=t)
        w, div = np_ghost_sgd(m, W0[t], 0.3, 1e-2, I)
        assert res.diverged_step[t] == div and rel_err(res.w[t], w) < 1e-12
    assert not res.diverged.all()


def test_a_batch_whose_spread_is_rounding_noise_flags_divergence():
    # Rows 0 and 1 differ in the last bits only: on the batch {0, 1}, X_I w - mean_I is
    # rounding noise, so ghost BN is undefined there although the gradient formula would
    # return finite (huge) numbers. Every trajectory stops at its first such batch.
    rng = np.random.default_rng(5)
    X = rng.standard_normal((5, 3))
    X[1] = X[0] * (1 + 4 * np.finfo(float).eps)
    m = BNLinearRegression(X, rng.standard_normal(5))
    T, steps = 6, 40
    W0 = _w0(m.dim, T=T)
    res = run_sgd(m, W0, 0.2, 2, steps, wd=1e-2, seed=3, record_every=1)
    for t in range(T):
        idx = sgd_batches(m.n, 2, steps, seed=3, trajectory=t)
        bad = [s for s, I in enumerate(idx) if sorted(I.tolist()) == [0, 1]]
        assert res.diverged_step[t] == (bad[0] + 1 if bad else -1), t
        w, _ = np_ghost_sgd(m, W0[t], 0.2, 1e-2, idx[:bad[0]] if bad else idx)
        assert rel_err(res.w[t], w) < 1e-12, t
    assert res.diverged.any()


def test_huge_learning_rates_grow_the_norm_without_nan():
    # The batch gradient is O(1/||w||) and orthogonal to w, so no lr makes SGD
    # blow up: ||w|| grows (||w+||^2 = ||w||^2 + lr^2 ||g||^2 at wd = 0), the
    # effective LR falls, and nothing becomes NaN.
    m = _model(n=10, d=4, seed=9)
    W0 = _w0(m.dim, T=3)
    lr = np.array([0.1, 1e3, 1e8])
    res = run_sgd(m, W0, lr, 4, 200, seed=3)
    assert not res.diverged.any() and np.isfinite(res.w).all() and np.isfinite(res.loss).all()
    norms = np.linalg.norm(res.w, axis=1)
    assert np.all(norms >= np.linalg.norm(W0, axis=1))
    assert norms[2] > norms[1] > norms[0]


@pytest.mark.parametrize("call, match", [
    (lambda m: run_sgd(m, _w0(4), 0.1, 1, 10), "batch sizes must be >= 2"),
    (lambda m: run_sgd(m, _w0(4), 0.1, np.array([3, 1]), 10), "ghost BN"),
    (lambda m: run_sgd(m, _w0(4), 0.1, 1, 10, replacement=True), "batch"),
    (lambda m: run_sgd(m, _w0(4), 0.1, 11, 10), "batch sizes must be <= n"),
    (lambda m: run_sgd(m, np.zeros(4), 0.1, 2, 10), "w0"),
])
def test_bad_ghost_bn_input_is_refused_with_the_argument_named(call, match):
    with pytest.raises(ValueError, match=match):
        call(_model())

"""pysharp.sgd: the SGD runner's records, defaults and divergence, and its batch sampler.

Oracles: an independent NumPy SGD over the engine's own batches (``sgd_batches``)
and a divergence worked out by hand (w_t = (-10)^t w_0).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _cases import rel_err
from _cases import square_linreg as _linreg
from _cases import square_net as _net

import pysharp as ps
from pysharp._engine import loader
from pysharp.models import LinearRegression
from pysharp.sgd import run_sgd, sgd_batches


def test_sgd_record_steps_keep_their_last_entry_and_defaults_match_sgd_batches():
    model = _linreg(6, 3, 9)
    w0 = np.full(3, 0.3)
    res = run_sgd(model, w0, 0.05, 2, 7, record_every=3)
    assert res.steps.tolist() == [0, 3, 6] and res.loss.shape == (3,)
    assert res.loss[0] == pytest.approx(float(model.loss(w0)), rel=1e-14)
    assert run_sgd(model, w0, 0.05, 2, 250).steps.tolist() == list(range(0, 251, 2))
    # defaults (seed 0, trajectory 0, without replacement) follow sgd_batches' defaults
    steps = 6
    res = run_sgd(model, w0, 0.05, 2, steps, record_every=steps)
    assert res.replacement is False and res.seed == 0
    w = w0.copy()
    X, y = model.X, model.y
    for I in sgd_batches(6, 2, steps):
        w = w - 0.05 * X[I].T @ (X[I] @ w - y[I]) / 2
    assert np.allclose(res.w, w, rtol=1e-13)
    assert res.loss[-1] == pytest.approx(float(model.loss(res.w)), rel=1e-12)
    with pytest.raises(ValueError, match="max_loss"):
        run_sgd(model, w0, 0.05, 2, 3, max_loss=0.0)
    with pytest.raises(ValueError, match="<= n"):
        run_sgd(model, w0, 0.05, 7, 3)
    assert run_sgd(model, w0, 0.05, 6, 3).batch == 6


def test_sgd_divergence_threshold_default_is_1e100():
    """a = 1, eta = 11: w_t = (-10)^t w_0, loss_t = 1.5e80 * 100^t crosses 1e100 at t = 10."""
    model = LinearRegression(np.ones((2, 1)), np.zeros(2))
    w0 = np.array([math.sqrt(3e80)])
    res = run_sgd(model, w0, 11.0, 2, 15, record_every=1)
    assert res.loss[9] == pytest.approx(1.5e98, rel=1e-12)
    assert res.diverged and res.diverged_step == 10 and np.all(np.isnan(res.loss[10:]))
    late = run_sgd(model, w0, 11.0, 2, 15, record_every=1, max_loss=2e100)
    assert late.diverged_step == 11 and late.loss[10] == pytest.approx(1.5e100, rel=1e-12)


def test_sgd_batches_respects_the_sampling_scheme():
    with pytest.raises(ValueError, match="batch must be <= n"):
        sgd_batches(5, 6, 2)
    I = sgd_batches(5, 6, 3, replacement=True)
    assert I.shape == (3, 6) and I.min() >= 0 and I.max() < 5
    J = sgd_batches(5, 5, 4)
    assert np.array_equal(np.sort(J, axis=1), np.tile(np.arange(5), (4, 1)))  # B = n: everything


# -- the runner against NumPy SGD on the same batches; bits, divergence ----------------
@pytest.mark.parametrize("replacement", [False, True])
def test_sgd_matches_numpy_sgd_on_the_same_batches(replacement):
    m = _linreg(n=10, d=3, seed=9, realizable=False)
    w0 = np.array([0.3, -0.2, 0.5])
    lr, B, wd, steps = 0.1, 4, 1e-2, 50
    res = run_sgd(m, w0, lr, B, steps, wd=wd, replacement=replacement, seed=3)
    idx = sgd_batches(m.n, B, steps, replacement=replacement, seed=3)
    assert idx.shape == (steps, B)
    if not replacement:
        assert all(len(set(row)) == B for row in idx)
    w = w0.copy()
    for I in idx:
        XI = m.X[I]
        w = (1 - lr * wd) * w - lr * XI.T @ (XI @ w - m.y[I]) / B
    assert rel_err(res.w, w) < 1e-12


def test_sgd_with_replacement_takes_batches_larger_than_n():
    m = _linreg(n=5, d=3, seed=11, realizable=False)
    w0 = np.array([0.3, -0.2, 0.5])
    lr, B, steps = 0.05, 13, 30  # B > n: the batch indices outgrow the n-entry permutation
    res = run_sgd(m, w0, lr, B, steps, replacement=True, seed=2)
    w = w0.copy()
    for I in sgd_batches(m.n, B, steps, replacement=True, seed=2):
        w = w - lr * m.X[I].T @ (m.X[I] @ w - m.y[I]) / B
    assert rel_err(res.w, w) < 1e-12


def test_sgd_bits_do_not_depend_on_threads_or_chunks():
    m = _net()
    W0 = m.random_point(6, seed=5)
    lr = np.linspace(0.05, 0.3, 6)
    core = loader.core()
    threads = core.max_threads()
    try:
        core.set_num_threads(1)
        a = run_sgd(m, W0, lr, 2, 100, seed=4)
        core.set_num_threads(max(2, threads))
        b = run_sgd(m, W0, lr, 2, 100, seed=4)
    finally:
        core.set_num_threads(threads)
    c = run_sgd(m, W0[3:], lr[3:], 2, 100, seed=4, first_trajectory=3)
    np.testing.assert_array_equal(a.w, b.w)
    np.testing.assert_array_equal(a.w[3:], c.w)


def test_diverging_sgd_is_flagged_and_the_rest_completes():
    m = _net()
    W0 = m.random_point(3, seed=6)
    res = run_sgd(m, W0, np.array([0.05, 500.0, 0.1]), 2, 200, seed=1)
    assert res.diverged.tolist() == [False, True, False]
    assert np.all(np.isfinite(res.w))
    assert np.isfinite(res.loss[-1, [0, 2]]).all() and np.isnan(res.loss[-1, 1])


@pytest.mark.parametrize("batch, error", [(2.5, ValueError), ([2, np.inf], ValueError),
                                          ([2.0, 3.5], ValueError), (True, TypeError)])
def test_batch_sizes_must_be_whole_numbers(batch, error):
    model = _linreg()
    with pytest.raises(error, match="batch"):
        run_sgd(model, np.zeros(model.dim), 0.1, batch, 3)


# A model answers for itself whether it runs SGD (models/_kinds.py's require_sgd): a
# scale-invariant model without ghost-BN SGD is refused by name, before any work.
@pytest.mark.parametrize("model", [ps.Toy3D(c=10.0), ps.BNTwoLayerNet.synthetic(seed=0)])
def test_a_model_without_sgd_is_refused_by_name(model):
    with pytest.raises(TypeError, match=f"run_sgd: .*got {type(model).__name__}"):
        ps.run_sgd(model, model.random_point(seed=0), 0.1, 2, 10)

"""pysharp.sgd: the SGD runner's records, defaults and divergence, and its batch sampler.

Oracles: an independent NumPy SGD over the engine's own batches (``sgd_batches``)
and a divergence worked out by hand (w_t = (-10)^t w_0).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_stability import _linreg

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


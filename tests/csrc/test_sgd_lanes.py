"""SGD on lane blocks: placement invariance and an independent NumPy oracle.

Every model advances trajectories in SIMD lane blocks, each lane with its own
batches (keyed by its trajectory index), lr and weight decay; the lanes of a
block share a batch size (a new block starts where the size changes). A
trajectory's bits must not depend on its block, lane, chunk or thread count
(same code path: bit equality), and the result must match a plain NumPy SGD on
the same batches (``sgd_batches``; a different code path: compared to 1e-12
over a short, non-chaotic run; test_ghost_bn.py holds the ghost-BN oracle).
"""

from __future__ import annotations

import numpy as np
import pytest
from _cases import rel_err

from pysharp._engine import loader
from pysharp.models import BNLinearRegression, LinearRegression, TwoLayerNet
from pysharp.sgd import run_sgd, sgd_batches

T = 11
BATCH = np.array([1, 3, 7, 2, 5, 13, 4, 1, 6, 9, 3])
WD = np.array([0.0, 1e-3, 0.0, 5e-2, 0.0, 1e-2, 0.0, 2e-3, 0.1, 0.0, 3e-2])


def _model(kind: str):
    # d = 11: the lane-form gather (a transposition) does whole blocks of 4 or 8 columns,
    # then a remainder column by column
    if kind == "bn_linreg":  # ghost BN
        return BNLinearRegression.synthetic(d=11, n=13, seed=21, noise=0.3)
    rng = np.random.default_rng(21)
    X = rng.standard_normal((13, 11))
    if kind.startswith("linreg"):
        return LinearRegression(X, X @ rng.standard_normal(11) + 0.1 * rng.standard_normal(13),
                                bias=kind == "linreg_bias")
    return TwoLayerNet(11, 4, kind.split("_")[1], X=X, y=np.sin(X[:, 0]))


def _setup(kind: str, dtype=np.float64):
    m = _model(kind)
    W0 = np.random.default_rng(22).standard_normal((T, m.dim)).astype(dtype)
    W0 *= 0.1 if kind.startswith("linreg") else 0.5
    lr = np.linspace(0.02, 0.15, T)[np.random.default_rng(23).permutation(T)]
    return m, W0, lr


def _run(m, W0, lr, batch, wd, first=0, steps=60, replacement=False):
    if isinstance(m, BNLinearRegression):
        batch = np.maximum(batch, 2)  # ghost BN needs two samples
    return run_sgd(m, W0, lr, batch, steps, wd=wd, replacement=replacement, record_every=7,
                   seed=5, first_trajectory=first)


def _same(a, b, i=slice(None), j=slice(None)):
    """Bit equality of trajectories i of a and j of b."""
    np.testing.assert_array_equal(a.w[i], b.w[j])
    np.testing.assert_array_equal(a.loss[:, i], b.loss[:, j])
    np.testing.assert_array_equal(a.diverged[i], b.diverged[j])
    np.testing.assert_array_equal(a.diverged_step[i], b.diverged_step[j])


SQUARE_LOSS = ["linreg", "linreg_bias", "net_tanh", "net_relu"]
KINDS = SQUARE_LOSS + ["bn_linreg"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("replacement", [False, True])
def test_a_trajectory_gets_the_same_bits_alone_and_at_any_position(kind, replacement):
    m, W0, lr = _setup(kind)
    full = _run(m, W0, lr, BATCH, WD, replacement=replacement)
    # ghost BN with replacement meets B = 2 batches of one repeated index: flagged
    assert np.isfinite(full.w).all() and (kind == "bn_linreg" or not full.diverged.any())
    rng = np.random.default_rng(24)
    for k in (0, 4, 10):  # the trajectory of interest, key k
        alone = _run(m, W0[k:k + 1], lr[k:k + 1], BATCH[k:k + 1], WD[k:k + 1], first=k,
                     replacement=replacement)
        _same(full, alone, [k], [0])
        for p in (0, 5, 10):  # placed at position p among other neighbours
            perm = rng.permutation(T)
            W, lrs, bs, wds = W0[perm], lr[perm], BATCH[perm], WD[perm]
            W[p], lrs[p], bs[p], wds[p] = W0[k], lr[k], BATCH[k], WD[k]
            other = _run(m, W, lrs, bs, wds, first=k - p + 100, replacement=replacement)
            moved = _run(m, W0[k:k + 1], lr[k:k + 1], BATCH[k:k + 1], WD[k:k + 1],
                         first=k + 100, replacement=replacement)
            _same(other, moved, [p], [0])


@pytest.mark.parametrize("kind", KINDS)
def test_chunks_and_threads_do_not_change_bits(kind):
    m, W0, lr = _setup(kind)
    core = loader.core()
    threads = core.max_threads()
    try:
        core.set_num_threads(1)
        one = _run(m, W0, lr, BATCH, WD)
        core.set_num_threads(2)
        two = _run(m, W0, lr, BATCH, WD)
    finally:
        core.set_num_threads(threads)
    _same(one, two)
    head = _run(m, W0[:4], lr[:4], BATCH[:4], WD[:4])
    tail = _run(m, W0[4:], lr[4:], BATCH[4:], WD[4:], first=4)
    _same(one, head, slice(0, 4))
    _same(one, tail, slice(4, T))


@pytest.mark.parametrize("kind", SQUARE_LOSS)  # no lr makes ghost BN diverge: see below
def test_a_diverging_lane_leaves_its_neighbours_bit_identical(kind):
    m, W0, lr = _setup(kind)
    calm = _run(m, W0, lr, BATCH, WD)
    hot = lr.copy()
    hot[5] = 1e4
    wild = _run(m, W0, hot, BATCH, WD)
    assert wild.diverged.tolist() == [i == 5 for i in range(T)]
    assert 0 < wild.diverged_step[5] <= 60 and np.isfinite(wild.w[5]).all()
    first_nan = -(-wild.diverged_step[5] // 7)  # records from the divergence on are NaN
    assert np.isnan(wild.loss[first_nan:, 5]).all() and np.isfinite(wild.loss[:first_nan, 5]).all()
    rest = np.arange(T) != 5
    _same(calm, wild, rest, rest)
    # frozen at the divergence: the iterate of a run that stops there, never flagged
    s = int(wild.diverged_step[5])
    stop = run_sgd(m, W0[5], hot[5], BATCH[5], s, wd=WD[5], record_every=7, seed=5,
                   first_trajectory=5, max_loss=1e308)
    if np.isfinite(stop.w).all():  # flagged by the loss at a record: the iterate of step s
        np.testing.assert_array_equal(wild.w[5], stop.w)
    else:  # flagged by a non-finite step s: the iterate of step s - 1
        before = run_sgd(m, W0[5], hot[5], BATCH[5], s - 1, wd=WD[5], record_every=7, seed=5,
                         first_trajectory=5, max_loss=1e308)
        np.testing.assert_array_equal(wild.w[5], before.w)


def test_ghost_bn_lanes_meeting_undefined_batches_leave_their_neighbours_alone():
    # With replacement and B = 2, a batch repeating one index has X_I w constant: ghost BN
    # is undefined there and that trajectory is flagged (probability 1/16 a step here). All
    # 16 share one batch size, so they share lane blocks and die at different steps.
    m = BNLinearRegression.synthetic(d=4, n=16, seed=2, noise=0.3)
    T, steps = 16, 40
    W0 = np.random.default_rng(3).standard_normal((T, m.dim))
    lr, wd = np.linspace(0.1, 2.0, T), np.full(T, 1e-2)
    full = run_sgd(m, W0, lr, 2, steps, wd=wd, replacement=True, seed=9, record_every=3)
    steps_died = set(full.diverged_step[full.diverged].tolist())
    assert len(steps_died) >= 2 and not full.diverged.all(), full.diverged_step
    for k in range(T):
        alone = run_sgd(m, W0[k], lr[k], 2, steps, wd=wd[k], replacement=True, seed=9,
                        record_every=3, first_trajectory=k)
        np.testing.assert_array_equal(full.w[k], alone.w)
        np.testing.assert_array_equal(full.loss[:, k], alone.loss)
        assert full.diverged_step[k] == alone.diverged_step
        idx = sgd_batches(m.n, 2, steps, replacement=True, seed=9, trajectory=k)
        repeats = [t for t, I in enumerate(idx) if I[0] == I[1]]
        assert full.diverged_step[k] == (repeats[0] + 1 if repeats else -1)


@pytest.mark.parametrize("kind", ["linreg_bias", "bn_linreg"])
def test_float32_lanes_are_placement_invariant(kind):
    m, W0, lr = _setup(kind, np.float32)
    full = _run(m, W0, lr, BATCH, WD)
    assert full.w.dtype == np.float32
    for k in (0, 5, 10):
        _same(full, _run(m, W0[k:k + 1], lr[k:k + 1], BATCH[k:k + 1], WD[k:k + 1], first=k),
              [k], [0])


def _numpy_forward(m, w, I):
    """f(x_i; w) - y_i for i in I and the pieces of grad_w f, from the formulas."""
    X, y = m.X[I], m.y[I]
    if isinstance(m, LinearRegression):
        A = np.hstack([X, np.ones((len(I), 1))]) if m.bias else X
        return A @ w - y, A
    W1, b1, a = m.unpack(w)
    h = X @ W1.T + b1
    if m.activation == "tanh":
        act, dact = np.tanh(h), 1 - np.tanh(h) ** 2
    else:
        act, dact = np.maximum(h, 0), (h > 0).astype(float)
    s = np.sqrt(m.width)
    u = dact * a / s  # (B, m): d f / d b1
    A = np.hstack([(u[:, :, None] * X[:, None, :]).reshape(len(I), -1), u, act / s])
    return act @ a / s - y, A  # A[i] = grad_w f(x_i) in the layout W1, b1, a


def _numpy_grad(m, w, I):
    """(1/B) sum_{i in I} grad_w (f(x_i; w) - y_i)^2 / 2."""
    r, A = _numpy_forward(m, w, I)
    return A.T @ r / len(I)


def _numpy_loss(m, w):
    r, _ = _numpy_forward(m, w, np.arange(m.n))
    return 0.5 * np.mean(r ** 2)


@pytest.mark.parametrize("kind", SQUARE_LOSS)
@pytest.mark.parametrize("replacement", [False, True])
def test_lane_sgd_matches_numpy_sgd_on_the_same_batches(kind, replacement):
    m, W0, lr = _setup(kind)
    steps = 25
    res = run_sgd(m, W0, lr, BATCH, steps, wd=WD, replacement=replacement, record_every=5,
                  seed=7)
    for t in range(T):
        w = W0[t].copy()
        losses = [_numpy_loss(m, w)]
        idx = sgd_batches(m.n, int(BATCH[t]), steps, replacement=replacement, seed=7,
                          trajectory=t)
        for s, I in enumerate(idx):
            w = (1 - lr[t] * WD[t]) * w - lr[t] * _numpy_grad(m, w, I)
            if (s + 1) % 5 == 0:
                losses.append(_numpy_loss(m, w))
        assert rel_err(res.w[t], w) < 1e-12, t
        assert rel_err(res.loss[:, t], np.array(losses)) < 1e-12, t

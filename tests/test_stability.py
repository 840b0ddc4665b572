"""SGD linear stability: models with per-sample Jacobians, pysharp.stability.

Oracles: dense NumPy algebra for linear regression (H_i = x_i x_i^T), finite
differences for the two-layer net, exhaustive enumeration of all batches of a
tiny problem for E (I - eta H_I)^2 and for T_2, the closed forms of D = 1
linear regression (T_2 is a number there), and an independent NumPy SGD that
follows the engine's own batches (``sgd_batches``, in test_sgd.py).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from _cases import rel_err
from _cases import square_linreg as _linreg
from _cases import square_net as _net

import pysharp as ps
from pysharp import stability
from pysharp.models import LinearRegression, TwoLayerNet
from pysharp.sgd import run_sgd


def _fd(f, w, h=1e-6):
    """Central differences of f at w, one column per coordinate: (..., D)."""
    cols = []
    for j in range(w.size):
        e = np.zeros_like(w)
        e[j] = h
        cols.append((f(w + e) - f(w - e)) / (2 * h))
    return np.stack(cols, axis=-1)


# -- models -----------------------------------------------------------------------------
def test_linear_regression_matches_dense_numpy():
    m = _linreg(realizable=False)
    X, y, n = m.X, m.y, m.n
    w = np.random.default_rng(1).standard_normal(m.dim)
    r = X @ w - y
    assert rel_err(m.loss(w), 0.5 * np.mean(r ** 2)) < 1e-14
    assert rel_err(m.grad(w), X.T @ r / n) < 1e-13
    assert rel_err(m.hessian(w), X.T @ X / n) < 1e-13
    assert rel_err(m.param_gradients(w), X) < 1e-15  # a_i = x_i
    assert rel_err(m.input_gradients(w), np.broadcast_to(w, X.shape)) < 1e-15


def test_two_layer_net_derivatives_match_finite_differences():
    m = _net()
    w = m.random_point(seed=2)
    assert rel_err(m.grad(w), _fd(m.loss, w)) < 1e-7
    assert rel_err(m.param_gradients(w), _fd(m.predict, w)) < 1e-7
    v = np.random.default_rng(3).standard_normal(m.dim)
    assert rel_err(m.hvp(w, v), _fd(lambda x: m.grad(x) @ v, w)) < 1e-6
    # grad_x f by moving the inputs
    X = m.X
    gx = m.input_gradients(w)
    for j in range(X.shape[1]):
        e = np.zeros_like(X)
        e[:, j] = 1e-6
        fd = (m.with_data(X + e).predict(w) - m.with_data(X - e).predict(w)) / 2e-6
        assert rel_err(gx[:, j], fd) < 1e-7


def test_two_layer_net_layout_and_gradient_identity():
    m = _net(m=4)
    W1, b1, a = m.unpack(m.random_point(seed=4))
    assert W1.shape == (4, 3) and b1.shape == (4,) and a.shape == (4,)
    w = m.pack(W1, b1, a)
    pred = np.tanh(m.X @ W1.T + b1) @ a / np.sqrt(4)
    assert rel_err(m.predict(w), pred) < 1e-14
    # square loss: grad L = (1/n) sum (f_i - y_i) a_i
    A = m.param_gradients(w)
    assert rel_err(m.grad(w), (pred - m.y) @ A / m.n) < 1e-13


# -- the kappa identity by enumeration ---------------------------------------------------
@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("B", [1, 2, 3])
def test_second_moment_of_the_update_matches_the_kappa_closed_form(replacement, B):
    m = _linreg(n=5, d=3, seed=5)
    A = m.param_gradients(np.zeros(m.dim) + 0.1)  # (n, D), a_i = x_i
    n, D = A.shape
    Hs = np.einsum("ni,nj->nij", A, A)
    H = Hs.mean(0)
    Sigma = np.einsum("nij,njk->ik", Hs, Hs) / n - H @ H
    eta = 0.3
    batches = (itertools.product(range(n), repeat=B) if replacement
               else itertools.combinations(range(n), B))
    acc, count = np.zeros((D, D)), 0
    for I in batches:
        M = np.eye(D) - eta * Hs[list(I)].mean(0)
        acc += M @ M
        count += 1
    kap = stability.kappa(n, B, replacement)
    assert kap == pytest.approx(1 / B if replacement else (n - B) / (B * (n - 1)))
    closed = (np.eye(D) - eta * H) @ (np.eye(D) - eta * H) + eta ** 2 * kap * Sigma
    assert rel_err(acc / count, closed) < 1e-13


def _enumerated_t2(A, eta, B, replacement=False):
    """T_2 = E_I (I - eta H_I) (x) (I - eta H_I) over every batch: (D^2, D^2)."""
    n, D = A.shape
    Hs = np.einsum("ni,nj->nij", A, A)
    batches = (itertools.product(range(n), repeat=B) if replacement
               else itertools.combinations(range(n), B))
    T, count = np.zeros((D * D, D * D)), 0
    for I in batches:
        M = np.eye(D) - eta * Hs[list(I)].mean(0)
        T += np.kron(M, M)
        count += 1
    return T / count


def _enumerated_rho(A, eta, B, replacement=False):
    return np.max(np.abs(np.linalg.eigvals(_enumerated_t2(A, eta, B, replacement))))


@pytest.mark.parametrize("replacement", [False, True])
def test_t2_spectral_radius_matches_the_enumerated_operator(replacement):
    m = _linreg(n=6, d=3, seed=6)
    w = np.zeros(m.dim)
    q = stability.sharpness_nonuniformity(m, w)
    eta, B = 1.5 / q.sharpness, 2
    rho_dense = _enumerated_rho(m.param_gradients(w), eta, B, replacement)
    for method in ("auto", "dense", "power"):
        op = stability.second_moment_operator(m, w, eta, B, replacement=replacement,
                                              method=method)
        assert op.converged
        assert op.spectral_radius == pytest.approx(rho_dense, rel=1e-8 if method == "power"
                                                   else 1e-12), method
        # the Perron eigenmatrix: PSD, and T_2(M) = rho M
        M = op.eigenmatrix
        assert np.linalg.eigvalsh(M)[0] >= -1e-8
        assert rel_err(op.apply(M), op.spectral_radius * M) < 1e-6


def test_sharpness_and_nonuniformity_match_dense_numpy():
    m = _linreg(n=7, d=4, seed=7)
    w = np.zeros(m.dim)
    A = m.param_gradients(w)
    Hs = np.einsum("ni,nj->nij", A, A)
    H = Hs.mean(0)
    Sigma = np.einsum("nij,njk->ik", Hs, Hs) / m.n - H @ H
    q = stability.sharpness_nonuniformity(m, w)
    assert q.sharpness == pytest.approx(np.linalg.eigvalsh(H)[-1], rel=1e-10)
    assert q.nonuniformity == pytest.approx(np.sqrt(np.linalg.eigvalsh(Sigma)[-1]), rel=1e-9)


@pytest.mark.parametrize("lr_a, B", [(0.5, 3), (1.9, 1)])
def test_monte_carlo_second_moment_agrees_with_t2_on_both_sides(lr_a, B):
    m = _linreg(n=8, d=3, seed=8)
    w = np.zeros(m.dim)
    a = stability.sharpness_nonuniformity(m, w).sharpness
    eta = lr_a / a
    rho = stability.second_moment_operator(m, w, eta, B).spectral_radius
    mc = stability.moment_growth(m, w, eta, B, order=2, n_runs=1024, steps=300, seed=1)
    assert (rho > 1) == (mc.rate > 1)
    assert mc.rate == pytest.approx(rho, rel=0.02)
    assert stability.is_linearly_stable(m, w, eta, B) == (rho <= 1)


# -- SGD at stable minima -----------------------------------------------------------------
def test_moment_growth_with_replacement_takes_batches_larger_than_n():
    m = _linreg(n=5, d=3, seed=12)
    w = np.zeros(m.dim)
    eta = 0.5 / stability.sharpness_nonuniformity(m, w).sharpness
    rho = stability.second_moment_operator(m, w, eta, 13, replacement=True).spectral_radius
    mc = stability.moment_growth(m, w, eta, 13, replacement=True, order=2, n_runs=256,
                                 steps=100, seed=1)
    assert mc.rate == pytest.approx(rho, rel=0.02)


def test_sgd_found_minima_are_linearly_stable_and_meet_the_moment_bounds():
    m = _linreg(n=12, d=4, seed=10)
    a = stability.sharpness_nonuniformity(m, np.zeros(m.dim)).sharpness
    for lr_a, B in [(0.5, 2), (1.2, 4), (1.6, 12)]:
        res = run_sgd(m, np.zeros(m.dim), lr_a / a, B, 3000, seed=2)
        assert res.loss[-1] < 1e-20, (lr_a, B)  # SGD reached the interpolating minimum
        w = res.w
        cond = stability.stability_conditions(m, w, lr_a / a, B)
        assert cond.stable and cond.sharpness_ok, (lr_a, B, cond)
        assert cond.spectral_radius == pytest.approx(
            _enumerated_rho(m.param_gradients(w), lr_a / a, B), rel=1e-10)
        assert stability.is_linearly_stable(m, w, lr_a / a, B)
        for k in (2, 3):
            assert stability.gradient_moment_ratio(m, w, lr_a / a, B, k=k) <= 1.0


# -- the stability criteria: exact, sufficient, necessary ------------------------------
def _audit_problem():
    """LinearRegression n 7, D 3 (seed 11, found by a seeded search), B 3, eta a = 1.16."""
    X = np.random.default_rng(11).standard_normal((7, 3))
    m = LinearRegression(X, X @ np.ones(3))
    a = np.linalg.eigvalsh(X.T @ X / 7)[-1]
    return m, 1.16 / a, 3


def test_a_stable_minimum_can_violate_wu_s_bound():
    """Regression (issue 13 item 1): s <= 1/(eta sqrt(kappa)) is not necessary for rho(T_2) <= 1."""
    m, eta, B = _audit_problem()
    w = np.zeros(m.dim)
    A = m.param_gradients(w)
    n, D = A.shape
    T = _enumerated_t2(A, eta, B)  # every one of the 35 batches
    rho = np.max(np.abs(np.linalg.eigvals(T)))
    # E ||x_t||^2 from x_0 ~ N(0, I/D), exactly: vec(E x x^T) evolves by T
    m2 = np.eye(D).ravel() / D
    for _ in range(400):
        m2 = T @ m2
    growth = np.trace(m2.reshape(D, D))
    Hs = np.einsum("ni,nj->nij", A, A)
    H = Hs.mean(0)
    Sigma = np.einsum("nij,njk->ik", Hs, Hs) / n - H @ H
    kap = (n - B) / (B * (n - 1))
    s = np.sqrt(np.linalg.eigvalsh(Sigma)[-1])
    assert rho < 0.98 and growth < 0.03  # stable, and visibly so
    assert eta * np.sqrt(kap) * s > 1.02  # yet the s bound fails
    c = stability.stability_conditions(m, w, eta, B)
    assert c.stable and c.spectral_radius == pytest.approx(rho, rel=1e-12)
    assert c.sharpness_ok and not c.nonuniformity_ok and not c.wu_pair
    P = np.eye(D) - eta * H
    assert c.vector_criterion == pytest.approx(
        np.linalg.eigvalsh(P @ P + eta**2 * kap * Sigma)[-1], rel=1e-12)
    assert not c.sufficient  # the criterion the pair is necessary for fails too
    assert stability.is_linearly_stable(m, w, eta, B)


def test_sufficient_implies_stable_implies_necessary_and_d1_sufficient_is_exact():
    rng = np.random.default_rng(21)
    seen = set()
    for trial in range(60):
        D = 1 if trial % 4 == 0 else 3
        X = rng.standard_normal((6, D)) * rng.uniform(0.3, 2.0, D)
        m = LinearRegression(X, np.zeros(6))
        w = np.zeros(D)
        B = int(rng.integers(1, 6))
        eta = rng.uniform(0.6, 1.05) * stability.critical_lr(m, w, B)
        c = stability.stability_conditions(m, w, eta, B)
        assert c.stable == (_enumerated_rho(X, eta, B) <= 1 + 1e-9)
        assert (not c.sufficient or c.stable) and (not c.stable or c.sharpness_ok)
        assert not c.sufficient or c.wu_pair
        if D == 1:  # T_2 is the number (1 - eta a)^2 + eta^2 kappa s^2
            assert c.sufficient == c.stable and (not c.stable or c.wu_pair)
        seen.add((c.stable, c.sufficient, c.wu_pair))
    # every implication was put to the test (stable without the pair: the audit problem above)
    assert {(True, True, True), (True, False, True), (False, False, False)} <= seen


def test_critical_lr_is_the_exact_boundary_by_enumeration():
    """Regression (issue 13 item 2): a_i = (2, 0), (0.5, +-1), B = 1."""
    from scipy.optimize import brentq

    A = np.array([[2.0, 0.0], [0.5, 1.0], [0.5, -1.0]])
    m = LinearRegression(A, np.zeros(3))
    w = np.zeros(2)
    exact = brentq(lambda e: _enumerated_rho(A, e, 1) - 1, 0.3, 2 / 1.5, xtol=1e-15)
    assert exact == pytest.approx(0.5565, abs=5e-5)
    assert stability.critical_lr(m, w, 1) == pytest.approx(exact, rel=1e-10)
    # H = diag(1.5, 2/3), Sigma = diag(79/24, 7/18), kappa = 1: sufficient criterion in closed form
    suff = 3 / (1.5**2 + 79 / 24)
    assert suff == pytest.approx(0.5414, abs=5e-5)
    assert stability.critical_lr(m, w, 1, criterion="sufficient") == pytest.approx(suff, rel=1e-10)
    # the closed-form curve is that sufficient criterion: it passes through (a, s) at eta = suff
    b = stability.stability_boundary(suff, 1, 3, points=3)  # a = 0, 1/suff, 2/suff
    assert b["a"][1] == pytest.approx(1 / suff)
    curve_s = np.sqrt(1 - (1 - suff * 1.5) ** 2) / suff
    assert curve_s == pytest.approx(np.sqrt(79 / 24), rel=1e-12)
    # per batch size, with and without replacement, against enumeration
    for rep, Bs in ((False, [1, 2, 3]), (True, [1, 2, 4])):
        etas = stability.critical_lr(m, w, Bs, replacement=rep)
        assert etas.shape == (3,)
        for eta, B in zip(etas, Bs):
            assert _enumerated_rho(A, eta * (1 - 1e-6), B, rep) < 1 < _enumerated_rho(
                A, eta * (1 + 1e-6), B, rep)
        assert np.all(stability.critical_lr(m, w, Bs, replacement=rep,
                                            criterion="sufficient") <= etas * (1 + 1e-12))
    assert stability.critical_lr(m, w, 3) == pytest.approx(2 / 1.5, rel=1e-14)  # B = n: 2/a


def test_critical_lr_power_path_matches_the_dense_path(monkeypatch):
    m, eta, B = _audit_problem()
    w = np.zeros(m.dim)
    dense = stability.critical_lr(m, w, [1, 3])
    monkeypatch.setattr(stability, "_DENSE_MAX", 0)
    assert rel_err(stability.critical_lr(m, w, [1, 3]), dense) < 1e-9


def test_input_smoothness_and_the_multiplicative_inequality():
    m = _net()
    w = m.random_point(seed=8)
    r = stability.input_smoothness(m, w)
    gW = np.sqrt(np.mean(np.sum(m.param_gradients(w) ** 2, axis=1)))
    gx = np.sqrt(np.mean(np.sum(m.input_gradients(w) ** 2, axis=1)))
    assert r.g_W == pytest.approx(gW, rel=1e-12) and r.g_x == pytest.approx(gx, rel=1e-12)
    assert r.all_hold and r.holds.shape == (m.n,)


@pytest.mark.parametrize("call, match", [
    (lambda m: stability.second_moment_operator(m, np.zeros(3), -0.1, 2), "lr"),
    (lambda m: stability.second_moment_operator(m, np.zeros(3), 0.1, 99), "batch"),
    (lambda m: run_sgd(m, np.zeros(3), 0.1, 0, 10), "batch"),
    (lambda m: run_sgd(m, np.full(3, np.nan), 0.1, 2, 10), "non-finite"),
    (lambda m: stability.moment_growth(m, np.zeros(3), 0.1, 2, order=0), "order"),
    (lambda m: stability.critical_lr(m, np.zeros(3), 2, criterion="wu"), "criterion"),
    (lambda m: stability.critical_lr(m, np.zeros(3), [2, 99]), "batch"),
    (lambda m: stability.stability_conditions(m, np.zeros(3), 0.0, 2), "lr"),
])
def test_bad_input_is_refused_with_the_argument_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(_linreg())


def test_bn_linreg_per_sample_jacobians_match_finite_differences(linreg_small):
    m, ref = linreg_small.model, linreg_small.ref
    w = linreg_small.points(seed=3)
    p, A, gx = m.per_sample_jacobians(w)
    assert rel_err(p, ref.predictions(w[None])[0]) < 1e-13
    assert rel_err(A, _fd(lambda x: ref.predictions(x[None])[0], w)) < 1e-7
    assert abs(A @ w).max() < 1e-12 * np.abs(A).max() * np.linalg.norm(w)  # scale invariance
    wt, _ = m.effective_predictor(w)
    assert rel_err(gx, np.broadcast_to(wt, gx.shape)) < 1e-13
    s = stability.sharpness_nonuniformity(m, w)
    assert s.sharpness > 0 and np.isfinite(s.nonuniformity)


# -- the Gram and Lanczos methods, other orders, verdicts at the boundary ----------------
def _line(x):
    """D = 1 linear regression: a_i = x_i, T_2 is the number (1 - eta a)^2 + eta^2 kappa s^2."""
    x = np.asarray(x, dtype=float)
    return LinearRegression(x[:, None], 0.7 * x)


_NET = TwoLayerNet(3, 4, X=np.random.default_rng(3).standard_normal((7, 3)), y=np.arange(7.0))


@pytest.mark.parametrize("model", [_linreg(30, 6, 1), _linreg(5, 12, 2), _NET],
                         ids=["n>D", "n<D", "net"])
def test_gram_and_lanczos_methods_match_dense_numpy(model):
    W = model.random_point(2, seed=1)
    A = model.jacobians(W)[1]
    for b in range(2):
        n = A.shape[1]
        H = A[b].T @ A[b] / n
        sq = np.sum(A[b] ** 2, axis=1)
        Sigma = (A[b].T * sq) @ A[b] / n - H @ H
        a, s2 = np.linalg.eigvalsh(H)[-1], np.linalg.eigvalsh(Sigma)[-1]
        for method in ("dense", "gram", "lanczos"):
            q = stability.sharpness_nonuniformity(model, W[b], method=method)
            assert q.method == method and q.n == n and q.dim == model.dim
            assert q.sharpness == pytest.approx(a, rel=1e-9)
            assert q.nonuniformity == pytest.approx(math.sqrt(s2), rel=1e-7)
            assert q.trace_h == pytest.approx(np.trace(H), rel=1e-12)
            assert q.rank == np.linalg.matrix_rank(A[b])
            assert q.converged and np.all(q.residuals <= 1e-7 * a)
    qb = stability.sharpness_nonuniformity(model, W, method="gram")
    assert qb.sharpness.shape == (2,) and qb.residuals.shape == (2, 2)
    assert qb.sharpness[1] == pytest.approx(stability.sharpness_nonuniformity(
        model, W[1], method="dense").sharpness, rel=1e-9)


def test_auto_method_switches_to_gram_beyond_128_parameters():
    model = _linreg(10, 130, 4)
    w = np.zeros(model.dim)
    q = stability.sharpness_nonuniformity(model, w)
    X = model.X
    assert q.method == "gram"
    assert q.sharpness == pytest.approx(np.linalg.eigvalsh(X.T @ X / 10)[-1], rel=1e-10)
    assert stability.sharpness_nonuniformity(_linreg(10, 128, 4), np.zeros(128)).method == "dense"


def _exact_line_rate(x, eta, B, order):
    """E_I |1 - eta h_I|^k over all B-subsets (D = 1): the exact per-step growth."""
    h = np.asarray(x, dtype=float) ** 2
    vals = [abs(1 - eta * h[list(I)].mean()) ** order
            for I in itertools.combinations(range(len(h)), B)]
    return float(np.mean(vals))


def test_moment_growth_rate_and_interval_match_the_enumerated_scalar_rate():
    x = [1.0, 0.5, -1.5, 2.0, 0.8]
    model, B, eta = _line(x), 2, 0.7
    exact = _exact_line_rate(x, eta, B, 2)
    wide = stability.moment_growth(model, np.zeros(1), eta, B, steps=200, n_runs=1024, level=0.99)
    narrow = stability.moment_growth(model, np.zeros(1), eta, B, steps=200, n_runs=1024, level=0.5)
    assert wide.rate == pytest.approx(exact, rel=0.03)
    assert wide.ci[0] < wide.rate < wide.ci[1]
    assert wide.ci[0] <= exact <= wide.ci[1]
    assert narrow.rate == wide.rate  # same particles, only the quantile differs
    assert wide.ci[0] < narrow.ci[0] < narrow.ci[1] < wide.ci[1]
    assert wide.burn_in == 50 and wide.level == 0.99 and wide.meta["dim"] == 1
    # the k = 2 rate is T_2's spectral radius, here the closed form
    a, s2 = np.mean(np.square(x)), np.mean(np.power(x, 4)) - np.mean(np.square(x)) ** 2
    kap = stability.kappa(5, B)
    assert exact == pytest.approx((1 - eta * a) ** 2 + eta ** 2 * kap * s2, rel=1e-12)


@pytest.mark.parametrize("order", [1, 4])
def test_is_linearly_stable_other_orders_follow_the_enumerated_rate(order):
    x = [1.0, 0.5, -1.5, 2.0, 0.8]
    model, B = _line(x), 2
    lo, hi = 0.3, 1.6  # exact rates well below and well above 1 for both orders
    assert _exact_line_rate(x, lo, B, order) < 0.8 and _exact_line_rate(x, hi, B, order) > 1.5
    assert stability.is_linearly_stable(model, np.zeros(1), lo, B, order=order, steps=120,
                                        n_runs=512)
    assert not stability.is_linearly_stable(model, np.zeros(1), hi, B, order=order, steps=120,
                                            n_runs=512)


def test_order_two_verdict_flips_at_the_critical_learning_rate():
    model = _linreg(6, 3, 7)
    w = np.zeros(3)
    eta = stability.critical_lr(model, w, 2)
    assert stability.is_linearly_stable(model, w, eta * (1 - 1e-6), 2)
    assert not stability.is_linearly_stable(model, w, eta * (1 + 1e-4), 2)
    assert stability.second_moment_operator(model, w, eta, 2).spectral_radius == pytest.approx(
        1.0, abs=1e-9)


def test_d1_verdicts_by_closed_form_including_a_point_between_two_tolerances():
    """D = 1: rho(T_2) = (1 - eta a)^2 + eta^2 kappa s^2 =: 1 + delta with delta = 5e-10."""
    x = np.array([1.0, -2.0, 0.5, 1.5])
    model, B = _line(x), 1
    a, s2 = np.mean(x ** 2), np.mean(x ** 4) - np.mean(x ** 2) ** 2
    kap = stability.kappa(4, B)
    assert kap == 1.0  # (n - B) / (B (n - 1)) = 3 / 3
    c, delta = a * a + kap * s2, 5e-10
    eta = (2 * a + math.sqrt(4 * a * a + 4 * c * delta)) / (2 * c)
    loose = stability.stability_conditions(model, np.zeros(1), eta, B)  # rtol 1e-9 > delta
    assert loose.spectral_radius == pytest.approx(1 + delta, abs=1e-13)
    assert loose.vector_criterion == pytest.approx(1 + delta, abs=1e-13)
    assert loose.stable and loose.sufficient
    tight = stability.stability_conditions(model, np.zeros(1), eta, B, rtol=1e-10)
    assert not tight.stable and not tight.sufficient
    # the stated bounds, by hand
    assert loose.sharpness_bound == 2 / eta and loose.sharpness == pytest.approx(a, rel=1e-14)
    assert loose.nonuniformity_bound == pytest.approx(1 / (eta * math.sqrt(kap)), rel=1e-15)
    assert loose.nonuniformity == pytest.approx(math.sqrt(s2), rel=1e-12)
    assert loose.sharpness_ok == (a <= 2 / eta)
    assert loose.nonuniformity_ok == (math.sqrt(s2) <= 1 / eta) and loose.wu_pair
    # s > 1 / eta with kappa = 1 forces rho > 1 here: Wu's s bound fails with the verdict
    rough = stability.stability_conditions(model, np.zeros(1), 1.1 / math.sqrt(s2), B)
    assert not rough.nonuniformity_ok and not rough.wu_pair and not rough.stable
    # critical_lr is that closed-form root for delta = 0: eta* = 2a / c
    assert stability.critical_lr(model, np.zeros(1), B) == pytest.approx(2 * a / c, rel=1e-10)
    assert stability.critical_lr(model, np.zeros(1), B, criterion="sufficient") == \
        pytest.approx(2 * a / c, rel=1e-10)


def test_violated_conditions_are_reported_as_violated():
    model = _linreg(6, 3, 8)
    w = np.zeros(3)
    q = stability.sharpness_nonuniformity(model, w)
    crit = stability.critical_lr(model, w, 2)
    c = stability.stability_conditions(model, w, 1.5 * crit, 2)
    assert not c.stable and not c.sufficient and c.spectral_radius > 1 and c.vector_criterion > 1
    over = stability.stability_conditions(model, w, 2.5 / q.sharpness, 2)
    assert not over.sharpness_ok and not over.stable and not over.wu_pair
    assert over.sharpness_bound == pytest.approx(0.8 * q.sharpness, rel=1e-14)
    full = stability.stability_conditions(model, w, 0.5 / q.sharpness, 6)  # B = n: kappa = 0
    assert full.kappa == 0 and full.nonuniformity_bound == math.inf and full.nonuniformity_ok
    assert full.stable and full.sufficient and full.sharpness_ok
    assert stability.critical_lr(model, w, 6) == pytest.approx(2 / q.sharpness, rel=1e-12)


def test_kappa_boundary_and_bounds_by_hand():
    assert stability.kappa(5, 5) == 0.0
    assert stability.kappa(5, 1) == 1.0
    assert stability.kappa(5, 2) == pytest.approx(3 / 8)
    assert stability.kappa(1, 1) == 1.0
    assert stability.kappa(5, 7, replacement=True) == pytest.approx(1 / 7)
    with pytest.raises(ValueError, match="batch"):
        stability.kappa(5, 6)
    b = stability.stability_boundary(0.5, 2, 5, points=3)
    assert b["a_max"] == 4.0 and b["kappa"] == pytest.approx(3 / 8)
    assert b["s_max"] == pytest.approx(math.sqrt(8 / 3) / 0.5, rel=1e-15)
    assert np.allclose(b["a"], [0.0, 2.0, 4.0])
    # (1 - eta a)^2 + eta^2 kappa s^2 = 1 at a = 2: s = sqrt(1 / kappa) / eta
    assert np.allclose(b["s"], [0.0, math.sqrt(8 / 3) / 0.5, 0.0], atol=1e-7)
    assert np.all(stability.stability_boundary(0.5, 5, 5)["s"] == np.inf)


def test_gradient_moment_ratio_by_hand():
    """x_i = (1, 2), (3, -1): k = 2 moment (1/n) sum ||a_i||_4^4 = (17 + 82) / 2."""
    model = LinearRegression(np.array([[1.0, 2.0], [3.0, -1.0]]), np.zeros(2))
    eta, B = 0.1, 2
    r1 = stability.gradient_moment_ratio(model, np.zeros(2), eta, B, k=1)
    assert r1 == pytest.approx((5 + 10) / 2 / (2 * 2 / eta), rel=1e-14)
    r2 = stability.gradient_moment_ratio(model, np.zeros(2), eta, B, k=2)
    assert r2 == pytest.approx((17 + 82) / 2 / (2 * 2 * (2 * B) / eta ** 2), rel=1e-14)


def test_rank_zero_hessian_is_trivially_stable():
    """All a_i = 0: H = 0, linearised SGD does not move (spectral radius 0 on an empty range)."""
    model = LinearRegression(np.zeros((4, 2)), np.zeros(4))
    op = stability.second_moment_operator(model, np.zeros(2), 0.1, 2)
    assert op.spectral_radius == 0.0 and op.rank == 0 and op.null_dim == 2
    assert stability.critical_lr(model, np.zeros(2), 2) == math.inf
    c = stability.stability_conditions(model, np.zeros(2), 0.1, 2)
    assert c.stable and c.sufficient and c.vector_criterion == 0.0



def test_input_smoothness_on_new_inputs_and_its_refusals():
    """X given: the model is evaluated on those inputs (as with_data does); a BN model,
    whose normalisation is over its training set, refuses other inputs."""
    net = _net()
    w = net.random_point(seed=2)
    X = np.random.default_rng(4).standard_normal((5, net.input_dim))
    got = stability.input_smoothness(net, w, X)
    want = stability.input_smoothness(net.with_data(X), w)
    np.testing.assert_allclose(got.g_x, want.g_x, rtol=1e-13)
    with pytest.raises(ValueError, match=r"X must have shape \(N, 3\)"):
        stability.input_smoothness(net, w, X[:, :2])
    bn = ps.BNLinearRegression.synthetic(d=4, n=6, seed=0)
    with pytest.raises(ValueError, match="training inputs only"):
        stability.input_smoothness(bn, bn.random_point(seed=0), np.ones((3, 4)))


# -- the almost-sure notion: the top Lyapunov exponent ------------------------------------
def test_lyapunov_exponent_matches_exhaustive_batches_where_the_second_moment_grows():
    """D = 1, n = 5, B = 2: the factor of batch I is 1 - eta mean_{i in I} x_i^2, so
    gamma = mean over all C(5, 2) batches of log |factor| and rho(T_2) = mean of factor^2.
    Here rho(T_2) = 1.05 > 1 (the second moment grows) while gamma = -0.254 < 0
    (almost every run converges): Ma & Ying's moment notion and the almost-sure one part."""
    x = np.array([1.0, 1.0, 1.0, 1.0, 3.0])
    lr, batch = 0.5, 2
    factors = np.array([1 - lr * np.mean(x[list(I)] ** 2)
                        for I in itertools.combinations(range(5), batch)])
    gamma, rho = float(np.mean(np.log(np.abs(factors)))), float(np.mean(factors ** 2))
    ly = stability.lyapunov_exponent(_line(x), [0.7], lr, batch, runs=16, steps=4000, seed=2)
    assert rho > 1 and gamma < 0
    assert abs(ly.exponent - gamma) < 4 * ly.stderr + 1e-3
    assert 0 < ly.stderr < 5e-3
    assert ly.moment_bound == pytest.approx(0.5 * math.log(rho), rel=1e-10)
    assert ly.converges and ly.exponent <= ly.moment_bound
    # Seeded: the same key gives the same bits, another key another estimate.
    again = stability.lyapunov_exponent(_line(x), [0.7], lr, batch, runs=16, steps=4000, seed=2)
    assert again.exponent == ly.exponent
    other = stability.lyapunov_exponent(_line(x), [0.7], lr, batch, runs=16, steps=4000, seed=3)
    assert other.exponent != ly.exponent


def test_lyapunov_exponent_of_full_batch_is_the_deterministic_rate():
    """B = n: every step multiplies by I - eta H, so gamma = log max_i |1 - eta lambda_i|
    on the range, which is also log(rho(T_2)) / 2."""
    model = _linreg(8, 3, 4)
    A = model.jacobians(np.zeros((1, 3)))[1][0]
    lam = np.linalg.eigvalsh(A.T @ A / 8)
    lr = 1.9 / lam[-1]
    exact = float(np.log(np.max(np.abs(1 - lr * lam))))
    ly = stability.lyapunov_exponent(model, np.zeros(3), lr, 8, runs=4, steps=3000)
    assert ly.exponent == pytest.approx(exact, abs=2e-3)
    assert ly.moment_bound == pytest.approx(exact, rel=1e-9)
    assert ly.dim == 3


def test_lyapunov_exponent_rejects_bad_arguments():
    m = _line([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="burn_in"):
        stability.lyapunov_exponent(m, [0.7], 0.1, 1, steps=10, burn_in=10)
    with pytest.raises(ValueError):
        stability.lyapunov_exponent(m, [0.7], 0.1, 4)  # B > n without replacement
    with pytest.raises(ValueError):
        stability.lyapunov_exponent(m, [0.7], 0.1, 1, runs=1)


# A model answers for itself whether it has per-sample Jacobians (models/_kinds.py):
# the scale-invariant models without them are refused by name, before any work.
@pytest.mark.parametrize("call", [
    lambda m, w: ps.stability.per_sample_gradients(m, w),
    lambda m, w: ps.stability.sharpness_nonuniformity(m, w),
    lambda m, w: ps.stability.second_moment_operator(m, w, 0.1, 2),
    lambda m, w: ps.stability.is_linearly_stable(m, w, 0.1, 2),
    lambda m, w: ps.stability.moment_growth(m, w, 0.1, 2),
    lambda m, w: ps.stability.lyapunov_exponent(m, w, 0.1, 2),
    lambda m, w: ps.stability.stability_conditions(m, w, 0.1, 2),
    lambda m, w: ps.stability.critical_lr(m, w, 2),
    lambda m, w: ps.stability.gradient_moment_ratio(m, w, 0.1, 2),
    lambda m, w: ps.stability.input_smoothness(m, w),
])
@pytest.mark.parametrize("model", [ps.Toy3D(c=10.0),
                                   ps.BNMatrixCompletion.synthetic(size=4, true_rank=1, rank=2,
                                                                   seed=0)])
def test_a_model_without_sample_jacobians_is_refused_by_name(call, model):
    with pytest.raises(TypeError, match=f"per-sample Jacobians.*{type(model).__name__}"):
        call(model, model.random_point(seed=0))

"""Gaps found by mutation testing (tools/mutation.py), closed with value checks.

Every test asserts numbers from an independent oracle: a hand computation
from the formula's statement, an enumeration over all batches, dense NumPy
algebra, an exact power-of-two identity, or a boundary input whose verdict
is fixed by the documented contract. They cover what the default suite only
checked by "some witness exists": rarely taken code paths (the Gram and
Lanczos methods, orders other than 2, confidence intervals, default
arguments), verdicts where they fail, and the edges of the input checks.
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest

import pysharp as ps
from pysharp import stability, theory
from pysharp._validation import (
    as_batch,
    as_float_array,
    as_positive_int,
    as_real,
    check_nonzero_rows,
)
from pysharp.dynamics import EOS, STABLE, UNSTABLE, first_eos_step, label_regimes
from pysharp.flow import FlowGeometry, FlowSolution, compare_to_flow
from pysharp.models import LinearRegression, TwoLayerNet
from pysharp.sgd import run_sgd, sgd_batches


def _unit(v):
    return v / np.linalg.norm(v)


# =========================================================================== theory
def test_gd_wd_norm_and_effective_lr_recursions_by_hand():
    """lr = 0.1, wd = 0.5 (decay 0.95), ||w||^2 = 4, ||grad L(w)||^2 = 9/4."""
    assert theory.effective_lr(0.1, 0.5, 4.0) == pytest.approx(0.1 / (0.95 * 4.0), rel=1e-15)
    # 0.95^2 * 4 + 0.01 * 2.25 = 3.61 + 0.0225
    assert theory.next_norm2(4.0, 0.1, 0.5, 2.25) == pytest.approx(3.6325, rel=1e-15)
    # 1 / (0.9025 (1/0.2 + 0.2 * 5)) = 1 / 5.415
    assert theory.next_effective_lr(0.2, 0.1, 0.5, 5.0) == pytest.approx(1 / 5.415, rel=1e-15)
    # the two recursions agree: ||grad L(theta)||^2 = ||w||^2 ||grad L(w)||^2
    lr, wd, n2, g2w = 0.03, 0.7, 2.5, 0.4
    eta1 = theory.effective_lr(lr, wd, theory.next_norm2(n2, lr, wd, g2w))
    eta1_direct = theory.next_effective_lr(theory.effective_lr(lr, wd, n2), lr, wd, g2w * n2)
    assert eta1 == pytest.approx(eta1_direct, rel=1e-14)


def test_theorem_4_2_at_lr_wd_exactly_one_half_by_hand():
    """lr = 1, wd = 1/2, rho2 = 1, ||w0||^2 = 100: eta_eff(0) = 1/50 <= 2/pi^2.

    T0 = ceil(ln(100 / pi^2) / 1) = ceil(2.3157) = 3; gradient bound 8 pi^4 * 0.5 = 4 pi^4;
    eta_eff bound 2 / (pi^2 / 2) = 4 / pi^2.
    """
    w0 = np.array([6.0, 0.0, 8.0])
    thm = theory.theorem_4_2(ps.Toy3D(), w0, 1.0, 0.5, rho2=1.0)
    assert thm.applicable and thm.reason == "hypotheses hold"
    assert thm.T0 == 3
    assert thm.grad_norm2_bound == pytest.approx(4 * math.pi ** 4, rel=1e-14)
    assert thm.eff_lr_bound == pytest.approx(4 / math.pi ** 2, rel=1e-14)
    over = theory.theorem_4_2(ps.Toy3D(), w0, 1.0, 0.5 * (1 + 1e-12), rho2=1.0)
    assert not over.applicable and "> 1/2" in over.reason
    for bad in ({"lr": 0.0}, {"wd": 0.0}, {"rho2": 0.0}):
        args = {"lr": 0.1, "wd": 0.1, "rho2": 1.0} | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            theory.theorem_4_2(ps.Toy3D(), w0, args["lr"], args["wd"], rho2=args["rho2"])


def test_theorem_4_2_with_a_sampled_rho2_says_so():
    model = ps.Toy3D(c=2.0)
    assert theory.smoothness_bound(model)[0] is None
    thm = theory.theorem_4_2(model, np.array([1.0, 2.0, 30.0]), 0.1, 0.01)
    assert thm.rho2_source == "sampled" and "approximate" in thm.reason
    assert thm.rho2 == theory.smoothness_constant(model)


def test_smoothness_constant_is_the_largest_sampled_hessian_norm():
    model = ps.Toy3D(c=3.0)
    thetas = model.random_point(16, seed=5)
    norms = [np.abs(np.linalg.eigvalsh(model.hessian(t))).max() for t in thetas]
    assert theory.smoothness_constant(model, samples=16, seed=5) == pytest.approx(max(norms),
                                                                                  rel=1e-12)


def test_full_rank_smoothness_bound_is_the_stated_formula():
    model = ps.BNLinearRegression.synthetic(d=4, n=15, seed=2)
    Xc = model.X - model.X.mean(axis=0)
    sv = np.linalg.svd(Xc, compute_uv=False)
    bound, why = theory.smoothness_bound(model)
    assert bound == pytest.approx(4 / math.sqrt(3) * np.var(model.y) * (sv[0] / sv[-1]) ** 2,
                                  rel=1e-12)
    assert theory.smoothness_bound(ps.BNMatrixCompletion.synthetic(size=4, rank=2))[0] == math.inf


def test_min_norm_interpolant_by_pseudo_inverse():
    model = ps.BNLinearRegression.synthetic(d=9, n=6, seed=4)
    Xc = model.X - model.X.mean(axis=0)
    wt = theory.min_norm_interpolant(model)
    yc = model.y - model.y.mean()
    assert np.allclose(Xc @ wt, yc, atol=1e-12)  # d >= n: it interpolates
    assert np.allclose(wt, np.linalg.lstsq(Xc, yc, rcond=None)[0], atol=1e-12)  # min norm
    with pytest.raises(TypeError):
        theory.min_norm_interpolant(ps.Toy3D())


def test_witness_is_the_first_record_meeting_all_three_conditions():
    tr = SimpleNamespace(steps=np.array([0, 10, 20, 30, 40]),
                         grad_norm=np.array([3.0, 2.0, 0.5, 0.5, 0.1]),
                         eff_lr=np.array([0.1, 0.05, 0.2, 0.1, 0.01]))

    def thm(T0, g2, eff, applicable=True):
        return theory.Theorem42(1.0, T0, g2, eff, applicable, "why")

    assert thm(35, 0.25, 0.1).witness(tr) == 30  # step 20 fails eta_eff, 40 is past T0
    assert thm(30, 0.25, 0.1).witness(tr) == 30  # t <= T0, inclusive
    assert thm(29, 0.25, 0.1).witness(tr) == -1
    assert thm(40, 0.25, 0.2).witness(tr) == 20  # bounds inclusive
    assert thm(40, 0.2499, 0.2).witness(tr) == 40
    batched = SimpleNamespace(steps=tr.steps,
                              grad_norm=np.stack([tr.grad_norm, tr.grad_norm * 0], 1),
                              eff_lr=np.stack([tr.eff_lr, tr.eff_lr * 0], 1))
    assert thm(40, 0.25, 0.2).witness(batched) == 20  # the first trajectory
    with pytest.raises(ValueError, match="why"):
        thm(40, 1.0, 1.0, applicable=False).witness(tr)


# ======================================================================== stability
def _linreg(n, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    return LinearRegression(X, X @ rng.standard_normal(d))


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


# ============================================================================= flow
def test_flow_velocity_and_dense_output_by_hand():
    geo = FlowGeometry(1.0, np.zeros(2), 1.0, 1, np.eye(2), np.array([3.0, 4.0]))
    assert np.allclose(geo.velocity, -2 * np.array([3.0, 4.0]) / 29)
    z0, z1 = np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])
    f0, f1 = np.array([0.0, 0.0, 1.0]), np.array([0.0, 0.0, -1.0])
    sol = FlowSolution(np.array([0.0, 2.0]), np.stack([z0, z1]), np.ones(2), np.zeros(2),
                       np.ones(2), True, "", np.stack([f0, f1]))
    assert np.array_equal(sol.sol(0.0), z0) and np.allclose(sol.sol(2.0), z1)
    # Hermite at s = 1/2, h = 2: (y0 + y1) / 2 + (h / 8) (f0 - f1), renormalised
    mid = (z0 + z1) / 2 + 0.25 * (f0 - f1)
    assert np.allclose(sol.sol(1.0), mid / np.linalg.norm(mid), atol=1e-15)
    with pytest.raises(ValueError, match="tau"):
        sol.sol(2.1)


def _fake_flow(D=3):
    rng = np.random.default_rng(0)
    zeta = np.array([_unit(rng.standard_normal(D)) for _ in range(3)])
    return FlowSolution(np.array([0.0, 1.0, 2.0]), zeta, np.ones(3), np.zeros(3), np.ones(3),
                        True, "", np.zeros((3, D)))


def test_compare_to_flow_aligns_at_the_eos_entry_step_by_default():
    flow = _fake_flow()
    lr, wd, entry = 0.5, 0.02, 50  # tau = 0.01 (t - 50)
    steps = np.arange(0, 301, 10)
    tau = lr * wd * (steps - entry)
    inside = (tau >= 0) & (tau <= 2)
    theta = np.tile(_unit(np.ones(3)), (len(steps), 1))
    theta[inside] = flow.sol(tau[inside])
    tr = SimpleNamespace(theta=theta, theta_steps=steps, lr=lr, wd=wd, eos_entry_step=entry)
    res = compare_to_flow(tr, flow)
    assert np.array_equal(res.steps, steps[inside]) and np.allclose(res.tau, tau[inside])
    assert res.max_error < 1e-14
    assert compare_to_flow(tr, flow, t_eos=40).max_error > 1e-3
    never = SimpleNamespace(theta=theta, theta_steps=steps, lr=lr, wd=wd, eos_entry_step=-1)
    res0 = compare_to_flow(never, flow)
    assert np.array_equal(res0.steps, steps[steps <= 200]) and res0.tau[0] == 0.0
    assert np.array_equal(res0.error, compare_to_flow(never, flow, t_eos=0).error)
    # a batch: trajectory 1 holds the aligned snapshots
    batched = SimpleNamespace(theta=np.stack([np.roll(theta, 1, axis=1), theta], 1),
                              theta_steps=steps, lr=np.array([0.5, lr]), wd=np.array([0.5, wd]),
                              eos_entry_step=np.array([0, entry]))
    assert compare_to_flow(batched, flow, index=1).max_error < 1e-14
    with pytest.raises(ValueError, match="theta_every"):
        compare_to_flow(SimpleNamespace(theta=None), flow)


# ========================================================================= dynamics
def test_regime_labels_at_the_tolerance_boundaries():
    ratio = np.array([np.nan, 1.89, 1.9, 2.0, 2.1, 2.1000001, 5.0])
    assert label_regimes(ratio, 0.05).tolist() == [STABLE, STABLE, EOS, EOS, EOS, UNSTABLE,
                                                   UNSTABLE]
    assert label_regimes(np.array([1.999, 2.0, 2.001]), 0.0).tolist() == [STABLE, EOS, UNSTABLE]


def test_eos_entry_of_a_run_that_jumps_from_stable_straight_to_unstable():
    regime = np.array([[STABLE, STABLE, STABLE],
                       [UNSTABLE, STABLE, EOS],
                       [EOS, STABLE, UNSTABLE]], dtype=np.int8)
    steps = np.array([0, 100, 200])
    assert first_eos_step(regime, steps).tolist() == [100, -1, 100]
    assert first_eos_step(np.zeros((0, 2), np.int8), np.zeros(0, np.int64)).tolist() == [-1, -1]


def test_default_record_and_sharpness_intervals():
    model, w0 = ps.Toy3D(c=1.0), np.array([1.0, 0.2, 0.3])
    tr = ps.run_gd_wd(model, w0, 0.05, 0.01, 2000)
    assert np.array_equal(tr.steps, np.arange(0, 2001, 2))  # steps // 1000
    assert np.array_equal(tr.sharpness_steps, np.arange(0, 2001, 100))  # steps // 20
    assert tr.loss.shape == (1001,) and tr.sharpness.shape == (21,) and tr.theta is None
    short = ps.run_gd_wd(model, w0, 0.05, 0.01, 7)
    assert np.array_equal(short.steps, np.arange(8)) and np.array_equal(short.sharpness_steps,
                                                                        np.arange(8))
    off = ps.run_gd_wd(model, w0, 0.05, 0.01, 6, record_every=3, sharpness_every=0, theta_every=2)
    assert off.top_grad is None and off.sharpness_steps.size == 0
    assert np.array_equal(off.steps, [0, 3, 6]) and np.array_equal(off.theta_steps, [0, 2, 4, 6])
    assert off.theta.shape == (4, 3)
    rms = ps.run_scalar_rmsprop(model, w0, 0.05, 0.01, 7)
    assert rms.theta is None and np.array_equal(rms.steps, np.arange(8))
    same = ps.run_scalar_rmsprop(model, w0, 0.05, 0.01, 7, beta=0.99, eps=1e-12)
    assert np.array_equal(rms.w, same.w)
    assert not np.array_equal(rms.w, ps.run_scalar_rmsprop(model, w0, 0.05, 0.01, 7, beta=0.9).w)


def test_the_last_record_is_the_final_iterate_and_regimes_follow_the_ratio():
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=0)
    w0 = model.random_point(3, seed=2, norm=2.0)
    tr = ps.run_gd_wd(model, w0, np.array([0.05, 0.5, 2.0]), 0.01, 300, record_every=10,
                      sharpness_every=50)
    assert tr.steps[-1] == 300 and tr.sharpness_steps[-1] == 300
    assert np.allclose(tr.loss[-1], model.loss(tr.w), rtol=1e-12, atol=1e-15)
    assert np.allclose(tr.norm2[-1], np.sum(tr.w ** 2, axis=1), rtol=1e-14)
    assert np.allclose(tr.norm2[0], 4.0, rtol=1e-14)
    assert np.allclose(tr.eff_lr[0], tr.lr / ((1 - tr.lr * tr.wd) * 4.0), rtol=1e-14)
    ratio = tr.eff_lr[np.searchsorted(tr.steps, tr.sharpness_steps)] * tr.sharpness
    assert np.allclose(tr.eos_ratio, ratio, rtol=1e-12)
    assert np.array_equal(tr.regime, label_regimes(tr.eos_ratio, 0.05))
    for b in range(3):
        hit = np.flatnonzero(tr.eos_ratio[:, b] >= 2 * 0.95)
        assert tr.eos_entry_step[b] == (tr.sharpness_steps[hit[0]] if hit.size else -1)
    assert tr.eos_entry_step[2] >= 0 and tr.eos_entry_step[0] == -1


def test_run_input_edges():
    model, w0 = ps.Toy3D(), np.array([1.0, 0.0, 0.0])
    for kwargs, match in [({"lr": 0.0}, "lr"), ({"lr": 2.0, "wd": 0.5}, "lr \\* wd"),
                          ({"lanczos_tol": 0.0}, "lanczos_tol"), ({"eos_tol": -1e-300}, "eos_tol"),
                          ({"lanczos_max_iter": 4}, "lanczos_max_iter"),
                          ({"jitter": -1e-300}, "jitter")]:
        args = {"lr": 0.1, "wd": 0.1} | kwargs
        lr, wd = args.pop("lr"), args.pop("wd")
        with pytest.raises(ValueError, match=match):
            ps.run_gd_wd(model, w0, lr, wd, 2, **args)
    tr = ps.run_gd_wd(model, w0, 2.0, 0.5 * (1 - 1e-12), 0, eos_tol=0.0, lanczos_max_iter=3)
    assert tr.steps.tolist() == [0] and tr.loss.shape == (1,)
    with pytest.raises(ValueError, match="both"):
        ps.run_pgd(model, w0, 0.1, 2, lr=0.1)
    with pytest.raises(ValueError, match="beta"):
        ps.run_scalar_rmsprop(model, w0, 0.1, 0.1, 2, beta=1.0)


# ======================================================================== sharpness
def test_eigenvector_sign_convention_and_k_equal_to_d():
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=1)
    W = model.random_point(2, seed=3, norm=3.0)
    dense = ps.spherical_sharpness(model, W, k=12, method="dense")
    H = model.hessian(W / 3.0)
    assert np.allclose(dense.eigenvalues, np.linalg.eigvalsh(H)[:, ::-1], atol=1e-10)
    for res in (dense, ps.spherical_sharpness(model, W, k=2, method="lanczos")):
        V = res.eigenvectors
        peak = np.take_along_axis(V, np.abs(V).argmax(-1)[..., None], -1)
        assert np.all(peak > 0)
        assert np.allclose(np.linalg.norm(V, axis=-1), 1.0)
    single = ps.spherical_sharpness(model, W[0], k=1, method="lanczos")
    assert single.eigenvalues.shape == (1,) and single.iterations.ndim == 0
    assert bool(single.converged) and single.iterations >= 8
    with pytest.raises(ValueError, match="k must be <= D"):
        ps.spherical_sharpness(model, W, k=13)
    with pytest.raises(ValueError, match="tol"):
        ps.spherical_sharpness(model, W, tol=0.0)
    top = ps.lanczos(lambda v: np.arange(1.0, 6.0) * v, 5, k=5)
    assert np.allclose(top.eigenvalues, [5, 4, 3, 2, 1])
    assert ps.lanczos(lambda v: np.arange(1.0, 6.0) * v, 5).eigenvalues.shape == (1,)
    with pytest.raises(ValueError, match="k must be <= dim"):
        ps.lanczos(lambda v: v, 5, k=6)
    with pytest.raises(ValueError, match="max_iter"):
        ps.lanczos(lambda v: v, 5, k=3, max_iter=2)


# ============================================================================= sgd
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


# ====================================================================== validation
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


# ======================================================================== models
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


# ========================================================================= sweeps
@pytest.mark.parametrize("kwargs, exc, match", [
    ({"lr": [0.0, 0.1]}, ValueError, "lr must be > 0"),
    ({"seeds": [1e19]}, ValueError, "seeds"),
    ({"seeds": [2 ** 63]}, ValueError, "seeds"),
    ({"init_norm": [0.0, 1.0]}, ValueError, "init_norm"),
    ({"progress": "yes"}, TypeError, "progress"),
    ({"steps": 0}, ValueError, "steps"),
    ({"chunk_size": 0}, ValueError, "chunk_size"),
    ({"eos_tol": -1e-300}, ValueError, "eos_tol"),
])
def test_sweep_rejects_bad_arguments_before_creating_the_store(tmp_path, kwargs, exc, match):
    pytest.importorskip("zarr")
    store = tmp_path / "s.zarr"
    args = {"lr": 0.1, "wd": 0.01, "steps": 10, "progress": False} | kwargs
    with pytest.raises(exc, match=match):
        ps.sweep("toy3d", store=store, **args)
    assert not store.exists()


def test_sweep_refuses_a_store_path_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        ps.sweep("toy3d", lr=0.1, wd=0.01, steps=10, store=path, progress=False)
    assert path.read_text() == "x"


def test_sweep_defaults_and_summaries_against_its_own_records_and_a_raw_run():
    pytest.importorskip("xarray")
    model = ps.Toy3D(c=4.0)
    ds = ps.sweep(model, lr=[0.05, 0.4], wd=[0.0, 0.02], seeds=[0, 1], init_norm=1.5, steps=200,
                  progress=False)
    assert np.array_equal(ds["step"], np.arange(0, 201, 2))  # steps // 100
    assert np.array_equal(ds["sharpness_step"], np.arange(0, 201, 10))  # steps // 20
    sharp = ds["sharpness"].values
    assert np.array_equal(ds["final_sharpness"].values, sharp[..., -1])
    assert np.array_equal(ds["min_sharpness"].values, np.nanmin(sharp, axis=-1))
    assert np.array_equal(ds["final_loss"].values, ds["loss"].values[..., -1])
    assert np.array_equal(ds["final_eff_lr"].values, ds["eff_lr"].values[..., -1])
    # one grid point against run_gd_wd from the documented start
    w0 = model.random_point(seed=1)
    w0 = 1.5 * w0 / np.linalg.norm(w0)
    tr = ps.run_gd_wd(model, w0, 0.05, 0.02, 200, record_every=2, sharpness_every=10)
    point = ds.sel(lr=0.05, wd=0.02, seed=1, init_norm=1.5)
    assert np.allclose(point["loss"], tr.loss, rtol=1e-12, atol=1e-15)
    assert np.allclose(point["sharpness"], tr.sharpness, rtol=1e-9)
    assert int(point["eos_entry_step"]) == int(tr.eos_entry_step)
    assert float(point["final_sharpness"]) == pytest.approx(tr.sharpness[-1], rel=1e-9)


# ================================================================ more defaults and edges
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


def test_rank_zero_hessian_is_trivially_stable():
    """All a_i = 0: H = 0, linearised SGD does not move (spectral radius 0 on an empty range)."""
    model = LinearRegression(np.zeros((4, 2)), np.zeros(4))
    op = stability.second_moment_operator(model, np.zeros(2), 0.1, 2)
    assert op.spectral_radius == 0.0 and op.rank == 0 and op.null_dim == 2
    assert stability.critical_lr(model, np.zeros(2), 2) == math.inf
    c = stability.stability_conditions(model, np.zeros(2), 0.1, 2)
    assert c.stable and c.sufficient and c.vector_criterion == 0.0


def test_spherical_sharpness_defaults_and_the_numpy_backend():
    model = ps.BNLinearRegression.synthetic(d=20, n=10, seed=3)
    W = model.random_point(2, seed=4)
    default = ps.spherical_sharpness(model, W, k=2)  # D > 16: Lanczos, seed 0
    seeded = ps.spherical_sharpness(model, W, k=2, seed=0)
    assert np.array_equal(default.eigenvectors, seeded.eigenvectors)
    other = ps.spherical_sharpness(model, W, k=2, seed=1)
    assert not np.array_equal(other.eigenvectors, seeded.eigenvectors)
    assert np.allclose(other.eigenvalues, seeded.eigenvalues, rtol=1e-9)
    dense = ps.spherical_sharpness(model, W, k=2, backend="numpy")  # "numpy" offers dense only
    assert np.allclose(dense.eigenvalues, seeded.eigenvalues, rtol=1e-9)
    assert np.all(dense.iterations == 20)
    with pytest.raises(ValueError, match="kernels only"):
        ps.spherical_sharpness(model, W, method="lanczos", backend="numpy")


def test_rmsprop_default_trajectory_offset_keys_the_jitter():
    model, w0 = ps.Toy3D(c=1.0), np.array([1.0, 0.2, 0.3])
    base = ps.run_scalar_rmsprop(model, w0, 0.05, 0.01, 5, jitter=0.01, sharpness_every=0)
    zero = ps.run_scalar_rmsprop(model, w0, 0.05, 0.01, 5, jitter=0.01, sharpness_every=0,
                                 first_trajectory=0)
    one = ps.run_scalar_rmsprop(model, w0, 0.05, 0.01, 5, jitter=0.01, sharpness_every=0,
                                first_trajectory=1)
    assert np.array_equal(base.w, zero.w) and not np.allclose(base.w, one.w, rtol=1e-6)


def test_gpu_arrays_other_than_cupy_are_refused():
    class FakeGpu:
        __cuda_array_interface__ = {}

    with pytest.raises(TypeError, match="CuPy"):
        as_float_array(FakeGpu(), "w")


def test_sweep_records_its_default_settings_and_resumes_the_progress_count(tmp_path, monkeypatch):
    pytest.importorskip("zarr")
    import json

    from pysharp.sweeps import _sweep

    seen = []

    class Recorder:
        def __init__(self, enabled, total, initial):
            seen.append((enabled, total, initial))

        def update(self, n):
            pass

        def close(self):
            pass

    monkeypatch.setattr(_sweep, "_Progress", Recorder)
    args = dict(lr=[0.05, 0.1, 0.2], wd=0.01, steps=40, store=tmp_path / "s.zarr", chunk_size=2)
    ds = ps.sweep("toy3d", **args)
    settings = json.loads(ds.attrs["pysharp_sweep"])["settings"]
    assert settings["eos_tol"] == 0.05 and settings["jitter"] == 0.0
    assert settings["record_every"] == 1 and settings["sharpness_every"] == 2
    again = ps.sweep("toy3d", **args)
    assert again.attrs["chunks_reused"] == 2 and again.attrs["chunks_computed"] == 0
    assert seen == [(True, 3, 0), (True, 3, 3)]  # resumed: the bar starts at 3 trajectories


def test_default_krylov_cap_admits_more_than_128_eigenpairs():
    """Default max_iter = min(D, 1024, max(128, 4k)): k = 130 of a diagonal D = 200 operator."""
    diag = np.arange(1.0, 201.0)
    res = ps.lanczos(lambda v: diag * v, 200, k=130)
    assert np.allclose(res.eigenvalues, diag[::-1][:130], rtol=1e-9)
    # iterations add up the Krylov steps of every run: the first (capped at
    # D = 200) and, for k > 1, the complement check runs of the locking scheme
    assert res.converged and 200 <= res.iterations <= 2 * 200

"""pysharp.theory: the GD+WD norm and effective-LR recursions, the min-norm interpolant,
Theorem 4.2 of Lyu, Li & Arora (2022) with its witness, and the smoothness constant rho_2.

Oracles: numbers worked out by hand from the paper's statement, Hessians
evaluated along a path into the set where rho_2 blows up, Hessian norms
maximised by sampling against the proven bound, the pseudo-inverse, and a
GD+WD run whose step 0 does not meet the theorem's gradient bound.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest

import pysharp as ps
from pysharp import theory


def _unit(v):
    return v / np.linalg.norm(v)


def _hess_norm(model, theta):
    return float(np.abs(np.linalg.eigvalsh(model.hessian(theta))).max())


# -- the formulas, by hand ---------------------------------------------------------------
def test_theorem_4_2_formulas_match_the_papers_statement_by_hand():
    """rho2 = 3, lr = 0.1, wd = 0.05 (lr wd = 0.005), ||w0||^2 = 0.3 pi^2 e^1.234.

    T0 = ceil(ln(||w0||^2 / (rho2 pi^2 lr)) / (2 lr wd)) = ceil(1.234 / 0.01) = 124;
    8 pi^4 rho2^2 wd lr = 0.36 pi^4 = 35.06727...; 2 / (pi^2 rho2 (1 - lr wd))
    = 2 / (2.985 pi^2) = 0.0678869...; eta_eff(0) = 0.1 / (0.995 ||w0||^2) = 0.0098...
    <= 1 / (2.985 pi^2) = 0.0339434...: applicable.
    """
    model, lr, wd = ps.Toy3D(), 0.1, 0.05
    w0 = _unit(np.array([1.0, 2.0, 2.0])) * math.sqrt(0.3 * math.pi ** 2 * math.exp(1.234))
    thm = ps.theory.theorem_4_2(model, w0, lr, wd, rho2=3.0)
    assert thm.T0 == 124
    assert thm.grad_norm2_bound == pytest.approx(35.067272772, rel=1e-10)
    assert thm.eff_lr_bound == pytest.approx(0.0678868902126, rel=1e-10)
    assert thm.applicable and thm.rho2 == 3.0 and thm.rho2_source == "given"
    # the eta_eff(0) hypothesis flips at ||w0||^2 = pi^2 rho2 lr = 0.3 pi^2
    for factor, ok in ((1 + 1e-9, True), (1 - 1e-9, False)):
        w = _unit(w0) * math.sqrt(0.3 * math.pi ** 2 * factor)
        t = ps.theory.theorem_4_2(model, w, lr, wd, rho2=3.0)
        assert t.applicable == ok
        assert t.T0 == (1 if ok else 0)  # ln(1 + 1e-9) / 0.01 rounds up to 1
    assert "eta_eff(0)" in t.reason
    t = ps.theory.theorem_4_2(model, w0, 2.0, 0.3, rho2=3.0)  # lr wd = 0.6 > 1/2
    assert not t.applicable and "1/2" in t.reason


# -- rho_2 infinite: not applicable --------------------------------------------------------
def test_bn_linreg_with_d_ge_n_has_unbounded_hessian_and_theorem_4_2_does_not_apply():
    """Regression (issue 13 item 3): the old test's model and start, where rho_2 = inf."""
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=3)
    null = np.linalg.svd(model._Xc)[2][-1]  # a unit vector of null(Xc)
    u = np.random.default_rng(0).standard_normal(model.dim)
    u = _unit(u - (u @ null) * null)
    norms = [_hess_norm(model, _unit(null + eps * u)) for eps in (1e-1, 1e-2, 1e-3)]
    assert norms[0] > 100
    for lo, hi in zip(norms, norms[1:]):
        assert 90 < hi / lo < 110  # ||H|| ~ 1 / dist^2: no finite sup
    assert ps.theory.smoothness_bound(model)[0] == math.inf
    assert ps.theory.smoothness_constant(model) == math.inf
    w0 = model.random_point(seed=0, norm=20.0)
    for rho2 in (None, 50.0):  # a finite rho2 from the caller cannot make it apply
        thm = ps.theory.theorem_4_2(model, w0, 0.5, 1e-3, rho2=rho2)
        assert not thm.applicable and "infinite" in thm.reason and "null(Xc)" in thm.reason
        assert thm.rho2 == math.inf
    with pytest.raises(ValueError, match="does not apply"):
        thm.witness(ps.run_gd_wd(model, w0, 0.5, 1e-3, 10, record_every=1, sharpness_every=0))


def test_bn_matrix_completion_has_unbounded_hessian_and_theorem_4_2_does_not_apply():
    model = ps.BNMatrixCompletion.synthetic(size=6, true_rank=2, rank=3, n_obs=18, seed=0)
    (m1, m2), r = model.shape, model.rank
    rng = np.random.default_rng(0)
    G, V = rng.standard_normal((m1, r)), rng.standard_normal((m2, r))
    norms = [_hess_norm(model, _unit(np.concatenate([(eps * G).ravel(), V.ravel()])))
             for eps in (1e-2, 1e-3, 1e-4)]  # towards U = 0, where every score is 0
    for lo, hi in zip(norms, norms[1:]):
        assert 80 < hi / lo < 120
    thm = ps.theory.theorem_4_2(model, model.random_point(seed=1, norm=30.0), 0.1, 1e-4)
    assert not thm.applicable and "infinite" in thm.reason


def test_bn_linreg_full_rank_bound_is_an_upper_bound():
    """d < n: rho_2 <= (4/sqrt 3) var(y) cond(Xc)^2; probe ||H|| hardest near the weakest
    direction."""
    model = ps.BNLinearRegression.synthetic(d=5, n=20, seed=1)
    bound, why = ps.theory.smoothness_bound(model)
    assert math.isfinite(bound) and why.startswith("proven")
    weak = np.linalg.svd(model._Xc)[2][-1]
    rng = np.random.default_rng(0)
    thetas = [_unit(weak + eps * rng.standard_normal(5))
              for eps in np.linspace(0.0, 2.0, 100) for _ in range(3)]
    worst = max(_hess_norm(model, t) for t in thetas)
    assert 0.3 * bound < worst <= bound
    assert ps.theory.smoothness_constant(model) <= worst  # the sampled value is a lower estimate
    thm = ps.theory.theorem_4_2(model, model.random_point(seed=0, norm=20.0), 0.5, 1e-3)
    assert thm.rho2 == bound and thm.rho2_source == "proven" and thm.applicable


# -- the claim on a run that has to work for it --------------------------------------------
def test_theorem_4_2_claim_holds_on_a_run_where_step_0_fails_the_bound():
    """Toy3D (c = 10): rho2 from a 1-degree grid of the sphere (max 44 = 4(1 + c), at the
    pole), doubled to stay an upper bound; lr wd = 1e-7 makes the gradient bound 0.60,
    below ||grad L(theta_0)||^2 = 43.7, and ||w0||^2 = 1.01e4 pi^2 rho2 lr makes
    eta_eff(0) so small that the witness needs the norm to decay for 5e5 steps."""
    model = ps.Toy3D(c=10.0)
    ph, az = np.meshgrid(np.linspace(0, np.pi, 181), np.linspace(0, 2 * np.pi, 361),
                         indexing="ij")
    grid = np.stack([np.sin(ph) * np.cos(az), np.sin(ph) * np.sin(az), np.cos(ph)],
                    -1).reshape(-1, 3)
    grid_max = np.abs(np.linalg.eigvalsh(model.hessian(grid))).max()
    assert grid_max == pytest.approx(44.0, rel=1e-9)
    assert ps.theory.smoothness_constant(model) <= grid_max
    rho2, lr, wd = 2 * grid_max, 0.05, 2e-6
    theta0 = _unit(np.array([1.0, -1.0, 0.3]))
    w0 = theta0 * math.sqrt(1.01e4 * math.pi ** 2 * rho2 * lr)
    thm = ps.theory.theorem_4_2(model, w0, lr, wd, rho2=rho2)
    assert thm.applicable
    assert thm.T0 == math.ceil(math.log(1.01e4) / (2 * lr * wd))
    g0 = float(np.sum(model.grad(theta0) ** 2))
    assert g0 > 50 * thm.grad_norm2_bound  # step 0 is no witness
    tr = ps.run_gd_wd(model, w0, lr, wd, thm.T0, record_every=2000, sharpness_every=0)
    t = thm.witness(tr)
    assert 100_000 < t <= thm.T0
    k = int(np.searchsorted(tr.steps, t))
    assert tr.grad_norm[k] ** 2 <= thm.grad_norm2_bound and tr.eff_lr[k] <= thm.eff_lr_bound
    assert np.all(tr.grad_norm[:k] ** 2 > thm.grad_norm2_bound)


# -- the recursions, the interpolant and Theorem 4.2's edges, by hand ----------------------
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



# -- the two-step drift (docs/theory.rst, "The two-step drift") ---------------------------
def _two_step_coefficient(model, phi, h):
    """c in phi_2 - phi_0 = -c h^2 grad_Gamma log lambda_1 for two projected-GD steps from
    phi + h v_1 at the effective LR 2 / lambda_1(phi), both ends projected onto Gamma."""
    from pysharp.flow import SharpnessReductionFlow

    flow = SharpnessReductionFlow(model)
    geo = flow.geometry(phi)
    tr = ps.run_pgd(model, _unit(phi + h * geo.top_vector), 2.0 / geo.sharpness, 2,
                    record_every=1, sharpness_every=0, theta_every=1)
    theta = np.asarray(tr.theta).reshape(3, -1)
    p0, _ = flow.project(theta[0])
    p2, _ = flow.project(theta[2])
    geo0 = flow.geometry(p0)
    h0 = float((theta[0] - p0) @ geo0.top_vector)
    g = geo0.log_grad
    return -float((p2 - p0) @ g) / (h0 ** 2 * float(g @ g))


def test_two_step_drift_coefficient_is_2_not_4():
    """The derivation's coefficient: 2 + O(h) (1.99968 at h = 3e-3, 1.99996 at 1e-3 on
    Toy3D(10) at phi = 0.6); the paper's sketch reads 4."""
    phi = 0.6
    zeta = np.array([np.cos(phi) / np.sqrt(2), np.cos(phi) / np.sqrt(2), np.sin(phi)])
    coef = [_two_step_coefficient(ps.Toy3D(10.0), zeta, h) for h in (3e-3, 1e-3)]
    assert abs(coef[1] - 2) < 2e-4
    assert abs(coef[1] - 2) < abs(coef[0] - 2)  # the error shrinks with h
    assert ps.period_two.DRIFT_COEFFICIENT == 2.0

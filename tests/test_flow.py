"""The sharpness-reduction flow and GD+WD against the theory (Lyu, Li, Arora 2022).

Also by hand on made-up solutions: the flow's velocity, its Hermite dense output and
compare_to_flow's alignment at the EoS entry step.
"""

from types import SimpleNamespace

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import pysharp as ps
from pysharp.flow import (
    FlowError,
    FlowGeometry,
    FlowSolution,
    SharpnessReductionFlow,
    compare_to_flow,
)
from pysharp.reproduce._common import loglog_slope, theory_start


def toy_point(phi):
    return np.array([np.cos(phi) / np.sqrt(2), np.cos(phi) / np.sqrt(2), np.sin(phi)])


def toy_phi(zeta):
    return np.arctan2(zeta[..., 2], (zeta[..., 0] + zeta[..., 1]) / np.sqrt(2))


@pytest.mark.parametrize("phi0", [1.2, 0.4, -0.8])
def test_toy3d_flow_matches_the_one_dimensional_ode(phi0):
    c = 10.0
    sol = SharpnessReductionFlow(ps.Toy3D(c)).integrate(toy_point(phi0), 0.5)
    assert sol.success, sol.message

    def G(p):
        return 2 * c * np.sin(p) * np.cos(p) / (1 + c * np.sin(p) ** 2)

    ref = solve_ivp(lambda t, p: -2 * G(p) / (4 + G(p) ** 2), (0, 0.5), [phi0],
                    t_eval=sol.tau, rtol=1e-12, atol=1e-14)
    assert np.max(np.abs(toy_phi(sol.zeta) - ref.y[0])) < 1e-6
    assert np.max(np.abs(sol.zeta[:, 0] - sol.zeta[:, 1])) < 1e-10          # on Gamma
    assert np.max(np.abs(np.linalg.norm(sol.zeta, axis=1) - 1)) < 1e-10     # on the sphere
    assert np.all(np.diff(sol.sharpness) <= 1e-12 * sol.sharpness[0])       # monotone
    # lambda_1 on Gamma is 4 (1 + c z^2) (docs/theory.rst, "The 3-D toy loss").
    np.testing.assert_allclose(sol.sharpness, 4 * (1 + c * sol.zeta[:, 2] ** 2), rtol=1e-9)
    # Dense output interpolates between the accepted steps.
    mid = 0.5 * (sol.tau[1] + sol.tau[2])
    assert abs(toy_phi(sol.sol(mid)) - solve_ivp(
        lambda t, p: -2 * G(p) / (4 + G(p) ** 2), (0, mid), [phi0], rtol=1e-12,
        atol=1e-14).y[0, -1]) < 1e-5


def test_toy3d_geometry_closed_forms():
    flow = SharpnessReductionFlow(ps.Toy3D(10.0))
    geo = flow.geometry(toy_point(0.3))
    assert geo.rank == 1 and geo.tangent.shape == (3, 1)
    tangent = np.array([-np.sin(0.3) / np.sqrt(2), -np.sin(0.3) / np.sqrt(2), np.cos(0.3)])
    assert abs(abs(geo.tangent[:, 0] @ tangent) - 1) < 1e-12
    np.testing.assert_allclose(abs(geo.top_vector @ np.array([1, -1, 0]) / np.sqrt(2)), 1,
                               rtol=1e-12)
    P = flow.tangent_projection(toy_point(0.3))
    np.testing.assert_allclose(P, np.outer(tangent, tangent), atol=1e-12)


def test_projection_lands_on_gamma():
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=3)
    flow = SharpnessReductionFlow(model)
    zeta, res = flow.project(model.random_point(seed=4))
    assert res < 1e-12 and abs(np.linalg.norm(zeta) - 1) < 1e-14
    assert model.loss(zeta) < 1e-20
    assert flow.geometry(zeta).rank == 8 - 2  # BN linreg: rank n - 2 on Gamma


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bn_linreg_flow_converges_to_min_norm_interpolant(seed):
    model = ps.BNLinearRegression.synthetic()
    wt = ps.theory.min_norm_interpolant(model)
    sol = SharpnessReductionFlow(model).integrate(model.random_point(seed=seed), 20.0)
    assert sol.success, sol.message
    cos = sol.zeta[-1] @ wt / np.linalg.norm(wt)
    assert cos >= 1 - 1e-8
    assert np.all(np.diff(sol.sharpness) <= 1e-10 * sol.sharpness[0])
    assert np.all(sol.rank == 18)


def test_flow_reports_failures_instead_of_hiding_them():
    model = ps.Toy3D(0.0)  # c = 0: lambda_1 is constant, the flow does not move
    sol = SharpnessReductionFlow(model).integrate(toy_point(0.5), 0.1)
    assert sol.success and np.allclose(sol.zeta[-1], sol.zeta[0])
    flow = SharpnessReductionFlow(ps.Toy3D(10.0), gap_tol=2.0)  # every gap counts as degenerate
    bad = flow.integrate(toy_point(0.5), 0.1)
    assert not bad.success and "degenerate" in bad.message
    with pytest.raises(FlowError):
        SharpnessReductionFlow(ps.Toy3D(10.0)).geometry(np.array([1.0, 0.0, 0.0]))  # off Gamma
    with pytest.raises(ValueError, match="tau_end"):
        SharpnessReductionFlow(ps.Toy3D()).integrate(toy_point(0.1), -1.0)


def _tracking_errors(model, zeta0, lr, wds, tau_end, seed=0, jitter=0.0):
    flow = SharpnessReductionFlow(model)
    sol = flow.integrate(zeta0, tau_end, project_start=False)
    errors = []
    for i, wd in enumerate(wds):
        w0 = theory_start(zeta0, sol.sharpness[0], lr, wd, seed=seed + i, perturbation=1e-4)
        steps = int(round(tau_end / (lr * wd)))
        tr = ps.run_gd_wd(model, w0, lr, wd, steps, record_every=steps, sharpness_every=0,
                          theta_every=max(1, steps // 200), jitter=jitter, seed=seed + i)
        errors.append(compare_to_flow(tr, sol, t_eos=0).max_error)
    return np.array(errors)


def test_gd_wd_tracks_the_flow_bn_linreg():
    model = ps.BNLinearRegression.synthetic()
    zeta0, _ = SharpnessReductionFlow(model).project(model.random_point(seed=0))
    wds = np.array([1e-3, 1e-4, 1e-5])
    err = _tracking_errors(model, zeta0, 0.5, wds, 1.0)
    assert np.all(np.diff(err) < 0), err
    assert loglog_slope(0.5 * wds, err) >= 0.25
    assert err[-1] < 0.01


def test_gd_wd_tracks_the_flow_toy3d():
    # Jitter restarts the oscillation whenever x - y collapses to 0 in float64.
    err = _tracking_errors(ps.Toy3D(10.0), toy_point(1.0), 0.1, np.array([1e-2, 1e-3, 1e-4]),
                           0.3, jitter=1e-9)
    assert np.all(np.diff(err) < 0), err
    assert err[-1] < 0.05


def test_descent_lemma_in_the_stable_regime():
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=3)
    lr, wd = 0.5, 1e-3
    tr = ps.run_gd_wd(model, model.random_point(seed=1, norm=6.0), lr, wd, 200, record_every=1,
                      sharpness_every=1, theta_every=1)
    assert np.all(tr.eos_ratio < 1.0)  # stable throughout
    theta, eff, g2 = tr.theta, tr.eff_lr, tr.grad_norm ** 2
    grad_theta = model.grad(theta)  # grad L(theta_t) on the unit sphere
    # lambda_max: sup of lambda_1(H) over the segment theta_t - alpha grad L(theta_t),
    # alpha <= eff_t.
    alphas = np.linspace(0, 1, 6)
    seg = (theta[:-1, None, :]
           - (alphas[None, :, None] * eff[:-1, None, None]) * grad_theta[:-1, None, :])
    pts = seg.reshape(-1, model.dim)
    lam = ps.spherical_sharpness(model, pts).eigenvalues[:, 0] / np.sum(pts * pts, axis=1)
    lam_max = lam.reshape(len(theta) - 1, len(alphas)).max(axis=1)
    bound = tr.loss[:-1] - eff[:-1] * (1 - eff[:-1] * lam_max / 2) * g2[:-1]
    assert np.all(tr.loss[1:] <= bound + 1e-13 * tr.loss[:-1])


@pytest.mark.parametrize("lr,wd", [(0.5, 2e-4), (0.5, 1e-3), (1.0, 1e-4)])
def test_eos_entry_happens_theorem_4_4(lr, wd):
    model = ps.BNLinearRegression.synthetic()
    tr = ps.run_gd_wd(model, model.random_point(seed=0, norm=10.0), lr, wd,
                      int(12 / (lr * wd)), sharpness_every=500)
    assert tr.regime[0] == ps.dynamics.STABLE and tr.eos_entry_step > 0
    after = tr.eos_ratio[tr.sharpness_steps >= tr.eos_entry_step + 5000]
    assert np.all(np.abs(after - 2) <= 0.1)


def test_matrix_completion_sharpness_falls_and_low_rank_emerges():
    model = ps.BNMatrixCompletion.synthetic(size=20, true_rank=2, rank=20, seed=0)
    tr = ps.run_gd_wd(model, model.random_point(seed=1, norm=5.0), 0.2, 1e-3, 20_000,
                      record_every=100, sharpness_every=500, theta_every=500)
    entry = tr.eos_entry_step
    assert entry > 0
    at_entry = tr.sharpness[tr.sharpness_steps == entry][0]
    assert tr.sharpness[-1] < 0.5 * at_entry

    def gap(theta):
        U, V = model.factors(theta)
        s = np.linalg.svd(U @ V.T, compute_uv=False)
        return s[2] / s[1]

    k = int(np.searchsorted(tr.theta_steps, entry))
    assert gap(tr.theta[-1]) < 0.6 * gap(tr.theta[k])
    assert model.test_loss(tr.theta[-1]) < 0.5 * model.test_loss(tr.theta[k])


def test_projection_reaches_a_critical_point_from_outside_newtons_basin():
    """BNTwoLayerNet from these starts: one flow round left Newton diverging (||grad|| 6e2,
    1e3, 7e-2 for seeds 1, 2, 4); further flow rounds bring it into the basin."""
    model = ps.BNTwoLayerNet.synthetic(n=10, d=4, width=3, teacher_width=2)
    flow = SharpnessReductionFlow(model)
    for seed in (1, 2, 4):
        zeta, residual = flow.project(model.random_point(seed=seed))
        assert residual <= 1e-9 and abs(np.linalg.norm(zeta) - 1) < 1e-14
        assert np.linalg.norm(model.grad(zeta)) == residual


# -- the flow's velocity and dense output, compare_to_flow's alignment -------------------
def _unit(v):
    return v / np.linalg.norm(v)


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



def test_geometry_at_a_flat_minimiser_scales_with_the_loss():
    """Sharpness below 1 is still curvature: BN linear regression's loss, and so its
    sharpness, scale with var(y), while Gamma (set by the direction of y) does not."""
    base = ps.BNLinearRegression.synthetic(d=12, n=8, seed=3)
    X, y = np.asarray(base.X), np.asarray(base.y)
    zeta, _ = SharpnessReductionFlow(base).project(base.random_point(seed=4))
    small, large = (SharpnessReductionFlow(ps.BNLinearRegression(X, s * y)).geometry(zeta)
                    for s in (1e-3, 1.0))
    assert 0 < small.sharpness < 1 < large.sharpness
    np.testing.assert_allclose(small.sharpness * 1e6, large.sharpness, rtol=1e-10)
    np.testing.assert_allclose(small.log_grad, large.log_grad, rtol=1e-8, atol=1e-12)

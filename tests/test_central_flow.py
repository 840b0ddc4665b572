"""The central flow (Cohen, Damian et al. 2024) against gradient flow, the edge and GD+WD."""

import dataclasses

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import pysharp as ps
from pysharp.central_flow import CentralFlow, central_start
from pysharp.flow import CentralFlow as ReExported
from pysharp.flow import SharpnessReductionFlow, compare_to_central
from pysharp.reproduce._common import theory_start


@pytest.fixture(scope="module")
def bn():
    return ps.BNLinearRegression.synthetic(d=20, n=12, seed=0)


def test_reexported_from_flow():
    assert ReExported is CentralFlow


def _eta(lr, wd):
    """eta' = lr (-log(1 - a)) / a: the ODE's time-1 map with a frozen gradient is
    GD+WD's step (1 - a) w - lr g."""
    a = lr * wd
    return lr * -np.log1p(-a) / a if a else lr


def test_eta_makes_the_time_one_map_gd_wd_step():
    lr, wd = 0.5, 1e-3
    g, w = np.random.default_rng(0).standard_normal((2, 5))
    sol = solve_ivp(lambda t, y: np.log1p(-lr * wd) * y - _eta(lr, wd) * g, (0, 1), w,
                    rtol=1e-13, atol=1e-15, method="DOP853")
    np.testing.assert_allclose(sol.y[:, -1], (1 - lr * wd) * w - lr * g, rtol=0, atol=1e-12)
    cf = CentralFlow(ps.Toy3D(1.0), lr=lr, wd=wd, k_max=1)
    assert cf._eta == pytest.approx(_eta(lr, wd), rel=1e-15)


def _gradient_flow(model, w0, lr, wd, t_eval):
    a = lr * wd
    def rhs(t, w):
        return np.log1p(-a) * w - _eta(lr, wd) * model.grad(w, backend="numpy")
    return solve_ivp(rhs, (0, t_eval[-1]), w0, t_eval=t_eval, rtol=1e-12, atol=1e-14,
                     method="DOP853").y.T


def test_below_the_edge_it_is_gradient_flow(bn):
    lr, wd = 0.05, 1e-3                      # eff_lr * S stays far below 2
    w0 = bn.random_point(seed=1, norm=3.0)
    sol = CentralFlow(bn, "gd_wd", lr=lr, wd=wd).integrate(w0, 60, record_every=10)
    assert sol.success, sol.message
    assert np.all(sol.X == 0) and np.all(sol.sharpness[:, 0] < 1.9)
    ref = _gradient_flow(bn, w0, lr, wd, sol.t)
    assert np.max(np.abs(sol.w - ref)) < 1e-8 * np.max(np.abs(ref))
    np.testing.assert_array_equal(sol.loss_pred, sol.loss)
    np.testing.assert_array_equal(sol.norm2_pred, sol.norm2)


def test_two_layer_net_below_the_edge_is_gradient_flow():
    rng = np.random.default_rng(0)
    net = ps.TwoLayerNet(3, 6, X=rng.standard_normal((8, 3)), y=rng.standard_normal(8))
    w0 = net.random_point(seed=0)
    lr = 0.5 / np.linalg.eigvalsh(net.hessian(w0))[-1]
    sol = CentralFlow(net, "gd", lr=lr, k_max=2).integrate(w0, 40, record_every=10)
    assert sol.success and np.all(sol.X == 0)
    ref = solve_ivp(lambda t, w: -lr * net.grad(w), (0, 40), w0, t_eval=sol.t, rtol=1e-12,
                    atol=1e-14, method="DOP853").y.T
    assert np.max(np.abs(sol.w - ref)) < 1e-8


def test_scalar_rmsprop_below_the_edge_matches_its_ode(bn):
    lr, wd, beta = 0.01, 1e-3, 0.9
    w0 = bn.random_point(seed=1, norm=3.0)
    sol = CentralFlow(bn, "scalar_rmsprop", lr=lr, wd=wd, beta=beta).integrate(
        w0, 50, record_every=10)
    assert sol.success and np.all(sol.X == 0)
    a = lr * wd

    def rhs(t, y):
        g = bn.grad(y[:-1], backend="numpy")
        return np.append(np.log1p(-a) * y[:-1] - _eta(lr, wd) / (np.sqrt(y[-1]) + 1e-12) * g,
                         -np.log(beta) * (g @ g - y[-1]))

    y0 = np.append(w0, (1 - beta) * bn.grad(w0) @ bn.grad(w0))
    ref = solve_ivp(rhs, (0, 50), y0, t_eval=sol.t, rtol=1e-12, atol=1e-14, method="DOP853").y.T
    assert np.max(np.abs(sol.w - ref[:, :-1])) < 1e-7 * np.max(np.abs(ref))
    assert np.max(np.abs(sol.nu - ref[:, -1])) < 1e-7 * np.max(ref[:, -1])


@pytest.fixture(scope="module")
def edge_run(bn):
    """GD+WD's flow from just below the edge (eff_lr * S = 0.98 x 2) on Gamma."""
    lr, wd = 0.5, 1e-3
    flow = SharpnessReductionFlow(bn)
    zeta, _ = flow.project(bn.random_point(seed=3))
    w0 = theory_start(zeta, flow.geometry(zeta).sharpness, lr, wd, perturbation=1e-3)
    cf = CentralFlow(bn, "gd_wd", lr=lr, wd=wd, k_max=2)
    return cf, cf.integrate(w0, 400, record_every=10)


def test_at_the_edge_it_keeps_the_edge(bn, edge_run):
    cf, sol = edge_run
    assert sol.success, sol.message
    eos = sol.eos
    assert not eos[0] and eos[-1]
    first = int(np.argmax(eos))
    settled = sol.t >= sol.t[first] + 40
    assert np.max(np.abs(sol.sharpness[settled, 0] - 2)) < 1e-6
    assert np.all(sol.sharpness[:, 1] < 1.9) and np.all(sol.X[:, 1, 1] == 0)
    # The recorded sharpness is eta' lambda_1, from an independent eigensolver.
    eta = _eta(cf.lr, cf.wd)
    for w, s in zip(sol.w[::10], sol.sharpness[::10, 0]):
        lam = np.linalg.eigvalsh(bn.hessian(w / np.linalg.norm(w), backend="numpy"))[-1]
        assert abs(eta / (w @ w) * lam - s) < 1e-10
    # Time-averaged loss exceeds the loss at the central point by exactly 1/2 <H, Sigma>.
    lam = sol.sharpness[:, 0] / eta
    np.testing.assert_allclose(sol.loss_pred - sol.loss, 0.5 * lam * sol.X[:, 0, 0], rtol=1e-12)


def test_the_edge_condition_holds_along_the_field(bn, edge_run):
    """d(eta' lambda_1)/dt along the field, by finite differences of an independent
    eigensolver, is relax (2 - eta' lambda_1): zero on the edge."""
    cf, sol = edge_run
    w = sol.w[-1]
    st = cf.state(w)
    assert st.X[0, 0] > 0
    eta = _eta(cf.lr, cf.wd)

    def sharp(v):
        return eta * np.linalg.eigvalsh(bn.hessian(v, backend="numpy"))[-1]

    d = 1e-4
    rate = (sharp(w + d * st.velocity) - sharp(w - d * st.velocity)) / (2 * d)
    assert abs(rate - cf.relax * (2 - st.sharpness[0])) < 1e-7
    # Without the oscillation term the sharpness would rise: X is needed.
    v0 = np.log1p(-cf.lr * cf.wd) * w - eta * st.grad
    assert (sharp(w + d * v0) - sharp(w - d * v0)) / (2 * d) > 1e-6


def test_order_two_edge_and_fourth_order_terms(bn, edge_run):
    """Order 2 on the edge: eta' (lambda_1 + P X / 6) = 2, loss4 = P X^2 / 24 and the drift
    gains eta' X^2 R / 24, with P = D^4L[u^4] and R = D^5L[u^4, .] from finite differences
    of the NumPy Hessian (an independent path)."""
    cf1, sol = edge_run
    cf = CentralFlow(bn, "gd_wd", lr=cf1.lr, wd=cf1.wd, k_max=1, order=2)
    sol2 = cf.integrate(sol.w[-1], 60, record_every=20)
    w = sol2.w[-1]
    st = cf.state(w)
    eta, X = _eta(cf.lr, cf.wd), st.X[0, 0]
    u = st.U[:, 0]

    def curv(v):
        return u @ bn.hessian(v, backend="numpy") @ u

    e = 2e-3
    c = [curv(w + j * e * u) for j in (-2, -1, 0, 1, 2)]
    P = (-c[4] + 16 * c[3] - 30 * c[2] + 16 * c[1] - c[0]) / (12 * e * e)
    assert X > 0 and abs(eta * (st.eigenvalues[0] + P * X / 6) - 2) < 1e-6
    assert st.sharpness[0] > 2 + 1e-3                # the central point sits above 2 here
    assert st.loss4 == pytest.approx(P * X ** 2 / 24, rel=1e-4)
    assert st.loss_pred == pytest.approx(st.loss + 0.5 * st.eigenvalues[0] * X + st.loss4,
                                         rel=1e-14)
    # The drift v = rho w - eta (g + X T / 2 + X^2 R / 24): its R along u is
    # D^5L[u, u, u, u, u], the third derivative of u^T H(w + e u) u in e.
    T = bn.third(w, u, backend="numpy")
    R = ((np.log1p(-cf.lr * cf.wd) * w - st.velocity) / eta - st.grad - X * T / 2) * 24 / X ** 2
    d3 = (c[4] - 2 * c[3] + 2 * c[1] - c[0]) / (2 * e ** 3)
    assert R @ u == pytest.approx(d3, rel=1e-3)


def test_complementarity_solver_kkt():
    """Random convex instances with a 3 x 3 PSD block and a free diagonal entry:
    x in the cone, s = c + Q x in the dual cone, <x, s> = 0."""
    rng = np.random.default_rng(0)
    pairs = [(0, 0), (1, 1), (2, 2), (3, 3), (0, 1), (0, 2), (1, 2)]
    cluster = [0, 1, 2]

    def block(z):
        B = np.diag(z[:3])
        for n, (i, j) in enumerate(pairs[4:], start=4):
            B[i, j] = B[j, i] = z[n] / np.sqrt(2)
        return B

    for trial in range(20):
        G = rng.standard_normal((7, 9))
        Q, c = G @ G.T, rng.standard_normal(7)
        x = CentralFlow._solve(c, Q, pairs, cluster)
        s = c + Q @ x
        scale = np.abs(x).max() + 1e-300
        assert np.linalg.eigvalsh(block(x))[0] > -1e-12 * scale and x[3] >= 0
        assert np.linalg.eigvalsh(block(s))[0] > -1e-8 and s[3] > -1e-8
        assert abs(x @ s) < 1e-8 * (1 + scale)
        if trial == 0:  # at least one instance with an active off-diagonal block
            assert np.count_nonzero(np.abs(x[4:]) > 1e-8) or np.linalg.matrix_rank(block(x)) > 0


def test_predict_matches_the_built_in_predictions(edge_run):
    _, sol = edge_run
    norm2 = sol.predict(lambda w: w @ w, lambda w, V: 2 * V)
    np.testing.assert_allclose(norm2, sol.norm2_pred, rtol=1e-14)


@pytest.mark.parametrize("steps, settle, order, loss_tol, norm2_tol", [
    # Measured: 800 steps 8.3e-4, 1.06e-3 (order 1) and 2.2e-4, 1.3e-4 (order 2, the start's
    # transient); 12000 steps 6.14e-4, 1.23e-3 and 4.4e-7, 3.2e-5. Order 1's residual is the
    # O(X) term of the period-two orbit: GD's mean point sits at eff_lr * S = 2.003 (the edge's
    # P X / 6 shift) and its averaged loss carries P X^2 / 24 (module notes).
    (800, 500, 1, 1.2e-3, 1.6e-3), (800, 500, 2, 3.3e-4, 2e-4),
    pytest.param(12000, 2000, 1, 9e-4, 1.8e-3, marks=pytest.mark.slow),
    pytest.param(12000, 2000, 2, 7e-7, 5e-5, marks=pytest.mark.slow)])
def test_predicted_averages_track_gd_wd_on_bn_linear_regression(bn, steps, settle, order,
                                                                loss_tol, norm2_tol):
    lr, wd, t0 = 0.5, 1e-3, 3000
    w0 = bn.random_point(seed=1, norm=3.0)
    tr = ps.run_gd_wd(bn, w0, lr, wd, t0 + steps + 200, record_every=1, sharpness_every=500,
                      theta_every=1)
    assert 0 < tr.eos_entry_step < t0
    sol = CentralFlow(bn, "gd_wd", lr=lr, wd=wd, k_max=1, order=order).integrate(
        central_start(tr, t0), steps, record_every=100)
    assert sol.success and np.all(sol.eos)
    cmp = compare_to_central(tr, sol, t0=t0, window=200)
    late = cmp.steps >= t0 + settle          # after the start's transient
    assert late.sum() >= 3
    assert np.max(cmp.loss_rel_error[late]) < loss_tol
    assert np.max(cmp.norm2_rel_error[late]) < norm2_tol


def _rmsprop_run(bn, t0, steps):
    lr, wd, beta = 0.01, 0.01, 0.99
    w0 = bn.random_point(seed=1, norm=3.0)
    tr = ps.run_scalar_rmsprop(bn, w0, lr, wd, t0 + steps + 101, beta=beta, record_every=1,
                               sharpness_every=100, theta_every=1)
    # nu_t from the recorded effective LR lr / ((sqrt(nu_t) + eps)(1 - a) ||w_t||^2)
    nu = (lr / (tr.eff_lr * (1 - lr * wd) * tr.norm2) - 1e-12) ** 2
    return tr, nu, CentralFlow(bn, "scalar_rmsprop", lr=lr, wd=wd, beta=beta, k_max=1)


def test_scalar_rmsprop_at_the_edge_keeps_it_and_tracks_the_averages(bn):
    """Scalar RMSprop (lr 0.01, wd 0.01, beta 0.99: EoS from step 1100, nu still growing by
    3e-4 a step): started at step 2000 from the mean point, the flow keeps
    eta' lambda_1 / (sqrt(nu) + eps) = 2 and its predicted loss (1/2 lambda_1 X: L(w) is
    1e-9 of it), ||w||^2 and nu follow the run's 200-step averages. Measured after step
    2750: loss 2.3e-4, ||w||^2 5.6e-5, nu 1.2e-4 (relative); the edge to 1.6e-9."""
    t0, steps = 2000, 1500
    tr, nu, cf = _rmsprop_run(bn, t0, steps)
    assert 0 < tr.eos_entry_step < t0 - 500
    nu0 = 0.25 * (nu[t0 - 1] + 2 * nu[t0] + nu[t0 + 1])
    sol = cf.integrate(central_start(tr, t0), steps, record_every=50, nu0=nu0)
    assert sol.success and np.all(sol.eos)
    settled = sol.t >= 100
    assert np.max(np.abs(sol.sharpness[settled, 0] - 2)) < 1e-6
    # Independent check of the edge: eta' lambda_1 / (sqrt(nu) + eps) from the NumPy Hessian.
    for w, n, s in zip(sol.w[settled][::10], sol.nu[settled][::10], sol.sharpness[settled][::10]):
        lam = np.linalg.eigvalsh(bn.hessian(w, backend="numpy"))[-1]
        assert abs(_eta(cf.lr, cf.wd) / (np.sqrt(n) + 1e-12) * lam - s[0]) < 1e-9
    cmp = compare_to_central(tr, sol, t0=t0, window=200)
    late = cmp.steps >= t0 + 750
    assert late.sum() >= 10
    assert np.max(cmp.loss_rel_error[late]) < 3.5e-4
    assert np.max(cmp.norm2_rel_error[late]) < 1e-4
    c = np.concatenate([[0.0], np.cumsum(nu)])
    s = cmp.steps[late]
    nu_avg = (c[s + 101] - c[s - 100] - 0.5 * (nu[s - 100] + nu[s + 100])) / 200
    nu_flow = sol.nu[np.isin(t0 + sol.t, s)]
    assert np.max(np.abs(nu_flow / nu_avg - 1)) < 2e-4


def test_compare_to_central_centres_the_window():
    """A loss linear in t plus a period-two part averages to the line at every record."""
    model = ps.Toy3D(1.0)
    tr = ps.run_gd_wd(model, np.array([0.6, 0.5, 0.3]), 0.1, 1e-3, 400, record_every=1,
                      sharpness_every=0)
    t = tr.steps.astype(float)
    tr = dataclasses.replace(tr, loss=1 + 1e-3 * t + 0.1 * (-1.0) ** t,
                             norm2=2 - 1e-3 * t + 0.2 * (-1.0) ** t)
    sol = CentralFlow(model, lr=0.1, wd=1e-3, k_max=1).integrate(tr.w, 300, record_every=50)
    cmp = compare_to_central(tr, sol, t0=50, window=100)
    np.testing.assert_array_equal(cmp.steps, [50, 100, 150, 200, 250, 300, 350])
    np.testing.assert_allclose(cmp.loss_avg, 1 + 1e-3 * cmp.steps, rtol=1e-14)
    np.testing.assert_allclose(cmp.norm2_avg, 2 - 1e-3 * cmp.steps, rtol=1e-14)


def test_central_start_removes_a_drifting_period_two_part():
    model = ps.Toy3D(1.0)
    tr = ps.run_gd_wd(model, np.array([0.6, 0.5, 0.3]), 0.1, 1e-3, 20, record_every=1,
                      sharpness_every=0, theta_every=1)
    t = tr.steps.astype(float)[:, None]
    c0, c1, h0, h1 = np.array([[1.0, 2, 3], [0.1, -0.2, 0.05], [0.3, 0.1, -0.2],
                               [0.01, 0.02, 0.03]])
    w = c0 + t * c1 + (-1.0) ** t * (h0 + t * h1)
    n2 = np.sum(w * w, axis=1)
    tr = dataclasses.replace(tr, theta=w / np.sqrt(n2)[:, None], norm2=n2,
                             theta_steps=tr.steps)
    np.testing.assert_allclose(central_start(tr, 7), c0 + 7 * c1, rtol=1e-14)
    with pytest.raises(ValueError, match="steps"):
        central_start(tr, 20)


def test_substeps(bn):
    cf = CentralFlow(bn, lr=0.1, wd=1e-3, k_max=1)
    w0 = bn.random_point(seed=1, norm=3.0)
    a = cf.integrate(w0, 10, substeps=4, record_every=5)
    b = cf.integrate(w0, 10, max_step=0.25, record_every=5)
    np.testing.assert_array_equal(a.w, b.w)
    assert a.n_steps >= 40
    assert cf.integrate(w0, 10, record_every=5).n_steps < 40       # the default cap is 2
    with pytest.raises(ValueError, match="not both"):
        cf.integrate(w0, 10, substeps=4, max_step=0.25)
    with pytest.raises(ValueError, match="substeps"):
        cf.integrate(w0, 10, substeps=0)
    with pytest.raises(TypeError, match="substeps"):
        cf.integrate(w0, 10, substeps=0.5)


@pytest.mark.slow
def test_predicted_averages_track_gd_wd_on_toy3d():
    """Toy3D's EoS cycles through loss spikes: averages over 1000 steps."""
    model, lr, wd, phi = ps.Toy3D(1.0), 0.5, 1e-3, 0.8
    flow = SharpnessReductionFlow(model)
    zeta, _ = flow.project(np.array([np.cos(phi) / np.sqrt(2), np.cos(phi) / np.sqrt(2),
                                     np.sin(phi)]))
    w0 = theory_start(zeta, flow.geometry(zeta).sharpness, lr, wd, perturbation=1e-3)
    tr = ps.run_gd_wd(model, w0, lr, wd, 2600, record_every=1, sharpness_every=0,
                      jitter=1e-9, seed=1)
    sol = CentralFlow(model, "gd_wd", lr=lr, wd=wd, k_max=1).integrate(w0, 2000,
                                                                       record_every=100)
    assert sol.success
    cmp = compare_to_central(tr, sol, window=1000)
    assert np.max(cmp.norm2_rel_error) < 5e-3      # measured 1.3e-3
    assert np.max(cmp.loss_rel_error) < 0.15       # measured 0.047


@pytest.mark.slow
def test_slow_limit_drift_along_gamma_is_the_sharpness_reduction_flow(bn):
    lr, wd = 0.5, 1e-4
    flow = SharpnessReductionFlow(bn)
    zeta, _ = flow.project(bn.random_point(seed=3))
    w0 = theory_start(zeta, flow.geometry(zeta).sharpness, lr, wd, perturbation=1e-4)
    tau_end = 0.5
    steps = int(tau_end / (lr * wd))
    sol = CentralFlow(bn, "gd_wd", lr=lr, wd=wd, k_max=1).integrate(w0, steps,
                                                                   record_every=steps // 5)
    sr = flow.integrate(zeta, tau_end, project_start=False)
    theta = sol.w / np.linalg.norm(sol.w, axis=1, keepdims=True)
    err = np.linalg.norm(theta - sr.sol(lr * wd * sol.t), axis=1)
    moved = np.linalg.norm(theta[-1] - theta[0])
    assert err[-1] < 0.05 * moved


def test_validation(bn):
    with pytest.raises(ValueError, match="method"):
        CentralFlow(bn, "adam", lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        CentralFlow(bn, lr=-1.0)
    with pytest.raises(ValueError, match="weight decay"):
        CentralFlow(bn, "gd", lr=0.1, wd=1e-3)
    with pytest.raises(ValueError, match="k_max"):
        CentralFlow(bn, lr=0.1, k_max=21)
    with pytest.raises(TypeError, match="model"):
        CentralFlow("bn", lr=0.1)
    net = ps.TwoLayerNet(2, 3, X=np.ones((4, 2)), y=np.ones(4))
    with pytest.raises(ValueError, match="scale invariant"):
        CentralFlow(net, "gd_wd", lr=0.1, wd=1e-3)
    cf = CentralFlow(bn, lr=0.1, wd=1e-3)
    with pytest.raises(ValueError, match="w0"):
        cf.integrate(np.zeros(20), 10)
    with pytest.raises(ValueError, match="w0"):
        cf.integrate(np.ones(19), 10)
    with pytest.raises(ValueError, match="steps"):
        cf.integrate(np.ones(20), 0)
    with pytest.raises(ValueError, match="order"):
        CentralFlow(bn, lr=0.1, order=3)
    with pytest.raises(ValueError, match="k_max = 1"):
        CentralFlow(bn, lr=0.1, k_max=2, order=2)
    with pytest.raises(ValueError, match="k_max = 1"):
        CentralFlow(bn, "scalar_rmsprop", lr=0.1, k_max=1, order=2)
    sol = cf.integrate(np.ones(20), 20, record_every=10)
    with pytest.raises(ValueError, match="every step"):
        compare_to_central(ps.run_gd_wd(bn, np.ones(20), 0.1, 1e-3, 20, record_every=2), sol)

"""Projected GD with a Quasi-RMSprop scheduler, and the sharpness-reduction flow it tracks.

docs/theory.rst, "Quasi-RMSprop": 1/eta_{t+1}^2 = beta/eta_t^2 + c ||g_t||^2 +
kappa c^2 ||g_t||^4 eta_t^2 with c = (1 - beta)/lr^2; at EoS the run tracks
d zeta/d tau = -2 g / (4 + (2/c) ||g||^2) in the time tau = t lr^2 / 2.
"""

import numpy as np
import pytest

import pysharp as ps
from pysharp.flow import SharpnessReductionFlow, compare_to_flow


def test_gd_wd_is_the_quasi_rmsprop_scheduler_of_its_parameters():
    """Lemma 3.1 through the scheduler: PGD with from_gd_wd(lr, wd) follows GD+WD's
    directions and effective LR (a different code path: compared before EoS)."""
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=3)
    w0 = model.random_point(seed=1, norm=3.0)
    lr, wd, steps = 0.2, 1e-3, 400
    gd = ps.run_gd_wd(model, w0, lr, wd, steps, record_every=1, sharpness_every=50,
                      theta_every=1)
    assert gd.eos_entry_step == -1  # stable throughout: rounding is not amplified
    eta0 = lr / ((1 - lr * wd) * (w0 @ w0))
    q = ps.run_pgd(model, w0, eta0, steps, scheduler=ps.QuasiRMSprop.from_gd_wd(lr, wd),
                   record_every=1, sharpness_every=50, theta_every=1)
    assert np.abs(q.theta - gd.theta).max() < 1e-12
    np.testing.assert_allclose(q.eff_lr, gd.eff_lr, rtol=1e-11)
    # and the recorded effective LR obeys the scheduler's recursion step by step
    s = ps.QuasiRMSprop(lr=0.05, beta=0.97, kappa=0.3)
    r = ps.run_pgd(model, w0, 0.3, 50, scheduler=s, record_every=1, sharpness_every=0)
    g2 = r.grad_norm[:-1] ** 2
    c = s.c
    expected = 1 / np.sqrt(s.beta / r.eff_lr[:-1] ** 2 + c * g2
                           + s.kappa * (c * g2) ** 2 * r.eff_lr[:-1] ** 2)
    np.testing.assert_allclose(r.eff_lr[1:], expected, rtol=1e-13)


def _toy_start():
    model = ps.Toy3D(10.0)
    phi0 = 1.0
    zeta0 = np.array([np.cos(phi0) / np.sqrt(2), np.cos(phi0) / np.sqrt(2), np.sin(phi0)])
    p = np.random.default_rng(0).standard_normal(3)
    p -= (p @ zeta0) * zeta0
    return model, zeta0, zeta0 + 1e-4 * p / np.linalg.norm(p)


@pytest.mark.parametrize("cb", [0.5, 8.0])
def test_quasi_rmsprop_tracks_its_own_flow(cb):
    """1 - beta = cb lr^2. The weight 2/c on ||g||^2 matters: with GD+WD's weight (1)
    the run and the flow part ways, with 2/c they stay within a few 1e-2, closer at
    the smaller lr."""
    model, zeta0, theta0 = _toy_start()
    errors = []
    for lr in (0.03, 0.015):
        s = ps.QuasiRMSprop(lr=lr, beta=1 - cb * lr ** 2)
        flow = SharpnessReductionFlow(model, scheduler=s)
        assert flow.time_per_step == pytest.approx(lr ** 2 / 2)
        sol = flow.integrate(zeta0, 1.5, project_start=False)
        eta0 = 0.98 * 2 / flow.geometry(zeta0).sharpness
        tr = ps.run_pgd(model, theta0, eta0, int(1.5 / flow.time_per_step), scheduler=s,
                        record_every=10, sharpness_every=0, theta_every=10, jitter=1e-9,
                        seed=1)
        errors.append(compare_to_flow(tr, sol, t_eos=0).max_error)
    assert errors[1] < 0.05 and errors[1] < errors[0]
    plain = SharpnessReductionFlow(model).integrate(zeta0, 1.5, project_start=False)
    assert compare_to_flow(tr, plain, t_eos=0).max_error > 0.15


def test_scheduler_arguments_are_checked():
    model, _, theta0 = _toy_start()
    s = ps.QuasiRMSprop(lr=0.05, beta=0.99)
    with pytest.raises(ValueError, match="not both"):
        ps.run_pgd(model, theta0, 0.1, 10, lr=0.1, wd=1e-3, scheduler=s)
    with pytest.raises(ValueError, match="beta must be < 1"):
        ps.run_pgd(model, theta0, 0.1, 10, scheduler=ps.QuasiRMSprop(lr=0.05, beta=1.0))
    with pytest.raises(TypeError, match="QuasiRMSprop"):
        ps.run_pgd(model, theta0, 0.1, 10, scheduler={"lr": 0.05})
    pytest.importorskip("numba")  # without it, "numba is not installed" comes first
    with pytest.raises(ps.BackendUnavailable, match="Quasi-RMSprop"):
        ps.run_pgd(model, theta0, 0.1, 10, scheduler=s, backend="numba")

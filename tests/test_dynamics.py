"""pysharp.dynamics: regime labels, EoS entry, recording defaults and the run input checks.

Oracles: the regime tolerance worked out by hand at its boundaries, hand-made
regime tables, the documented default intervals, and the last record
recomputed from the final iterate.
"""

from __future__ import annotations

import numpy as np
import pytest

import pysharp as ps
from pysharp.dynamics import EOS, STABLE, UNSTABLE, first_eos_step, label_regimes


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


def test_rmsprop_default_trajectory_offset_keys_the_jitter():
    model, w0 = ps.Toy3D(c=1.0), np.array([1.0, 0.2, 0.3])
    base = ps.run_scalar_rmsprop(model, w0, 0.05, 0.01, 5, jitter=0.01, sharpness_every=0)
    zero = ps.run_scalar_rmsprop(model, w0, 0.05, 0.01, 5, jitter=0.01, sharpness_every=0,
                                 first_trajectory=0)
    one = ps.run_scalar_rmsprop(model, w0, 0.05, 0.01, 5, jitter=0.01, sharpness_every=0,
                                first_trajectory=1)
    assert np.array_equal(base.w, zero.w) and not np.allclose(base.w, one.w, rtol=1e-6)



def test_adaptive_pgd_refuses_a_decay_factor_that_is_not_positive():
    model, w0 = ps.Toy3D(), np.array([1.0, 0.0, 0.0])
    for lr, wd in [(2.0, 0.5), (3.0, 0.5)]:  # lr wd = 1 and 1.5
        with pytest.raises(ValueError, match="lr \\* wd must be < 1"):
            ps.run_pgd(model, w0, 0.1, 2, lr=lr, wd=wd)


def test_theta_final_is_the_direction_of_the_final_iterate():
    tr = ps.run_gd_wd(ps.Toy3D(), np.array([[3.0, 1.0, 0.5], [0.2, -4.0, 1.0]]), 0.1, 0.05, 20)
    norms = np.linalg.norm(tr.w, axis=-1, keepdims=True)
    assert (np.abs(norms - 1) > 0.1).all()  # the iterates are off the sphere
    np.testing.assert_allclose(tr.theta_final, tr.w / norms, rtol=1e-15)

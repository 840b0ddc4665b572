"""The trajectory engine against plain NumPy loops, identities and the theory."""

import numpy as np
import pytest

import pysharp as ps
from pysharp._engine import loader
from pysharp.reference import (
    BNLinearRegressionReference,
    BNMatrixCompletionReference,
    BNTwoLayerNetReference,
    Toy3DReference,
)


def _models():
    lin = ps.BNLinearRegression.synthetic(d=12, n=8, seed=3)
    mc = ps.BNMatrixCompletion.synthetic(size=6, true_rank=2, rank=3, n_obs=18, seed=0)
    toy = ps.Toy3D(c=10.0)
    bn2 = ps.BNTwoLayerNet.synthetic(n=10, d=4, width=3, teacher_width=2, seed=1)
    return [
        (lin, BNLinearRegressionReference(lin.X, lin.y)),
        (mc, BNMatrixCompletionReference(mc.rows, mc.cols, mc.values, mc.shape, mc.rank)),
        (toy, Toy3DReference(10.0)),
        (bn2, BNTwoLayerNetReference(bn2.X, bn2.y, 3)),
    ]


MODELS = _models()
IDS = ["bn_linreg", "bn_mc", "toy3d", "bn_two_layer"]


def numpy_gd_wd(ref, w0, lr, wd, steps):
    """The update of docs/theory.rst, "GD with weight decay", one step at a time, on the
    NumPy oracle."""
    w = np.array(w0, dtype=float)[None]
    for _ in range(steps):
        w = (1 - lr * wd) * w - lr * ref.grad(w)
    return w[0]


@pytest.mark.parametrize("model,ref", MODELS, ids=IDS)
def test_engine_matches_numpy_loop(model, ref):
    # Stable phase (large initial norm), where rounding differences do not grow.
    w0 = model.random_point(seed=1, norm=4.0)
    lr, wd, steps = 0.1, 1e-3, 10_000
    tr = ps.run_gd_wd(model, w0, lr, wd, steps, record_every=steps, sharpness_every=0)
    expected = numpy_gd_wd(ref, w0, lr, wd, steps)
    assert np.max(np.abs(tr.w - expected)) <= 1e-12 * np.max(np.abs(expected))


@pytest.mark.parametrize("model,ref", MODELS, ids=IDS)
def test_batched_equals_single_and_threads_and_chunks(model, ref):
    W0 = model.random_point(6, seed=2, norm=2.0)
    lr = np.linspace(0.05, 0.3, 6)
    kw = dict(record_every=10, sharpness_every=50, jitter=1e-3, seed=7)
    full = ps.run_gd_wd(model, W0, lr, 1e-3, 200, **kw)
    for b in (0, 4):
        one = ps.run_gd_wd(model, W0[b], lr[b], 1e-3, 200, first_trajectory=b, **kw)
        np.testing.assert_array_equal(one.w, full.w[b])
        np.testing.assert_array_equal(one.sharpness, full.sharpness[:, b])
    chunk = ps.run_gd_wd(model, W0[3:], lr[3:], 1e-3, 200, first_trajectory=3, **kw)
    np.testing.assert_array_equal(chunk.w, full.w[3:])
    np.testing.assert_array_equal(chunk.loss, full.loss[:, 3:])
    core = loader.core()
    try:
        core.set_num_threads(1)
        serial = ps.run_gd_wd(model, W0, lr, 1e-3, 200, **kw)
    finally:
        core.set_num_threads(core.max_threads() if core.max_threads() > 1 else 2)
    np.testing.assert_array_equal(serial.w, full.w)
    np.testing.assert_array_equal(serial.eos_ratio, full.eos_ratio)


def test_jitter_is_reproducible_and_keyed_by_seed():
    model = ps.Toy3D()
    w0 = np.array([1.0, 1.0, 0.3])  # on Gamma: without jitter x - y stays exactly 0
    a = ps.run_gd_wd(model, w0, 0.1, 1e-2, 500, jitter=1e-6, seed=1, sharpness_every=0)
    b = ps.run_gd_wd(model, w0, 0.1, 1e-2, 500, jitter=1e-6, seed=1, sharpness_every=0)
    c = ps.run_gd_wd(model, w0, 0.1, 1e-2, 500, jitter=1e-6, seed=2, sharpness_every=0)
    quiet = ps.run_gd_wd(model, w0, 0.1, 1e-2, 500, sharpness_every=0)
    np.testing.assert_array_equal(a.w, b.w)
    assert not np.array_equal(a.w, c.w)
    assert quiet.w[0] == quiet.w[1] and a.w[0] != a.w[1]


@pytest.mark.parametrize("model,ref", MODELS, ids=IDS)
def test_lemma_3_1_gd_wd_equals_adaptive_pgd(model, ref):
    w0 = model.random_point(seed=4, norm=3.0)
    # 1000 steps: into EoS, where rounding differences later grow chaotically.
    lr, wd, steps = 0.2, 5e-3, 1000
    gd = ps.run_gd_wd(model, w0, lr, wd, steps, record_every=1, theta_every=100,
                      sharpness_every=0)
    eff0 = lr / ((1 - lr * wd) * (w0 @ w0))
    pgd = ps.run_pgd(model, w0 / np.linalg.norm(w0), eff0, steps, lr=lr, wd=wd,
                     record_every=1, theta_every=100, sharpness_every=0)
    assert np.max(np.abs(gd.theta - pgd.theta)) < 1e-10
    np.testing.assert_allclose(pgd.eff_lr, gd.eff_lr, rtol=1e-10)


@pytest.mark.parametrize("model,ref", MODELS, ids=IDS)
def test_norm_and_effective_lr_recursions(model, ref):
    lr, wd = 0.3, 1e-2
    tr = ps.run_gd_wd(model, model.random_point(seed=5, norm=2.0), lr, wd, 300,
                      record_every=1, sharpness_every=0)
    grad_w2 = tr.grad_norm ** 2 / tr.norm2  # ||grad L(w)||^2 = ||grad L(theta)||^2 / ||w||^2
    np.testing.assert_allclose(tr.norm2[1:], ps.theory.next_norm2(tr.norm2[:-1], lr, wd,
                                                                  grad_w2[:-1]), rtol=1e-13)
    np.testing.assert_allclose(tr.eff_lr[1:], ps.theory.next_effective_lr(
        tr.eff_lr[:-1], lr, wd, tr.grad_norm[:-1] ** 2), rtol=1e-12)
    np.testing.assert_allclose(tr.eff_lr, ps.theory.effective_lr(lr, wd, tr.norm2), rtol=1e-15)


@pytest.mark.parametrize("model,ref", MODELS, ids=IDS)
def test_lanczos_matches_dense_eigvalsh(model, ref):
    W = model.random_point(5, seed=6, norm=1.7)
    res = ps.spherical_sharpness(model, W, k=2, method="lanczos")
    H = model.hessian(W)
    dense = np.linalg.eigvalsh(H)[:, ::-1][:, :2] * np.sum(W * W, axis=1)[:, None]
    scale = np.abs(dense[:, :1])
    assert np.all(np.abs(res.eigenvalues - dense) <= 1e-9 * scale)
    assert res.converged.all() and res.iterations.min() >= min(model.dim, 8)
    # The eigenvectors are eigenvectors: H v = lambda v on the sphere.
    Hv = model.hvp(W, res.eigenvectors[:, 0])
    lam = res.eigenvalues[:, 0] / np.sum(W * W, axis=1)
    assert np.max(np.abs(Hv - lam[:, None] * res.eigenvectors[:, 0])) < 1e-8 * np.abs(lam).max()
    auto = ps.spherical_sharpness(model, W[0], method="dense")
    assert auto.eigenvalues.shape == (1,)
    np.testing.assert_allclose(auto.eigenvalues, dense[0, :1], rtol=1e-12)


def test_lanczos_operator_repeated_top_eigenvalue_and_breakdown():
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.standard_normal((30, 30)))
    evals = np.concatenate([[5.0, 5.0, 5.0], np.linspace(-3, 4, 27)])
    A = (Q * evals) @ Q.T
    res = ps.lanczos(lambda x: A @ x, 30, k=1)
    assert abs(res.eigenvalues[0] - 5.0) < 1e-9 * 5 and res.converged
    assert res.iterations > 2
    assert res.residuals[0] < 1e-8
    # A diagonal operator started on a 2-D invariant subspace forces a restart.
    D = np.diag(np.arange(1.0, 11.0))
    start = np.zeros(10)
    start[[0, 1]] = 1.0
    top = ps.lanczos(lambda x: D @ x, 10, k=3, start=start)
    np.testing.assert_allclose(top.eigenvalues, [10.0, 9.0, 8.0], rtol=1e-10)


def test_lanczos_rejects_bad_input():
    with pytest.raises(ValueError, match="k must be"):
        ps.lanczos(lambda x: x, 4, k=5)
    with pytest.raises(TypeError, match="callable"):
        ps.lanczos(np.eye(3), 3)
    with pytest.raises(ValueError, match="matvec"):
        ps.lanczos(lambda x: np.ones(2), 4)
    with pytest.raises(ValueError, match="non-finite"):
        ps.lanczos(lambda x: x * np.nan, 4)


def test_paper_setting_enters_eos_and_converges_to_min_norm():
    model = ps.BNLinearRegression.synthetic()  # d = 40, n = 20
    w0 = model.random_point(seed=0, norm=10.0)  # starts stable: eff_lr(0) = 0.005
    tr = ps.run_gd_wd(model, w0, 0.5, 2e-4, 100_000, record_every=100, sharpness_every=500)
    assert not tr.diverged
    assert tr.regime[0] == ps.dynamics.STABLE
    entry = tr.eos_entry_step
    assert 0 < entry < 60_000
    after = tr.eos_ratio[tr.sharpness_steps >= entry]
    assert np.all(np.abs(after - 2) <= 0.05 * 2), (after.min(), after.max())
    wt = ps.theory.min_norm_interpolant(model)
    cos = tr.w @ wt / (np.linalg.norm(tr.w) * np.linalg.norm(wt))
    assert cos >= 0.9999
    # Sharpness fell after EoS entry (the flow reduces it).
    assert tr.sharpness[-1] < tr.sharpness[tr.sharpness_steps == entry][0]


def test_period_two_oscillation_in_eos():
    model = ps.BNLinearRegression.synthetic()
    tr = ps.run_gd_wd(model, model.random_point(seed=0, norm=10.0), 0.5, 2e-4, 60_000,
                      record_every=1, sharpness_every=1000)
    window = tr.top_grad[-200:]
    flips = np.sign(window[1:]) * np.sign(window[:-1]) < 0
    assert flips.mean() > 0.95


def test_without_weight_decay_sharpness_freezes():
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=3)
    tr = ps.run_gd_wd(model, model.random_point(seed=1), 0.05, 0.0, 20_000,
                      sharpness_every=2000)
    assert tr.loss[-1] < 1e-8
    assert abs(tr.sharpness[-1] - tr.sharpness[-2]) <= 1e-6 * tr.sharpness[-1]
    # Without WD the norm only grows (up to rounding once the gradient vanishes).
    assert np.all(np.diff(tr.norm2) >= -1e-14 * tr.norm2[1:])


def test_divergent_trajectory_is_flagged_and_frozen():
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=3)
    W0 = model.random_point(3, seed=2)
    tr = ps.run_gd_wd(model, W0, np.array([0.1, 1e308, 0.2]), 0.0, 100, record_every=1,
                      sharpness_every=10)
    assert tr.diverged.tolist() == [False, True, False]
    assert tr.diverged_step[1] >= 1 and tr.diverged_step[[0, 2]].tolist() == [-1, -1]
    assert np.all(np.isfinite(tr.w))
    assert np.isnan(tr.loss[-1, 1]) and np.all(np.isfinite(tr.loss[:, [0, 2]]))


def test_rmsprop_and_float32_runs():
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=3)
    w0 = model.random_point(seed=1, norm=3.0)
    r = ps.run_scalar_rmsprop(model, w0, 1e-2, 1e-2, 3000, sharpness_every=0)
    assert not r.diverged and r.loss[-1] < r.loss[0]
    t64 = ps.run_gd_wd(model, w0, 0.1, 1e-3, 500, sharpness_every=100)
    t32 = ps.run_gd_wd(model, w0.astype(np.float32), 0.1, 1e-3, 500, sharpness_every=100)
    assert t32.w.dtype == np.float32
    np.testing.assert_allclose(t32.loss, t64.loss, rtol=1e-3, atol=1e-5)


def test_grid_in_one_call_broadcasts():
    model = ps.Toy3D()
    lr = np.repeat([0.05, 0.1], 3)
    wd = np.tile([0.0, 1e-3, 1e-2], 2)
    tr = ps.run_gd_wd(model, [1.0, 0.2, 0.4], lr, wd, 100, sharpness_every=0)
    assert tr.w.shape == (6, 3)
    assert tr.loss.shape == (101 if tr.steps.size == 101 else tr.steps.size, 6)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(lr=0.0), ValueError, "lr must be > 0"),
    (dict(lr=-1.0), ValueError, "lr must be > 0"),
    (dict(wd=-1e-3), ValueError, "wd must be >= 0"),
    (dict(lr=2.0, wd=0.5), ValueError, "lr \\* wd must be < 1"),
    (dict(steps=-1), ValueError, "steps must be >= 0"),
    (dict(steps=1.5), TypeError, "steps must be an integer"),
    (dict(record_every=0), ValueError, "record_every"),
    (dict(w0=np.zeros(3)), ValueError, "zero vector"),
    (dict(w0=np.array([np.nan, 1, 1])), ValueError, "non-finite"),
    (dict(lr=np.array([0.1, 0.2]), wd=np.array([0.0, 0.1, 0.2])), ValueError, "equal lengths"),
    (dict(jitter=-1.0), ValueError, "jitter"),
    (dict(backend="cuda"), ImportError, "backend .cuda. is not available"),
    (dict(backend="fortran"), ValueError, "backend must be"),
])
def test_run_validation(kwargs, exc, match):
    args = dict(w0=np.array([1.0, 0.5, 0.2]), lr=0.1, wd=1e-3, steps=10)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        ps.run_gd_wd(ps.Toy3D(), args.pop("w0"), args.pop("lr"), args.pop("wd"),
                     args.pop("steps"), **args)


def test_reduced_bits_do_not_depend_on_placement_threads_or_chunks():
    """The reduced update runs blocks of 32 trajectories: a trajectory's records and final
    iterate are the same bits alone, in a padded last block, in a chunk and on one thread,
    far past EoS entry (nearly all enter it by step 2000)."""
    model = ps.BNLinearRegression.synthetic(d=40, n=20, seed=5)
    B = 70
    W0 = model.random_point(B, seed=6, norm=3.0)
    lr = np.linspace(0.2, 0.8, B)
    kw = dict(record_every=50, sharpness_every=500, reduced=True)
    full = ps.run_gd_wd(model, W0, lr, 2e-3, 3000, **kw)
    assert full.meta["reduced"] and np.mean(full.eos_entry_step > 0) > 0.9
    for b in (0, 33, 69):
        one = ps.run_gd_wd(model, W0[b], lr[b], 2e-3, 3000, first_trajectory=b, **kw)
        np.testing.assert_array_equal(one.w, full.w[b])
        np.testing.assert_array_equal(one.loss, full.loss[:, b])
        np.testing.assert_array_equal(one.sharpness, full.sharpness[:, b])
    chunk = ps.run_gd_wd(model, W0[37:], lr[37:], 2e-3, 3000, first_trajectory=37, **kw)
    np.testing.assert_array_equal(chunk.w, full.w[37:])
    np.testing.assert_array_equal(chunk.loss, full.loss[:, 37:])
    core = loader.core()
    threads = core.max_threads()
    try:
        core.set_num_threads(1)
        serial = ps.run_gd_wd(model, W0, lr, 2e-3, 3000, **kw)
    finally:
        core.set_num_threads(threads)
    np.testing.assert_array_equal(serial.w, full.w)
    np.testing.assert_array_equal(serial.norm2, full.norm2)


def test_reduced_update_equals_direct_update():
    """The singular-basis shortcut for BN linear regression is the same GD+WD."""
    for n, d in ((20, 40), (30, 10)):  # overparameterised and not
        model = ps.BNLinearRegression.synthetic(d=d, n=n, seed=2)
        W0 = model.random_point(8, seed=3, norm=3.0)
        kw = dict(record_every=1, sharpness_every=100, theta_every=500)
        direct = ps.run_gd_wd(model, W0, 0.5, 2e-4, 2000, reduced=False, **kw)
        fast = ps.run_gd_wd(model, W0, 0.5, 2e-4, 2000, reduced=True, **kw)
        assert fast.meta["reduced"] and not direct.meta["reduced"]
        assert np.max(np.abs(fast.w - direct.w)) <= 1e-10 * np.max(np.abs(direct.w))
        for name in ("loss", "norm2", "eff_lr", "grad_norm", "sharpness", "top_grad", "theta"):
            a, b = getattr(fast, name), getattr(direct, name)
            assert np.max(np.abs(a - b)) <= 1e-10 * max(np.max(np.abs(b)), 1e-300), name
    with pytest.raises(ValueError, match="reduced=True"):
        ps.run_gd_wd(model, W0, 0.5, 2e-4, 10, reduced=True, jitter=1e-3)


def test_reduced_lockstep_is_independent_of_grouping():
    """Lanes of 8 advance in lockstep: a trajectory's bits must not depend on its lane."""
    model = ps.BNLinearRegression.synthetic()
    W0 = model.random_point(11, seed=5, norm=3.0)
    lr = np.linspace(0.2, 0.6, 11)
    kw = dict(record_every=7, sharpness_every=300, theta_every=450)
    full = ps.run_gd_wd(model, W0, lr, 2e-4, 3000, **kw)
    assert full.meta["reduced"]
    part = ps.run_gd_wd(model, W0[3:], lr[3:], 2e-4, 3000, first_trajectory=3, **kw)
    one = ps.run_gd_wd(model, W0[9], lr[9], 2e-4, 3000, first_trajectory=9, **kw)
    np.testing.assert_array_equal(part.w, full.w[3:])
    np.testing.assert_array_equal(part.loss, full.loss[:, 3:])
    np.testing.assert_array_equal(part.sharpness, full.sharpness[:, 3:])
    np.testing.assert_array_equal(one.w, full.w[9])
    np.testing.assert_array_equal(one.theta, full.theta[:, 9])


@pytest.mark.parametrize("model,ref", MODELS, ids=IDS)
def test_in_run_top_k_eigenvalues(model, ref):
    """top_k records the k largest eigenvalues at every sharpness step: equal to dense
    eigvalsh of the Hessian at the recorded directions, placement-independent, and
    leaving every other record untouched."""
    k = min(3, model.dim - 1)
    W0 = model.random_point(6, seed=2, norm=2.0)
    lr = np.linspace(0.05, 0.3, 6)
    kw = dict(record_every=10, sharpness_every=50, theta_every=50)
    full = ps.run_gd_wd(model, W0, lr, 1e-3, 200, top_k=k, **kw)
    plain = ps.run_gd_wd(model, W0, lr, 1e-3, 200, **kw)
    for name in ("w", "loss", "sharpness", "eos_ratio", "theta"):
        np.testing.assert_array_equal(getattr(full, name), getattr(plain, name), err_msg=name)
    assert plain.top_eigenvalues is None and full.top_eigenvalues.shape == (5, 6, k)
    H = model.hessian(full.theta.reshape(-1, model.dim))
    dense = np.linalg.eigvalsh(H)[:, ::-1][:, :k].reshape(5, 6, k)
    scale = np.abs(dense[..., :1])
    assert np.all(np.abs(full.top_eigenvalues - dense) <= 1e-8 * scale)
    one = ps.run_gd_wd(model, W0[4], lr[4], 1e-3, 200, top_k=k, first_trajectory=4, **kw)
    np.testing.assert_array_equal(one.top_eigenvalues, full.top_eigenvalues[:, 4])
    with pytest.raises(ValueError, match="sharpness_every"):
        ps.run_gd_wd(model, W0, lr, 1e-3, 10, top_k=k, sharpness_every=0)

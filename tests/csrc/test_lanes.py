"""Bits do not depend on placement: the lane engine and the lane kernels.

The compiled core advances trajectories (and evaluates kernel rows) in SIMD
lane blocks. A trajectory's arithmetic never involves another lane, so its
iterates, records and flags must be identical, bit for bit, whether it runs
alone or at any position of any batch, chunk or thread count. These runs go
far past EoS entry on purpose: the period-two dynamics would amplify any
difference in rounding, so exact equality there is a strong check. (Different
code paths -- reduced vs direct, cpp vs numba -- are compared before entry, in
test_trajectory.py and test_backends.py.)
"""

import numpy as np
import pytest
from _cases import rel_err

import pysharp as ps
from pysharp._engine import loader
from pysharp.reference import (
    BNLinearRegressionReference,
    BNMatrixCompletionReference,
    BNTwoLayerNetReference,
    Toy3DReference,
)

RECORDS = ("loss", "norm2", "eff_lr", "grad_norm", "top_grad", "sharpness", "eos_ratio",
           "sharpness_converged", "diverged", "diverged_step", "w", "theta", "group_norm2")


def _models():
    lin = ps.BNLinearRegression.synthetic(d=12, n=8, seed=3)
    mc = ps.BNMatrixCompletion.synthetic(size=6, true_rank=2, rank=3, n_obs=18, seed=0)
    bn2 = ps.BNTwoLayerNet.synthetic(n=10, d=4, width=3, teacher_width=2, seed=1)
    return {"bn_linreg": lin, "bn_mc": mc, "toy3d": ps.Toy3D(c=10.0), "bn_two_layer": bn2}


MODELS = _models()
# (runner, extra keyword arguments): every method, with and without jitter.
METHODS = {
    "gd_wd": (ps.run_gd_wd, {}),
    "gd_wd_jitter": (ps.run_gd_wd, {"jitter": 1e-3, "seed": 5}),
    "pgd": (ps.run_pgd, {}),
    "pgd_adaptive": (ps.run_pgd, {"lr": 0.2, "wd": 1e-2}),
    "scalar_rmsprop": (ps.run_scalar_rmsprop, {}),
    "pgd_quasi_rmsprop": (ps.run_pgd, {"scheduler": ps.QuasiRMSprop(lr=0.1, beta=0.98,
                                                                     kappa=0.5)}),
}


def _run(name, method, W0, lr, dtype=np.float64, steps=600, **kw):
    model = MODELS[name]
    runner, extra = METHODS[method]
    opts = dict(record_every=7, sharpness_every=50, theta_every=100, reduced=False, **extra)
    opts.update(kw)
    if runner is ps.run_gd_wd:
        return runner(model, W0.astype(dtype), lr, 5e-3, steps, **opts)
    opts.pop("reduced")
    if runner is ps.run_pgd:  # lr is eta_0; adaptive when extra holds lr and wd
        return runner(model, W0.astype(dtype), lr, steps, **opts)
    return runner(model, W0.astype(dtype), lr, 5e-3, steps, **opts)


def _row(tr, b):
    """Everything recorded for trajectory b of a batch (b = None: an unbatched run)."""
    out = {}
    for key in RECORDS:
        x = getattr(tr, key)
        if x is None or b is None:
            out[key] = x
        elif key in ("w", "diverged", "diverged_step"):
            out[key] = np.asarray(x)[b]
        else:
            out[key] = np.asarray(x)[:, b]
    return out


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if a[key] is None:
            assert b[key] is None, key
        else:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _batch(name, B=11, seed=2):
    model = MODELS[name]
    W0 = model.random_point(B, seed=seed, norm=2.0)
    lr = np.geomspace(0.05, 0.8, B)
    return W0, lr


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_trajectory_bits_do_not_depend_on_placement(name, method, dtype):
    W0, lr = _batch(name)
    full = _run(name, method, W0, lr, dtype)
    for b in (0, 5, 10):
        alone = _run(name, method, W0[b], lr[b], dtype,
                     first_trajectory=b)
        _assert_same(_row(alone, None), _row(full, b))
    chunk = _run(name, method, W0[6:], lr[6:], dtype,
                 first_trajectory=6)
    for b in range(6, 11):
        _assert_same(_row(chunk, b - 6), _row(full, b))
    if "jitter" in METHODS[method][1]:
        return
    # A batch of 11 fills blocks of 2, 4, 8 or 16 lanes only partly: shuffled,
    # trajectories move between blocks, lanes and the padded last block. The
    # random streams (jitter, Lanczos starts) are keyed by the global index, so
    # the shuffled runs use neither.
    order = np.array([10, 3, 7, 0, 9, 1, 8, 2, 6, 4, 5])
    plain = _run(name, method, W0, lr, dtype, sharpness_every=0)
    shuffled = _run(name, method, W0[order], lr[order], dtype, sharpness_every=0)
    for p, b in enumerate(order):
        _assert_same(_row(shuffled, p), _row(plain, b))


@pytest.mark.parametrize("name", list(MODELS))
def test_trajectory_bits_do_not_depend_on_threads(name):
    W0, lr = _batch(name, B=37)
    core = loader.core()
    full = _run(name, "gd_wd_jitter", W0, lr)
    try:
        core.set_num_threads(1)
        serial = _run(name, "gd_wd_jitter", W0, lr)
    finally:
        core.set_num_threads(max(core.max_threads(), 2))
    for b in range(37):
        _assert_same(_row(serial, b), _row(full, b))


@pytest.mark.parametrize("method", ["gd_wd_jitter", "scalar_rmsprop"])
def test_interleaved_blocks_do_not_see_each_other(method):
    # Toy3D's engine advances three lane blocks in alternation once a batch has
    # 64 blocks or more; B = 1100 makes full groups, a short last group and a
    # padded last block (for 2, 4, 8 or 16 lanes). One trajectory runs rescaled.
    W0, lr = _batch("toy3d", B=1100, seed=4)
    W0[517] *= 1e160  # ||w||^2 overflows: evaluated at w 2^-e in its lane alone
    full = _run("toy3d", method, W0, lr, steps=200)
    assert not full.diverged.any()
    for b in (0, 1, 5, 516, 517, 518, 1099):
        alone = _run("toy3d", method, W0[b], lr[b], first_trajectory=b, steps=200)
        _assert_same(_row(alone, None), _row(full, b))
    tail = _run("toy3d", method, W0[300:], lr[300:], first_trajectory=300, steps=200)
    for b in range(300, 1100):
        _assert_same(_row(tail, b - 300), _row(full, b))


def test_a_diverging_lane_leaves_its_block_untouched():
    model = MODELS["bn_linreg"]
    W0, lr = _batch("bn_linreg", B=8)
    lr = lr.copy()
    W0[2] *= 1e-10  # ||grad L|| ~ 1e10 there,
    lr[2] = 1e308   # so lr * grad overflows at the first step
    kw = dict(record_every=7, sharpness_every=50, reduced=False)
    full = ps.run_gd_wd(model, W0, lr, 0.0, 300, **kw)
    assert full.diverged.tolist() == [b == 2 for b in range(8)]
    # Frozen at its last finite iterate, later records NaN.
    t = full.diverged_step[2]
    assert 1 <= t <= 3 and np.isfinite(full.w[2]).all()
    assert np.isnan(full.loss[full.steps >= t, 2]).all()
    assert np.isfinite(full.loss[full.steps < t, 2]).all()
    for b in (1, 3, 7):
        alone = ps.run_gd_wd(model, W0[b], lr[b], 0.0, 300, first_trajectory=b, **kw)
        _assert_same(_row(alone, None), _row(full, b))


def _oracles():
    lin, mc = MODELS["bn_linreg"], MODELS["bn_mc"]
    return {
        "bn_linreg": BNLinearRegressionReference(lin.X, lin.y),
        "bn_mc": BNMatrixCompletionReference(mc.rows, mc.cols, mc.values, mc.shape, mc.rank),
        "toy3d": Toy3DReference(10.0),
        "bn_two_layer": BNTwoLayerNetReference(MODELS["bn_two_layer"].X, MODELS["bn_two_layer"].y,
                                               3),
    }


ORACLES = _oracles()


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernel_rows_do_not_depend_on_placement_and_match_the_oracle(name, dtype):
    model, ref = MODELS[name], ORACLES[name]
    rng = np.random.default_rng(4)
    W = model.random_point(13, seed=6, norm=1.7).astype(dtype)
    V = rng.standard_normal(W.shape).astype(dtype)
    loss, grad = model.loss_and_grad(W)
    hv = model.hvp(W, V)
    third = model.third(W, V)
    hess = model.hessian(W[:5])
    for b in (0, 6, 12):
        l1, g1 = model.loss_and_grad(W[b])
        assert l1 == loss[b]
        np.testing.assert_array_equal(g1, grad[b])
        np.testing.assert_array_equal(model.hvp(W[b], V[b]), hv[b])
        np.testing.assert_array_equal(model.third(W[b], V[b]), third[b])
    np.testing.assert_array_equal(model.hessian(W[3]), hess[3])
    W64, V64 = W.astype(np.float64), V.astype(np.float64)
    tol = 1e-12 if dtype == np.float64 else 2e-4
    scale = np.abs(ref.grad(W64)).max()
    assert np.abs(grad - ref.grad(W64)).max() <= tol * scale
    assert np.abs(hv - ref.hvp(W64, V64)).max() <= tol * np.abs(ref.hvp(W64, V64)).max()
    D = W.shape[1]
    H = np.stack([ref.hvp(W64[:5], np.broadcast_to(e, (5, D))) for e in np.eye(D)], axis=-1)
    assert np.abs(hess - H).max() <= tol * np.abs(H).max()


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("which", ["LA", "SA"])
def test_batched_sharpness_lanes_do_not_see_each_other(name, which):
    """k = 1 runs lane blocks in lockstep: a point's result must not depend on
    the other points of its block (random streams are keyed by the row index,
    so the row keeps its index and only its neighbours change)."""
    model = MODELS[name]
    W = model.random_point(11, seed=8, norm=1.5)
    other = model.random_point(11, seed=9, norm=0.7)
    kw = dict(method="lanczos", which=which, max_iter=model.dim)
    full = ps.spherical_sharpness(model, W, **kw)
    for b in (0, 5, 10):
        mixed = other.copy()
        mixed[b] = W[b]
        res = ps.spherical_sharpness(model, mixed, **kw)
        for key in ("eigenvalues", "eigenvectors", "residuals", "iterations", "converged"):
            np.testing.assert_array_equal(getattr(res, key)[b], getattr(full, key)[b],
                                          err_msg=key)
    dense = ps.spherical_sharpness(model, W, method="dense", which=which)
    err = np.abs(full.eigenvalues - dense.eigenvalues)[:, 0]
    assert full.converged.any()
    assert err[full.converged].max() <= 1e-8 * np.abs(dense.eigenvalues).max()


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernels_skip_rescaling_only_where_it_changes_no_bit(name, dtype):
    """Rows of moderate norm run as they are; far from 1 they are rescaled by powers of
    two first. Every kernel is homogeneous in w, so both routes give the same bits."""
    model = MODELS[name]
    W = model.random_point(9, seed=3, norm=1.3).astype(dtype)
    V = model.random_point(9, seed=4, norm=0.7).astype(dtype)
    k = 200 if dtype == np.float64 else 20  # ||2^-k w||^2 is outside the no-rescale window
    Ws = (W * dtype(2.0 ** -k)).astype(dtype)
    loss, grad = model.loss_and_grad(W)
    loss_s, grad_s = model.loss_and_grad(Ws)
    np.testing.assert_array_equal(loss_s, loss)
    np.testing.assert_array_equal(grad_s, grad * dtype(2.0 ** k))
    np.testing.assert_array_equal(model.hvp(Ws, V), model.hvp(W, V) * dtype(2.0 ** (2 * k)))
    np.testing.assert_array_equal(model.hessian(Ws[:2]),
                                  model.hessian(W[:2]) * dtype(2.0 ** (2 * k)))
    # Mixed batches: rows far out (either way) beside ordinary ones, and a far v.
    mixed = W.copy()
    mixed[2] *= dtype(2.0 ** -k)
    mixed[5] *= dtype(2.0 ** k)
    scale = np.ones(9, dtype)
    scale[2], scale[5] = 2.0 ** k, 2.0 ** -k
    loss_m, grad_m = model.loss_and_grad(mixed)
    np.testing.assert_array_equal(loss_m, loss)
    np.testing.assert_array_equal(grad_m, grad * scale[:, None])
    Vm = V.copy()
    Vm[4] *= dtype(2.0 ** k)
    expected = model.third(W, V) * (scale ** 3)[:, None]
    expected[4] *= dtype(2.0 ** (2 * k))
    np.testing.assert_array_equal(model.third(mixed, Vm), expected)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_core_flags_the_rows_it_cannot_take_as_they_are(dtype):
    """The compiled kernels mark rows outside the no-rescale window with ok = 2
    (the Python layer then rescales them); their window is the Python one."""
    from pysharp._engine.validation import SAFE_NORM2 as _SAFE_NORM2
    core_bounds = loader.core().SAFE_NORM2[np.dtype(dtype).name]
    assert core_bounds == _SAFE_NORM2[np.dtype(dtype)]
    model = MODELS["toy3d"]
    core = model._core(np.dtype(dtype), "cpp")
    lo, hi = core_bounds
    W = np.array([[1.0, 0.5, 0.25], [0, 0, 0], [3, 0, 0], [3, 0, 0], [3, 0, 0], [3, 0, 0]],
                 dtype)
    W[2:, 0] = [np.sqrt(lo) * 0.99, np.sqrt(lo) * 1.01, np.sqrt(hi) * 0.99, np.sqrt(hi) * 1.01]
    assert core.loss_grad(W)[2].tolist() == [1, 2, 2, 1, 1, 2]
    V = np.zeros_like(W)
    assert core.hvp(W[[0, 3]], V[:2])[1].tolist() == [1, 1]  # a zero v is exact
    V[0, 0] = np.sqrt(lo) * 0.5  # ||v||^2 below lo
    assert core.hvp(W[[0, 3]], V[:2])[1].tolist() == [2, 1]


# The Numba engine's lane blocks (_numba_kernels.run): methods 0-3 on the models it ports.
NUMBA_METHODS = ("gd_wd", "gd_wd_jitter", "pgd", "pgd_adaptive", "scalar_rmsprop")


def _numba_batch(name, B=45):
    """45 trajectories (with 32 lanes: a full block and a padded one of 13), one that
    diverges at its first step (6: lr 1e308, wd 0, ||grad L|| ~ 1e10) and one whose
    ||w||^2 overflows (20: evaluated at w 2^-e in its lane alone)."""
    W0, lr = _batch(name, B=B, seed=7)
    wd = np.full(B, 5e-3)
    lr[6], wd[6] = 1e308, 0.0
    W0[6] *= 1e-10
    W0[20] *= 1e160
    return W0, lr, wd


def _numba_run(name, method, W0, lr, wd, first):
    model = MODELS[name]
    runner, extra = METHODS[method]
    kw = dict(record_every=7, sharpness_every=40, theta_every=30, backend="numba",
              first_trajectory=first, **extra)
    if runner is ps.run_pgd:  # lr is eta_0
        return runner(model, W0, lr, 120, **kw)
    return runner(model, W0, lr, wd, 120, **kw)


@pytest.mark.skipif(not ps.backends()["numba"]["available"], reason="numba is not installed")
@pytest.mark.parametrize("name", ["bn_linreg", "bn_mc", "toy3d"])
@pytest.mark.parametrize("method", NUMBA_METHODS)
def test_numba_trajectory_bits_do_not_depend_on_placement(name, method):
    W0, lr, wd = _numba_batch(name)
    full = _numba_run(name, method, W0, lr, wd, 0)
    assert np.flatnonzero(full.diverged).tolist() == [6]
    assert full.diverged_step[6] >= 1 and full.diverged_step[20] == -1
    # Batches of 5 and 13 (the diverging lanes inside) and of 1: every row as in the full one.
    for lo, hi in ((4, 9), (0, 13), (13, 25)):
        part = _numba_run(name, method, W0[lo:hi], lr[lo:hi], wd[lo:hi], lo)
        for b in range(lo, hi):
            _assert_same(_row(part, b - lo), _row(full, b))
    for b in (0, 5, 6, 7, 20, 31, 32, 44):
        alone = _numba_run(name, method, W0[b], lr[b], wd[b], b)
        _assert_same(_row(alone, None), _row(full, b))



# -- the CUDA engine (pysharp._cuda): runs where a GPU is lent, skipped elsewhere ----------
# One thread per trajectory over the same headers, so a trajectory's bits must not depend
# on its place in a launch (thread block, warp, chunk) either. Against the CPU lanes it is
# a different code path (the device compiler contracts differently): that comparison is
# made before EoS entry, where rounding has not yet been amplified.
needs_cuda = pytest.mark.skipif(not ps.backends()["cuda"]["available"],
                                reason=f"no CUDA backend: {ps.backends()['cuda']['reason']}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cuda_kernel_rows_match_the_oracle_alone_and_in_a_batch(name, dtype):
    model, ref = MODELS[name], ORACLES[name]
    W = model.random_point(300, seed=6, norm=1.7).astype(dtype)
    V = np.random.default_rng(4).standard_normal(W.shape).astype(dtype)
    cu = dict(backend="cuda")
    loss, grad = model.loss_and_grad(W, **cu)
    hv, third, hess = model.hvp(W, V, **cu), model.third(W, V, **cu), model.hessian(W[:5], **cu)
    for b in (0, 129, 299):
        l1, g1 = model.loss_and_grad(W[b], **cu)
        assert l1 == loss[b]
        np.testing.assert_array_equal(g1, grad[b])
        np.testing.assert_array_equal(model.hvp(W[b], V[b], **cu), hv[b])
        np.testing.assert_array_equal(model.third(W[b], V[b], **cu), third[b])
    W64, V64 = W.astype(np.float64), V.astype(np.float64)
    tol = 1e-12 if dtype == np.float64 else 2e-4

    def close(a, b):
        assert np.abs(np.asarray(a, dtype=np.float64) - b).max() <= tol * np.abs(b).max()
    close(loss, ref.loss(W64))
    close(grad, ref.grad(W64))
    close(hv, ref.hvp(W64, V64))
    close(third, ref.third(W64, V64))
    D = W.shape[1]
    H = np.stack([ref.hvp(W64[:5], np.broadcast_to(e, (5, D))) for e in np.eye(D)], axis=-1)
    close(hess, H)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", list(MODELS))
def test_cuda_sharpness_matches_dense_eigvalsh(name):
    model = MODELS[name]
    W = model.random_point(200, seed=8, norm=1.5)
    for k in (1, 2):
        got = ps.spherical_sharpness(model, W, k=k, method="lanczos", max_iter=model.dim,
                                     backend="cuda")
        dense = ps.spherical_sharpness(model, W, k=k, method="dense")
        assert got.converged.all()
        err = np.abs(got.eigenvalues - dense.eigenvalues)
        assert err.max() <= 1e-8 * np.abs(dense.eigenvalues).max(), k


@pytest.mark.gpu
@needs_cuda
def test_cuda_flags_a_diverging_trajectory_and_leaves_the_others_alone():
    model = MODELS["bn_linreg"]
    W0, lr = _batch("bn_linreg", B=200)
    lr = lr.copy()
    lr[130] = 1e308  # lr * grad overflows at the first step
    kw = dict(record_every=7, sharpness_every=50, reduced=False, backend="cuda")
    full = ps.run_gd_wd(model, W0, lr, 0.0, 300, **kw)
    assert full.diverged.tolist() == [b == 130 for b in range(200)]
    t = full.diverged_step[130]
    assert 1 <= t <= 3 and np.isfinite(full.w[130]).all()
    assert np.isnan(full.loss[full.steps >= t, 130]).all()
    for b in (0, 129, 131):
        alone = ps.run_gd_wd(model, W0[b], lr[b], 0.0, 300, first_trajectory=b, **kw)
        _assert_same(_row(alone, None), _row(full, b))


@pytest.mark.gpu
@needs_cuda
def test_cuda_reduced_path_matches_the_cpu_before_eos_and_keeps_its_bits_past_it():
    model = MODELS["bn_linreg"]
    W0, lr = _batch("bn_linreg", B=300)
    kw = dict(record_every=5, sharpness_every=0, reduced=True)
    a = ps.run_gd_wd(model, W0, lr / 4, 5e-3, 40, **kw)
    b = ps.run_gd_wd(model, W0, lr / 4, 5e-3, 40, backend="cuda", **kw)
    assert rel_err(b.w, a.w) < 1e-10 and rel_err(b.loss, a.loss) < 1e-10
    kw.update(backend="cuda")
    full = ps.run_gd_wd(model, W0, lr, 5e-3, 600, **kw)
    for b in (0, 129, 299):
        alone = ps.run_gd_wd(model, W0[b], lr[b], 5e-3, 600, first_trajectory=b, **kw)
        _assert_same(_row(alone, None), _row(full, b))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cuda_trajectories_match_the_cpu_lanes_before_eos(name, method, dtype):
    W0, lr = _batch(name, B=40)
    a = _run(name, method, W0, lr / 4, dtype, steps=60)
    b = _run(name, method, W0, lr / 4, dtype, steps=60, backend="cuda")
    pre = a.eos_entry_step < 0  # the trajectories that never reached the edge of stability
    assert pre.sum() >= 20 and not a.diverged.any()
    tol = 1e-10 if dtype == np.float64 else 1e-3
    for key in ("loss", "norm2", "eff_lr", "grad_norm", "sharpness", "w", "theta"):
        x, y = getattr(a, key), getattr(b, key)
        if x is None:
            assert y is None, key
            continue
        rows = (pre,) if key == "w" else (slice(None), pre)  # records are (T, B, ...)
        x, y = np.asarray(x, dtype=np.float64)[rows], np.asarray(y, dtype=np.float64)[rows]
        assert np.abs(y - x).max() <= tol * np.abs(x).max(), key
    np.testing.assert_array_equal(b.diverged, a.diverged)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cuda_trajectory_bits_do_not_depend_on_placement(name, method, dtype):
    W0, lr = _batch(name, B=300)  # three 128-thread blocks, the last one partial
    full = _run(name, method, W0, lr, dtype, steps=300, backend="cuda")
    for b in (0, 129, 299):
        alone = _run(name, method, W0[b], lr[b], dtype, steps=300, backend="cuda",
                     first_trajectory=b)
        _assert_same(_row(alone, None), _row(full, b))
    part = _run(name, method, W0[100:140], lr[100:140], dtype, steps=300, backend="cuda",
                first_trajectory=100)
    for b in range(100, 140):
        _assert_same(_row(part, b - 100), _row(full, b))

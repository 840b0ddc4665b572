"""The GPU engine's fused tiles, checked on the CPU (issue 28).

The per-tile algorithms (csrc/include/pysharp/tile/) are written once over a warp
policy; the ``_tile_*`` helpers of ``pysharp._core`` run them over the emulated warp, so
these tests check what a CPU can: the fragment layout of mma.m8n8k4, the padding of d and n, the
per-trajectory reductions, divergence freezing and placement bits, against the models'
``loss_grad`` and the CPU engine. Where nvcc is present, the tile kernels are compiled
for sm_90 and must have no spill and no stack frame (ptxas). What only a device can
show (DMMA's rounding, races, speed) is listed in docs/architecture.rst.
"""

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _cases import rel_err

import pysharp as ps
from pysharp._engine import loader

ROOT = Path(__file__).resolve().parents[2]
core = loader.core()


def _data(model):
    """The fields of a BNLinearRegression that its kernels read."""
    return model._Xc, model._u, model._scale


def _start(model, B, seed):
    return np.random.default_rng(seed).standard_normal((B, model.dim))


def _same(a, b):
    """Bit-identical, NaN included."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return (a.shape == b.shape and a.dtype == b.dtype
            and np.array_equal(a.view(np.uint8), b.view(np.uint8)))


def _same_run(a, b):
    return all(_same(x, y) for x, y in zip(a, b))


def _rows(run, keep):
    """The outputs of a run (w (B, D), loss and norm2 (R, B), diverged, step, eff_lr and
    grad_norm (R, B)) of rows keep."""
    w, loss, norm2, diverged, step, eff, gnorm = run[:7]
    return (w[keep], loss[:, keep], norm2[:, keep], diverged[keep], step[keep],
            eff[:, keep], gnorm[:, keep])


# ------------------------------------------------------------------ (a) mma fragments

def test_mma_fragments_give_the_matrix_product():
    rng = np.random.default_rng(0)
    # Integer-valued: every product and sum is exact, so any misplaced element shows.
    A = rng.integers(-50, 50, (8, 4)).astype(float)
    B = rng.integers(-50, 50, (4, 8)).astype(float)
    C = rng.integers(-50, 50, (8, 8)).astype(float)
    assert np.array_equal(core._tile_mma_m8n8k4(A, B, C), A @ B + C)
    # Distinct entries in each operand: a transposed or shifted fragment cannot agree.
    A = np.arange(32.0).reshape(8, 4)
    B = 100 + np.arange(32.0).reshape(4, 8)
    C = 1000 * np.arange(64.0).reshape(8, 8)
    assert np.array_equal(core._tile_mma_m8n8k4(A, B, C), A @ B + C)
    A, B, C = rng.standard_normal((8, 4)), rng.standard_normal((4, 8)), rng.standard_normal((8, 8))
    assert rel_err(core._tile_mma_m8n8k4(A, B, C), A @ B + C) < 1e-15


# ------------------------------------------------------------------ (b) one step

@pytest.mark.parametrize("d, n", [(40, 20), (13, 11), (100, 200)])
def test_tile_loss_and_grad_match_the_model(d, n):
    """Every compiled shape: padding of d and n (13, 11), w parked in shared memory
    (100, 200), rows of a tile and a partial last tile (B = 19)."""
    assert (d, n) in [tuple(s) for s in core._TILE_BN_LINREG_SHAPES]
    model = ps.BNLinearRegression.synthetic(d=d, n=n, seed=1)
    W = _start(model, 19, seed=2) * np.logspace(-3, 3, 19)[:, None]
    loss, grad, ok = core._tile_bn_linreg_loss_grad(*_data(model), W)
    ref_loss, ref_grad = model.loss_and_grad(W, backend="cpp")
    assert ok.all()
    assert rel_err(loss, ref_loss) < 1e-14
    for b in range(len(W)):  # per row: the gradient scales as 1/||w||
        assert rel_err(grad[b], ref_grad[b]) < 1e-13, b


def test_tile_flags_an_undefined_loss():
    """Xc w = 0 (w = 0, or w in the null space of Xc for n <= d) is undefined, in its row only."""
    model = ps.BNLinearRegression.synthetic(d=13, n=11, seed=1)
    W = _start(model, 8, seed=3)
    W[2] = 0.0
    _, null = np.linalg.eigh(model._Xc.T @ model._Xc)
    W[5] = null[:, 0]  # Xc w = 0 to rounding (rank <= n - 1 < d)
    loss, grad, ok = core._tile_bn_linreg_loss_grad(*_data(model), W)
    assert ok.tolist() == [True, True, False, True, True, False, True, True]
    ref_loss, ref_grad = model.loss_and_grad(W[ok.astype(bool)], backend="cpp")
    assert rel_err(loss[ok.astype(bool)], ref_loss) < 1e-14


# ------------------------------------------------------------------ (c) a run

def test_tile_run_matches_the_cpu_engine_before_eos():
    model = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    B, steps = 13, 300
    W0 = _start(model, B, seed=4)
    lr = np.linspace(0.02, 0.2, B)
    wd = np.linspace(1e-4, 1e-3, B)
    ref = ps.run_gd_wd(model, W0, lr, wd, steps, record_every=10, sharpness_every=100,
                       backend="cpp", reduced=False)
    assert np.nanmax(ref.eos_ratio) < 2 * (1 - ref.eos_tol)  # still before EoS entry
    w, loss, norm2, diverged, step, eff, gnorm, _ = core._tile_bn_linreg_gd_wd(
        *_data(model), W0, lr, wd, steps, 10)
    assert not diverged.any() and (step == -1).all() and not ref.diverged.any()
    assert rel_err(w, ref.w) < 1e-10
    assert rel_err(loss, ref.loss) < 1e-10
    assert rel_err(norm2, ref.norm2) < 1e-10
    assert rel_err(eff, ref.eff_lr) < 1e-10 and rel_err(gnorm, ref.grad_norm) < 1e-10
    assert (loss[-1] < 0.5 * loss[0]).all()  # the runs went somewhere


# ------------------------------------------------------------------ (d) placement

def _past_eos(d=40, n=20, B=13, steps=1500):
    """A batch run into and past EoS, where period-two dynamics amplify any rounding."""
    model = ps.BNLinearRegression.synthetic(d=d, n=n, seed=0)
    W0 = _start(model, B, seed=5) * 0.3
    lr = np.linspace(0.3, 0.6, B)
    wd = np.full(B, 5e-3)
    return model, W0, lr, wd, steps


def test_tile_bits_do_not_depend_on_placement():
    model, W0, lr, wd, steps = _past_eos()
    args = (*_data(model), W0, lr, wd, steps, 7)
    base = core._tile_bn_linreg_gd_wd(*args)  # 0..12 in order, 3 padding rows at the end
    ref = ps.run_gd_wd(model, W0, lr, wd, steps, record_every=7, sharpness_every=100,
                       backend="cpp", reduced=False)
    assert (np.nanmax(ref.eos_ratio, axis=0) > 2 * (1 - ref.eos_tol)).sum() >= 5  # past entry
    B = len(W0)
    reverse = np.array(list(range(B - 1, -1, -1)) + [-1, -1, -1])
    assert _same_run(core._tile_bn_linreg_gd_wd(*args, placement=reverse), base)
    # padding rows scattered among 4 tiles, trajectories shuffled
    rng = np.random.default_rng(6)
    slots = np.full(32, -1)
    slots[rng.permutation(32)[:B]] = rng.permutation(B)
    assert _same_run(core._tile_bn_linreg_gd_wd(*args, placement=slots), base)
    # alone in its tile, at another row
    for b in (0, 7, 12):
        alone = np.full(8, -1)
        alone[b % 8] = 0
        one = core._tile_bn_linreg_gd_wd(*_data(model), W0[b:b + 1], lr[b:b + 1],
                                         wd[b:b + 1], steps, 7,
                                         placement=alone)
        assert _same(one[0][0], base[0][b]) and _same(one[1][:, 0], base[1][:, b])


def test_tile_placement_with_padded_shapes():
    """d and n off the multiples of 8 (padded coordinates and samples) keep the bits too."""
    model, W0, lr, wd, steps = _past_eos(d=13, n=11, B=10, steps=800)
    args = (*_data(model), W0, lr, wd, steps, 5)
    base = core._tile_bn_linreg_gd_wd(*args)
    placement = np.array([-1, 9, 8, -1, 7, 6, 5, 4, 3, 2, 1, -1, -1, 0, -1, -1])
    assert _same_run(core._tile_bn_linreg_gd_wd(*args, placement=placement), base)
    # Against the engine (another path) before EoS entry, which the first of these rows
    # reaches at step 20: after it the period-two dynamics amplify the paths' rounding, to
    # 1e-10 by step 100 (more without FMA: 8e-10 on an SSE2 build).
    ref = ps.run_gd_wd(model, W0, lr, wd, 20, record_every=5, sharpness_every=5, backend="cpp",
                       reduced=False)
    assert ref.eos_entry_step.max() <= 20
    short = core._tile_bn_linreg_gd_wd(*_data(model), W0, lr, wd, 20, 5)
    assert rel_err(short[0], ref.w) < 1e-13


# ------------------------------------------------------------------ (d') top_grad

@pytest.mark.parametrize("name", ["bn_linreg d13", "bn_linreg d100", "toy3d", "bn_mc",
                                  "bn_mc warp"])
def test_tiles_record_top_grad_against_the_models_gradient(name):
    """Given unit vectors v1, each record holds ||w|| v1 . grad L(w) (the engine's top_grad)
    at the iterate it records: checked at w0 and, through a run of 7 steps, at w7, against
    the model's own gradient; (0, B) without v1, and a v1 not shaped as W0 refused."""
    if name.startswith("bn_linreg"):
        d, n = (13, 11) if name.endswith("13") else (100, 200)
        model = ps.BNLinearRegression.synthetic(d=d, n=n, seed=2)
        run = functools.partial(core._tile_bn_linreg_gd_wd, *_data(model))
    elif name == "toy3d":
        model = ps.Toy3D(c=10.0)
        run = functools.partial(core._tile_toy3d_gd_wd, 10.0)
    else:
        model = ps.BNMatrixCompletion.synthetic(size=8, true_rank=1, rank=3, seed=4)
        tile = core._tile_bn_mc_gd_wd if name == "bn_mc" else core._tile_bn_mc_warp_gd_wd
        run = functools.partial(tile, *_mc_data(model))
    rng = np.random.default_rng(5)
    B = 11
    W0 = rng.standard_normal((B, model.dim))
    V = rng.standard_normal((B, model.dim))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    lr, wd = np.full(B, 0.05), np.full(B, 1e-3)
    lr[0], wd[0] = 1e200, 1.0  # ||w||^2 overflows after step 0: record 1 never reached
    out = run(W0, lr, wd, 7, 7, v1=V)
    w7 = run(W0, lr, wd, 7, 7)[0]
    for k, W in enumerate((W0[1:], w7[1:])):
        want = np.linalg.norm(W, axis=1) * np.sum(V[1:] * model.grad(W, backend="cpp"), axis=1)
        np.testing.assert_allclose(out[7][k, 1:], want, rtol=1e-12,
                                   atol=1e-12 * np.max(np.abs(want)))
    assert np.isfinite(out[7][0, 0]) and np.isnan(out[7][1, 0])  # NaN as the loss, not read
    np.testing.assert_array_equal(np.isnan(out[7]), np.isnan(out[1]))
    assert run(W0, lr, wd, 7, 7)[7].shape == (0, B)
    with pytest.raises(ValueError, match="v1"):
        run(W0, lr, wd, 7, 7, v1=V[:, :-1])


# ------------------------------------------------------------------ (e) divergence

def test_tile_freezes_a_diverging_trajectory_and_spares_its_tile():
    model, W0, lr, wd, steps = _past_eos(B=8, steps=400)
    args = (*_data(model),)
    base = core._tile_bn_linreg_gd_wd(*args, W0, lr, wd, steps, 4)
    # Row 3: decay 1 - lr wd = -1e200 multiplies w each step: ||w|| overflows at step 2.
    lr_bad, wd_bad = lr.copy(), wd.copy()
    lr_bad[3], wd_bad[3] = 1e200, 1.0
    # Row 5: w = 0, undefined at step 0. Row 6: ||w||^2 overflows at step 0 while w, the
    # loss, the gradient and the update are finite: only the flag stops it moving.
    W0_bad = W0.copy()
    W0_bad[5] = 0.0
    W0_bad[6] *= 1e160
    w, loss, norm2, diverged, step, eff, gnorm, _ = core._tile_bn_linreg_gd_wd(
        *args, W0_bad, lr_bad, wd_bad, steps, 4)
    assert diverged.tolist() == [0, 0, 0, 1, 0, 1, 1, 0]
    assert step[5] == 0 and step[6] == 0 and 1 <= step[3] <= 4, step
    assert _same(w[6], W0_bad[6]) and np.isnan(loss[:, 6]).all()
    for rec in (norm2, eff, gnorm):  # every record series stops where the loss does
        assert _same(np.isnan(rec), np.isnan(loss))
    keep = [0, 1, 2, 4, 7]
    assert _same_run(_rows((w, loss, norm2, diverged, step, eff, gnorm), keep), _rows(base, keep))
    # Frozen: the records from the flagged step on are NaN, those before are not, and
    # the final iterate is the last finite one: that of the same row run to step s.
    s = step[3]
    rec = np.arange(loss.shape[0]) * 4
    assert np.isnan(loss[rec >= s, 3]).all() and np.isfinite(loss[rec < s, 3]).all()
    assert np.isnan(loss[:, 5]).all() and _same(w[5], W0_bad[5])
    stopped = core._tile_bn_linreg_gd_wd(*args, W0_bad, lr_bad, wd_bad, s, 1)
    assert np.isfinite(w[3]).all() and _same(w[3], stopped[0][3])


def test_tile_divergence_steps_match_the_engine():
    """An update that overflows is flagged at t + 1, as the CPU engine flags it."""
    model = ps.BNLinearRegression.synthetic(d=13, n=11, seed=1)
    W0 = _start(model, 3, seed=7) * np.array([[1.0], [1e-40], [1.0]])
    lr, wd = np.array([0.1, 1e270, 0.1]), np.array([1e-3, 0.0, 1e-3])
    ref = ps.run_gd_wd(model, W0, lr, wd, 20, record_every=1, backend="cpp", reduced=False)
    got = core._tile_bn_linreg_gd_wd(*_data(model), W0, lr, wd, 20, 1)
    assert ref.diverged.tolist() == [False, True, False]
    assert got[3].tolist() == [0, 1, 0] and got[4].tolist() == ref.diverged_step.tolist()
    assert _same(np.isnan(got[1]), np.isnan(ref.loss)) and rel_err(got[0], ref.w) < 1e-10


# ------------------------------------------------------------------ (f) Toy3D

def test_toy3d_tile_matches_the_engine_and_its_placement():
    model = ps.Toy3D(c=10.0)
    B, steps = 11, 400
    W0 = np.random.default_rng(8).standard_normal((B, 3))
    lr = np.linspace(0.05, 0.3, B)
    wd = np.full(B, 1e-3)
    ref = ps.run_gd_wd(model, W0, lr, wd, steps, record_every=5, sharpness_every=50,
                       backend="cpp")
    got = core._tile_toy3d_gd_wd(10.0, W0, lr, wd, steps, 5)
    assert rel_err(got[0], ref.w) < 1e-10
    assert rel_err(got[1], ref.loss) < 1e-10 and rel_err(got[2], ref.norm2) < 1e-10
    assert rel_err(got[5], ref.eff_lr) < 1e-10 and rel_err(got[6], ref.grad_norm) < 1e-10
    order = np.random.default_rng(9).permutation(B)
    perm = core._tile_toy3d_gd_wd(10.0, W0[order], lr[order], wd[order], steps, 5)
    assert _same(perm[0], got[0][order]) and _same(perm[1], got[1][:, order])


@pytest.mark.parametrize("steps, every", [(10, 0), (10, -2), (-1, 1)])
def test_tile_runs_refuse_bad_record_spacing(steps, every):
    """A record spacing below 1 is refused before anything is shaped by it (it divided by
    zero, killing the interpreter, before the check ran)."""
    W0, lr, wd = np.ones((2, 3)), np.full(2, 0.1), np.full(2, 1e-3)
    with pytest.raises(ValueError, match="record_every >= 1"):
        core._tile_toy3d_gd_wd(10.0, W0, lr, wd, steps, every)
    model = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    with pytest.raises(ValueError, match="record_every >= 1"):
        core._tile_bn_linreg_gd_wd(*_data(model), _start(model, 2, seed=0), lr, wd, steps,
                                   every)


def test_toy3d_tile_freezes_a_diverging_trajectory():
    W0 = np.random.default_rng(10).standard_normal((4, 3))
    lr, wd = np.full(4, 0.1), np.full(4, 1e-3)
    base = core._tile_toy3d_gd_wd(10.0, W0, lr, wd, 50, 1)
    lr_bad, wd_bad, W0_bad = lr.copy(), wd.copy(), W0.copy()
    lr_bad[1], wd_bad[1] = 1e200, 1.0  # |w| ~ 1e200 after a step: ||w||^2 overflows
    W0_bad[2] = 0.0                    # undefined at step 0
    W0_bad[3] *= 1e160                 # ||w||^2 overflows, all else finite: flagged, frozen
    w, loss, norm2, diverged, step, eff, gnorm, _ = core._tile_toy3d_gd_wd(
        10.0, W0_bad, lr_bad, wd_bad, 50, 1)
    assert diverged.tolist() == [0, 1, 1, 1] and step.tolist() == [-1, 1, 0, 0]
    assert _same_run(_rows((w, loss, norm2, diverged, step, eff, gnorm), [0]), _rows(base, [0]))
    assert _same(w[3], W0_bad[3]) and np.isnan(loss[:, 3]).all()
    for rec in (norm2, eff, gnorm):
        assert _same(np.isnan(rec), np.isnan(loss))
    assert np.isnan(loss[1:, 1]).all() and np.isfinite(loss[:1, 1]).all()
    assert np.isnan(loss[:, 2]).all() and _same(w[2], W0_bad[2])
    # the last finite iterate is kept: that of one step from W0
    one = core._tile_toy3d_gd_wd(10.0, W0_bad[1:2], lr_bad[1:2], wd_bad[1:2], 1, 1)
    assert np.isfinite(w[1]).all() and _same(w[1], one[0][0])


# ------------------------------------------------------------------ (g) BN matrix completion

def _mc_data(model):
    """The arguments of _tile_bn_mc_gd_wd before W0: the fields its loss_grad reads."""
    return (model.rows, model.cols, model._u, model._scale, model.shape[0], model.shape[1],
            model.rank)


def test_bn_mc_tile_freezes_a_diverging_trajectory():
    model = ps.BNMatrixCompletion.synthetic(size=6, true_rank=1, rank=2, seed=1)
    W0 = model.random_point(3, seed=2)
    W0[1] = 0.0  # every score zero: BN undefined at step 0
    lr, wd = np.full(3, 0.1), np.full(3, 1e-3)
    w, loss, norm2, diverged, step, eff, gnorm, _ = core._tile_bn_mc_gd_wd(
        *_mc_data(model), W0, lr, wd, 20, 2)
    assert diverged.tolist() == [0, 1, 0] and step.tolist() == [-1, 0, -1]
    assert np.isnan(loss[:, 1]).all() and _same(w[1], W0[1]) and np.isfinite(loss[:, 0]).all()


@pytest.mark.parametrize("tile", ["_tile_bn_mc_gd_wd", "_tile_bn_mc_warp_gd_wd"])
def test_bn_mc_tiles_refuse_bad_data(tile):
    model = ps.BNMatrixCompletion.synthetic(size=6, true_rank=1, rank=2, seed=1)
    W0, lr, wd = model.random_point(3, seed=2), np.full(3, 0.1), np.full(3, 1e-3)
    rows, cols, u, scale, m1, m2, r = _mc_data(model)
    bad = rows.copy()
    bad[0] = m1  # outside the matrix: refused, not read out of bounds
    with pytest.raises(ValueError, match="outside"):
        getattr(core, tile)(bad, cols, u, scale, m1, m2, r, W0, lr, wd, 20, 2)
    with pytest.raises(ValueError, match=r"\(B, \(m1 \+ m2\) r\)"):
        getattr(core, tile)(rows, cols, u, scale, m1, m2, r, W0[:, :-1], lr, wd, 20, 2)


# ------------------------------------------------------------ (h) BN-MC, a warp per trajectory

def _sparse_mc(m1=11, m2=9, rank=5, N=40, seed=3):
    """A model off every multiple of 32 (D 100, N 40), with factor rows no observation
    touches, the last V row among them (its list starts at 2 N: the end of the arrays)."""
    rng = np.random.default_rng(seed)
    cells = rng.choice((m1 - 2) * (m2 - 2), size=N, replace=False)
    rows, cols = np.divmod(cells, m2 - 2)  # rows m1 - 2, m1 - 1 and cols m2 - 2, m2 - 1 unseen
    values = rng.standard_normal(N)
    return ps.BNMatrixCompletion(rows, cols, values, (m1, m2), rank)


def test_bn_mc_warp_terms_are_each_coordinates_observations_in_order():
    """Lane l of pass p (coordinate i = 32 p + l, factor row f = i // r) reads the
    observations of row f in increasing order, then padding terms (observation N, whose
    dL/ds slot holds 0) up to the pass's longest list; lanes past D read padding only."""
    model = _sparse_mc()
    m1, m2, r, N, D = model.shape[0], model.shape[1], model.rank, model.n_obs, model.dim
    pass_start, obs, other = core._tile_bn_mc_warp_terms(model.rows, model.cols, m1, m2, r)
    factor = np.concatenate([model.rows, m1 + model.cols])  # U rows, then V rows
    partner = np.concatenate([m1 + model.cols, model.rows])
    k = np.concatenate([np.arange(N)] * 2)
    lists = [np.flatnonzero(factor == f) for f in range(m1 + m2)]  # increasing k per row
    assert any(len(x) == 0 for x in lists[:m1]) and len(lists[-1]) == 0
    passes = -(-D // 32)
    assert len(pass_start) == passes + 1 and pass_start[0] == 0
    for p in range(passes):
        rows_here = [(32 * p + lane) // r for lane in range(32) if 32 * p + lane < D]
        longest = max(len(lists[f]) for f in rows_here)
        assert pass_start[p + 1] - pass_start[p] == 32 * longest
        for lane in range(32):
            at = pass_start[p] + 32 * np.arange(longest) + lane
            mine = lists[rows_here[lane]] if lane < len(rows_here) else np.array([], int)
            want_obs = np.concatenate([k[mine], np.full(longest - len(mine), N)])
            want_other = np.concatenate([partner[mine] * r, np.zeros(longest - len(mine))])
            assert obs[at].tolist() == want_obs.tolist()
            assert other[at].tolist() == want_other.tolist()
    with pytest.raises(ValueError, match="outside"):
        core._tile_bn_mc_warp_terms(model.rows, model.cols + m2, m1, m2, r)


@pytest.mark.parametrize("tile, make", [
    ("_tile_bn_mc_gd_wd",
     lambda: ps.BNMatrixCompletion.synthetic(size=10, true_rank=2, rank=4, seed=0)),  # D 80
    ("_tile_bn_mc_gd_wd", _sparse_mc),
    ("_tile_bn_mc_warp_gd_wd",
     lambda: ps.BNMatrixCompletion.synthetic(size=20, true_rank=2, rank=20, seed=0)),  # D 800
    ("_tile_bn_mc_warp_gd_wd", _sparse_mc),
], ids=["thread D80", "thread unseen rows", "warp D800", "warp unseen rows"])
def test_bn_mc_tiles_match_the_engine_and_their_placement(tile, make):
    model, run = make(), getattr(core, tile)
    B, steps = 5, 300
    W0 = model.random_point(B, seed=11)
    lr, wd = np.linspace(0.05, 0.3, B), np.full(B, 1e-3)
    ref = ps.run_gd_wd(model, W0, lr, wd, steps, record_every=5, sharpness_every=0,
                       backend="cpp")
    got = run(*_mc_data(model), W0, lr, wd, steps, 5)
    assert not ref.diverged.any() and not got[3].any()
    assert rel_err(got[0], ref.w) < 1e-10
    assert rel_err(got[1], ref.loss) < 1e-10 and rel_err(got[2], ref.norm2) < 1e-10
    assert rel_err(got[5], ref.eff_lr) < 1e-10 and rel_err(got[6], ref.grad_norm) < 1e-10
    order = np.random.default_rng(12).permutation(B)
    perm = run(*_mc_data(model), W0[order], lr[order], wd[order], steps, 5)
    assert _same(perm[0], got[0][order]) and _same(perm[1], got[1][:, order])


def test_bn_mc_warp_tile_gradient_is_the_models():
    """One step from w with lr 1, wd 0 gives w - grad L(w): the warp's gradient (its own
    sum orders) against the model's loss_and_grad (relative to the largest entry), and the
    factor rows no observation touches (U's and V's) left exactly as they were."""
    model = _sparse_mc()
    W0 = model.random_point(3, seed=5)
    w1 = core._tile_bn_mc_warp_gd_wd(*_mc_data(model), W0, np.ones(3), np.zeros(3), 1, 1)[0]
    loss, G = model.loss_and_grad(W0)
    assert rel_err(W0 - w1, G) < 1e-12
    m1, r = model.shape[0], model.rank
    unseen = np.setdiff1d(np.arange(m1 + model.shape[1]),
                          np.concatenate([model.rows, m1 + model.cols]))  # U rows, then V
    assert (unseen < m1).any() and (unseen >= m1).any()
    assert all(_same(w1[:, f * r:(f + 1) * r], W0[:, f * r:(f + 1) * r]) for f in unseen)


def test_bn_mc_warp_tile_freezes_a_diverging_trajectory():
    model = _sparse_mc()
    W0 = model.random_point(4, seed=2)
    W0[1] = 0.0  # every score zero: BN undefined at step 0
    lr, wd = np.full(4, 0.1), np.full(4, 1e-3)
    lr[2] = 1e308  # the first update overflows: flagged at step 1, W0 kept
    run = core._tile_bn_mc_warp_gd_wd(*_mc_data(model), W0, lr, wd, 20, 2)
    w, loss, norm2, diverged, step, eff, gnorm = run[:7]
    assert diverged.tolist() == [0, 1, 1, 0] and step.tolist() == [-1, 0, 1, -1]
    assert np.isnan(loss[:, 1]).all() and _same(w[1], W0[1])
    assert np.isfinite(loss[0, 2]) and np.isnan(loss[1:, 2]).all() and _same(w[2], W0[2])
    for rec in (norm2, eff, gnorm):
        assert _same(np.isnan(rec), np.isnan(loss))
    alone = core._tile_bn_mc_warp_gd_wd(*_mc_data(model), W0[[0, 3]], lr[[0, 3]], wd[[0, 3]],
                                        20, 2)
    assert _same_run(_rows(run, [0, 3]), alone)  # the others' bits are their own


# ------------------------------------------------------------------ (5) ptxas gate

def _nvcc():
    for cand in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file():
            return cand
    return None


def ptxas_report(nvcc, arch="sm_90"):
    """{kernel (mangled): (registers, stack bytes, spill store bytes, spill load bytes)}
    of csrc/cuda/tile_kernels.cu compiled by nvcc for ``arch``."""
    out = subprocess.run(
        [nvcc, "-std=c++17", f"-arch={arch}", "-cubin", "-o", os.devnull,
         "--expt-relaxed-constexpr", "-Xptxas", "-v", "-I", str(ROOT / "csrc" / "include"),
         "-I", str(ROOT / "csrc"), str(ROOT / "csrc" / "cuda" / "tile_kernels.cu")],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report, name = {}, None
    for line in out.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m and name:
            report[name] = [None, *map(int, m.groups())]
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            report[name][0] = int(m.group(1))
    return {k: tuple(v) for k, v in report.items()}


@pytest.mark.skipif(_nvcc() is None, reason="nvcc not found")
@pytest.mark.skipif(not (ROOT / "csrc").is_dir(),
                    reason="no csrc/ beside these tests (a copy of tests/ alone, as "
                           "tools/mutation.py's scratch)")
def test_tile_kernels_have_no_spill_and_no_stack():
    report = ptxas_report(_nvcc())
    tiles = {k: v for k, v in report.items() if "tile" in k}
    assert any("bn_linreg" in k and "Li40ELi20E" in k for k in tiles), report
    assert any("bn_linreg" in k and "Li100ELi200E" in k for k in tiles), report
    assert any("toy3d" in k for k in tiles) and any("bn_mc" in k for k in tiles), report
    for name, (regs, stack, spill_st, spill_ld) in tiles.items():
        assert (stack, spill_st, spill_ld) == (0, 0, 0), (name, regs, stack, spill_st, spill_ld)


# ------------------------------------------------------------------ on a device

needs_cuda = pytest.mark.skipif(not ps.backends()["cuda"]["available"],
                                reason=f"no CUDA backend: {ps.backends()['cuda']['reason']}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("d, n, steps", [(40, 20, 300), (100, 200, 60)])
def test_device_tiles_match_the_engine_the_emulation_and_their_placement(d, n, steps):
    import pysharp._cuda as cuda

    model = ps.BNLinearRegression.synthetic(d=d, n=n, seed=0)
    B = 37  # 5 tiles, the last with 3 padding rows
    W0 = _start(model, B, seed=11)
    lr, wd = np.linspace(0.02, 0.2, B), np.linspace(1e-4, 1e-3, B)
    dev = cuda._tile_bn_linreg_gd_wd(*_data(model), W0, lr, wd, steps, 10)
    emu = core._tile_bn_linreg_gd_wd(*_data(model), W0, lr, wd, steps, 10)
    ref = ps.run_gd_wd(model, W0, lr, wd, steps, record_every=10, backend="cpp", reduced=False)
    assert rel_err(dev[0], ref.w) < 1e-10 and rel_err(dev[1], ref.loss) < 1e-10
    assert rel_err(dev[0], emu[0]) < 1e-12  # DMMA's rounding against the emulation's order
    rev = cuda._tile_bn_linreg_gd_wd(*_data(model), W0[::-1], lr[::-1], wd[::-1], steps, 10)
    assert _same(rev[0][::-1], dev[0]) and _same(rev[1][:, ::-1], dev[1])


@pytest.mark.gpu
@needs_cuda
def test_device_toy3d_tile_matches_the_engine_and_the_emulation():
    import pysharp._cuda as cuda

    B, steps = 1000, 400
    W0 = np.random.default_rng(12).standard_normal((B, 3))
    lr, wd = np.linspace(0.05, 0.3, B), np.full(B, 1e-3)
    dev = cuda._tile_toy3d_gd_wd(10.0, W0, lr, wd, steps, 5)
    ref = ps.run_gd_wd(ps.Toy3D(c=10.0), W0, lr, wd, steps, record_every=5, backend="cpp")
    assert rel_err(dev[0], ref.w) < 1e-10 and rel_err(dev[1], ref.loss) < 1e-10
    assert rel_err(dev[0], core._tile_toy3d_gd_wd(10.0, W0, lr, wd, steps, 5)[0]) < 1e-12


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("tile, size, rank, B", [
    ("_tile_bn_mc_gd_wd", 10, 4, 20000),  # D 80: a thread per trajectory
    ("_tile_bn_mc_warp_gd_wd", 20, 20, 4096),  # D 800: a warp per trajectory
])
def test_device_bn_mc_tiles_match_the_engine_the_emulation_and_their_placement(tile, size, rank,
                                                                                 B):
    import pysharp._cuda as cuda

    model = ps.BNMatrixCompletion.synthetic(size=size, true_rank=2, rank=rank, seed=0)
    # More trajectories than an H100/H200 holds at once (about 17000 threads of the D 80
    # tile, 2000 warps of the D 800 one): each thread or warp runs several in turn, on the
    # scratch the one before left.
    steps = 40
    W0 = model.random_point(B, seed=13)
    lr, wd = np.linspace(0.05, 0.3, B), np.full(B, 1e-3)
    dev = getattr(cuda, tile)(*_mc_data(model), W0, lr, wd, steps, 5)
    ref = ps.run_gd_wd(model, W0, lr, wd, steps, record_every=5, sharpness_every=0,
                       backend="cpp")
    assert rel_err(dev[0], ref.w) < 1e-10 and rel_err(dev[1], ref.loss) < 1e-10
    emu = getattr(core, tile)(*_mc_data(model), W0, lr, wd, steps, 5)
    assert rel_err(dev[0], emu[0]) < 1e-12
    rev = getattr(cuda, tile)(*_mc_data(model), W0[::-1], lr[::-1], wd[::-1], steps, 5)
    assert _same(rev[0][::-1], dev[0]) and _same(rev[1][:, ::-1], dev[1])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", ["toy3d", "bn_linreg", "bn_mc", "bn_mc D800"])
def test_device_tiles_track_sharpness_as_the_engine(name):
    """backend="cuda" with sharpness every 25 steps takes the tiles in segments between the
    device Lanczos solves; every record within 1e-10 of the CPU engine's, before EoS entry
    (after it, top_grad's sign at a switch of the top eigenvector is a tie that rounding
    decides: 4e-2 apart in the emulation with Toy3D's learning rates 10x these)."""
    lr_max = 0.2
    if name == "toy3d":
        model, lr_max = ps.Toy3D(c=10.0), 0.002  # EoS ratios up to 0.5
    elif name == "bn_linreg":
        model = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    else:
        size, rank = (10, 4) if name == "bn_mc" else (20, 20)
        model = ps.BNMatrixCompletion.synthetic(size=size, true_rank=2, rank=rank, seed=0)
    B = 300
    W0 = np.random.default_rng(14).standard_normal((B, model.dim))
    lr, wd = np.linspace(lr_max / 10, lr_max, B), np.full(B, 1e-3)
    kw = dict(record_every=5, sharpness_every=25, first_trajectory=3)
    if name == "bn_linreg":
        kw["reduced"] = False
    dev = ps.run_gd_wd(model, W0, lr, wd, 100, backend="cuda", **kw)
    ref = ps.run_gd_wd(model, W0, lr, wd, 100, backend="cpp", **kw)
    assert dev.meta["tiles"] and not ref.meta["tiles"] and np.nanmax(ref.eos_ratio) < 1
    for key in ("w", "loss", "norm2", "grad_norm", "top_grad", "sharpness", "eos_ratio"):
        assert rel_err(getattr(dev, key), getattr(ref, key)) < 1e-10, key
    np.testing.assert_array_equal(dev.sharpness_converged, ref.sharpness_converged)

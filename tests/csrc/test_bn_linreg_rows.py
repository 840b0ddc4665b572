"""BN linear regression's row kernel (csrc/cpu/bn_linreg_rows.hpp) against the lanes driver
(cpu/batched.hpp): the same sums in the same order, so every loss, gradient and ok code is
bit-identical, whatever the shapes, the padding of d to whole vectors, a batch that is not
a multiple of the lane count, or rows outside the safe range; and the model's public
loss_and_grad (which takes the row kernel where it pays) equals both and the NumPy oracle."""

from __future__ import annotations

import numpy as np
import pytest

import pysharp as ps

_core = pytest.importorskip("pysharp._core")

PATHS = {np.float64: _core._bn_linreg_loss_grad_path,
         np.float32: _core._bn_linreg_loss_grad_path_f32}


def _problem(n, d, B, dtype, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    Xc = X - X.mean(axis=0)
    u = rng.standard_normal(n)
    u = (u - u.mean()) / np.linalg.norm(u - u.mean())
    W = rng.standard_normal((B, d))
    return Xc.astype(dtype), u.astype(dtype), W.astype(dtype)


def _both(Xc, u, W, scale=1.7):
    path = PATHS[W.dtype.type]
    return path("rows", Xc, u, scale, W), path("lanes", Xc, u, scale, W)


def _assert_bits(rows, lanes):
    for a, b in zip(rows, lanes):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n, d, B", [(20, 40, 64), (20, 40, 67), (200, 100, 19), (7, 13, 33),
                                     (2, 3, 5), (33, 9, 17), (16, 16, 16), (5, 64, 8),
                                     (3, 1, 9)])
def test_rows_and_lanes_agree_bit_for_bit(n, d, B, dtype):
    Xc, u, W = _problem(n, d, B, dtype, seed=n * 1000 + d)
    rows, lanes = _both(Xc, u, W)
    _assert_bits(rows, lanes)
    assert np.all(lanes[2] == 1)


def test_rows_and_lanes_agree_on_codes_of_special_rows():
    Xc, u, W = _problem(20, 40, 24, np.float64, seed=3)
    W[1] = 0.0                        # zero: outside the safe range (2)
    W[2] *= 1e200                     # huge: outside the safe range (2)
    W[3, 5] = np.nan                  # not finite (2)
    W[4] = np.linalg.svd(Xc)[2][-1]   # in Xc's null space: Xc w ~ 0, undefined (0)
    W[9] *= 2.0 ** -600               # tiny, still finite
    rows, lanes = _both(Xc, u, W)
    _assert_bits(rows, lanes)
    assert rows[2][1] == 2 and rows[2][2] == 2 and rows[2][3] == 2 and rows[2][4] == 0
    assert rows[2][0] == 1


def test_rows_kernel_matches_the_numpy_oracle():
    Xc, u, W = _problem(20, 40, 40, np.float64, seed=5)
    loss, G, ok = PATHS[np.float64]("rows", Xc, u, 1.7, W)
    Z = W @ Xc.T
    Zc = Z - Z.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(Zc, axis=1, keepdims=True)
    ref_loss = 0.5 * 1.7 * np.sum((Zc / norm - u) ** 2, axis=1)
    cos = (Zc / norm) @ u
    ref_G = ((cos[:, None] * Zc / norm - u) / norm * 1.7) @ Xc
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
    np.testing.assert_allclose(G, ref_G, rtol=1e-11, atol=1e-14 * np.abs(ref_G).max())
    assert np.all(ok == 1)


def test_public_loss_and_grad_is_the_lanes_drivers_to_the_bit():
    """Whichever driver `pays` picks on this machine, the model's kernel gives the same bits
    as the lanes driver, for a batch that is a multiple of the lanes and one that is not."""
    model = ps.BNLinearRegression.synthetic(d=40, n=20, seed=1)
    Xc, u = model.X - model.X.mean(axis=0), model.y - model.y.mean()
    for B in (1024, 1029):  # from 1024 rows the row kernel runs where it pays
        W = model.random_point(B, seed=2, norm=3.0)
        loss, G = model.loss_and_grad(W, backend="cpp")
        path = PATHS[np.float64]("lanes", np.ascontiguousarray(Xc), u / np.linalg.norm(u),
                                 2 * model.y.var(), W)
        np.testing.assert_allclose(loss, path[0], rtol=1e-14)
        np.testing.assert_allclose(G, path[1], rtol=1e-13, atol=1e-16)


def test_path_is_checked():
    Xc, u, W = _problem(4, 3, 2, np.float64)
    with pytest.raises(ValueError, match="path must be"):
        PATHS[np.float64]("columns", Xc, u, 1.0, W)
    with pytest.raises(ValueError, match="W \\(B, d\\)"):
        PATHS[np.float64]("rows", Xc, u, 1.0, W[:, :2])

"""The NumPy oracle BNTwoLayerNetReference checked against independent routes.

Gradient and HVP (hand-derived) against complex-step derivatives of the loss
and the gradient; the third-order contraction (complex step of the HVP)
against central differences; predictions against a plain loop over samples and
units and against hand-computed n = 2 cases; the per-row scale invariance
against its consequences for loss, gradient and HVP.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _cases import rel_err

from pysharp.reference import BNTwoLayerNetReference, complex_step

ACTS = ("tanh", "relu")
SHAPES = ((7, 3, 1), (9, 4, 3), (12, 2, 4))  # (n, d, m)


def _instance(n, d, m, act, seed=0, B=3):
    """A random oracle and random points w, v, u of shape (B, m d)."""
    rng = np.random.default_rng(seed)
    ref = BNTwoLayerNetReference(rng.standard_normal((n, d)), rng.standard_normal(n), m, act)
    w, v, u = (rng.standard_normal((B, m * d)) for _ in range(3))
    return ref, w, v, u


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_grad_matches_complex_step_of_loss(shape, act):
    ref, w, _, _ = _instance(*shape, act)
    D = ref.dim
    cs = np.stack([complex_step(ref.loss, w, np.broadcast_to(np.eye(D)[k], w.shape))
                   for k in range(D)], axis=1)
    assert rel_err(ref.grad(w), cs) < 1e-13


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_hvp_matches_complex_step_of_grad(shape, act):
    ref, w, v, _ = _instance(*shape, act)
    assert rel_err(ref.hvp(w, v), complex_step(ref.grad, w, v)) < 1e-13


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_hvp_symmetric(shape, act):
    ref, w, v, u = _instance(*shape, act)
    uHv = np.sum(u * ref.hvp(w, v), axis=1)
    vHu = np.sum(v * ref.hvp(w, u), axis=1)
    assert rel_err(uHv, vHu) < 1e-12


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_third_matches_central_differences_of_hvp(shape, act):
    ref, w, v, _ = _instance(*shape, act)
    eps = 2e-5  # truncation ~ eps^2, rounding ~ 1e-16 / eps: both well below 1e-6
    fd = (ref.hvp(w + eps * v, v) - ref.hvp(w - eps * v, v)) / (2 * eps)
    assert rel_err(ref.third(w, v), fd) < 1e-6


def _scale_rows(ref, w, c):
    """w with row j of each W scaled by c[j]."""
    return (w.reshape(w.shape[0], ref.m, ref.d) * c[:, None]).reshape(w.shape)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_per_row_scale_invariance(shape, act):
    ref, w, _, _ = _instance(*shape, act)
    c = np.geomspace(0.3, 5.0, ref.m)
    ws = _scale_rows(ref, w, c)
    assert rel_err(ref.loss(ws), ref.loss(w)) < 1e-13
    g = ref.grad(w)
    # each row's gradient is orthogonal to that row ...
    W, G = w.reshape(-1, ref.m, ref.d), g.reshape(-1, ref.m, ref.d)
    radial = np.sum(W * G, axis=-1)
    assert np.max(np.abs(radial)) < 1e-13 * np.max(np.linalg.norm(W, axis=-1)
                                                    * np.linalg.norm(G, axis=-1))
    # ... and scales as 1 / c_j under W_j -> c_j W_j
    assert rel_err(ref.grad(ws), _scale_rows(ref, g, 1 / c)) < 1e-13


@pytest.mark.parametrize("act", ACTS)
def test_hvp_along_a_row_is_minus_that_rows_gradient(act):
    """grad(W with W_j -> (1+t) W_j) = grad with row j divided by 1+t,
    so H (e_j x W_j) = -(e_j x grad_j)."""
    ref, w, _, _ = _instance(9, 4, 3, act)
    g = ref.grad(w)
    for j in range(ref.m):
        mask = np.zeros(ref.m)
        mask[j] = 1.0
        assert rel_err(ref.hvp(w, _scale_rows(ref, w, mask)), -_scale_rows(ref, g, mask)) < 1e-12


def _loop_predictions(X, w, m, act):
    """f(x_i) = sum_j a_j act(zhat_ij), written with plain loops from the definition."""
    n, d = len(X), len(X[0])
    f = [0.0] * n
    for j in range(m):
        a_j = (1.0 if j % 2 == 0 else -1.0) / math.sqrt(m)
        z = [sum(w[j * d + k] * X[i][k] for k in range(d)) for i in range(n)]
        mu = sum(z) / n
        sd = math.sqrt(sum((zi - mu) ** 2 for zi in z) / n)
        for i in range(n):
            t = (z[i] - mu) / sd
            f[i] += a_j * (math.tanh(t) if act == "tanh" else max(t, 0.0))
    return f


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_predictions_match_loop(shape, act):
    ref, w, _, _ = _instance(*shape, act)
    X = ref.X.tolist()
    loop = np.array([_loop_predictions(X, row.tolist(), ref.m, act) for row in w])
    assert rel_err(ref.predictions(w), loop) < 1e-13
    assert rel_err(ref.loss(w), np.mean((loop - ref.y) ** 2, axis=1)) < 1e-13


# n = 2: each unit's zhat is exactly (-1, +1) or (+1, -1), so f is computable by hand.
# X = [[0, 0], [1, 2]], W rows (1, 0), (0, -1), (3, 1): z = (0, 1), (0, -2), (0, 5),
# zhat = (-1, 1), (1, -1), (-1, 1); a = (1, -1, 1) / sqrt(3).
# tanh: f = (-3 tanh 1, 3 tanh 1) / sqrt(3); relu: f = (-1, 2) / sqrt(3).
HAND_X = [[0.0, 0.0], [1.0, 2.0]]
HAND_W = [1.0, 0.0, 0.0, -1.0, 3.0, 1.0]
HAND_F = {"tanh": [-1.3191197728629198, 1.3191197728629198],
          "relu": [-0.5773502691896258, 1.1547005383792517]}


@pytest.mark.parametrize("act", ACTS)
def test_predictions_hand_case(act):
    y = np.array([0.5, -0.25])
    ref = BNTwoLayerNetReference(HAND_X, y, 3, act)
    w = np.array([HAND_W])
    np.testing.assert_allclose(ref.predictions(w)[0], HAND_F[act], rtol=1e-15)
    expected = ((HAND_F[act][0] - 0.5) ** 2 + (HAND_F[act][1] + 0.25) ** 2) / 2
    np.testing.assert_allclose(ref.loss(w), [expected], rtol=1e-15)
    # with n = 2, L is locally constant: gradient and HVP vanish
    g = ref.grad(w)
    assert np.max(np.abs(g)) < 1e-15
    assert np.max(np.abs(ref.hvp(w, np.ones_like(w)))) < 1e-14


def test_predictions_hand_case_single_unit():
    """m = 1, d = 1: X = (0, 1), W = 2 gives zhat = (-1, 1), f = (tanh(-1), tanh(1))."""
    ref = BNTwoLayerNetReference([[0.0], [1.0]], [0.0, 0.0], 1)
    np.testing.assert_allclose(ref.predictions(np.array([[2.0]]))[0],
                               [-0.7615941559557649, 0.7615941559557649], rtol=1e-15)
    np.testing.assert_allclose(ref.predictions(np.array([[-2.0]]))[0],
                               [0.7615941559557649, -0.7615941559557649], rtol=1e-15)


def test_complex_input_is_analytic():
    """Complex-step of the loss along a real direction equals grad . v (relu away from kinks)."""
    for act in ACTS:
        ref, w, v, _ = _instance(9, 4, 3, act)
        assert rel_err(complex_step(ref.loss, w, v), np.sum(ref.grad(w) * v, axis=1)) < 1e-13


@pytest.mark.parametrize("kwargs, name", [
    (dict(X=np.ones(4), y=np.ones(4), width=2), "X"),
    (dict(X=np.ones((1, 3)), y=np.ones(1), width=2), "X"),
    (dict(X=np.ones((4, 3)), y=np.ones(3), width=2), "y"),
    (dict(X=np.ones((4, 3)), y=np.ones((4, 1)), width=2), "y"),
    (dict(X=np.ones((4, 3)), y=np.ones(4), width=0), "width"),
    (dict(X=np.ones((4, 3)), y=np.ones(4), width=2.0), "width"),
    (dict(X=np.ones((4, 3)), y=np.ones(4), width=True), "width"),
    (dict(X=np.ones((4, 3)), y=np.ones(4), width=2, activation="gelu"), "activation"),
])
def test_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        BNTwoLayerNetReference(**kwargs)

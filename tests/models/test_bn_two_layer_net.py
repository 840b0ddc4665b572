"""BNTwoLayerNet, the fourth scale-invariant model: kernels against the NumPy oracle and
finite differences, per-row scale invariance, the per-row norm records, registry use.

The model is defined in docs/theory.rst ("BN two-layer network"); the oracle,
pysharp.reference.BNTwoLayerNetReference, is hand-derived and checked on its own in
test_reference.py. The placement, engine-vs-NumPy-loop, Lemma 3.1 and
Lanczos checks every model gets run on it in test_lanes.py and test_trajectory.py.
"""

import numpy as np
import pytest

import pysharp as ps
from pysharp.models._registry import REGISTRY, entry_of
from pysharp.reference import BNTwoLayerNetReference


@pytest.fixture(scope="module", params=["tanh", "relu"])
def model(request):
    return ps.BNTwoLayerNet.synthetic(n=12, d=5, width=4, teacher_width=2,
                                      activation=request.param, seed=3)


def _points(model, B=6, seed=0):
    W = model.random_point(B, seed=seed, norm=1.3)
    V = np.random.default_rng(seed + 1).standard_normal(W.shape)
    return W, V


def test_kernels_match_the_oracle(model):
    ref = BNTwoLayerNetReference(model.X, model.y, model.width, model.activation)
    W, V = _points(model)
    loss, grad = model.loss_and_grad(W)

    def close(a, b, tol=1e-12):
        assert np.abs(a - b).max() <= tol * np.abs(b).max()
    close(loss, ref.loss(W))
    close(grad, ref.grad(W))
    close(model.hvp(W, V), ref.hvp(W, V))
    close(model.third(W, V), ref.third(W, V))
    H = model.hessian(W[:2])
    close(H, np.stack([ref.hvp(W[:2], np.broadcast_to(e, W[:2].shape)) for e in
                       np.eye(model.dim)], axis=-1))
    np.testing.assert_allclose(H, np.swapaxes(H, 1, 2), atol=1e-13 * np.abs(H).max())
    # float32 computes in float32, to its precision
    np.testing.assert_allclose(model.loss(W.astype(np.float32)), loss, rtol=2e-5)
    np.testing.assert_allclose(model.predict(W), ref.predictions(W), rtol=1e-13, atol=1e-13)


def test_gradient_and_hvp_against_central_differences(model):
    W, V = _points(model, B=2, seed=5)
    h = 1e-6
    fd = (model.loss(W + h * V) - model.loss(W - h * V)) / (2 * h)
    np.testing.assert_allclose(np.sum(model.grad(W) * V, axis=1), fd, rtol=1e-6, atol=1e-9)
    fd_h = (model.grad(W + h * V) - model.grad(W - h * V)) / (2 * h)
    hv = model.hvp(W, V)
    assert np.abs(hv - fd_h).max() <= 1e-6 * np.abs(hv).max()


def test_each_row_is_scale_invariant_alone(model):
    W, _ = _points(model, B=3, seed=7)
    c = np.array([0.25, 3.0, 1.0, 7.5])  # one factor per hidden unit
    Wc = (W.reshape(3, model.width, -1) * c[:, None]).reshape(W.shape)
    loss, grad = model.loss_and_grad(W)
    loss_c, grad_c = model.loss_and_grad(Wc)
    np.testing.assert_allclose(loss_c, loss, rtol=1e-13)
    # grad of row j scales as 1 / c_j, and each row's gradient is orthogonal to the row
    G, Gc = grad.reshape(3, model.width, -1), grad_c.reshape(3, model.width, -1)
    np.testing.assert_allclose(Gc * c[:, None], G, rtol=1e-11, atol=1e-14 * np.abs(G).max())
    R = W.reshape(3, model.width, -1)
    assert np.abs(np.sum(R * G, axis=-1)).max() <= 1e-13 * np.abs(G).max() * np.abs(R).max()
    np.testing.assert_allclose(model.row_norms(Wc), model.row_norms(W) * c, rtol=1e-14)


def test_undefined_where_a_unit_is_constant():
    X = np.random.default_rng(0).standard_normal((6, 3))
    X[:, 2] = 1.5  # a constant input column: a unit reading only it is constant
    model = ps.BNTwoLayerNet(X, np.arange(6.0), width=2)
    w = np.array([0.3, -1.0, 0.2, 0.0, 0.0, 2.0])  # unit 1 = 2 x_2: constant over samples
    with pytest.raises(ValueError, match="constant over the samples"):
        model.loss(w)
    with pytest.raises(ValueError, match="constant over the samples"):
        ps.run_gd_wd(model, w, 0.1, 1e-3, 10)
    with pytest.raises(ValueError, match="activation"):
        ps.BNTwoLayerNet(X, np.arange(6.0), width=2, activation="gelu")
    with pytest.raises(ValueError, match="width"):
        ps.BNTwoLayerNet(X, np.arange(6.0), width=0)


def test_teacher_is_a_minimiser_when_the_widths_match():
    model = ps.BNTwoLayerNet.synthetic(n=20, d=4, width=3, teacher_width=3, seed=2)
    assert model.loss(model.teacher.ravel()) < 1e-28
    assert np.abs(model.grad(model.teacher.ravel())).max() < 1e-14


def test_engine_records_each_rows_norm():
    model = ps.BNTwoLayerNet.synthetic(n=12, d=5, width=4, teacher_width=2, seed=3)
    W0 = model.random_point(3, seed=1, norm=3.0)
    tr = ps.run_gd_wd(model, W0, [0.1, 0.4, 1.0], 1e-3, 400, record_every=20, theta_every=20,
                      sharpness_every=100)
    assert tr.group_norm2.shape == (21, 3, model.width)
    np.testing.assert_allclose(tr.group_norm2.sum(axis=-1), tr.norm2, rtol=1e-14)
    rows = (tr.theta * np.sqrt(tr.norm2)[..., None]).reshape(21, 3, model.width, -1)
    np.testing.assert_allclose(tr.group_norm2, np.sum(rows ** 2, axis=-1), rtol=1e-13)
    # Each row obeys the GD+WD norm recursion alone (its gradient is orthogonal to it):
    # ||W_j+||^2 = (1 - lr wd)^2 ||W_j||^2 + lr^2 ||grad_j||^2.
    one = ps.run_gd_wd(model, W0[1], 0.4, 1e-3, 30, record_every=1, sharpness_every=0,
                       theta_every=1)
    w = one.theta * np.sqrt(one.norm2)[:, None]
    g = model.grad(w[:-1]).reshape(30, model.width, -1)
    expected = (1 - 0.4e-3) ** 2 * one.group_norm2[:-1] + 0.16 * np.sum(g ** 2, axis=-1)
    np.testing.assert_allclose(one.group_norm2[1:], expected, rtol=1e-12)
    assert ps.run_gd_wd(ps.Toy3D(), [1.0, 0.5, 0.2], 0.1, 1e-3, 10).group_norm2 is None


def test_backends(model):
    W, V = _points(model, B=3)
    np.testing.assert_allclose(model.hvp(W, V, backend="numpy"), model.hvp(W, V), rtol=1e-11,
                               atol=1e-13 * np.abs(model.hvp(W, V)).max())
    pytest.importorskip("numba")  # without it, "numba is not installed" comes first
    with pytest.raises(ps.BackendUnavailable, match="no BNTwoLayerNet port"):
        model.loss(W, backend="numba")


def test_registered_and_sweepable_by_name():
    pytest.importorskip("xarray")
    entry = entry_of("bn_two_layer_net")
    assert entry.cls is ps.BNTwoLayerNet and REGISTRY["bn_two_layer_net"] is entry
    assert entry_of(ps.BNTwoLayerNet.synthetic(n=6, d=2, width=2)) is entry
    spec = {"name": "bn_two_layer_net", "n": 10, "d": 3, "width": 2, "teacher_width": 2}
    ds = ps.sweep(spec, lr=[0.1, 0.5], wd=[1e-3], seeds=[0], init_norm=2.0, steps=300,
                  sharpness_every=100, progress=False)
    model = ps.BNTwoLayerNet.synthetic(n=10, d=3, width=2, teacher_width=2)
    assert "row_norm_ratio" in ds and "description" in ds.row_norm_ratio.attrs
    from pysharp.sweeps._compute import initial_points
    w0 = initial_points(model, np.array([0]), np.array([2.0]))[0]
    lone = ps.run_gd_wd(model, w0, 0.5, 1e-3, 300, record_every=3, sharpness_every=100,
                        first_trajectory=1)
    norms = model.row_norms(lone.w)
    assert float(ds.row_norm_ratio.isel(lr=1).item()) == norms.max() / norms.min()
    # A model instance ships its data, and is rebuilt from its spec.
    rebuilt = ps.sweep(model, lr=[0.5], wd=[1e-3], seeds=[0], init_norm=2.0, steps=300,
                       sharpness_every=100, progress=False)
    assert float(rebuilt.final_loss.item()) == float(ds.final_loss.isel(lr=1).item())
    with pytest.raises(ValueError, match="unknown model"):
        entry_of("bn_three_layer_net")

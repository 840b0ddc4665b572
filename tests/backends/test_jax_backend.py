"""The XLA backend (backend="jax"): kernels, Lanczos and the engine against the compiled core.

Oracles: the compiled core's kernels (exact to rounding, checked against the NumPy
oracles elsewhere) to 1e-12, and its trajectories before the Edge of Stability to 1e-10
(two different paths: different summation orders and random streams, so bit-equality is
not expected); dense eigendecompositions for Lanczos; the records' shapes from the one
record table. JAX programs compile in seconds, so the cases are few and small.
"""

from __future__ import annotations

import numpy as np
import pytest
from _cases import conv_bn_loss, rel_err

import pysharp as ps
from pysharp._backends import BackendUnavailable, resolve
from pysharp._engine.methods import METHODS
from pysharp._engine.records import run_result_names

jax = pytest.importorskip("jax")


@pytest.fixture(scope="module")
def linreg():
    return ps.BNLinearRegression.synthetic(n=12, d=6, seed=3)


@pytest.mark.parametrize("make", [
    lambda: ps.BNLinearRegression.synthetic(n=12, d=6, seed=3),
    lambda: ps.BNMatrixCompletion.synthetic(size=5, rank=2, seed=1),
    lambda: ps.BNTwoLayerNet.synthetic(n=10, d=3, width=3, seed=2),
    lambda: ps.Toy3D(c=10.0),
], ids=["bn_linreg", "bn_mc", "bn_two_layer", "toy3d"])
def test_the_kernels_equal_the_compiled_cores(make):
    model = make()
    W, V = model.random_point(3, seed=1), model.random_point(3, seed=2)
    for a, b in zip(model.loss_and_grad(W, backend="cpp"), model.loss_and_grad(W, backend="jax")):
        assert rel_err(b, a) < 1e-12
    for kernel in ("hvp", "third"):
        a = getattr(model, kernel)(W, V, backend="cpp")
        b = getattr(model, kernel)(W, V, backend="jax")
        assert rel_err(b, a) < 1e-11, kernel
    assert rel_err(model.hessian(W[0], backend="jax"), model.hessian(W[0], backend="cpp")) < 1e-11


def test_a_builtin_stays_on_the_compiled_core_unless_asked(linreg):
    assert resolve("auto", np.zeros(3), model=linreg) == "cpp"
    assert resolve("jax", np.zeros(3), trajectories=True, model=linreg) == "jax"


def test_lanczos_finds_the_top_and_repeated_eigenvalues(linreg):
    W = linreg.random_point(2, seed=4)
    H = linreg.hessian(W, backend="cpp")
    dense = np.linalg.eigvalsh(H)[:, ::-1]
    res = ps.spherical_sharpness(linreg, W, k=3, method="lanczos", backend="jax")
    norm2 = np.sum(W * W, axis=1, keepdims=True)
    assert np.allclose(res.eigenvalues, dense[:, :3] * norm2, rtol=1e-9, atol=1e-12)
    assert res.converged.all()
    # a multiple eigenvalue: a quadratic form with a 3-fold top (Python operator path)
    q = np.diag([5.0, 5.0, 5.0, 2.0, 1.0, 0.5])

    def loss(p):
        u = p["w"] / jax.numpy.linalg.norm(p["w"])
        return 0.5 * u @ jax.numpy.asarray(q) @ u

    model = _xla(loss, {"w": np.arange(1.0, 7.0)})
    w = model.initial_point()
    w /= np.linalg.norm(w)
    res = ps.spherical_sharpness(model, w, k=4, method="lanczos")  # one block of 4
    dense = np.linalg.eigvalsh(model.hessian(w))[::-1]
    assert dense[0] - dense[1] < 1e-12 * dense[0]  # the repeated top is there
    assert rel_err(res.eigenvalues, dense[:4]) < 1e-9 and res.converged
    assert np.allclose(res.residuals, _true_residuals(model, w, res), rtol=0,
                       atol=1e-12 * dense[0])


def _sphere_quadratic(spectrum, seed):
    """An XlaModel of u^T A u / 2, u = w / ||w||, A with the given spectrum."""
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((len(spectrum), len(spectrum))))[0]
    a = U @ np.diag(spectrum) @ U.T

    def loss(p):
        u = p["w"] / jax.numpy.linalg.norm(p["w"])
        return 0.5 * u @ jax.numpy.asarray(a) @ u
    return _xla(loss, {"w": rng.standard_normal(len(spectrum))})


def _true_residuals(model, w, res):
    """||H v - lambda v|| of each returned pair at a unit w, from the model's own HVPs."""
    hv = model.hvp(np.repeat(w[None], len(res.eigenvalues), axis=0), res.eigenvectors)
    return np.linalg.norm(hv - res.eigenvalues[:, None] * res.eigenvectors, axis=1)


def test_lanczos_above_the_block_size_locks_and_sees_multiplicity():
    # k = 6 > _MAX_BLOCK: single-vector runs with locking and complement checks. A's top
    # eigenvalue of multiplicity 7 gives H(w) one of multiplicity >= 6 at a unit w, which
    # one Krylov sequence would see once
    k, mult = 6, 7
    D = 12
    model = _sphere_quadratic(np.concatenate([np.full(mult, 5.0),
                                              np.linspace(3.0, 0.5, D - mult)]), seed=k)
    W = np.random.default_rng(10 + k).standard_normal((2, D))
    W /= np.linalg.norm(W, axis=1, keepdims=True)  # unit rows: eigenvalues of H(w) itself
    res = ps.spherical_sharpness(model, W, k=k, method="lanczos")
    assert res.converged.all()
    for b in range(2):
        dense = np.linalg.eigvalsh(model.hessian(W[b]))[::-1]
        assert dense[0] - dense[mult - 2] < 1e-9 * dense[0]  # the repeated top is there
        assert rel_err(res.eigenvalues[b], dense[:k]) < 1e-9
        one = ps.sharpness.EigenResult(res.eigenvalues[b], res.eigenvectors[b],
                                       res.residuals[b], res.iterations[b], res.converged[b])
        assert np.allclose(res.residuals[b], _true_residuals(model, W[b], one), rtol=0,
                           atol=1e-12 * dense[0])
        assert np.allclose(res.eigenvectors[b] @ res.eigenvectors[b].T, np.eye(k), atol=1e-9)


def test_a_warm_start_at_the_top_eigenvector_converges_at_the_first_test():
    model = _sphere_quadratic(np.linspace(6.0, 0.5, 40), seed=1)
    w = np.random.default_rng(2).standard_normal(40)
    cold = ps.spherical_sharpness(model, w, method="lanczos")
    warm = ps.spherical_sharpness(model, w, method="lanczos", start=cold.eigenvectors[0])
    assert warm.iterations == 8 < cold.iterations  # min_iter = 8
    assert rel_err(warm.eigenvalues, cold.eigenvalues) < 1e-12


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_follows_the_compiled_engine_before_the_edge(linreg, method):
    spec = METHODS[method]
    W0 = linreg.random_point(2, seed=5)
    hyper = {"lr": np.array([0.05, 0.08]), "wd": np.array([1e-2, 5e-3]),
             "eta": np.array([0.05, 0.02]), "c": np.array([0.3, 0.2])}
    hyper = {k: hyper[k] for k in spec.hyper}
    kw = {"steps": 40, "record_every": 5, "sharpness_every": 10, "theta_every": 20,
          "method": method}
    a = ps.dynamics.run_method(linreg, W0, hyper, backend="cpp", **kw)
    b = ps.dynamics.run_method(linreg, W0, hyper, backend="jax", **kw)
    assert (a.eos_ratio < 1.5).all()  # before the edge: the two paths agree to rounding
    for name in ("loss", "norm2", "eff_lr", "grad_norm", "sharpness", "eos_ratio", "theta", "w"):
        assert rel_err(getattr(b, name), getattr(a, name)) < 1e-10, name
    # top_grad: the same to rounding of the top eigenvector's direction
    assert np.allclose(b.top_grad, a.top_grad, rtol=1e-6, atol=1e-10)
    assert b.meta["backend"] == "jax" and not b.diverged.any()


def test_the_records_are_the_tables_with_groups_and_top_k():
    net = ps.BNTwoLayerNet.synthetic(n=10, d=3, width=3, seed=2)
    W0 = net.random_point(2, seed=1)
    kw = {"steps": 20, "record_every": 5, "sharpness_every": 10, "top_k": 2}
    a = ps.run_gd_wd(net, W0, lr=0.05, wd=1e-2, backend="cpp", **kw)
    b = ps.run_gd_wd(net, W0, lr=0.05, wd=1e-2, backend="jax", **kw)
    assert rel_err(b.group_norm2, a.group_norm2) < 1e-10
    assert rel_err(b.top_eigenvalues, a.top_eigenvalues) < 1e-9
    raw = net._core(np.dtype(np.float64), "jax").run(
        W0, {"lr": np.full(2, 0.05), "wd": np.full(2, 1e-2)},
        ps._engine.EngineConfig(ps._engine.Method.GD_WD, steps=20, record_every=5,
                                lanczos=ps._engine.LanczosOptions.for_dim(net.dim)).to_core())
    assert list(raw) == run_result_names(3, 0)


def test_a_diverging_trajectory_is_flagged_and_the_batch_goes_on(linreg):
    W0 = linreg.random_point(2, seed=5)
    a = ps.run_gd_wd(linreg, W0, lr=np.array([0.05, 1e200]), wd=np.array([0.0, 0.0]),
                     steps=10, record_every=1, sharpness_every=5, backend="cpp")
    b = ps.run_gd_wd(linreg, W0, lr=np.array([0.05, 1e200]), wd=np.array([0.0, 0.0]),
                     steps=10, record_every=1, sharpness_every=5, backend="jax")
    assert list(b.diverged) == list(a.diverged) == [False, True]
    assert b.diverged_step[1] == a.diverged_step[1]
    assert np.isnan(b.loss[b.diverged_step[1]:, 1]).all() and np.isfinite(b.loss[:, 0]).all()
    assert np.isfinite(b.w).all()  # the last finite iterate is kept


def test_jitter_draws_from_jax_streams_reproducibly(linreg):
    W0 = linreg.random_point(2, seed=5)
    kw = {"lr": 0.05, "wd": 1e-2, "steps": 10, "sharpness_every": 0, "backend": "jax"}
    a = ps.run_gd_wd(linreg, W0, jitter=1e-3, seed=1, **kw)
    b = ps.run_gd_wd(linreg, W0, jitter=1e-3, seed=1, **kw)
    c = ps.run_gd_wd(linreg, W0, jitter=1e-3, seed=2, **kw)
    plain = ps.run_gd_wd(linreg, W0, **kw)
    assert np.array_equal(a.w, b.w) and not np.array_equal(a.w, c.w)
    assert 0 < rel_err(a.w, plain.w) < 1e-2


# -- any JAX network: from_jax(compile=False) -------------------------------------------------

def _xla(loss, params, **kw):
    from pysharp.models._xla import from_jax
    return from_jax(loss, params, **kw)


def _bn_net(p, X, y):
    jnp = jax.numpy
    z = X @ p["layer"]["W"]
    z = (z - z.mean(0)) / jnp.sqrt(z.var(0) + 1e-12)
    logits = jnp.tanh(z) @ (p["head"] / jnp.linalg.norm(p["head"]))
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(y.shape[0]), y])


@pytest.fixture(scope="module")
def net_data():
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((16, 5)), rng.integers(0, 3, 16)
    params = {"layer": {"W": rng.standard_normal((5, 4))}, "head": rng.standard_normal((4, 3))}
    return params, X, y


def test_a_pytree_network_is_a_model_with_jaxs_own_derivatives(net_data):
    params, X, y = net_data
    model = _xla(_bn_net, params, X=X, y=y)
    assert model.dim == 32 and model.leaf_paths == ["head", "layer/W"]
    w = model.initial_point()
    back = model.unravel(w)
    assert np.array_equal(np.asarray(back["layer"]["W"]), params["layer"]["W"])
    with ps._backends._jax.x64():
        f = lambda v: _bn_net(model.unravel(v), X, y)  # noqa: E731
        g = np.asarray(jax.grad(f)(w))
        v = np.random.default_rng(1).standard_normal(32)
        hv = np.asarray(jax.jvp(jax.grad(f), (w,), (v,))[1])
    assert rel_err(model.grad(w), g) < 1e-13
    assert rel_err(model.hvp(w, v), hv) < 1e-13
    assert abs(model.grad(w) @ w) < 1e-12 * np.linalg.norm(w)  # scale invariance holds
    assert model.invariance["rel_change"] < 1e-12
    # the hvp by finite differences, an independent oracle
    h = 1e-5
    fd = (model.grad(w + h * v) - model.grad(w - h * v)) / (2 * h)
    assert rel_err(model.hvp(w, v), fd) < 1e-7
    assert resolve("auto", w, model=model) == "jax"
    with pytest.raises(BackendUnavailable, match="cpp backend has no XlaModel port.*XLA"):
        model.loss(w, backend="cpp")


def test_groups_by_leaf_record_each_leafs_norm(net_data):
    params, X, y = net_data
    model = _xla(_bn_net, params, groups="leaves", X=X, y=y)
    assert model.n_groups == 2
    w = model.initial_point()
    tr = ps.run_gd_wd(model, w, lr=0.1, wd=1e-2, steps=6, record_every=3, sharpness_every=3)
    head = slice(0, 12)
    t = tr.steps[-1]
    assert tr.group_norm2.shape == (3, 2) and t == 6
    assert np.isclose(tr.group_norm2[0, 0], w[head] @ w[head])
    assert np.allclose(tr.group_norm2.sum(axis=1), tr.norm2, rtol=1e-13)
    by_list = _xla(_bn_net, params, groups=["head", ["layer/W"]], X=X, y=y)
    assert np.array_equal(by_list.groups, model.groups)


@pytest.mark.parametrize("groups, match", [
    ("rows", "None, 'leaves' or a list"),
    (["head"], r"leave out the leaves \['layer/W'\]"),
    (["head", "nope"], "names 'nope', which is no leaf"),
    (["head", "head", "layer/W"], "each leaf belongs to one group"),
])
def test_bad_groups_are_refused_in_words(net_data, groups, match):
    params, X, y = net_data
    with pytest.raises(ValueError, match=match):
        _xla(_bn_net, params, groups=groups, X=X, y=y)


def test_bad_params_and_data_are_refused_in_words(net_data):
    params, X, y = net_data
    with pytest.raises(TypeError, match="leaf 'n' is not a float array"):
        _xla(lambda p, X, y: 0.0, {"W": params["head"], "n": np.arange(3)}, X=X, y=y)
    X_nan = X.copy()
    X_nan[3, 2] = np.nan
    with pytest.raises(ValueError, match=r"data 'X' has a non-finite entry at index \(3, 2\)"):
        _xla(_bn_net, params, X=X_nan, y=y)
    with pytest.warns(UserWarning, match="not scale-invariant"):
        _xla(lambda p, X, y: jax.numpy.sum(p["head"] ** 2), params, X=X, y=y)


def test_a_conv_network_runs_its_rows_apart_on_the_cpu_as_the_vmapped_batch_would():
    # XLA's CPU runs a vmapped convolution with per-row kernels as a grouped convolution, far
    # slower than the rows one after another: the engine runs such a batch row by row, with
    # each row keyed by its global index, so the records are the vmapped batch's to rounding
    rng = np.random.default_rng(4)
    X, y = rng.standard_normal((8, 1, 4, 4)), rng.integers(0, 2, 8)

    model = _xla(conv_bn_loss, {"c": rng.standard_normal((2, 1, 3, 3)),
                        "fc": rng.standard_normal((2, 2))}, X=X, y=y, check=False)
    core = model._core(np.dtype(np.float64), "jax")
    assert core.rows_apart == (jax.default_backend() == "cpu")
    W = model.initial_point() + 0.05 * rng.standard_normal((3, model.dim))
    kw = {"lr": np.array([0.02, 0.05, 0.1]), "wd": 1e-3, "steps": 12, "record_every": 4,
          "sharpness_every": 0, "theta_every": 12, "jitter": 1e-4, "seed": 3, "backend": "jax"}
    apart = ps.run_gd_wd(model, W, **kw)
    core.__dict__["rows_apart"] = not core.rows_apart
    try:
        other = ps.run_gd_wd(model, W, **kw)
    finally:
        del core.__dict__["rows_apart"]
    for name in ("loss", "norm2", "eff_lr", "grad_norm", "theta", "w"):
        assert rel_err(getattr(other, name), getattr(apart, name)) < 1e-10, name
    assert apart.loss.shape == (4, 3) and apart.theta.shape == (2, 3, model.dim)


def test_the_xla_model_equals_the_traced_model_of_the_same_loss():
    # one loss, two paths: traced to C++ (compile=True) and run by XLA
    model = ps.BNLinearRegression.synthetic(n=12, d=6, seed=3)
    X, y = model.X, model.y

    def bn_linreg(w, X, y):
        jnp = jax.numpy
        z = X @ w
        p = y.std() * (z - z.mean()) / z.std() + y.mean()
        return jnp.mean((p - y) ** 2)

    xla = _xla(bn_linreg, np.ones(6), X=X, y=y)
    W, V = model.random_point(2, seed=1), model.random_point(2, seed=2)
    assert rel_err(xla.loss(W), model.loss(W)) < 1e-12
    assert rel_err(xla.third(W, V), model.third(W, V)) < 1e-10
    a = ps.run_gd_wd(model, W, lr=0.05, wd=1e-2, steps=30, record_every=10, sharpness_every=10)
    b = ps.run_gd_wd(xla, W, lr=0.05, wd=1e-2, steps=30, record_every=10, sharpness_every=10)
    assert rel_err(b.sharpness, a.sharpness) < 1e-10 and rel_err(b.w, a.w) < 1e-10


@pytest.mark.slow
def test_the_real_networks_tutorial_runs_as_written():
    """examples/real_network.py, which docs/tutorials/real_networks.rst includes: the CNN is
    invariant to each layer's scale, every learning rate trains it and the largest ones
    reach the edge."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "real_network.py"
    if not path.is_file():
        pytest.skip("examples/ not next to the tests")
    spec = importlib.util.spec_from_file_location("real_network_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = example.main(steps=600)
    tr, model = out["trajectory"], out["model"]
    assert model.dim == 680 and model.n_groups == 3
    assert model.invariance["rel_change_per_group"] < 1e-12
    assert not tr.diverged.any() and (tr.loss[-1] < 0.05 * tr.loss[0]).all()
    assert (tr.eos_entry_step[2:] >= 0).all()  # lr 0.2 and 0.4 reach the edge by step 600
    assert np.allclose(tr.group_norm2[:, -1].sum(axis=1), tr.norm2[:, -1], rtol=1e-12)
    assert out["params"]["conv2"].shape == (8, 8, 3, 3)

"""Hessian spectra: exact spectra against dense eigh, trace estimators' bias and
stderr coverage over many seeds, SLQ against its NumPy twin and exact moments,
loss slices against pointwise losses."""

from __future__ import annotations

import numpy as np
import pytest
from _cases import REGISTERED, get_case

import pysharp as ps
from pysharp.spectra import _backend, _points, _slq_numpy, rademacher

RNG = np.random.default_rng(7)


def _model(name):
    return get_case(name).model


def _points_of(model, batch, seed=0):
    if isinstance(model, ps.ScaleInvariantModel):
        return model.random_point(batch, seed=seed, norm=2.5)
    return model.random_point(batch, seed=seed)


def _dense(model, W, spherical, oracle=None):
    """The oracle Hessian: the NumPy oracle's HVPs (``oracle``, else the model's own) for a
    scale-invariant model, the model's dense Hessian for the others."""
    if isinstance(model, ps.ScaleInvariantModel):
        oracle = model._reference() if oracle is None else oracle
        B, D = W.shape
        H = oracle.hvp(np.repeat(W, D, axis=0), np.tile(np.eye(D), (B, 1))).reshape(B, D, D)
        if spherical:
            H = H * np.einsum("bi,bi->b", W, W)[:, None, None]
        return 0.5 * (H + np.swapaxes(H, 1, 2))
    H = model.hessian(W)
    return 0.5 * (H + np.swapaxes(H, 1, 2))


# -- hessian_spectrum -----------------------------------------------------------
@pytest.mark.parametrize("name", REGISTERED)
def test_spectrum_matches_dense_eigh(name):
    case = get_case(name)
    model = case.model
    W = _points_of(model, 3)
    for spherical in ([True, False] if isinstance(model, ps.ScaleInvariantModel) else [False]):
        H = _dense(model, W, spherical, case.ref)
        ref = np.linalg.eigvalsh(H)[:, ::-1]
        sp = ps.hessian_spectrum(model, W, spherical=spherical, eigenvectors=True)
        scale = np.abs(ref).max()
        assert sp.eigenvalues.shape == (3, model.dim)
        np.testing.assert_allclose(sp.eigenvalues, ref, atol=1e-12 * scale)
        assert np.all(np.diff(sp.eigenvalues, axis=1) <= 0)
        V = sp.eigenvectors  # rows
        np.testing.assert_allclose(np.einsum("bij,bkj->bki", H, V),
                                   sp.eigenvalues[..., None] * V, atol=1e-10 * scale)
        np.testing.assert_allclose(V @ np.swapaxes(V, 1, 2), np.broadcast_to(np.eye(model.dim),
                                   H.shape), atol=1e-12)


def test_spectrum_spherical_identity_and_weight_decay():
    model = _model("bn_linear_regression")
    W = _points_of(model, 2)
    norm2 = np.einsum("bi,bi->b", W, W)
    sph = ps.hessian_spectrum(model, W).eigenvalues
    flat = ps.hessian_spectrum(model, W, spherical=False).eigenvalues
    unit = ps.hessian_spectrum(model, W / np.sqrt(norm2)[:, None], spherical=False).eigenvalues
    np.testing.assert_allclose(sph, norm2[:, None] * flat, atol=1e-12 * np.abs(sph).max())
    np.testing.assert_allclose(sph, unit, atol=1e-12 * np.abs(sph).max())
    # The spherical spectrum depends on the direction only.
    np.testing.assert_allclose(ps.hessian_spectrum(model, 7.0 * W).eigenvalues, sph,
                               atol=1e-12 * np.abs(sph).max())
    wd = ps.hessian_spectrum(model, W, weight_decay=0.3).eigenvalues
    np.testing.assert_allclose(wd, sph + 0.3, atol=1e-12 * np.abs(sph).max())
    single = ps.hessian_spectrum(model, W[1])
    assert single.eigenvalues.shape == (model.dim,) and single.eigenvectors is None
    np.testing.assert_array_equal(single.eigenvalues, sph[1])


def test_spectrum_toy3d_closed_form():
    # On Gamma at the unit point (cos p/sqrt2, cos p/sqrt2, sin p): lambda_1 = 4 (1 + c sin^2 p),
    # and the other two eigenvalues vanish (Gamma is a minimiser set; w is a null direction).
    model = _model("toy3d")
    p = 0.3
    w = np.array([np.cos(p) / np.sqrt(2), np.cos(p) / np.sqrt(2), np.sin(p)]) * 3.0
    ev = ps.hessian_spectrum(model, w).eigenvalues
    np.testing.assert_allclose(ev, [4 * (1 + 10.0 * np.sin(p) ** 2), 0, 0], atol=1e-12)


# -- hessian_trace --------------------------------------------------------------
@pytest.mark.parametrize("name", REGISTERED)
def test_trace_exact_method(name):
    case = get_case(name)
    model = case.model
    W = _points_of(model, 3)
    spherical = isinstance(model, ps.ScaleInvariantModel)
    tr = np.trace(_dense(model, W, spherical, case.ref), axis1=1, axis2=2)
    t = ps.hessian_trace(model, W, n_probes=64)  # D <= 64: exact
    assert t.method == "exact" and t.matvecs == model.dim
    np.testing.assert_allclose(t.estimate, tr, atol=1e-12 * np.abs(tr).max() + 1e-14)
    np.testing.assert_array_equal(t.stderr, 0)
    t = ps.hessian_trace(model, W, method="exact", weight_decay=0.5)
    np.testing.assert_allclose(t.estimate, tr + 0.5 * model.dim, atol=1e-12 * np.abs(tr).max()
                               + 1e-12)


COVERAGE_MODELS = {
    "bn_linreg_d100_n80": lambda: ps.BNLinearRegression.synthetic(d=100, n=80, seed=0),
    "bn_mc_12x12_r3": lambda: ps.BNMatrixCompletion.synthetic(size=12, true_rank=2, rank=3,
                                                              n_obs=72, seed=0),
}


@pytest.mark.parametrize("method", ["hutchinson", "hutch++"])
@pytest.mark.parametrize("name", COVERAGE_MODELS)
def test_trace_estimators_unbiased_and_stderr_covers(name, method):
    """250 seeds x 4 points: the true trace lies within 3 stderr in >= 99% of the
    1000 estimates, and the seed average is unbiased within its own error."""
    model = COVERAGE_MODELS[name]()
    W = model.random_point(4, seed=3, norm=2.0)
    tr = np.trace(_dense(model, W, True), axis1=1, axis2=2)
    est, err = [], []
    for seed in range(250):
        t = ps.hessian_trace(model, W, n_probes=96, seed=seed, method=method)
        est.append(t.estimate)
        err.append(t.stderr)
    est, err = np.array(est), np.array(err)
    z = (est - tr) / err
    assert np.mean(np.abs(z) <= 3) >= 0.99
    bias = est.mean(axis=0) - tr
    assert np.all(np.abs(bias) <= 4 * est.std(axis=0) / np.sqrt(len(est)))
    # The stderr estimates the spread of the estimates across seeds.
    ratio = np.median(err, axis=0) / est.std(axis=0)
    assert np.all((ratio > 0.7) & (ratio < 1.3))


def test_hutchpp_beats_hutchinson_on_low_rank_hessian():
    model = COVERAGE_MODELS["bn_linreg_d100_n80"]()
    W = model.random_point(4, seed=3, norm=2.0)
    plain = ps.hessian_trace(model, W, n_probes=96, method="hutchinson").stderr
    hpp = ps.hessian_trace(model, W, n_probes=96).stderr  # auto: D > n_probes -> hutch++
    assert np.all(hpp < plain)


def test_trace_probes_are_shared_across_the_batch():
    model = COVERAGE_MODELS["bn_mc_12x12_r3"]()
    W = model.random_point(5, seed=1)
    batch = ps.hessian_trace(model, W, n_probes=30, seed=4)
    one = ps.hessian_trace(model, W[3], n_probes=30, seed=4)
    np.testing.assert_allclose(one.estimate, batch.estimate[3], rtol=1e-13)
    np.testing.assert_allclose(one.stderr, batch.stderr[3], rtol=1e-12)


# -- spectral_density -----------------------------------------------------------
def test_rademacher_probes():
    Z = rademacher(5, 200, 300)
    assert set(np.unique(Z)) == {-1.0, 1.0}
    assert abs(Z.mean()) < 0.01
    np.testing.assert_array_equal(rademacher(5, 3, 300, first=10), rademacher(5, 13, 300)[10:])
    assert not np.array_equal(rademacher(5, 3, 300), rademacher(6, 3, 300))


@pytest.mark.parametrize("name", REGISTERED)
def test_slq_cpp_matches_numpy_lanczos(name):
    """The C++ lane-block recurrence against the NumPy one on the same probes
    (which also checks that the C++ and NumPy Rademacher hashes agree)."""
    model = _model(name)
    W = _points_of(model, 3)
    if _backend(model, "auto", W) != "cpp":
        pytest.skip(f"{name} runs no C++ engine: its density is this NumPy recurrence")
    invariant = isinstance(model, ps.ScaleInvariantModel)
    if invariant and "numpy" not in model._backends:
        # on the compiled HVPs, one probe's breakdown test (b <= 1e-12 scale) falls on the
        # other side of its threshold than in C++ (the built-ins' too): the twin needs the
        # NumPy oracle's
        pytest.skip(f"{name} has no NumPy oracle backend")
    steps = min(10, model.dim)
    Ws, factor, _ = _points(model, W, invariant)
    ref = _slq_numpy(model, Ws, 4, steps, 11, "numpy" if invariant else "cpp")
    d = ps.spectral_density(model, W, n_probes=4, steps=10, seed=11)
    np.testing.assert_array_equal(d.count, ref["count"])
    nodes = ref["nodes"] * factor[:, None, None]
    np.testing.assert_allclose(d.nodes, nodes, atol=1e-11 * np.abs(nodes).max())
    np.testing.assert_allclose(d.weights, ref["weights"], atol=1e-11)


@pytest.mark.parametrize("name", REGISTERED)
def test_slq_quadrature_is_exact_for_low_degree(name):
    """sum_j w_j t_j^k = z^T H^k z / D (k < 2 steps) for the probes actually used."""
    case = get_case(name)
    model = case.model
    W = _points_of(model, 2, seed=1)
    invariant = isinstance(model, ps.ScaleInvariantModel)
    H = _dense(model, W, invariant, case.ref)
    steps = min(4, model.dim)
    d = ps.spectral_density(model, W, n_probes=6, steps=steps, seed=3)
    Z = rademacher(3, 6, model.dim)
    moments = d.moments(2 * steps - 1)
    for k in range(2 * steps):
        Hk = np.linalg.matrix_power(H, k)
        exact = np.einsum("pi,bij,pj->b", Z, Hk, Z) / (6 * model.dim)
        scale = np.linalg.norm(H, ord=2, axis=(1, 2)).max() ** k
        np.testing.assert_allclose(moments[:, k], exact, atol=1e-11 * max(scale, 1.0))


def test_slq_full_steps_nodes_are_eigenvalues():
    model = _model("bn_matrix_completion")
    W = _points_of(model, 2)
    ev = ps.hessian_spectrum(model, W).eigenvalues
    d = ps.spectral_density(model, W, n_probes=3, steps=500)  # capped at D
    assert d.nodes.shape == (2, 3, model.dim)
    scale = np.abs(ev).max()
    for b in range(2):
        used = d.nodes[b][d.weights[b] > 1e-8]
        gap = np.abs(used[:, None] - ev[b][None, :]).min(axis=1)
        assert np.all(gap <= 1e-9 * scale)
    np.testing.assert_allclose(d.weights.sum(axis=-1), 1.0, atol=1e-12)


def test_slq_moments_estimate_normalised_traces():
    """Over 200 seeds, the moment estimates of tr(H^k)/D (k = 1, 2) cover the truth
    within 3 stderr in >= 99% of seeds, and their mean is unbiased."""
    model = ps.BNMatrixCompletion.synthetic(size=10, true_rank=2, rank=3, n_obs=50, seed=1)
    W = model.random_point(2, seed=5)
    H = _dense(model, W, True)
    D = model.dim
    truth = np.stack([np.trace(np.linalg.matrix_power(H, k), axis1=1, axis2=2) / D
                      for k in (1, 2)], axis=1)
    est, hits = [], []
    for seed in range(200):
        d = ps.spectral_density(model, W, n_probes=32, steps=6, seed=seed)
        per_probe = np.einsum("bpj,bpjk->bpk", d.weights, d.nodes[..., None] ** np.array([1, 2]))
        m = per_probe.mean(axis=1)
        se = per_probe.std(axis=1, ddof=1) / np.sqrt(32)
        est.append(m)
        hits.append(np.abs(m - truth) <= 3 * se)
    est = np.array(est)
    assert np.mean(hits) >= 0.99
    assert np.all(np.abs(est.mean(axis=0) - truth) <= 4 * est.std(axis=0) / np.sqrt(len(est)))


def test_density_integrates_to_one_with_broadened_moments():
    model = _model("bn_linear_regression")
    W = _points_of(model, 3)
    d = ps.spectral_density(model, W, n_probes=8, steps=8)
    m = d.moments(2)
    mass = np.trapezoid(d.density, d.grid, axis=-1)
    np.testing.assert_allclose(mass, 1.0, atol=1e-8)
    mean = np.trapezoid(d.density * d.grid, d.grid, axis=-1)
    second = np.trapezoid(d.density * d.grid ** 2, d.grid, axis=-1)
    scale = np.abs(d.nodes).max()
    np.testing.assert_allclose(mean, m[:, 1], atol=1e-8 * scale)
    np.testing.assert_allclose(second, m[:, 2] + d.sigma ** 2, atol=1e-8 * scale ** 2)
    # A user grid and sigma are used as given.
    grid = np.linspace(d.grid[0], d.grid[-1], 301)
    d2 = ps.spectral_density(model, W, n_probes=8, steps=8, grid=grid, sigma=0.05)
    assert d2.density.shape == (3, 301) and d2.sigma == 0.05
    np.testing.assert_array_equal(d2.nodes, d.nodes)


def test_density_batch_placement_weight_decay_and_spherical():
    model = _model("bn_matrix_completion")
    W = _points_of(model, 5)
    batch = ps.spectral_density(model, W, n_probes=5, steps=9, seed=2)
    one = ps.spectral_density(model, W[3], n_probes=5, steps=9, seed=2)
    np.testing.assert_array_equal(one.nodes, batch.nodes[3])  # lane-wise: same bits
    np.testing.assert_array_equal(one.weights, batch.weights[3])
    core = ps._engine.loader.core()
    threads = core.max_threads()
    try:
        core.set_num_threads(2)
        two = ps.spectral_density(model, W, n_probes=5, steps=9, seed=2)
    finally:
        core.set_num_threads(threads)
    np.testing.assert_array_equal(two.nodes, batch.nodes)  # any thread count: same bits
    wd = ps.spectral_density(model, W, n_probes=5, steps=9, seed=2, weight_decay=0.25)
    np.testing.assert_allclose(wd.nodes, batch.nodes + 0.25, atol=1e-12 * np.abs(wd.nodes).max())
    flat = ps.spectral_density(model, W, n_probes=5, steps=9, seed=2, spherical=False)
    norm2 = np.einsum("bi,bi->b", W, W)
    np.testing.assert_allclose(flat.nodes * norm2[:, None, None], batch.nodes,
                               atol=1e-12 * np.abs(batch.nodes).max())


def test_density_numpy_backend_matches_cpp():
    model = _model("bn_linear_regression")
    W = _points_of(model, 2)
    a = ps.spectral_density(model, W, n_probes=3, steps=7)
    b = ps.spectral_density(model, W, n_probes=3, steps=7, backend="numpy")
    np.testing.assert_allclose(b.nodes, a.nodes, atol=1e-11 * np.abs(a.nodes).max())
    np.testing.assert_allclose(b.density, a.density, atol=1e-9 * a.density.max())


# -- loss_slice -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["bn_linear_regression", "two_layer_net"])
def test_loss_slice_matches_pointwise_losses(name):
    model = _model(name)
    w = _points_of(model, None)
    U = np.linalg.qr(RNG.standard_normal((model.dim, 2)))[0].T
    a, b = np.linspace(-0.4, 0.3, 5), np.linspace(-0.2, 0.2, 3)
    s = ps.loss_slice(model, w, U, (a, b))
    assert s.loss.shape == (5, 3)
    for i in range(5):
        for j in range(3):
            assert s.loss[i, j] == pytest.approx(float(model.loss(w + a[i] * U[0] + b[j] * U[1])),
                                                 rel=1e-13, abs=1e-15)
    s1 = ps.loss_slice(model, w, U[0], a)
    assert s1.b is None and s1.loss.shape == (5,)
    np.testing.assert_allclose(s1.loss, s.loss[:, 1], rtol=1e-13)  # b[1] = 0


def test_loss_slice_default_directions_are_top_eigenvectors():
    model = _model("bn_linear_regression")
    w = _points_of(model, None)
    s = ps.loss_slice(model, w)
    top = ps.hessian_spectrum(model, w, spherical=False, eigenvectors=True)
    np.testing.assert_allclose(np.abs(s.directions @ top.eigenvectors[:2].T), np.eye(2),
                               atol=1e-10)
    assert s.loss.shape == (41, 41)
    # Curvature along u at the centre: second difference ~ lambda_1(H(w)).
    h = 1e-4
    f = ps.loss_slice(model, w, s.directions[0], np.array([-h, 0.0, h])).loss
    assert (f[0] - 2 * f[1] + f[2]) / h ** 2 == pytest.approx(top.eigenvalues[0], rel=1e-4)


# -- validation -----------------------------------------------------------------
def test_bad_input_is_named():
    model = _model("bn_linear_regression")
    w = _points_of(model, 2)
    with pytest.raises(TypeError, match="model"):
        ps.hessian_spectrum(object(), w)
    with pytest.raises(ValueError, match="spherical"):
        ps.hessian_trace(_model("linear_regression"), np.zeros(5), spherical=True)
    with pytest.raises(ValueError, match="n_probes"):
        ps.spectral_density(model, w, n_probes=0)
    with pytest.raises(ValueError, match="seed"):
        ps.hessian_trace(model, w, seed=-1)
    with pytest.raises(ValueError, match="method"):
        ps.hessian_trace(model, w, method="lanczos")
    with pytest.raises(ValueError, match="n_probes"):
        ps.hessian_trace(model, w, method="hutch++", n_probes=4)
    with pytest.raises(ValueError, match="grid"):
        ps.spectral_density(model, w, grid=[0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="sigma"):
        ps.spectral_density(model, w, sigma=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        ps.hessian_spectrum(model, w, weight_decay=-1.0)
    with pytest.raises(ValueError, match="zero vector"):
        ps.hessian_spectrum(model, np.zeros(model.dim))
    with pytest.raises(ValueError, match="single point"):
        ps.loss_slice(model, w)
    with pytest.raises(ValueError, match="directions"):
        ps.loss_slice(model, w[0], np.ones((3, model.dim)))
    with pytest.raises(ValueError, match="grid"):
        ps.loss_slice(model, w[0], w[0], [0.5, -1.0])  # w - w = 0


# -- reproduce spectra ----------------------------------------------------------
def test_reproduce_spectra_quick(tmp_path):
    pytest.importorskip("matplotlib")
    from pysharp import reproduce

    s = reproduce.run("spectra", tmp_path, quick=True)
    assert (tmp_path / "spectra.png").exists() and (tmp_path / "spectra.json").exists()
    snaps = s["snapshots"]
    # The top Ritz value of 12 Lanczos steps is the exact sharpness.
    assert s["slq_top_node_max_rel_err"] < 1e-8
    # Sharpness frozen at the interpolating minimum until EoS entry, then reduced.
    assert snaps["EoS entry"]["eos_ratio"] > 1.9
    assert snaps["end"]["lambda_1"] < 0.8 * snaps["EoS entry"]["lambda_1"]
    # Minimisers: rank n - 2 = 18 of D = 40, a null bulk of 22 / 40.
    assert snaps["EoS entry"]["rank"] == 18
    for snap in snaps.values():
        assert abs(snap["trace_hutchpp"] - snap["trace_exact"]) <= 4 * snap["trace_stderr"]
        assert abs(snap["slq_null_mass"] - snap["exact_null_mass"]) < 0.15
        assert abs(snap["slq_mean"] - snap["exact_mean"]) <= 4 * snap["slq_mean_stderr"]

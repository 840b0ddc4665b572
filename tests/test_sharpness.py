"""spherical_sharpness and lanczos: top-k / bottom-k eigenpairs with multiplicity (issue 13
item 5), the eigenvectors' sign convention, the defaults and the Krylov cap.

The oracle is numpy.linalg.eigvalsh of the dense Hessian built from the NumPy
reference HVP (backend="numpy"), independent of the Lanczos code, or a
diagonal operator whose eigenpairs are known.
"""

import numpy as np
import pytest
from _cases import get_case

import pysharp as ps
from pysharp._engine import LANCZOS_MAX_ITER, LanczosOptions
from pysharp._engine.loader import core

numba_only = pytest.mark.skipif(not ps.backends()["numba"]["available"],
                                reason="numba is not installed")

# (case key, number of random points, k values)
CASES = [("bn_linreg_paper", 40, (3, 6)), ("bn_mc", 20, (3, 5)), ("toy3d", 20, (2, 3))]


def dense_spectrum(case, W):
    """Eigenvalues of H(w/||w||) = ||w||^2 H(w), ascending, from the NumPy oracle."""
    H = case.model.hessian(W, backend="numpy")
    return np.linalg.eigvalsh(0.5 * (H + np.swapaxes(H, 1, 2))) * np.sum(W * W, 1)[:, None]


def extreme(spectrum, k, which):
    return spectrum[:, :k] if which == "SA" else spectrum[:, ::-1][:, :k]


@pytest.mark.parametrize("which", ["LA", "SA"])
@pytest.mark.parametrize("key,n,ks", CASES, ids=[c[0] for c in CASES])
def test_extreme_eigenvalues_match_dense_with_multiplicity(key, n, ks, which):
    case = get_case(key)
    W = case.points(n, seed=11)
    spectrum = dense_spectrum(case, W)
    scale = np.abs(spectrum).max(axis=1, keepdims=True)
    for k in ks:
        res = ps.spherical_sharpness(case.model, W, k=k, which=which, method="lanczos")
        want = extreme(spectrum, k, which)
        err = np.abs(res.eigenvalues - want) / scale
        assert err.max() <= 1e-8, (k, which, np.argwhere(err > 1e-8)[:5])
        assert res.converged.all()


def test_linreg_spectrum_is_degenerate_where_single_vector_lanczos_fails(linreg_paper):
    # Guards the test above: the paper's setting has a multiple eigenvalue 0
    # inside the top 3 at many points, which a single Krylov sequence returns once.
    W = linreg_paper.points(40, seed=11)
    top3 = extreme(dense_spectrum(linreg_paper, W), 3, "LA")
    tiny = 1e-10 * np.abs(top3[:, :1])
    assert np.sum(np.abs(top3[:, 2]) < tiny[:, 0]) >= 10
    m = linreg_paper.model
    w0 = m.random_point(seed=1, norm=10.0)  # the README example
    res = ps.spherical_sharpness(m, w0, k=3)
    want = extreme(dense_spectrum(linreg_paper, w0[None]), 3, "LA")[0]
    assert abs(want[1]) < 1e-12 * want[0] and abs(want[2]) < 1e-12 * want[0]
    np.testing.assert_allclose(res.eigenvalues, want, rtol=0, atol=1e-10 * want[0])
    assert res.converged


@pytest.mark.parametrize("which", ["LA", "SA"])
def test_eigenvectors_are_orthonormal_eigenvectors(linreg_paper, mc_case, which):
    for case in (linreg_paper, mc_case):
        W = case.points(8, seed=4)
        k = 6
        res = ps.spherical_sharpness(case.model, W, k=k, which=which, method="lanczos")
        V = res.eigenvectors
        gram = np.einsum("bki,bli->bkl", V, V)
        assert np.abs(gram - np.eye(k)).max() < 1e-10
        n2 = np.sum(W * W, axis=1)
        HV = np.stack([case.model.hvp(np.repeat(W[b:b + 1], k, 0), V[b], backend="numpy")
                       for b in range(len(W))]) * n2[:, None, None]
        r = np.linalg.norm(HV - res.eigenvalues[..., None] * V, axis=-1)
        scale = np.abs(res.eigenvalues).max()
        assert r.max() <= 1e-9 * scale
        np.testing.assert_allclose(res.residuals, r, rtol=0, atol=1e-12 * scale)
        # sign convention: the largest-magnitude entry is positive
        assert np.all(np.take_along_axis(V, np.abs(V).argmax(-1)[..., None], -1) > 0)


def test_too_few_iterations_is_not_converged(linreg_paper):
    W = linreg_paper.points(40, seed=11)
    want = extreme(dense_spectrum(linreg_paper, W), 3, "LA")
    for max_iter in (3, 4, 6):
        res = ps.spherical_sharpness(linreg_paper.model, W, k=3, method="lanczos",
                                     max_iter=max_iter)
        right = np.all(np.abs(res.eigenvalues - want) <= 1e-8 * np.abs(want[:, :1]), axis=1)
        assert not res.converged.any()  # a 3..6-dim Krylov space cannot meet tol 1e-10
        assert not right.all()
    # converged => right, at every cap
    for max_iter in (10, 15, 20, 40):
        res = ps.spherical_sharpness(linreg_paper.model, W, k=3, method="lanczos",
                                     max_iter=max_iter)
        right = np.all(np.abs(res.eigenvalues - want) <= 1e-8 * np.abs(want[:, :1]), axis=1)
        assert np.all(right[res.converged])


def _operator(evals, seed=0):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((len(evals), len(evals))))
    return (Q * np.asarray(evals, float)) @ Q.T


def test_python_operator_with_repeated_eigenvalues():
    evals = np.concatenate([[5.0, 5.0, 5.0], np.linspace(-3.0, 4.0, 24), [-4.0, -4.0, -4.0]])
    A = _operator(evals)
    top = ps.lanczos(lambda x: A @ x, 30, k=4)
    np.testing.assert_allclose(top.eigenvalues, [5, 5, 5, 4], rtol=1e-10)
    assert top.converged
    bottom = ps.lanczos(lambda x: A @ x, 30, k=5, which="SA")
    np.testing.assert_allclose(bottom.eigenvalues, [-4, -4, -4, -3, -3 + 7 / 23], rtol=1e-10)
    assert bottom.converged
    for r in (top, bottom):
        V = r.eigenvectors
        np.testing.assert_allclose(V @ V.T, np.eye(len(V)), atol=1e-10)
        assert np.linalg.norm(V @ A - r.eigenvalues[:, None] * V, axis=1).max() < 1e-9
    # A multiple top eigenvalue filling more than k slots, a diagonal operator
    # (every coordinate vector an eigenvector) and k = dim (empty complement).
    d = np.array([7.0] * 6 + [1.0, 2.0, 3.0, 0.5])
    r = ps.lanczos(lambda x: d * x, 10, k=5)
    np.testing.assert_allclose(r.eigenvalues, [7.0] * 5, rtol=1e-12)
    assert r.converged
    full = ps.lanczos(lambda x: d * x, 10, k=10)
    np.testing.assert_allclose(full.eigenvalues, np.sort(d)[::-1], rtol=1e-12)
    assert full.converged


def test_k1_is_the_top_of_k3(case):
    W = case.points(6, seed=3)
    one = ps.spherical_sharpness(case.model, W, k=1, method="lanczos")
    three = ps.spherical_sharpness(case.model, W, k=3, method="lanczos")
    np.testing.assert_allclose(one.eigenvalues[:, 0], three.eigenvalues[:, 0], rtol=1e-12)
    cos = np.abs(np.einsum("bi,bi->b", one.eigenvectors[:, 0], three.eigenvectors[:, 0]))
    assert cos.min() > 1 - 1e-8
    low = ps.spherical_sharpness(case.model, W, k=1, which="SA", method="lanczos")
    np.testing.assert_allclose(low.eigenvalues[:, 0], dense_spectrum(case, W)[:, 0],
                               rtol=0, atol=1e-9 * np.abs(three.eigenvalues).max())


def test_auto_method_is_right(toy_case, linreg_small, linreg_paper):
    for case in (toy_case, linreg_small, linreg_paper):
        W = case.points(5, seed=8)
        want = dense_spectrum(case, W)
        for which in ("LA", "SA"):
            k = min(3, case.dim)
            res = ps.spherical_sharpness(case.model, W, k=k, which=which)
            assert np.abs(res.eigenvalues - extreme(want, k, which)).max() <= \
                1e-9 * np.abs(want).max()
            assert res.converged.all()
        # D <= 16 takes the dense path (D products), larger D Lanczos
        dense_path = np.all(res.iterations == case.dim)
        assert dense_path == (case.dim <= 16)


def test_dense_method_which(mc_case):
    W = mc_case.points(3, seed=1)
    want = dense_spectrum(mc_case, W)
    for which in ("LA", "SA"):
        res = ps.spherical_sharpness(mc_case.model, W, k=4, which=which, method="dense")
        np.testing.assert_allclose(res.eigenvalues, extreme(want, 4, which), rtol=0,
                                   atol=1e-10 * np.abs(want).max())


def test_iteration_cap_is_one_constant():
    d = np.linspace(1.0, 2.0, LANCZOS_MAX_ITER + 1)
    d[-1] = 3.0
    r = ps.lanczos(lambda x: d * x, d.size, max_iter=LANCZOS_MAX_ITER)
    assert abs(r.eigenvalues[0] - 3.0) < 1e-9
    with pytest.raises(ValueError, match="max_iter"):
        ps.lanczos(lambda x: d * x, d.size, max_iter=LANCZOS_MAX_ITER + 1)
    with pytest.raises(ValueError, match=f"min\\(D, {LANCZOS_MAX_ITER}\\)"):  # the C++ check
        options = LanczosOptions(max_iter=LANCZOS_MAX_ITER + 1).to_core()
        core().lanczos_callable(lambda x: d * x, d.size, options)
    assert core().LANCZOS_MAX_ITER == LANCZOS_MAX_ITER  # the constant the C++ exports


def test_which_is_validated(toy_case):
    with pytest.raises(ValueError, match="which"):
        ps.spherical_sharpness(toy_case.model, toy_case.points(seed=0), which="LM")
    with pytest.raises(ValueError, match="which"):
        ps.lanczos(lambda x: x, 3, which="la")


@numba_only
def test_numba_lanczos_matches_cpp_with_multiplicity(linreg_paper):
    W = linreg_paper.points(4, seed=11)
    for which in ("LA", "SA"):
        a = ps.spherical_sharpness(linreg_paper.model, W, k=3, which=which, method="lanczos",
                                   backend="cpp")
        b = ps.spherical_sharpness(linreg_paper.model, W, k=3, which=which, method="lanczos",
                                   backend="numba")
        assert np.abs(a.eigenvalues - b.eigenvalues).max() <= 1e-10 * np.abs(a.eigenvalues).max()
        np.testing.assert_array_equal(a.converged, b.converged)
        np.testing.assert_array_equal(a.iterations, b.iterations)


# -- spherical_sharpness and lanczos: sign convention, defaults, caps --------------------
def test_eigenvector_sign_convention_and_k_equal_to_d():
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=1)
    W = model.random_point(2, seed=3, norm=3.0)
    dense = ps.spherical_sharpness(model, W, k=12, method="dense")
    H = model.hessian(W / 3.0)
    assert np.allclose(dense.eigenvalues, np.linalg.eigvalsh(H)[:, ::-1], atol=1e-10)
    for res in (dense, ps.spherical_sharpness(model, W, k=2, method="lanczos")):
        V = res.eigenvectors
        peak = np.take_along_axis(V, np.abs(V).argmax(-1)[..., None], -1)
        assert np.all(peak > 0)
        assert np.allclose(np.linalg.norm(V, axis=-1), 1.0)
    single = ps.spherical_sharpness(model, W[0], k=1, method="lanczos")
    assert single.eigenvalues.shape == (1,) and single.iterations.ndim == 0
    assert bool(single.converged) and single.iterations >= 8
    with pytest.raises(ValueError, match="k must be <= D"):
        ps.spherical_sharpness(model, W, k=13)
    with pytest.raises(ValueError, match="tol"):
        ps.spherical_sharpness(model, W, tol=0.0)
    top = ps.lanczos(lambda v: np.arange(1.0, 6.0) * v, 5, k=5)
    assert np.allclose(top.eigenvalues, [5, 4, 3, 2, 1])
    assert ps.lanczos(lambda v: np.arange(1.0, 6.0) * v, 5).eigenvalues.shape == (1,)
    with pytest.raises(ValueError, match="k must be <= dim"):
        ps.lanczos(lambda v: v, 5, k=6)
    with pytest.raises(ValueError, match="max_iter"):
        ps.lanczos(lambda v: v, 5, k=3, max_iter=2)


def test_spherical_sharpness_defaults_and_the_numpy_backend():
    model = ps.BNLinearRegression.synthetic(d=20, n=10, seed=3)
    W = model.random_point(2, seed=4)
    default = ps.spherical_sharpness(model, W, k=2)  # D > 16: Lanczos, seed 0
    seeded = ps.spherical_sharpness(model, W, k=2, seed=0)
    assert np.array_equal(default.eigenvectors, seeded.eigenvectors)
    other = ps.spherical_sharpness(model, W, k=2, seed=1)
    assert not np.array_equal(other.eigenvectors, seeded.eigenvectors)
    assert np.allclose(other.eigenvalues, seeded.eigenvalues, rtol=1e-9)
    dense = ps.spherical_sharpness(model, W, k=2, backend="numpy")  # "numpy" offers dense only
    assert np.allclose(dense.eigenvalues, seeded.eigenvalues, rtol=1e-9)
    assert np.all(dense.iterations == 20)
    with pytest.raises(ValueError, match="kernels only"):
        ps.spherical_sharpness(model, W, method="lanczos", backend="numpy")


def test_default_krylov_cap_admits_more_than_128_eigenpairs():
    """Default max_iter = min(D, 1024, max(128, 4k)): k = 130 of a diagonal D = 200 operator."""
    diag = np.arange(1.0, 201.0)
    res = ps.lanczos(lambda v: diag * v, 200, k=130)
    assert np.allclose(res.eigenvalues, diag[::-1][:130], rtol=1e-9)
    # iterations add up the Krylov steps of every run: the first (capped at
    # D = 200) and, for k > 1, the complement check runs of the locking scheme
    assert res.converged and 200 <= res.iterations <= 2 * 200



def test_sharpness_and_lanczos_refuse_what_they_cannot_run():
    case = get_case("toy3d")
    w = case.points(seed=0)
    with pytest.raises(ValueError, match="method must be 'auto', 'lanczos' or 'dense'"):
        ps.spherical_sharpness(case.model, w, method="power")
    with pytest.raises(TypeError, match="matvec must be callable"):
        ps.lanczos(np.eye(3), 3)


def test_dense_eigenvectors_are_unit_and_sign_fixed():
    """The dense path orients each eigenvector so that its largest entry is positive."""
    case = get_case("bn_linreg_small")
    res = ps.spherical_sharpness(case.model, case.points(seed=1), k=3, method="dense")
    v = res.eigenvectors
    np.testing.assert_allclose(np.linalg.norm(v, axis=-1), 1.0, rtol=1e-13)
    top = np.take_along_axis(v, np.abs(v).argmax(-1)[..., None], -1)
    assert (top > 0).all()

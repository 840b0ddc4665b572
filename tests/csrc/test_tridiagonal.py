"""The tridiagonal routines of engine/tridiagonal.hpp, one matrix at a time and in lockstep
lane blocks, against SciPy's LAPACK solver: the implicit-QL eigensolver, inverse iteration,
and the O(m) top-pair test of the lockstep Lanczos.

The lane version serves the batched Lanczos convergence tests: every lane runs its own QL
iteration, masked while the others rotate, so a matrix's result must not depend on which
matrices share its block.
"""

import numpy as np
import pytest
from scipy.linalg import eigh_tridiagonal

core = pytest.importorskip("pysharp._core")
eigh_rows = core._tridiagonal_eigh


def _matrices(rng, B, m):
    """Random symmetric tridiagonals with the hard cases mixed in: a split at a nonzero
    coupling below the deflation threshold (so that lanes of one block rotate over
    different ranges), integer diagonals (repeated eigenvalues), a diagonal matrix, wide
    scales."""
    d = rng.standard_normal((B, m))
    e = rng.standard_normal((B, m))
    e[:, -1] = 0.0
    if m > 3:
        k = m // 2                            # below the threshold: T splits into two blocks
        e[1::5, k] = 0.5 * np.finfo(float).eps * (np.abs(d[1::5, k]) + np.abs(d[1::5, k + 1]))
        d[2::5] = np.round(d[2::5] * 2)       # clustered / repeated eigenvalues
        e[3::5] = 0.0                         # already diagonal
        d[4::5] *= 1e6
        e[4::5] *= 1e-3                       # strongly graded
    return d, e


def _dense(d, e):
    return np.diag(d) + np.diag(e[:-1], 1) + np.diag(e[:-1], -1)


@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize("m", [1, 2, 7, 16, 33])
def test_eigenpairs_match_lapack(m, lanes):
    rng = np.random.default_rng(m)
    d, e = _matrices(rng, 23, m)
    vals, Z, ok = eigh_rows(d, e, 0, m, lanes)
    assert ok.all()
    for b in range(d.shape[0]):
        T = _dense(d[b], e[b])
        ref = eigh_tridiagonal(d[b], e[b, :-1], eigvals_only=True)
        scale = max(np.abs(ref).max(), 1e-300)
        np.testing.assert_allclose(np.sort(vals[b]), ref, rtol=0, atol=1e-13 * scale)
        V = Z[b]                              # V[:, c] is the eigenvector of vals[b, c]
        np.testing.assert_allclose(V.T @ V, np.eye(m), atol=1e-13)
        np.testing.assert_allclose(T @ V, V * vals[b], rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("lanes", [False, True])
def test_a_band_of_rows_has_the_bits_of_the_full_run(lanes):
    """The Lanczos test asks for the last row only, Gauss quadrature for the first."""
    d, e = _matrices(np.random.default_rng(1), 17, 12)
    full_vals, full_Z, _ = eigh_rows(d, e, 0, 12, lanes)
    for first, rows in [(11, 1), (0, 1), (4, 3)]:
        vals, Z, _ = eigh_rows(d, e, first, rows, lanes)
        assert np.array_equal(vals, full_vals)
        assert np.array_equal(Z, full_Z[:, first:first + rows])


def test_a_matrix_gets_the_same_bits_beside_any_neighbours_in_its_lane_block():
    rng = np.random.default_rng(2)
    m = 14
    d, e = _matrices(rng, 40, m)
    d[7, 3] = np.nan                          # a failing neighbour
    alone = [eigh_rows(d[b:b + 1], e[b:b + 1], m - 1, 1, True) for b in range(40)]
    for trial in range(4):
        order = rng.permutation(40)[: 9 + 10 * trial]
        vals, Z, ok = eigh_rows(d[order], e[order], m - 1, 1, True)
        for i, b in enumerate(order):
            assert ok[i] == alone[b][2][0] == (b != 7)
            if b != 7:
                assert np.array_equal(vals[i], alone[b][0][0])
                assert np.array_equal(Z[i], alone[b][1][0])


def test_lanes_and_one_at_a_time_agree_to_rounding():
    """Same operations in the same order; FMA contraction may fuse them differently."""
    d, e = _matrices(np.random.default_rng(3), 31, 20)
    v1, z1, ok1 = eigh_rows(d, e, 19, 1, False)
    v2, z2, ok2 = eigh_rows(d, e, 19, 1, True)
    assert ok1.all() and ok2.all()
    scale = np.abs(v1).max(axis=1, keepdims=True)
    np.testing.assert_allclose(np.sort(v2), np.sort(v1), rtol=0, atol=1e-13 * scale.max())


def test_non_finite_input_fails_that_matrix_only():
    d, e = _matrices(np.random.default_rng(4), 9, 10)
    d[2, 0] = np.nan
    e[5, 4] = np.nan
    for lanes in (False, True):
        vals, _, ok = eigh_rows(d, e, 9, 1, lanes)
        assert ok.tolist() == [b not in (2, 5) for b in range(9)]
        assert np.isfinite(vals[ok.astype(bool)]).all()


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="shape"):
        eigh_rows(np.zeros((2, 3)), np.zeros((2, 4)), 0, 1, True)
    with pytest.raises(ValueError, match="rows"):
        eigh_rows(np.zeros((2, 3)), np.zeros((2, 3)), 2, 2, False)


# -- one eigenvector by inverse iteration (the Lanczos Ritz-vector coefficients) -------------
eigvec = core._tridiagonal_eigenvectors


@pytest.mark.parametrize("m", [1, 2, 7, 16, 33])
def test_inverse_iteration_gives_the_top_eigenvector(m):
    """Against LAPACK: the residual is at rounding level for every matrix, the hard cases
    included (splits, repeated eigenvalues, diagonal, graded); where the top eigenvalue is
    isolated the vector is LAPACK's up to sign."""
    d, e = _matrices(np.random.default_rng(5), 60, m)
    top = np.array([eigh_tridiagonal(d[b], e[b, :-1])[0][-1] for b in range(60)])
    s = eigvec(d, e, top)
    for b in range(60):
        T = _dense(d[b], e[b])
        scale = np.abs(T).sum(axis=1).max()
        assert abs(np.linalg.norm(s[b]) - 1) < 1e-14
        assert np.linalg.norm(T @ s[b] - top[b] * s[b]) <= 1e-13 * scale, b
        w, V = eigh_tridiagonal(d[b], e[b, :-1])
        if m == 1 or w[-1] - w[-2] > 1e-6 * scale:
            assert abs(abs(V[:, -1] @ s[b]) - 1) < 1e-12, b


def test_inverse_iteration_reaches_every_eigenvalue_and_split_blocks():
    """Any eigenvalue, not only the top: interior ones, and a matrix split by a zero
    coupling whose eigenvector lives in the second block (exact zero pivots)."""
    rng = np.random.default_rng(6)
    d, e = rng.standard_normal(12), rng.standard_normal(12)
    e[5] = 0.0  # two blocks, 0..5 and 6..11
    e[-1] = 0.0
    w, V = eigh_tridiagonal(d, e[:-1])
    s = eigvec(np.tile(d, (12, 1)), np.tile(e, (12, 1)), w)
    T = _dense(d, e)
    for i in range(12):
        assert np.linalg.norm(T @ s[i] - w[i] * s[i]) <= 1e-13 * np.abs(T).sum(axis=1).max()
        assert abs(abs(V[:, i] @ s[i]) - 1) < 1e-10, i
    diag = np.array([[3.0, 1.0, 3.0 + 1e-300, -2.0]])  # diagonal: theta hits a pivot exactly
    s = eigvec(diag, np.zeros((1, 4)), np.array([3.0]))
    assert np.isfinite(s).all() and abs(np.linalg.norm(s) - 1) < 1e-15
    assert abs(s[0, 1]) < 1e-15 and abs(s[0, 3]) < 1e-15  # in the eigenspace of 3


def test_inverse_iteration_from_a_start_orthogonal_to_all_ones():
    """theta = -1 is exact here and its eigenvector (+-1/sqrt 8, two zeros) is orthogonal
    to the all-ones vector: an iteration started there never leaves the range of
    T - theta I (a residual of 0.06 when the start was all ones)."""
    d = np.array([[1.0, 2, 1, -1, -2, -2, 0, 0, 2, -1]])
    e = np.array([[2.0, 1, 1, 1, -1, -1, 1, 1, 1, 0]])
    w, V = eigh_tridiagonal(d[0], e[0, :-1])
    assert abs(w[3] + 1) < 1e-14 and abs(V[:, 3].sum()) < 1e-14
    s = eigvec(d, e, np.array([-1.0]))[0]
    T = _dense(d[0], e[0])
    assert np.linalg.norm(T @ s + s) < 1e-14 * np.abs(T).sum(axis=1).max()
    assert abs(abs(V[:, 3] @ s) - 1) < 1e-14


# -- the Lanczos convergence test's top Ritz pair (Laguerre + twisted factorisation) --------
top_test = core._tridiagonal_top_test


def _hard_matrices(rng, B, m):
    """_matrices' cases with nonzero couplings (the test refuses zero ones), plus nearly
    decoupled indices (a top eigenvector whose last entry is far below rounding),
    negative definite matrices and extreme scales."""
    d, e = _matrices(rng, B, m)
    e[3::5, :-1] = rng.standard_normal((len(range(3, B, 5)), m - 1))  # no zero coupling
    e[1::5, :-1] = np.where(e[1::5, :-1] == 0, 1e-300, e[1::5, :-1])
    e[1::7, :-1] *= 1e-8
    d[2::7] = -np.abs(d[2::7]) * 3
    d[5::7] *= 1e-200
    e[5::7] *= 1e-200
    d[6::7] *= 1e250
    e[6::7] *= 1e250
    return d, e


@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize("m", [1, 2, 3, 7, 16, 33])
def test_top_test_matches_lapack(m, lanes):
    """theta and ||T|| to rounding of ||T||, and the last entry of theta's unit eigenvector
    to rounding (absolute: LAPACK's own vector is no better), for every hard case."""
    d, e = _hard_matrices(np.random.default_rng(10 + m), 70, m)
    theta, z, norm, ok = top_test(d, e, lanes)
    assert ok.all()
    for b in range(d.shape[0]):
        w, V = eigh_tridiagonal(d[b], e[b, :-1])
        scale = np.abs(w).max()
        assert abs(theta[b] - w[-1]) <= 4e-15 * scale, b
        assert abs(norm[b] - scale) <= 4e-15 * scale, b
        if m == 1 or w[-1] - w[-2] > 1e-6 * scale:  # an isolated eigenvalue: a unique vector
            assert abs(z[b] - abs(V[-1, -1])) <= 1e-13, b


def test_top_test_sees_a_last_entry_far_below_rounding():
    """A Ritz value that has converged at a nearly decoupled index: its eigenvector's last
    entry is a product of tiny couplings (about 1e-40 here), which the pivots from the top
    alone lose (theta's rounding leaves the pivot at that index without a correct digit)."""
    d = np.array([[0.0, 0.3, 3.0, 1.0, 0.5, -0.2]])
    e = np.array([[0.7, 0.4, 1e-8, 1e-8, 1e-8, 0.0]])
    theta, z, _, ok = top_test(d, e, False)
    w, V = eigh_tridiagonal(d[0], e[0, :-1])
    assert ok[0] and abs(theta[0] - w[-1]) <= 4e-15 * abs(w[-1])
    assert abs(V[-1, -1]) < 1e-20 and z[0] < 1e-20
    np.testing.assert_allclose(z[0], abs(V[-1, -1]), rtol=1e-6)


def test_top_test_finds_the_top_of_two_close_decoupled_values():
    """Laguerre's step from just below the top root of a 2 x 2 matrix lands exactly on the
    other root; the step's sign rule and the Sturm certificate keep the top one."""
    rng = np.random.default_rng(12)
    d = rng.standard_normal((200, 2))
    e = np.zeros((200, 2))
    e[:, 0] = rng.choice([1e-8, 1e-4, 1.0], 200) * rng.standard_normal(200)
    theta, _, norm, ok = top_test(d, e, True)
    assert ok.all()
    for b in range(200):
        w = eigh_tridiagonal(d[b], e[b, :-1], eigvals_only=True)
        assert abs(theta[b] - w[-1]) <= 4e-15 * np.abs(w).max(), b


def test_top_test_refuses_what_it_cannot_vouch_for_and_lanes_stay_apart():
    """A zero coupling (T splits: theta's vector may miss the last row) or a non-finite
    entry fails that matrix alone, to be decomposed by QL instead; a matrix's result has
    the same bits beside any neighbours in its lane block."""
    rng = np.random.default_rng(13)
    d, e = _hard_matrices(rng, 40, 9)
    e[4, 3] = 0.0
    d[7, 2] = np.nan
    e[9, 1] = np.inf
    theta, z, norm, ok = top_test(d, e, True)
    assert ok.tolist() == [b not in (4, 7, 9) for b in range(40)]
    alone = [top_test(d[b:b + 1], e[b:b + 1], True) for b in range(40)]
    for trial in range(3):
        order = rng.permutation(40)[: 9 + 13 * trial]
        res = top_test(d[order], e[order], True)
        for i, b in enumerate(order):
            for got, single in zip(res, alone[b]):
                assert np.array_equal(got[i], single[0], equal_nan=True)


@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize("m", [1, 2, 7, 20])
def test_top_test_in_float32(m, lanes):
    """The float32 lanes (16 per AVX-512 register) of the float32 lockstep Lanczos: theta and
    ||T|| to float32 rounding of ||T||, z to float32 rounding."""
    rng = np.random.default_rng(20 + m)
    d = rng.standard_normal((50, m))
    e = rng.standard_normal((50, m))
    e[:, -1] = 0.0
    d[1::5] = np.round(d[1::5] * 2)
    d[2::5] = -np.abs(d[2::5]) * 3
    d[3::5] *= 1e20
    e[3::5] *= 1e20
    d32, e32 = d.astype(np.float32), e.astype(np.float32)
    theta, z, norm, ok = core._tridiagonal_top_test_f32(d32, e32, lanes)
    assert theta.dtype == np.float32 and ok.all()
    for b in range(50):
        w, V = eigh_tridiagonal(d32[b].astype(float), e32[b, :-1].astype(float))
        scale = np.abs(w).max()
        assert abs(theta[b] - w[-1]) <= 4e-7 * scale, b
        assert abs(norm[b] - scale) <= 4e-7 * scale, b
        if m == 1 or w[-1] - w[-2] > 1e-2 * scale:
            assert abs(z[b] - abs(V[-1, -1])) <= 1e-5, b


def test_top_test_refuses_a_cluster_it_cannot_resolve():
    """A top cluster far tighter than rounding (glued 2 x 2 blocks): Laguerre converges
    only linearly there and stops short, up to ~40 eps above the top. The Sturm window
    (8 eps of the scaled norm) must then refuse, so that QL answers; whatever it accepts
    is within 20 eps of ||T||."""
    eps = np.finfo(float).eps
    cases = [(np.tile([1.0, 1 - 1e-11], 100), np.tile([1e-11, 1e-20], 100))]
    rng = np.random.default_rng(14)
    for width in (1e-12, 1e-10, 1e-8):
        cases.append((1 + width * rng.standard_normal(200), width * rng.standard_normal(200)))
    for d, e in cases:
        e[-1] = 0.0
        theta, _, norm, ok = top_test(d[None], e[None], False)
        w = eigh_tridiagonal(d, e[:-1], eigvals_only=True)
        if ok[0]:
            assert abs(theta[0] - w[-1]) <= 20 * eps * np.abs(w).max()
            assert abs(norm[0] - np.abs(w).max()) <= 20 * eps * np.abs(w).max()

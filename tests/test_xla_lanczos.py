"""The XLA Lanczos's single-vector option (``multiplicity=False``) on small JAX networks.

Oracle: numpy.linalg.eigvalsh of the dense Hessian (JAX's jacfwd of the gradient, D <= 30).
A top-k solve of one Krylov sequence must equal the dense top k where the top k are
distinct, take fewer HVPs than the block run that sees multiplicity, and, where the top
eigenvalue is repeated, can miss the repeat (what its docstring says not to use it for).
Each Lanczos program compiles in 4-12 s on the shared 2-core Xeon, so only the k = 1 test,
one program, is fast.
"""

from __future__ import annotations

import numpy as np
import pytest

from pysharp._engine import LanczosOptions

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _bn_tanh_net():
    """A BN tanh net with integer-label cross-entropy, invariant to the scale of w (D = 30)."""
    from pysharp.models import from_jax

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((24, 4)), rng.integers(0, 3, 24)

    def loss(p, X, y):
        z = X @ p["W1"]
        z = (z - z.mean(0)) / jnp.sqrt(z.var(0) + 1e-12)
        logits = jnp.tanh(z) @ p["W2"]
        logits = (logits - logits.mean(0)) / jnp.sqrt(logits.var(0) + 1e-12)
        return -jnp.mean(jax.nn.log_softmax(2.0 * logits)[jnp.arange(24), y])

    params = {"W1": rng.standard_normal((4, 6)), "W2": rng.standard_normal((6, 3))}
    model = from_jax(loss, params, compile=False, check=False, X=X, y=y)
    w = model.initial_point()
    return model, w / np.linalg.norm(w)


def _solve(model, w, k, multiplicity, tol=1e-12):
    core = model._core(np.dtype(np.float64), "jax")
    options = LanczosOptions.for_dim(model.dim, k, tol=tol).to_core()
    evals, evecs, resid, iters, conv, ok = core.lanczos(w[None], options,
                                                        multiplicity=multiplicity)
    assert ok.all()
    return evals[0], evecs[0], resid[0], int(iters[0]), bool(conv[0])


@pytest.fixture(scope="module")
def net():
    model, w = _bn_tanh_net()
    H = model.hessian(w)
    return model, w, np.linalg.eigvalsh(H)[::-1], H


def test_k1_single_vector_equals_the_dense_top_eigenvalue(net):
    model, w, dense, H = net
    assert dense[0] - dense[1] > 1e-3 * dense[0]  # a simple top eigenvalue
    val, vec, res, iters, conv = _solve(model, w, 1, multiplicity=False)
    assert conv and abs(val[0] - dense[0]) < 1e-10 * dense[0]
    # an eigenvector of the dense H, with the reported residual
    hv = H @ vec[0]
    assert np.linalg.norm(hv - val[0] * vec[0]) < 1e-9 * dense[0]
    assert res[0] == pytest.approx(np.linalg.norm(hv - val[0] * vec[0]), abs=1e-12 * dense[0])
    # k = 1 runs one Krylov sequence either way: the same run, the same HVPs
    again = _solve(model, w, 1, multiplicity=True)
    assert again[3] == iters and again[0][0] == val[0]


@pytest.mark.slow   # two Lanczos programs to compile: 20-25 s on the loaded 2-core Xeon
def test_top2_single_vector_takes_fewer_hvps_than_the_block_and_agrees_with_dense(net):
    model, w, dense, _ = net
    assert dense[1] - dense[2] > 1e-3 * dense[0]  # the top two are distinct
    one = _solve(model, w, 2, multiplicity=False)
    block = _solve(model, w, 2, multiplicity=True)
    for val, _, _, _, conv in (one, block):
        assert conv and np.max(np.abs(val - dense[:2])) < 1e-10 * dense[0]
    assert one[3] < block[3]


@pytest.mark.slow   # a model, its Hessian and two Lanczos programs to compile
def test_single_vector_misses_a_repeated_top_eigenvalue_which_the_block_sees():
    from pysharp.models import from_jax

    rng = np.random.default_rng(3)
    D = 12
    U = np.linalg.qr(rng.standard_normal((D, D)))[0]
    a = U @ np.diag(np.concatenate([[5.0, 5.0], np.linspace(3.0, 0.5, D - 2)])) @ U.T

    def loss(p):
        u = p["w"] / jnp.linalg.norm(p["w"])
        return 0.5 * u @ jnp.asarray(a) @ u

    model = from_jax(loss, {"w": rng.standard_normal(D)}, compile=False, check=False)
    w = model.initial_point()
    w /= np.linalg.norm(w)
    # at a unit w, H(w) = P A P - (u^T A u) P: A's double top 5 stays double in H unless w
    # lies in its eigenspace
    dense = np.linalg.eigvalsh(model.hessian(w))[::-1]
    assert dense[0] - dense[1] < 1e-12 * dense[0] and dense[1] - dense[2] > 0.1
    block = _solve(model, w, 2, multiplicity=True, tol=1e-10)
    one = _solve(model, w, 2, multiplicity=False, tol=1e-10)
    assert block[4] and np.max(np.abs(block[0] - dense[:2])) < 1e-10 * dense[0]
    # one start's Krylov space is invariant after one step per distinct eigenvalue (11 of
    # them here), where every Ritz pair is exact and the double eigenvalue appears once: the
    # second slot holds the third eigenvalue, reported as converged
    assert one[4] and one[3] == 11
    assert abs(one[0][0] - dense[0]) < 1e-10 * dense[0]
    assert abs(one[0][1] - dense[2]) < 1e-10 * dense[0]


@pytest.mark.slow   # two Lanczos programs to compile, as above
def test_spherical_sharpness_passes_multiplicity_to_the_xla_backend(net):
    import pysharp as ps

    model, w, dense, _ = net
    one = ps.spherical_sharpness(model, w, k=2, tol=1e-12, backend="jax", multiplicity=False)
    block = ps.spherical_sharpness(model, w, k=2, tol=1e-12, backend="jax")
    assert int(one.iterations) == _solve(model, w, 2, multiplicity=False)[3]
    assert int(one.iterations) < int(block.iterations)
    np.testing.assert_allclose(one.eigenvalues, dense[:2], rtol=1e-10)


def test_the_compiled_core_ignores_multiplicity_false():
    """Its k > 1 solve always locks (multiplicity is kept): the same run, the same bits."""
    import pysharp as ps

    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=0)
    w = model.random_point(batch=2, seed=1)
    a = ps.spherical_sharpness(model, w, k=3, method="lanczos", backend="cpp")
    b = ps.spherical_sharpness(model, w, k=3, method="lanczos", backend="cpp", multiplicity=False)
    assert np.array_equal(a.eigenvalues, b.eigenvalues)
    assert np.array_equal(a.iterations, b.iterations)

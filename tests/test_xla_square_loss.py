"""SGD stability of JAX networks: ps.models.square_loss_from_jax with run_sgd and pysharp.stability.

Oracles: finite differences for the per-sample Jacobians; dense NumPy algebra on the
explicit Jacobians for a, s, T_2 (as a D^2 x D^2 Kronecker matrix) and the vector
criterion; the compiled core's TwoLayerNet, the same network with one output, for every
number and the SGD trajectory; a hand-written NumPy backprop SGD over the engine's own
batches for vector outputs; the compiled core's linear_sgd for the NumPy linearised SGD.
"""

from __future__ import annotations

import numpy as np
import pytest
from _cases import rel_err

import pysharp as ps
from pysharp import stability
from pysharp._backends._jax import x64
from pysharp.models import TwoLayerNet, square_loss_from_jax
from pysharp.sgd import run_sgd, sgd_batches

jax = pytest.importorskip("jax")
jnp = jax.numpy

N, D_IN, WIDTH, K = 12, 3, 3, 3


def mlp(p, x):
    """A 2-layer tanh MLP with K outputs, for one sample x (D_IN,)."""
    return p["W2"] @ jnp.tanh(p["W1"] @ x + p["b1"])


def _params(seed=0):
    rng = np.random.default_rng(seed)
    return {"W1": rng.standard_normal((WIDTH, D_IN)) / np.sqrt(D_IN), "b1": np.zeros(WIDTH),
            "W2": rng.standard_normal((K, WIDTH)) / np.sqrt(WIDTH)}


@pytest.fixture(scope="module")
def vec():
    """The K-output MLP on N samples (D = 21 < N K = 36: H has full rank), chunks of 5."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, D_IN))
    Y = rng.standard_normal((N, K))
    model = square_loss_from_jax(mlp, _params(), X, Y, chunk=5)
    w = model.initial_point()
    J = model.param_gradients(w)
    return model, w, J


def _dense(J):
    """H, Sigma and the H_i from explicit Jacobians J (n, k, D), plain NumPy."""
    Hs = np.einsum("nkd,nke->nde", J, J)
    H = Hs.mean(0)
    return H, np.einsum("nde,nef->df", Hs, Hs) / len(J) - H @ H, Hs


def _t2_dense(Hs, lr, kap):
    """T_2 on all D x D matrices (row-major vec), from Kronecker products."""
    n, D, _ = Hs.shape
    H, I = Hs.mean(0), np.eye(D)
    QI = sum(np.kron(h, h) for h in Hs) / n
    return (np.eye(D * D) - lr * (np.kron(H, I) + np.kron(I, H))
            + lr ** 2 * ((1 - kap) * np.kron(H, H) + kap * QI))


def test_jacobians_loss_and_grad_against_finite_differences(vec):
    model, w, J = vec
    assert J.shape == (N, K, model.dim) and model.dim == 21
    assert model.unravel(w)["W1"].shape == (WIDTH, D_IN)
    h = 1e-6
    fd = np.stack([(model.predict(w + h * e) - model.predict(w - h * e)) / (2 * h)
                   for e in np.eye(model.dim)], axis=-1)
    assert np.abs(fd - J).max() < 1e-8
    F, J2, GX = model.jacobians(w)
    assert np.array_equal(J2, J) and GX.shape == (N, K, D_IN)
    x0, p = model.X[0], model.unravel(w)
    with x64():
        fdx = np.stack([(np.asarray(mlp(p, x0 + h * e)) - np.asarray(mlp(p, x0 - h * e)))
                        / (2 * h) for e in np.eye(D_IN)], axis=-1)
    assert np.abs(fdx - GX[0]).max() < 1e-8
    r = F - model.Y
    loss, g = model.loss_and_grad(w)
    assert rel_err(loss, 0.5 * np.mean(np.sum(r * r, axis=1))) < 1e-14
    assert rel_err(g, np.einsum("nk,nkd->d", r, J) / N) < 1e-13


@pytest.mark.parametrize("method", ["dense", "gram", "lanczos"])
def test_sharpness_nonuniformity_against_dense_numpy(vec, method):
    model, w, J = vec
    H, Sigma, _ = _dense(J)
    q = stability.sharpness_nonuniformity(model, w, method=method)
    assert rel_err(q.sharpness, np.linalg.eigvalsh(H)[-1]) < 1e-10
    assert rel_err(q.nonuniformity, np.sqrt(np.linalg.eigvalsh(Sigma)[-1])) < 1e-9
    assert rel_err(q.trace_h, np.trace(H)) < 1e-12
    assert q.rank == (-1 if method == "lanczos" else model.dim)  # lanczos: never forms J


def test_t2_critical_lr_and_conditions_against_kronecker_matrices(vec):
    model, w, J = vec
    H, Sigma, Hs = _dense(J)
    a = np.linalg.eigvalsh(H)[-1]
    lr, B = 1.1 / a, 4
    kap = stability.kappa(N, B)
    rho = np.max(np.abs(np.linalg.eigvals(_t2_dense(Hs, lr, kap))))
    op = stability.second_moment_operator(model, w, lr, B)
    assert op.rank == model.dim and op.outputs == K
    assert rel_err(op.spectral_radius, rho) < 1e-10
    M = np.random.default_rng(3).standard_normal((model.dim, model.dim))
    M = M + M.T
    Q = op.basis  # (D, D) here: apply takes range coordinates when r = D
    TM = Q @ op.apply(Q.T @ M @ Q) @ Q.T
    assert rel_err(TM.ravel(), _t2_dense(Hs, lr, kap) @ M.ravel()) < 1e-12
    I = np.eye(model.dim)
    E2 = (I - lr * H) @ (I - lr * H) + lr ** 2 * kap * Sigma
    assert rel_err(op.expected_square(), E2) < 1e-12
    c = stability.stability_conditions(model, w, lr, B)
    assert rel_err(c.vector_criterion, np.linalg.eigvalsh(E2)[-1]) < 1e-10
    assert c.stable == (rho <= 1)
    etas = stability.critical_lr(model, w, [1, 4, N])
    for eta, b in zip(etas, [1, 4, N]):
        T = _t2_dense(Hs, eta, stability.kappa(N, b))
        assert abs(np.max(np.abs(np.linalg.eigvals(T))) - 1) < 1e-9
    assert rel_err(etas[-1], 2 / a) < 1e-12  # B = n: GD's 2/a


def test_chunking_gives_the_same_numbers(vec):
    model, w, J = vec
    whole = square_loss_from_jax(mlp, _params(), model.X, model.y, chunk=N)
    assert whole.chunk == N and model.chunk == 5
    assert np.abs(whole.param_gradients(w) - J).max() < 1e-15
    assert rel_err(whole.loss(w), model.loss(w)) < 1e-14
    assert rel_err(whole.grad(w), model.grad(w)) < 1e-14
    for method in ("dense", "lanczos"):
        q1 = stability.sharpness_nonuniformity(model, w, method=method)
        q2 = stability.sharpness_nonuniformity(whole, w, method=method)
        assert rel_err(q1.sharpness, q2.sharpness) < 1e-12
        assert rel_err(q1.nonuniformity, q2.nonuniformity) < 1e-10
    s1, s2 = stability.input_smoothness(model, w, k=2), stability.input_smoothness(whole, w, k=2)
    assert rel_err(s1.g_W, s2.g_W) < 1e-13 and rel_err(s1.g_x, s2.g_x) < 1e-13


def test_input_smoothness_and_moment_ratio_against_explicit_jacobians(vec):
    model, w, J = vec
    GX = model.input_gradients(w)
    for k in (1, 2):
        s = stability.input_smoothness(model, w, k=k)
        assert rel_err(s.g_W, np.mean(np.sum(J ** (2 * k), axis=(1, 2))) ** (1 / (2 * k))) < 1e-13
        assert rel_err(s.g_x, np.mean(np.sum(GX ** (2 * k), axis=(1, 2))) ** (1 / (2 * k))) < 1e-13
        assert s.holds is None  # no first layer known
        ratio = stability.gradient_moment_ratio(model, w, 0.3, 4, k=k)
        bound = 2 * model.dim * 8 ** (k - 1) / 0.3 ** k
        assert rel_err(ratio, np.mean(np.sum(J ** (2 * k), axis=(1, 2))) / bound) < 1e-13


def test_vector_linear_sgd_port_follows_the_core_batches():
    """The NumPy linearised SGD (k > 1) on rows padded with zero rows is the core's k = 1."""
    rng = np.random.default_rng(5)
    C = rng.standard_normal((7, 4))
    X0 = rng.standard_normal((3, 4))
    padded = np.stack([C, np.zeros_like(C)], axis=1).reshape(14, 4)  # H_i = c_i c_i^T
    for repl in (False, True):
        Xc, gc = ps._engine.loader.core().linear_sgd(C, X0, 0.3, 3, repl, 11, 0, 5, 40)
        Xp, gp = stability._linear_sgd(padded, 2, X0, 0.3, 3, repl, 11, 5, 40)
        assert np.abs(Xc - Xp).max() < 1e-13 and np.abs(gc - gp).max() < 1e-12


def test_moment_growth_and_lyapunov_for_vector_outputs(vec):
    model, w, J = vec
    a = stability.sharpness_nonuniformity(model, w).sharpness
    lr, B = 1.1 / a, 4
    rho = stability.second_moment_operator(model, w, lr, B).spectral_radius
    mg = stability.moment_growth(model, w, lr, B, n_runs=128, steps=60, seed=1)
    assert abs(mg.rate - rho) < 0.02 * rho
    ly = stability.lyapunov_exponent(model, w, lr, B, runs=3, steps=200, seed=1)
    assert ly.exponent <= ly.moment_bound + 4 * ly.stderr
    assert stability.is_linearly_stable(model, w, lr, B) == (rho <= 1 + 1e-9)


# -- k = 1: the compiled core's TwoLayerNet is the same network ------------------------------
@pytest.fixture(scope="module")
def pair():
    """TwoLayerNet (compiled) and the same net written in JAX: params [W1, b1, a] ravel to
    TwoLayerNet's layout (W1 row-major, b1, a)."""
    rng = np.random.default_rng(1)
    n, d, m = 10, 3, 4
    X = rng.standard_normal((n, d))
    net = TwoLayerNet.synthetic(d=d, m=m, n=n, seed=2)
    net = TwoLayerNet(d, m, X=X, y=net.with_data(X).predict(net.w_true))  # realizable

    def predict(p, x):
        return p[2] @ jnp.tanh(p[0] @ x + p[1]) / np.sqrt(m)
    w = net.random_point(seed=3)
    model = square_loss_from_jax(predict, list(net.unpack(w)), X, net.y, chunk=4)
    assert np.array_equal(model.initial_point(), w)
    return net, model, w


def test_scalar_network_equals_the_compiled_two_layer_net(pair):
    net, model, w = pair
    assert rel_err(model.loss(w), net.loss(w)) < 1e-13
    assert rel_err(model.grad(w), net.grad(w)) < 1e-12
    assert model.param_gradients(w).shape == (net.n, net.dim)
    assert rel_err(model.param_gradients(w), net.param_gradients(w)) < 1e-12
    assert rel_err(model.input_gradients(w), net.input_gradients(w)) < 1e-12
    for method in ("dense", "gram", "lanczos"):
        q1 = stability.sharpness_nonuniformity(net, w, method=method)
        q2 = stability.sharpness_nonuniformity(model, w, method=method)
        assert rel_err(q1.sharpness, q2.sharpness) < 1e-10
        assert rel_err(q1.nonuniformity, q2.nonuniformity) < 1e-10
    lr, B = 1.2 / q1.sharpness, 3
    assert abs(stability.second_moment_operator(net, w, lr, B).spectral_radius
               - stability.second_moment_operator(model, w, lr, B).spectral_radius) < 1e-10
    assert rel_err(stability.critical_lr(net, w, [1, 3]), stability.critical_lr(model, w, [1, 3])) \
        < 1e-10
    g1 = stability.moment_growth(net, w, lr, B, n_runs=64, steps=40)
    g2 = stability.moment_growth(model, w, lr, B, n_runs=64, steps=40)
    assert abs(g1.rate - g2.rate) < 1e-10
    s1, s2 = stability.input_smoothness(net, w, k=2), stability.input_smoothness(model, w, k=2)
    assert rel_err(s1.g_W, s2.g_W) < 1e-12 and rel_err(s1.g_x, s2.g_x) < 1e-12


def test_run_sgd_equals_the_compiled_engine(pair):
    net, model, w = pair
    kw = dict(record_every=7, seed=3, wd=[0.0, 1e-3, 0.0])
    r1 = run_sgd(net, w, [0.3, 0.6, 1.0], [2, 3, 10], 200, **kw)
    r2 = run_sgd(model, w, [0.3, 0.6, 1.0], [2, 3, 10], 200, **kw)
    assert np.abs(r1.w - r2.w).max() < 1e-10
    assert np.abs(r1.loss - r2.loss).max() < 1e-10 and not r2.diverged.any()
    assert np.array_equal(r1.steps, r2.steps) and np.array_equal(r2.batch, [2, 3, 10])
    # divergence: flagged at the same step, records NaN from there, as the core writes them
    r1 = run_sgd(net, w, 40.0, 3, 60, record_every=4, seed=3, max_loss=1e4)
    r2 = run_sgd(model, w, 40.0, 3, 60, record_every=4, seed=3, max_loss=1e4)
    assert r1.diverged and r2.diverged and r1.diverged_step == r2.diverged_step
    assert np.array_equal(np.isnan(r1.loss), np.isnan(r2.loss))
    with pytest.raises(ValueError, match="XLA"):
        run_sgd(model, w, 0.1, 2, 3, backend="cpp")


def test_run_sgd_vector_outputs_against_numpy_backprop(vec):
    model, w, _ = vec
    X, Y = model.X, model.Y
    lr, B, wd, steps = 0.2, 4, 0.01, 30
    res = run_sgd(model, w, lr, B, steps, wd=wd, replacement=True, seed=4, record_every=10)
    p = {k: np.asarray(v) for k, v in model.unravel(w).items()}
    for I in sgd_batches(N, B, steps, replacement=True, seed=4):
        h = np.tanh(X[I] @ p["W1"].T + p["b1"])  # (B, m)
        r = h @ p["W2"].T - Y[I]  # (B, k)
        dh = (r @ p["W2"]) * (1 - h * h)
        g = {"W2": r.T @ h / B, "W1": dh.T @ X[I] / B, "b1": dh.sum(0) / B}
        p = {k: (1 - lr * wd) * p[k] - lr * g[k] for k in p}
    want = np.concatenate([p["W1"].ravel(), p["W2"].ravel(), p["b1"]])  # ravel: sorted keys
    got = model.unravel(res.w)
    assert rel_err(np.concatenate([np.ravel(got[k]) for k in ("W1", "W2", "b1")]), want) < 1e-12
    assert rel_err(res.loss[-1], model.loss(res.w)) < 1e-13


# -- refusals ---------------------------------------------------------------------------------
def test_refusals_in_words(vec, monkeypatch):
    model, w, _ = vec
    with pytest.raises(NotImplementedError, match="compile=False"):
        square_loss_from_jax(mlp, _params(), model.X, model.Y, compile=True)
    with pytest.raises(ValueError, match=r"returns shape \(3,\)"):
        square_loss_from_jax(mlp, _params(), model.X, model.Y[:, 0])
    with pytest.raises(ValueError, match="Y must have shape"):
        square_loss_from_jax(mlp, _params(), model.X, model.Y[:5])
    monkeypatch.setattr("pysharp._backends._jax.available_memory", lambda: 1000)
    with pytest.raises(MemoryError, match="per-sample Jacobian of n = 12 samples x k = 3"):
        stability.second_moment_operator(model, w, 0.1, 2)
    monkeypatch.setattr("pysharp.stability.available_memory", lambda: 1000)
    q = stability.sharpness_nonuniformity(model, w)  # auto: chunked Lanczos, never the whole J
    assert q.method == "lanczos" and q.rank == -1
    with pytest.raises(TypeError, match="square-loss model"):
        ps.spherical_sharpness(model, w)


@pytest.mark.slow
def test_the_tutorial_real_networks_section_runs_as_written():
    """docs/tutorials/sgd_stability.rst, "Real networks": its code, and what it prints agrees
    with itself (rho(T_2) <= 1 exactly when the learning rate is below the critical one)."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs/tutorials/sgd_stability.rst").read_text()
    section = text[text.index("Real networks\n-------"):]
    block = re.search(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", section).group(1)
    env: dict = {}
    exec("\n".join(line[3:] for line in block.splitlines()), env)
    assert env["res"].loss[-1] < 1e-6 and env["model"].dim == 48
    assert (env["T2"].spectral_radius <= 1) == (0.2 <= stability.critical_lr(
        env["model"], env["res"].w, 2))
    assert env["W1"].shape == (6, 4)

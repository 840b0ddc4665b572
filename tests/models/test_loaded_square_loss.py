"""Square-loss models through the run-time door: a user's header with per-sample
Jacobians gets SGD and the linear-stability tools (issue 26, item 3's SGD clause).

Oracles: the diagonal net's closed-form Jacobians and a NumPy SGD on the engine's own
batches (examples/models/diagonal_net.hpp); the built-in square-loss models, whose own
header loaded at run time must give their bits.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pysharp as ps
from pysharp.models import LinearRegression, LoadedSquareLossModel, TwoLayerNet
from pysharp.models._compiler import ModelCompileError
from pysharp.sgd import sgd_batches

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "models"
DIAGONAL = EXAMPLES / "diagonal_net.hpp"
SQUARE_LOSS = ps.include_dir() / "pysharp" / "models" / "square_loss.hpp"

_spec = importlib.util.spec_from_file_location("diagonal_net_reference",
                                               EXAMPLES / "diagonal_net.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


@pytest.fixture(scope="module")
def diag():
    X, y = reference.synthetic(n=12, d=6, sparsity=2, seed=0)
    return ps.load_model(DIAGONAL, X=X, y=y), X, y


def diag_jacobians(w, X):
    """f (n,), a = grad_w f (n, 2d), gx = grad_x f (n, d) in closed form."""
    d = X.shape[1]
    u, v = w[:d], w[d:]
    beta = u ** 2 - v ** 2
    return X @ beta, np.concatenate([2 * u * X, -2 * v * X], axis=1), np.tile(beta, (len(X), 1))


# -- the example against its oracles -----------------------------------------------------

def test_load_model_returns_a_square_loss_model_for_a_header_with_jacobians(diag):
    model, X, y = diag
    assert isinstance(model, LoadedSquareLossModel) and isinstance(model, ps.models.SquareLossModel)
    assert model.dim == 2 * X.shape[1] and model.n == len(y) and model.input_dim == X.shape[1]
    assert np.array_equal(model.X, X) and np.array_equal(model.y, y)
    assert not model.X.flags.writeable and model.spec()["model"] == "loaded_square_loss"


def test_the_example_passes_check_against_its_reference_and_a_wrong_one_fails(diag):
    model, X, y = diag
    report = ps.models.check(model, lambda w: reference.loss_numpy(w, X, y))
    assert report.ok, str(report)
    assert "g.w" not in report.errors  # not scale-invariant: no invariance identities
    bad = ps.models.check(model, lambda w: 1.1 * reference.loss_numpy(w, X, y))
    assert not bad.passed["loss"] and "loss off the reference" in " ".join(bad.problems())
    with pytest.raises(ValueError, match="not scale-invariant"):
        ps.models.check(model, lambda w: reference.loss_numpy(w, X, y), groups=2)


def test_jacobians_match_the_closed_form_and_the_gauss_newton_hessian(diag, dtype):
    model, X, _ = diag
    W = model.random_point(3, seed=1)
    F, A, GX = model.jacobians(W.astype(dtype))
    assert F.dtype == A.dtype == GX.dtype == dtype
    tol = 1e-13 if dtype == np.float64 else 1e-5
    for b in range(3):
        f, a, gx = diag_jacobians(W[b], X)
        for got, want in ((F[b], f), (A[b], a), (GX[b], gx)):
            assert np.max(np.abs(got - want)) <= tol * max(1.0, np.max(np.abs(want)))
    # At an interpolating point the Hessian is the Gauss-Newton matrix (1/n) A^T A.
    d = X.shape[1]
    beta = np.zeros(d)
    beta[:2] = 1.0
    w_star = np.concatenate([np.sqrt(beta), np.zeros(d)])
    model_star = model.with_data(X, X @ beta)
    _, A_star, _ = model_star.jacobians(w_star)
    np.testing.assert_allclose(model_star.hessian(w_star), A_star.T @ A_star / len(X),
                               rtol=0, atol=1e-13)


def test_sgd_matches_a_numpy_sgd_on_the_engines_batches(diag):
    model, X, y = diag
    w0 = model.random_point(seed=3)
    lr, wd, batch, steps = 0.05, 1e-3, 4, 60
    run = ps.run_sgd(model, w0, lr=lr, batch=batch, wd=wd, steps=steps, seed=7)
    w = w0.copy()
    for idx in sgd_batches(len(y), batch, steps, seed=7):
        _, A, _ = diag_jacobians(w, X[idx])
        r = X[idx] @ (w[:6] ** 2 - w[6:] ** 2) - y[idx]
        w = (1 - lr * wd) * w - lr * (A.T @ r) / batch
    np.testing.assert_allclose(run.w, w, rtol=1e-12, atol=1e-14)
    assert not run.diverged


def test_a_diverging_trajectory_is_flagged_not_fatal_to_its_batch(diag):
    model, _, _ = diag
    run = ps.run_sgd(model, np.full((2, model.dim), 0.5), lr=[0.01, 50.0], batch=4, steps=200)
    assert list(run.diverged) == [False, True] and np.isfinite(run.loss[-1, 0])


def test_each_kind_refuses_the_other_kinds_tools_in_words(diag):
    # the library of a square-loss model has no engine to run, that of a scale-invariant
    # one no samples: asked directly (past the Python layer), the core refuses, never crashes
    from pysharp.sharpness import LanczosOptions

    model, _, _ = diag
    core = model._core(np.dtype(np.float64))
    with pytest.raises(ValueError, match="has no lanczos"):
        core.lanczos(np.ones((1, model.dim)), LanczosOptions.for_dim(model.dim, 1).to_core(),
                     None)
    X = np.random.default_rng(0).standard_normal((30, 8))
    phase = ps.load_model(EXAMPLES / "phase_retrieval.hpp", X=X, y=np.ones(30), c=1.0)
    with pytest.raises(ValueError, match="has no training samples"):
        phase._core(np.dtype(np.float64)).jacobians(np.ones((1, phase.dim)))


def test_the_stability_tools_run_on_a_loaded_model(diag):
    model, X, _ = diag
    beta = np.zeros(6)
    beta[:2] = 1.0
    m = model.with_data(X, X @ beta)
    w_star = np.concatenate([np.sqrt(beta), np.zeros(6)])  # an interpolating minimum
    s = ps.stability.sharpness_nonuniformity(m, w_star)
    A = m.param_gradients(w_star)
    H = A.T @ A / m.n
    assert abs(s.sharpness - np.linalg.eigvalsh(H)[-1]) <= 1e-10 * s.sharpness
    lr_crit = ps.stability.critical_lr(m, w_star, batch=3)
    assert ps.stability.is_linearly_stable(m, w_star, 0.9 * lr_crit, 3)
    assert not ps.stability.is_linearly_stable(m, w_star, 1.1 * lr_crit, 3)
    smooth = ps.stability.input_smoothness(m, w_star)
    assert smooth.bound is None and smooth.holds is None  # no first layer declared
    assert smooth.g_x == pytest.approx(np.linalg.norm(beta))
    with pytest.raises(ValueError, match="declares no first layer"):
        m.first_layer(w_star)


def test_an_sgd_sweep_is_bit_equal_to_lone_runs_and_rebuilds_from_a_spec(diag):
    pytest.importorskip("xarray")
    model, X, y = diag
    grid = {"lr": [0.02, 0.05], "batch": [3, 6], "wd": [0.0], "seeds": [0, 1], "init_norm": 1.0}
    ds = ps.sweep(model, method="sgd", steps=200, record_every=20, **grid, chunk_size=3)
    # The last point (flat trajectory 7) is its lone run: its start is random_point(1) at
    # norm 1, its batches the engine's stream of trajectory 7.
    w0 = model.random_point(seed=1)
    lone = ps.run_sgd(model, w0 * (1.0 / np.linalg.norm(w0)), lr=0.05, batch=6, steps=200,
                      record_every=20, first_trajectory=7)
    got = ds.sel(lr=0.05, batch=6, seed=1).isel(wd=0, init_norm=0)
    assert got.loss.values.tobytes() == lone.loss.tobytes()
    whole = ps.sweep(model, method="sgd", steps=200, record_every=20, **grid)
    assert whole.loss.values.tobytes() == ds.loss.values.tobytes()
    spec = {"name": "loaded", "header": str(DIAGONAL), "fields": {"X": X, "y": y}}
    again = ps.sweep(spec, method="sgd", steps=200, record_every=20, **grid)
    assert again.loss.values.tobytes() == ds.loss.values.tobytes()


# -- the built-ins' own header, loaded at run time, gives their bits ------------------------

@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_the_two_layer_net_header_gives_the_builtins_bits(dtype, activation):
    net = TwoLayerNet.synthetic(d=4, m=5, n=9, seed=2, activation=activation)
    loaded = ps.load_model(SQUARE_LOSS, model_name="TwoLayerNet", X=net.X, y=net.y, m=5,
                           act={"tanh": 0, "relu": 1}[activation], inv_sqrt_m=1 / np.sqrt(5))
    W, V = net.random_point(6, seed=4, dtype=dtype), net.random_point(6, seed=5, dtype=dtype)
    for a, b in zip(loaded.loss_and_grad(W) + (loaded.hvp(W, V), loaded.third(W, V)),
                    net.loss_and_grad(W) + (net.hvp(W, V), net.third(W, V))):
        assert np.array_equal(a, b)
    for a, b in zip(loaded.jacobians(W), net.jacobians(W)):
        assert np.array_equal(a, b)
    ra = ps.run_sgd(loaded, W, lr=0.05, batch=3, steps=300, record_every=10, seed=3)
    rb = ps.run_sgd(net, W, lr=0.05, batch=3, steps=300, record_every=10, seed=3)
    assert np.array_equal(ra.w, rb.w) and np.array_equal(ra.loss, rb.loss, equal_nan=True)


def test_the_linear_regression_header_gives_the_builtins_bits():
    lin = LinearRegression.synthetic(d=6, n=10, seed=1, bias=True)
    loaded = ps.load_model(SQUARE_LOSS, model_name="LinearRegression", X=lin.X, y=lin.y, bias=1)
    W = lin.random_point(5, seed=2)
    ra = ps.run_sgd(loaded, W, lr=0.05, batch=[1, 3, 3, 10, 4], steps=200, seed=1)
    rb = ps.run_sgd(lin, W, lr=0.05, batch=[1, 3, 3, 10, 4], steps=200, seed=1)
    assert np.array_equal(ra.w, rb.w) and np.array_equal(ra.loss, rb.loss)
    assert np.array_equal(loaded.hessian(W), lin.hessian(W))


# -- errors a user can act on --------------------------------------------------------------

def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_square_loss_model_without_sample_is_named_by_a_static_assert(tmp_path):
    path = write(tmp_path, "nosample.hpp", """\
        #include <pysharp/model.hpp>
        template <class Real>
        struct NoSample {
          const Real* X; const Real* y; int n, d;
          PYSHARP_HD int dim() const { return d; }
          PYSHARP_HD int input_dim() const { return d; }
          PYSHARP_HD int n_samples() const { return n; }
          PYSHARP_HD int work_size() const { return 0; }
          PYSHARP_HD void jacobian(const Real*, const Real*, Real*, Real*, Real*, Real*) const {}
          template <class S>
          PYSHARP_HD mask_t<S> loss_grad(const S*, S* loss, S*, S*) const {
            *loss = S(0);
            return mask_t<S>(true);
          }
        };
        PYSHARP_MODEL(NoSample, PYSHARP_ARRAY(X, n, d), PYSHARP_ARRAY(y, n))
    """)
    with pytest.raises(ModelCompileError, match=r"missing member `template <class S, class X>"):
        ps.load_model(path, X=np.ones((3, 2)), y=np.ones(3))


def test_square_loss_data_of_the_wrong_form_is_refused(diag, tmp_path):
    _, X, y = diag
    with pytest.raises(ValueError, match="y: axis 0 \\(n\\) has length 5"):
        ps.load_model(DIAGONAL, X=X, y=np.ones(5))
    text = DIAGONAL.read_text().replace("PYSHARP_ARRAY(y, n))", "PYSHARP_ARRAY(y, d))")
    path = write(tmp_path, "yd.hpp", text)
    with pytest.raises(ValueError, match=r"declares PYSHARP_ARRAY\(X, n, d\) and "
                                         r"PYSHARP_ARRAY\(y, n\)"):
        ps.load_model(path, X=X, y=np.ones(X.shape[1]))


def test_pysharp_sweep_runs_sgd_on_a_model_header(tmp_path, diag):
    pytest.importorskip("xarray")
    _, X, y = diag
    np.savez(tmp_path / "diag.npz", X=X, y=y)
    (tmp_path / "diag.toml").write_text(
        f'[model]\nheader = "{DIAGONAL}"\ndata = "diag.npz"\n\n'
        '[grid]\nlr = [0.02, 0.05]\nbatch = [3]\nwd = [0.0]\n\n'
        '[run]\nmethod = "sgd"\nsteps = 200\n')
    cmd = [sys.executable, "-m", "pysharp"]
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run(cmd + ["sweep", "diag.toml", "--no-progress"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2 trajectories" in done.stdout
    run = subprocess.run(cmd + ["run", str(DIAGONAL), "--data", "diag.npz"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "use method='sgd'" in run.stderr

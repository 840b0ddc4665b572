"""Every public tool on every registered model and dtype (issue 31, bug 1).

``ps.spectral_density`` raised TypeError on BNTwoLayerNet because no test ran every
tool on every model. Here each test is parametrized by registry entry (conftest's
``any_case``: every model in ``pysharp.models.REGISTRY``, built small by its own
factory), so a newly registered model is covered without editing this file. Each
tool is called once at tiny sizes; results must be finite and of the documented
shape, and, where cheap, agree with an independent oracle (the model's NumPy
reference, central differences, scale-invariance identities, a dense eigh).

A tool that does not apply to a model (a scale-invariant tool on a square-loss
model, SGD on a model without mini-batch losses, the Numba backend on a model
without a port) must refuse it with a TypeError or BackendUnavailable that says why:
these tests assert the refusal, never skip.

float32: the kernel API, the trajectory engines and ``spherical_sharpness`` compute
in float32 (results in float32). The spectra, the two flows and the period-two
diagnostics take float32 points but compute in float64; the tests check that they
give the float64 result of the same (rounded) point. The Numba backend refuses
float32 (documented: float64 only).
"""

from __future__ import annotations

import numpy as np
import pytest
from _cases import rel_err

import pysharp as ps
from pysharp._backends import BackendUnavailable
from pysharp.central_flow import CentralFlow
from pysharp.flow import SharpnessReductionFlow
from pysharp.models import REGISTRY, BNLinearRegression, SquareLossModel

F64, F32 = np.dtype(np.float64), np.dtype(np.float32)
LR, WD, STEPS = 0.05, 1e-2, 12
NEEDS_SCALE_INVARIANCE = "needs a scale-invariant model.*square-loss model"


def close(dtype, f64=1e-10, f32=2e-3) -> float:
    return f64 if np.dtype(dtype) == F64 else f32


def finite(*arrays) -> bool:
    return all(np.all(np.isfinite(np.asarray(a, dtype=np.float64))) for a in arrays)


def test_the_fixture_covers_the_registry(any_case):
    """One instance per registered name, of the registered class (a new model lands here)."""
    entry = REGISTRY[any_case.name]
    assert isinstance(any_case.model, entry.cls)
    assert (any_case.ref is not None) == any_case.scale_invariant


# -- the kernel API --------------------------------------------------------------------
def test_kernels(any_case, dtype):
    m, D = any_case.model, any_case.model.dim
    W, V = any_case.points(3, seed=1, dtype=dtype), any_case.points(3, seed=2, dtype=dtype)
    loss, G = m.loss_and_grad(W)
    HV = m.hvp(W, V)
    H = m.hessian(W)
    assert loss.shape == (3,) and G.shape == HV.shape == (3, D) and H.shape == (3, D, D)
    assert {loss.dtype, G.dtype, HV.dtype, H.dtype} == {dtype}
    assert finite(loss, G, HV, H)
    # The dense Hessian is the stacked HVPs, symmetric.
    assert rel_err(np.einsum("bij,bj->bi", H, V), HV) < close(dtype)
    assert rel_err(H, np.swapaxes(H, 1, 2)) < close(dtype)
    # one row alone gives the row's bits in a batch; XLA compiles a program per batch shape,
    # whose reductions may round differently in the last place (docs/conventions.rst)
    same = 0 if getattr(m, "_backends", ("cpp",))[0] != "jax" else 4 * np.finfo(dtype).eps
    assert rel_err(m.loss(W[0]), loss[0]) <= same and m.grad(W[0]).shape == (D,)
    W64 = W.astype(np.float64)
    if any_case.scale_invariant:
        T = m.third(W, V)
        assert T.shape == (3, D) and T.dtype == dtype and finite(T)
        # The NumPy oracle.
        ref = any_case.ref
        assert rel_err(loss, ref.loss(W64)) < close(dtype)
        assert rel_err(G, ref.grad(W64)) < close(dtype)
        assert rel_err(HV, ref.hvp(W64, V.astype(np.float64))) < close(dtype)
        assert rel_err(T, ref.third(W64, V.astype(np.float64))) < close(dtype, 1e-9)
        # Scale invariance: <g, w> = 0, H w = -g, D^3L[w, w] = 2 g.
        scale = np.linalg.norm(G, axis=1) * np.linalg.norm(W64, axis=1)
        assert np.max(np.abs(np.einsum("bi,bi->b", G, W64)) / scale) < close(dtype, 1e-12, 1e-5)
        assert rel_err(m.hvp(W, W), -G) < close(dtype)
        assert rel_err(m.third(W, W), 2 * G) < close(dtype)
        if "numpy" not in m._backends:  # loaded, JAX: no NumPy oracle of their own
            only = ", ".join(repr(b) for b in m._backends)
            with pytest.raises(BackendUnavailable, match=f"numpy backend has no .* {only} only"):
                m.hvp(W64, V.astype(np.float64), backend="numpy")
        else:  # the kernel-only fallback on every built-in model
            assert rel_err(m.hvp(W64, V.astype(np.float64), backend="numpy"),
                           m.hvp(W64, V.astype(np.float64))) < 1e-12
    else:
        assert isinstance(m, SquareLossModel)
        T = m.third(W, V)  # checked against differences of the HVP below
        assert T.shape == (3, D) and T.dtype == dtype and finite(T)
    if dtype == F64:
        # Central differences of the loss and of the gradient: O(h^2), h = 1e-5.
        h, v = 1e-5, V[0] / np.linalg.norm(V[0])
        fd_g = (m.loss(W[0] + h * v) - m.loss(W[0] - h * v)) / (2 * h)
        assert abs(fd_g - G[0] @ v) <= 1e-7 * max(1.0, np.abs(G[0]).max())
        fd_h = (m.grad(W[0] + h * v) - m.grad(W[0] - h * v)) / (2 * h)
        assert rel_err(fd_h, m.hvp(W[0], v)) < 1e-6
        fd_t = (m.hvp(W[0] + h * v, v) - m.hvp(W[0] - h * v, v)) / (2 * h)
        assert rel_err(fd_t, m.third(W[0], v)) < 1e-6


def test_numba_backend_on_every_model(any_case, dtype):
    """Numba runs float64 where the model has a port; otherwise a refusal that says why."""
    if not ps.backends()["numba"]["available"]:
        pytest.skip("numba is not installed")  # an optional backend, reported by ps.backends()
    m = any_case.model
    W = any_case.points(2, seed=3, dtype=dtype)
    if not any_case.scale_invariant:
        with pytest.raises(TypeError):  # square-loss kernels take no backend argument
            m.grad(W, backend="numba")
        return
    if "numba" not in m._backends:  # BNTwoLayerNet, loaded models: refused by the dispatch
        with pytest.raises(BackendUnavailable, match="numba backend has no .* port"):
            m.grad(W, backend="numba")
        return
    if dtype == F32:
        with pytest.raises(BackendUnavailable, match="float64 only"):
            m.grad(W, backend="numba")
    else:
        assert rel_err(m.grad(W, backend="numba"), m.grad(W)) < 1e-12


# -- trajectories ----------------------------------------------------------------------
def _runs(m, W0):
    """Every trajectory engine pysharp exports, tracking the sharpness (top 2)."""
    track = dict(record_every=1, sharpness_every=4, top_k=2)
    return {
        "gd_wd": ps.run_gd_wd(m, W0, LR, WD, STEPS, theta_every=6, **track),
        "pgd": ps.run_pgd(m, W0, LR, STEPS, **track),
        "pgd_adaptive": ps.run_pgd(m, W0, LR, STEPS, lr=LR, wd=WD, **track),
        "pgd_quasi_rmsprop": ps.run_pgd(m, W0, LR, STEPS,
                                        scheduler=ps.QuasiRMSprop.from_gd_wd(LR, WD), **track),
        "scalar_rmsprop": ps.run_scalar_rmsprop(m, W0, 1e-3, WD, STEPS, **track),
    }


def test_trajectories(any_case, dtype):
    m, D, B = any_case.model, any_case.model.dim, 2
    W0 = any_case.points(B, seed=4, dtype=dtype)
    if not any_case.scale_invariant:
        for run in (lambda: ps.run_gd_wd(m, W0, LR, WD, STEPS),
                    lambda: ps.run_pgd(m, W0, LR, STEPS),
                    lambda: ps.run_scalar_rmsprop(m, W0, LR, WD, STEPS)):
            with pytest.raises(TypeError, match=NEEDS_SCALE_INVARIANCE + ".*run_sgd"):
                run()
        return
    n_sharp = STEPS // 4 + 1
    for method, tr in _runs(m, W0).items():
        assert tr.w.shape == (B, D) and tr.w.dtype == dtype, method
        assert tr.loss.shape == tr.norm2.shape == tr.eff_lr.shape == (STEPS + 1, B), method
        assert tr.sharpness.shape == (n_sharp, B), method
        assert tr.top_eigenvalues.shape == (n_sharp, B, 2), method
        assert finite(tr.w, tr.loss, tr.norm2, tr.eff_lr, tr.sharpness, tr.top_eigenvalues)
        assert not tr.diverged.any(), method
        assert np.all(tr.top_eigenvalues[..., 0] >= tr.top_eigenvalues[..., 1]
                      - close(dtype, 1e-8, 1e-3) * np.abs(tr.top_eigenvalues[..., 0])), method
        # In-run tracking against spherical_sharpness at the start (same points).
        s0 = ps.spherical_sharpness(m, W0, k=2).eigenvalues
        assert rel_err(tr.top_eigenvalues[0], s0) < close(dtype, 1e-7, 1e-3), method
        if method.startswith("pgd"):  # on the unit sphere
            assert np.max(np.abs(np.linalg.norm(tr.w.astype(np.float64), axis=1) - 1)) \
                < close(dtype, 1e-12, 1e-5), method
    # One GD+WD step is (1 - lr wd) w - lr grad L(w).
    one = ps.run_gd_wd(m, W0, LR, WD, 1, record_every=1, sharpness_every=0)
    expect = (1 - LR * WD) * W0.astype(np.float64) - LR * any_case.ref.grad(
        W0.astype(np.float64))
    assert rel_err(one.w, expect) < close(dtype, 1e-12, 1e-5)


def test_sgd(any_case, dtype):
    """run_sgd on the models with mini-batch losses; a clear refusal on the others."""
    m = any_case.model
    W0 = any_case.points(2, seed=5, dtype=dtype)
    if not (isinstance(m, (SquareLossModel, BNLinearRegression))):
        with pytest.raises(TypeError, match="square-loss model .* or BNLinearRegression"):
            ps.run_sgd(m, W0, 0.01, 2, STEPS)
        return
    r = ps.run_sgd(m, W0, 0.01, 2, STEPS)
    assert r.w.shape == W0.shape and finite(r.w, r.loss)


def test_sgd_stability_tools(any_case, dtype):
    """pysharp.stability needs per-sample losses (square-loss models, BN linear regression);
    the other models are refused by name."""
    m = any_case.model
    w = any_case.points(seed=11, dtype=dtype)
    tools = {
        "per_sample_gradients": lambda: ps.stability.per_sample_gradients(m, w),
        "sharpness_nonuniformity": lambda: ps.stability.sharpness_nonuniformity(m, w),
        "is_linearly_stable": lambda: ps.stability.is_linearly_stable(m, w, 0.01, 2),
        "critical_lr": lambda: ps.stability.critical_lr(m, w, 2),
        "gradient_moment_ratio": lambda: ps.stability.gradient_moment_ratio(m, w, 0.01, 2),
        "input_smoothness": lambda: ps.stability.input_smoothness(m, w),
    }
    if not isinstance(m, (SquareLossModel, BNLinearRegression)):
        for tool in tools.values():
            with pytest.raises(TypeError, match=f"LinearRegression.*got {type(m).__name__}"):
                tool()
        return
    A = tools["per_sample_gradients"]()
    n = m.X.shape[0]
    assert A.shape == (n, m.dim) and finite(A)
    for name, tool in tools.items():
        out = tool()
        values = [v for v in vars(out).values()] if hasattr(out, "__dict__") else [out]
        assert all(finite(v) for v in values if isinstance(v, (np.ndarray, float, np.floating))
                   ), name


# -- sharpness and spectra -------------------------------------------------------------
def test_spherical_sharpness(any_case, dtype):
    m, D = any_case.model, any_case.model.dim
    W = any_case.points(2, seed=6, dtype=dtype)
    if not any_case.scale_invariant:
        with pytest.raises(TypeError, match=NEEDS_SCALE_INVARIANCE + ".*hessian_spectrum"):
            ps.spherical_sharpness(m, W)
        return
    dense = ps.spherical_sharpness(m, W, k=2, method="dense")
    lanczos = ps.spherical_sharpness(m, W, k=2, method="lanczos")
    for r in (dense, lanczos):
        assert r.eigenvalues.shape == (2, 2) and r.eigenvectors.shape == (2, 2, D)
        assert finite(r.eigenvalues, r.eigenvectors)
    assert rel_err(lanczos.eigenvalues, dense.eigenvalues) < close(dtype, 1e-8, 1e-3)
    # Oracle: eigh of ||w||^2 H(w) from the float64 Hessian.
    W64 = W.astype(np.float64)
    H = m.hessian(W64) * np.einsum("bi,bi->b", W64, W64)[:, None, None]
    top = np.linalg.eigvalsh(H)[:, ::-1][:, :2]
    assert rel_err(dense.eigenvalues, top) < close(dtype, 1e-10, 1e-3)


def test_spectra(any_case, dtype):
    """hessian_spectrum, hessian_trace, spectral_density and loss_slice on every model;
    they compute in float64, so float32 points give the float64 result of that point."""
    m, D = any_case.model, any_case.model.dim
    W = any_case.points(2, seed=7, dtype=dtype)
    W64 = W.astype(np.float64)
    spec = ps.hessian_spectrum(m, W)
    assert spec.eigenvalues.shape == (2, D) and finite(spec.eigenvalues)
    assert rel_err(spec.eigenvalues, ps.hessian_spectrum(m, W64).eigenvalues) < 1e-12
    # Oracle: eigh of the dense Hessian (times ||w||^2 on the sphere for scale-invariant ones).
    H = m.hessian(W64)
    if any_case.scale_invariant:
        H = H * np.einsum("bi,bi->b", W64, W64)[:, None, None]
    assert rel_err(np.sort(spec.eigenvalues, axis=1), np.linalg.eigvalsh(H)) < 1e-10
    exact = ps.hessian_trace(m, W, method="exact")
    hutch = ps.hessian_trace(m, W, n_probes=4)
    assert exact.estimate.shape == hutch.estimate.shape == (2,)
    assert finite(exact.estimate, hutch.estimate, hutch.stderr)
    assert rel_err(exact.estimate, np.trace(H, axis1=1, axis2=2)) < 1e-10
    lz = ps.lanczos(lambda x: m.hvp(W64[0], x), D, k=1)
    assert rel_err(lz.eigenvalues, np.linalg.eigvalsh(m.hessian(W64[0]))[-1:]) < 1e-8
    sd = ps.spectral_density(m, W, n_probes=2, steps=D)
    assert sd.density.shape == (2, sd.grid.size) and sd.nodes.shape == (2, 2, D)
    assert finite(sd.density, sd.nodes, sd.weights) and np.all(sd.density >= 0)
    # steps = D: each probe's Gauss nodes are H's eigenvalues, so the top node is lambda_1.
    top = spec.eigenvalues.max(axis=1)
    assert rel_err(sd.nodes.max(axis=(1, 2)), top) < 1e-8
    sl = ps.loss_slice(m, W[0], directions=spec.eigenvectors[0][:1] if spec.eigenvectors
                       is not None else W64[1:2], grid=np.linspace(-0.1, 0.1, 5))
    assert sl.loss.shape == (5,) and finite(sl.loss)
    assert rel_err(sl.loss[2], m.loss(W64[0])) < 1e-12


# -- flows and diagnostics -------------------------------------------------------------
def test_sharpness_reduction_flow(any_case, dtype):
    m, D = any_case.model, any_case.model.dim
    w = any_case.points(seed=8, dtype=dtype)
    if not any_case.scale_invariant:
        with pytest.raises(TypeError, match=NEEDS_SCALE_INVARIANCE + ".*CentralFlow"):
            SharpnessReductionFlow(m)
        return
    flow = SharpnessReductionFlow(m)
    zeta, res = flow.project(w)
    assert zeta.shape == (D,) and zeta.dtype == F64 and finite(zeta)
    assert abs(np.linalg.norm(zeta) - 1) < 1e-12 and res < 1e-9
    assert np.linalg.norm(m.grad(zeta)) < 1e-9  # on Gamma: a critical point on the sphere
    geo = flow.geometry(zeta)
    v = geo.velocity
    assert v.shape == (D,) and finite(v, geo.sharpness)
    # The field moves along Gamma: tangent to the sphere and to the null space of H.
    assert abs(v @ zeta) <= 1e-8 * max(1.0, np.linalg.norm(v))
    P = flow.tangent_projection(zeta)
    assert rel_err(P @ v, v) < 1e-8
    sol = flow.integrate(zeta, 1e-3 * (1 + abs(float(geo.sharpness))) ** -2)
    assert finite(sol.sol(sol.tau[-1]))


def test_central_flow(any_case, dtype):
    m, D = any_case.model, any_case.model.dim
    w0 = any_case.points(seed=9, dtype=dtype)
    if any_case.scale_invariant:
        methods = {"gd_wd": dict(wd=WD), "gd": {}, "scalar_rmsprop": dict(wd=WD)}
    else:
        methods = {"gd": {}}
        with pytest.raises(ValueError, match="not scale invariant: only method 'gd'"):
            CentralFlow(m, "gd_wd", lr=LR, wd=WD)
    for method, kw in methods.items():
        lr = 1e-3 if method == "scalar_rmsprop" else LR
        sol = CentralFlow(m, method, lr=lr, k_max=2, **kw).integrate(w0, 1.0)
        assert sol.success, (method, sol.message)
        assert sol.w.shape == (len(sol.t), D) and sol.t[-1] == 1.0
        assert finite(sol.w, sol.loss, sol.loss_pred, sol.norm2, sol.sharpness), method
        # The recorded loss is the model's loss at the recorded points.
        assert rel_err(sol.loss, m.loss(sol.w)) < 1e-10, method
        if dtype == F32 and method == "gd":  # computed in float64 from the rounded start
            again = CentralFlow(m, method, lr=lr, k_max=2, **kw).integrate(
                w0.astype(np.float64), 1.0)
            assert rel_err(sol.w, again.w) < 1e-12, method


def test_period_two_diagnostics(any_case, dtype):
    """GD+WD started near Gamma at 0.98 of the edge enters EoS within the run."""
    m = any_case.model
    if not any_case.scale_invariant:
        from pysharp.dynamics import Trajectory
        with pytest.raises(TypeError, match=NEEDS_SCALE_INVARIANCE):
            ps.period_two_diagnostics(m, Trajectory.__new__(Trajectory))
        return
    flow = SharpnessReductionFlow(m)
    zeta, _ = flow.project(any_case.points(seed=10))
    lam = float(flow.geometry(zeta).sharpness)
    lr, wd = 0.1, 1e-2
    rng = np.random.default_rng(0)
    p = rng.standard_normal(zeta.shape)
    p -= (p @ zeta) * zeta
    w = zeta + 1e-4 * p / np.linalg.norm(p)
    w *= np.sqrt(lr / ((1 - lr * wd) * 0.98 * 2 / lam)) / np.linalg.norm(w)
    tr = ps.run_gd_wd(m, w.astype(dtype), lr, wd, 160, record_every=1, theta_every=1,
                      sharpness_every=1, jitter=1e-9, seed=1)
    assert tr.eos_entry_step >= 0, "the run must reach the edge for the diagnostics"
    d = ps.period_two_diagnostics(m, tr, window=12)
    assert d.h.shape == (12,) and d.phi.shape == (12, m.dim)
    assert finite(d.h, d.phi, d.sharpness, d.drift_measured, d.drift_predicted)
    # phi is on Gamma and on the sphere; lambda_1 there is the recorded one's order.
    assert np.max(np.abs(np.linalg.norm(d.phi, axis=1) - 1)) < 1e-12
    assert np.max(np.linalg.norm(m.grad(d.phi), axis=1)) < 1e-8


# -- sweeps ----------------------------------------------------------------------------
def test_sweep_with_a_model_instance(any_case):
    pytest.importorskip("xarray")
    m = any_case.model
    if any_case.scale_invariant:
        for method, wd in (("gd_wd", [WD]), ("pgd", None), ("scalar_rmsprop", [WD])):
            lr = [1e-3] if method == "scalar_rmsprop" else [LR]
            ds = ps.sweep(m, lr=lr, wd=wd, seeds=[0, 1], steps=8, sharpness_every=4,
                          method=method, progress=False)
            loss = np.asarray(ds["final_loss"])
            assert loss.size == 2 and finite(loss), method
    else:
        with pytest.raises(ValueError, match="needs a scale-invariant model.*method='sgd'"):
            ps.sweep(m, lr=[LR], wd=[WD], steps=8, progress=False)
    if isinstance(m, (SquareLossModel, BNLinearRegression)):
        ds = ps.sweep(m, lr=[0.01], batch=[2], seeds=[0], steps=8, method="sgd",
                      progress=False)
        assert finite(np.asarray(ds["final_loss"]))
    else:
        with pytest.raises((TypeError, ValueError), match="sgd|square-loss"):
            ps.sweep(m, lr=[0.01], batch=[2], seeds=[0], steps=8, method="sgd",
                     progress=False)

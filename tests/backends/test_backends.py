"""Dispatch and the fallback backends: Numba and NumPy against the C++ core.

The Numba port must agree with the C++ path to 1e-10 in float64 (kernels,
Lanczos and whole trajectories, jitter included: both use the same
counter-based RNG). GPU backends are checked in tests marked ``gpu``, which
skip with a reason on machines without one.
"""

from __future__ import annotations

import numpy as np
import pytest
from _cases import SCALE_INVARIANT, rel_err

import pysharp as ps
from pysharp import _backends
from pysharp._backends import BackendUnavailable, resolve
from pysharp.models import REGISTRY, ScaleInvariantModel

numba_only = pytest.mark.skipif(not ps.backends()["numba"]["available"],
                                reason="numba is not installed")


def no_numba_port(model) -> bool:
    """Whether the model has no Numba port (BNTwoLayerNet): the numba backend then refuses
    it, naming the backends that run it, which the numba tests assert instead."""
    if "numba" in model._backends:  # then the class gives the port's parameters
        assert type(model)._numba_params is not ScaleInvariantModel._numba_params
        return False
    try:
        model._core(np.float64, "numba")
    except BackendUnavailable as e:
        assert "numba backend has no" in str(e) and "backend='cpp'" in str(e), str(e)
        return True
    raise AssertionError(f"{type(model).__name__} lists no numba adapter, yet numba ran it")


def refused_by_numba():
    return pytest.raises(BackendUnavailable, match="numba backend has no .* port")


class FakeGpuArray:
    """Anything with __cuda_array_interface__ counts as a GPU array for dispatch."""

    __cuda_array_interface__ = {"shape": (3,), "typestr": "<f8", "data": (0, False),
                                "version": 3}


def test_backends_report_every_name_with_a_reason_when_missing():
    report = ps.backends()
    assert set(report) == set(_backends.NAMES)
    for name, entry in report.items():
        assert entry["available"] == (entry["reason"] is None), name
    assert report["numpy"]["available"] and not report["numpy"]["trajectories"]
    assert report["cpp"]["available"]  # the test suite runs on a built package


def test_resolve_auto_prefers_cpp_for_host_arrays():
    assert resolve("auto", np.zeros(3)) == "cpp"
    assert resolve("auto", np.zeros(3), trajectories=True) == "cpp"


def test_resolve_refuses_unknown_names_and_kernel_only_backends():
    with pytest.raises(ValueError, match="backend must be"):
        resolve("fortran")
    with pytest.raises(ValueError, match="kernels only"):
        resolve("numpy", trajectories=True)


def test_gpu_arrays_steer_auto_to_gpu_backends_or_explain():
    if ps.backends()["cuda"]["available"] or ps.backends()["cupy"]["available"]:
        assert resolve("auto", FakeGpuArray()) in ("cuda", "cupy")
    else:
        with pytest.raises(BackendUnavailable, match="GPU arrays.*cuda:.*cupy:"):
            resolve("auto", FakeGpuArray())


@pytest.mark.parametrize("name", ["cuda", "cupy"])
def test_missing_gpu_backend_raises_a_clear_error(name, toy_case):
    if ps.backends()[name]["available"]:
        pytest.skip(f"{name} is available here")
    with pytest.raises(BackendUnavailable, match=f"backend '{name}' is not available"):
        toy_case.model.loss(np.ones(3), backend=name)
    with pytest.raises(BackendUnavailable, match=f"backend '{name}'"):
        ps.run_gd_wd(toy_case.model, np.ones(3), 0.1, 0.0, 5, backend=name)


def test_without_the_extension_auto_falls_back(monkeypatch, toy_case):
    """A build without pysharp._core (PYSHARP_BUILD_EXT=OFF) still runs everything."""
    from pysharp._engine import loader

    monkeypatch.setattr(loader, "_import_error", "simulated: no compiled core")
    _backends._probe.cache_clear()
    try:
        assert ps.backends()["cpp"]["reason"] == "simulated: no compiled core"
        expected = "numba" if ps.backends()["numba"]["available"] else "numpy"
        assert resolve("auto") == expected
        w = toy_case.points(seed=1)
        np.testing.assert_allclose(toy_case.model.loss(w), toy_case.ref.loss(w[None])[0],
                                   rtol=1e-13)
    finally:
        monkeypatch.undo()
        _backends._probe.cache_clear()


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("kernel", ["loss", "grad", "hvp", "third", "hessian"])
def test_fallback_kernels_match_cpp(case, backend, kernel):
    if backend == "numba" and not ps.backends()["numba"]["available"]:
        pytest.skip("numba is not installed")
    m = case.model
    W, V = case.points(4, seed=3), case.points(4, seed=4)
    args = (W, V) if kernel in ("hvp", "third") else (W,)
    a = getattr(m, kernel)(*args, backend="cpp")
    if backend == "numba" and no_numba_port(m):
        with refused_by_numba():
            getattr(m, kernel)(*args, backend=backend)
        return
    b = getattr(m, kernel)(*args, backend=backend)
    assert b.shape == a.shape and b.dtype == a.dtype
    assert rel_err(b, a) < 1e-12


@numba_only
def test_numba_refuses_float32_instead_of_computing_it_in_float64(linreg_small):
    m = linreg_small.model
    W = linreg_small.points(3, seed=2, dtype=np.float32)
    with pytest.raises(BackendUnavailable, match="float64 only.*float32"):
        m.grad(W, backend="numba")
    with pytest.raises(BackendUnavailable, match="float64 only.*float32"):
        ps.run_gd_wd(m, W, 0.1, 0.0, 5, backend="numba")
    with pytest.raises(BackendUnavailable, match="float64 only.*float32"):
        ps.run_gd_wd(m, W.astype(np.float64), 0.1, 0.0, 5, dtype=np.float32, backend="numba")
    g = m.grad(W.astype(np.float64), backend="numba")
    assert g.dtype == np.float64 and rel_err(g, m.grad(W.astype(np.float64))) < 1e-12


@numba_only
def test_numba_plain_kernels_match_the_jet_kernels(case):
    """loss_grad_into (plain values, the engine's path) against loss_grad on K = 1 jets."""
    from pysharp._backends import _numba_kernels as nk

    if no_numba_port(case.model):
        return  # the refusal is asserted by no_numba_port itself
    p = case.model._numba_params()
    for w in case.points(4, seed=8):
        g = np.full(case.model.dim, np.nan)
        work = np.full(nk.work_size(p), np.nan)
        ok, loss = nk.loss_grad_into(p, w.copy(), g, work)
        ok_j, loss_j, g_j = nk.loss_grad(p, w.reshape(-1, 1).copy())
        assert ok and ok_j
        assert rel_err(np.array([loss]), loss_j) < 1e-13
        assert rel_err(g, g_j[:, 0]) < 1e-13


@numba_only
def test_numba_refuses_undefined_points_like_cpp(linreg_small):
    m = linreg_small.model
    w = np.zeros(m.dim)
    w[0] = 1.0
    null = np.linalg.svd(m._Xc)[2][-1]  # Xc @ null = 0: BatchNorm undefined
    with pytest.raises(ValueError, match=r"w\[0\]"):
        m.loss(null, backend="numba")
    assert np.isfinite(m.loss(w, backend="numba"))


@numba_only
def test_numba_lanczos_matches_cpp(case):
    W = case.points(3, seed=5)
    a = ps.spherical_sharpness(case.model, W, k=2, method="lanczos", backend="cpp")
    if no_numba_port(case.model):
        with refused_by_numba():
            ps.spherical_sharpness(case.model, W, k=2, method="lanczos", backend="numba")
        return
    b = ps.spherical_sharpness(case.model, W, k=2, method="lanczos", backend="numba")
    assert rel_err(b.eigenvalues, a.eigenvalues) < 1e-10
    np.testing.assert_array_equal(b.converged, a.converged)


def test_numpy_sharpness_uses_the_dense_method(toy_case):
    w = toy_case.points(seed=2)
    a = ps.spherical_sharpness(toy_case.model, w, backend="numpy")
    b = ps.spherical_sharpness(toy_case.model, w, method="dense")
    assert rel_err(a.eigenvalues, b.eigenvalues) < 1e-12
    with pytest.raises(ValueError, match="kernels only"):
        ps.spherical_sharpness(toy_case.model, w, method="lanczos", backend="numpy")


_RUNS = {
    "gd_wd": lambda m, w0, be: ps.run_gd_wd(m, w0, 0.3, 1e-3, 120, record_every=10,
                                            sharpness_every=40, theta_every=60, backend=be,
                                            reduced=False if be == "cpp" else None),
    "jitter": lambda m, w0, be: ps.run_gd_wd(m, w0, 0.3, 1e-3, 120, record_every=10,
                                             sharpness_every=40, jitter=1e-3, seed=7,
                                             backend=be),
    "pgd": lambda m, w0, be: ps.run_pgd(m, w0, 0.2, 120, record_every=10, sharpness_every=40,
                                        theta_every=40, backend=be),
    "pgd_adaptive": lambda m, w0, be: ps.run_pgd(m, w0, 0.2, 120, lr=0.3, wd=1e-3,
                                                 record_every=10, sharpness_every=40,
                                                 backend=be),
    "scalar_rmsprop": lambda m, w0, be: ps.run_scalar_rmsprop(m, w0, 3e-3, 1e-3, 120,
                                                              record_every=10,
                                                              sharpness_every=40, backend=be),
}


@numba_only
@pytest.mark.parametrize("method", list(_RUNS))
def test_numba_trajectories_match_cpp(case, method):
    w0 = case.points(3, seed=6)
    a = _RUNS[method](case.model, w0, "cpp")
    if no_numba_port(case.model):
        with refused_by_numba():
            _RUNS[method](case.model, w0, "numba")
        return
    b = _RUNS[method](case.model, w0, "numba")
    assert b.meta["backend"] == "numba" and not b.meta["reduced"]
    for name in ("loss", "norm2", "eff_lr", "grad_norm", "top_grad", "sharpness", "eos_ratio",
                 "w"):
        assert rel_err(getattr(b, name), getattr(a, name)) < 1e-10, name
    if a.theta is not None:
        assert rel_err(b.theta, a.theta) < 1e-10
    np.testing.assert_array_equal(b.diverged, a.diverged)
    np.testing.assert_array_equal(b.eos_entry_step, a.eos_entry_step)


@numba_only
def test_numba_flags_divergence_like_cpp(toy_case):
    w0 = toy_case.points(2, seed=1)
    w0[1] *= 1e-10                 # ||grad L|| ~ 1e10: lr grad overflows w at the first step
    lr = np.array([0.05, 1e308])
    a = ps.run_gd_wd(toy_case.model, w0, lr, 0.0, 20, sharpness_every=0, backend="cpp")
    b = ps.run_gd_wd(toy_case.model, w0, lr, 0.0, 20, sharpness_every=0, backend="numba")
    np.testing.assert_array_equal(b.diverged, a.diverged)
    np.testing.assert_array_equal(b.diverged_step, a.diverged_step)
    assert b.diverged[1] and not b.diverged[0]
    assert np.isnan(b.loss[-1, 1]) and np.isfinite(b.loss[-1, 0])
    assert rel_err(b.w, a.w) < 1e-12


@numba_only
def test_reduced_needs_the_cpp_backend(linreg_small):
    w0 = linreg_small.points(seed=1)
    with pytest.raises(ValueError, match="cpp or cuda backend"):
        ps.run_gd_wd(linreg_small.model, w0, 0.1, 0.0, 5, backend="numba", reduced=True)


def test_mc_test_loss_on_every_host_backend(mc_case):
    m = mc_case.model
    if m.test is None:
        pytest.skip("the fixture has no held-out entries")
    W = mc_case.points(3, seed=2)
    a = m.test_loss(W, backend="cpp")
    for be in ("numpy",) + (("numba",) if ps.backends()["numba"]["available"] else ()):
        assert rel_err(m.test_loss(W, backend=be), a) < 1e-12, be


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cupy"])
def test_gpu_backend_matches_cpu(case, backend):
    if not ps.backends()[backend]["available"]:
        pytest.skip(ps.backends()[backend]["reason"])
    W, V = case.points(64, seed=3), case.points(64, seed=4)
    for kernel, args in (("loss", (W,)), ("grad", (W,)), ("hvp", (W, V)), ("third", (W, V))):
        a = getattr(case.model, kernel)(*args, backend="cpp")
        b = getattr(case.model, kernel)(*args, backend=backend)
        assert rel_err(np.asarray(b), a) < 1e-10, kernel
    a = ps.run_gd_wd(case.model, W, 0.3, 1e-3, 200, record_every=10, sharpness_every=50,
                     backend="cpp", reduced=False)
    b = ps.run_gd_wd(case.model, W, 0.3, 1e-3, 200, record_every=10, sharpness_every=50,
                     backend=backend)
    # Two code paths: equal to rounding only on the trajectories that never entered the
    # edge of stability (after entry the period-two dynamics amplify rounding; on the
    # H200, BN-MC's one entering trajectory had drifted to 1.3e-7 by step 200).
    pre = a.eos_entry_step < 0
    assert pre.sum() >= 32
    for name in ("loss", "sharpness", "w"):
        x, y = getattr(a, name), getattr(b, name)
        rows = (pre,) if name == "w" else (slice(None), pre)
        assert rel_err(y[rows], x[rows]) < 1e-10, name


def test_cuda_module_imports_without_a_gpu_and_says_why():
    """With PYSHARP_CUDA on, pysharp._cuda loads anywhere (static CUDA runtime)."""
    if not ps.build_info().get("cuda"):
        pytest.skip("built without the CUDA module")
    import pysharp._cuda as cuda

    reason = cuda.device_error()
    assert isinstance(reason, str)
    assert (reason == "") == ps.backends()["cuda"]["available"]
    # a class per registered built-in that says it runs on CUDA, in both precisions
    built_ins = [REGISTRY[n].cls for n in SCALE_INVARIANT if "cuda" in REGISTRY[n].cls._backends]
    assert built_ins
    for name in (f"{cls.__name__}{suffix}" for cls in built_ins for suffix in ("_f64", "_f32")):
        for method in ("loss_grad", "hvp", "third", "hessian", "lanczos", "run"):
            assert hasattr(getattr(cuda, name), method), (name, method)


class FakeCupyArray(FakeGpuArray):
    def __init__(self, a):
        self._a = np.asarray(a)

    def get(self):
        return self._a


def test_cupy_style_arrays_are_validated_as_host_copies(toy_case):
    w = toy_case.points(seed=4)
    assert rel_err(toy_case.model.loss(FakeCupyArray(w), backend="cpp"),
                   toy_case.model.loss(w)) == 0
    with pytest.raises(TypeError, match="GPU arrays other than CuPy"):
        toy_case.model.loss(FakeGpuArray(), backend="cpp")

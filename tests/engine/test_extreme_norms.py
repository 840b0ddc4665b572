"""The engine at any norm (engine/trajectory.hpp's unit_scale, its Numba port).

A scale-invariant loss makes a GD+WD run from c w0 (c a power of two) the run from w0 with
lr / c^2 and wd c^2, scaled by c: every step's arithmetic is the same up to the power of
two, so the records agree to rounding whatever the norm, while the run from c w0 alone
sees squared norms that no float holds (||w||^2 = 2^1000 or 2^-500). Scalar RMSprop maps
to lr / c, wd c and eps c; the sphere methods start from w0 / ||w0|| either way. Beyond
what the hyperparameters can mirror (||w||^2 past the format), the first records are
checked against the kernels, which rescale on their own."""

from __future__ import annotations

import numpy as np
import pytest
from _cases import SCALE_INVARIANT, get_case

import pysharp as ps
from pysharp._engine.methods import METHODS
from pysharp.dynamics import run_method

BASE = {"lr": 0.3, "wd": 1e-3, "eta": 0.05, "c": 0.5}
STEPS = 12


def _hyper(method: str, c: float) -> tuple[dict, dict]:
    """The method's hyperparameters at c w0 and the unit run's, and its options."""
    spec = METHODS[method]
    at_c = {name: BASE[name] for name in spec.hyper}
    unit, options = dict(at_c), {}
    if method == "gd_wd":
        unit.update(lr=at_c["lr"] / c**2, wd=at_c["wd"] * c**2)
    elif method == "scalar_rmsprop":
        unit.update(lr=at_c["lr"] / c, wd=at_c["wd"] * c)
        options = {"rms_eps": 1e-8 * c}
    return at_c, unit, options


def _run(model, w0, method, hyper, backend, **options):
    return run_method(model, w0, hyper, STEPS, method=method, record_every=1,
                      sharpness_every=1, backend=backend, **options)


def _close(a, b, rtol):
    a, b = np.asarray(a, float), np.asarray(b, float)
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b))
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.max(np.abs(b)))


def _skip_unported(model, method: str, backend: str) -> None:
    if backend != "numba":
        return
    pytest.importorskip("numba")
    if not METHODS[method].numba:
        pytest.skip(f"{method} is not in the Numba port")
    if "numba" not in type(model)._backends:
        pytest.skip(f"{type(model).__name__} has no Numba port")


@pytest.mark.parametrize("backend", ["cpp", "numba"])
@pytest.mark.parametrize("k", [-250, 200, 500])
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("name", SCALE_INVARIANT)
def test_a_run_from_c_w0_is_c_times_the_run_from_w0(name, method, k, backend):
    model = get_case(name).model
    _skip_unported(model, method, backend)
    w0 = get_case(name).points(seed=3, norm=1.0)
    c = 2.0**k
    at_c, unit, options = _hyper(method, c)
    options_c = {"rms_eps": 1e-8} if method == "scalar_rmsprop" else {}
    big = _run(model, c * w0, method, at_c, backend, **options_c)
    ref = _run(model, w0, method, unit, backend, **options)
    assert not big.diverged and not ref.diverged
    for field in ("loss", "eff_lr", "grad_norm", "sharpness", "eos_ratio", "top_grad"):
        _close(getattr(big, field), getattr(ref, field), 1e-11)
    scale = 1.0 if METHODS[method].on_sphere else c
    _close(big.w / scale, ref.w, 1e-11)
    _close(big.norm2 / scale**2, ref.norm2, 1e-11)


@pytest.mark.parametrize("backend", ["cpp", "numba"])
@pytest.mark.parametrize("norm", [2.0**-600, 1e-80, 1e90, 2.0**600])
@pytest.mark.parametrize("name", SCALE_INVARIANT)
def test_the_first_records_are_the_kernels_at_any_norm(name, norm, backend):
    model = get_case(name).model
    _skip_unported(model, "gd_wd", backend)
    w0 = get_case(name).points(seed=4, norm=1.0)
    tr = ps.run_gd_wd(model, norm * w0, lr=0.3, wd=1e-3, steps=2, record_every=1,
                      sharpness_every=1, backend=backend, reduced=False)
    assert not tr.diverged
    assert tr.loss[0] == pytest.approx(model.loss(w0), rel=1e-13)
    assert tr.sharpness[0] == pytest.approx(
        ps.spherical_sharpness(model, w0).eigenvalues[0], rel=1e-9)
    assert tr.grad_norm[0] == pytest.approx(
        np.linalg.norm(model.loss_and_grad(w0)[1]), rel=1e-12)
    with np.errstate(over="ignore", under="ignore"):
        norm2 = np.float64(norm) ** 2  # inf or 0 beyond the format
    assert tr.norm2[0] == pytest.approx(norm2, rel=1e-12)


def test_float32_runs_rescale_at_their_own_bounds():
    model = get_case("bn_linear_regression").model
    w0 = get_case("bn_linear_regression").points(seed=5, norm=1.0, dtype=np.float32)
    c = np.float32(2.0**20)  # ||w||^2 = 2^40, beyond float32's safe 2^24
    big = _run(model, c * w0, "gd_wd", {"lr": 0.3, "wd": 1e-3}, "cpp")
    ref = _run(model, w0, "gd_wd", {"lr": 0.3 / 2.0**40, "wd": 1e-3 * 2.0**40}, "cpp")
    for field in ("loss", "sharpness", "grad_norm"):
        _close(getattr(big, field), getattr(ref, field), 1e-5)
    _close(big.w / c, ref.w, 1e-5)


def test_the_reduced_path_refuses_a_norm_it_cannot_hold_and_the_default_leaves_it():
    model = get_case("bn_linear_regression").model
    w0 = 1e90 * get_case("bn_linear_regression").points(seed=6, norm=1.0)
    with pytest.raises(ValueError, match="reduced=True needs starts"):
        ps.run_gd_wd(model, w0, lr=0.3, wd=1e-3, steps=2, reduced=True)
    tr = ps.run_gd_wd(model, w0, lr=0.3, wd=1e-3, steps=2, sharpness_every=1)
    assert tr.meta["reduced"] is False
    assert tr.sharpness[0] == pytest.approx(
        ps.spherical_sharpness(model, w0).eigenvalues[0], rel=1e-9)


def test_a_sweep_at_a_huge_init_norm_gives_the_unit_sweeps_sharpness():
    pytest.importorskip("xarray")
    kw = dict(wd=[1e-3], seeds=[0], steps=400, sharpness_every=100)
    c = 2.0**200
    big = ps.sweep("toy3d", lr=[0.3], init_norm=c, **kw)
    unit = ps.sweep("toy3d", lr=[0.3 / c**2], init_norm=1.0, **{**kw, "wd": [1e-3 * c**2]})
    _close(big.final_sharpness.values, unit.final_sharpness.values, 1e-11)
    assert not bool(big.diverged.any())

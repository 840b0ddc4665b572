"""Property-based tests (hypothesis): scale-invariance identities and input validation.

Identities of a scale-invariant loss, L(c w) = L(w) for c > 0, checked on random points:
grad L(c w) = grad L(w) / c, <w, grad L(w)> = 0, H(c w) v = H(w) v / c^2 and, from
differentiating the second in c at c = 1, H(w) w = -grad L(w). Validation: random
shapes, dtypes and values either give finite results of the right shape, or a
ValueError / TypeError naming the argument; nothing may crash the interpreter.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from _cases import get_case  # noqa: E402
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

import pysharp as ps  # noqa: E402

FAST = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
CASES = ["bn_linreg_small", "bn_mc", "toy3d"]


def _point(case, data):
    """A random direction with entries of mixed scale, away from where L is undefined."""
    w = data.draw(hnp.arrays(np.float64, case.dim,
                             elements=st.floats(-10, 10, allow_nan=False, width=64)))
    assume(np.linalg.norm(w) > 1e-3)
    if isinstance(case.model, ps.BNLinearRegression):
        Xc = case.model.X - case.model.X.mean(axis=0)
        assume(np.linalg.norm(Xc @ w) > 1e-3 * np.linalg.norm(Xc) * np.linalg.norm(w))
    if isinstance(case.model, ps.BNMatrixCompletion):
        try:
            case.model.loss(w)
        except ValueError:  # all scores equal: the BN map is undefined there
            assume(False)
        scores = case.model.factors(w)
        s = (scores[0] @ scores[1].T)[case.model.rows, case.model.cols]
        assume(s.std() > 1e-3 * np.linalg.norm(w) ** 2 / case.dim)
    return w


def _close(a, b, rtol, scale):
    return np.max(np.abs(np.asarray(a) - np.asarray(b))) <= rtol * scale


@pytest.mark.parametrize("key", CASES)
@FAST
@given(data=st.data(), c=st.floats(1e-3, 1e3))
def test_scale_invariance_identities(key, data, c):
    case = get_case(key)
    m = case.model
    w = _point(case, data)
    v = data.draw(hnp.arrays(np.float64, case.dim, elements=st.floats(-1, 1, width=64)))
    v = v + 0.5  # entries of order one (scales below are max-abs, free of underflow)
    L, g = m.loss_and_grad(w)
    wn = np.abs(w).max()
    gscale = np.abs(g).max() + 1e-300
    assert abs(m.loss(c * w) - L) <= 1e-12 * max(abs(L), 1e-300) + 1e-15
    assert _close(m.grad(c * w) * c, g, 1e-10, gscale)
    assert abs(w @ g) <= 1e-12 * case.dim * wn * gscale
    hv = m.hvp(w, v)
    # The natural scale of H v is |H| |v|: where H v itself is near zero (e.g. Toy3D
    # on Gamma, x - y ~ 1e-16) it is rounding noise of that size, not of |H v|.
    hscale = np.abs(hv).max() + np.abs(m.hessian(w)).max() * np.abs(v).max() + gscale / wn
    assert _close(m.hvp(c * w, v) * c ** 2, hv, 1e-9, hscale)
    assert _close(m.hvp(w, w), -g, 1e-9, gscale + wn * hscale)


_SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9)
_DTYPES = st.sampled_from([np.float64, np.float32, np.float16, np.int64, np.int8, np.bool_,
                           np.complex128, np.uint8])


def _names_argument(exc: Exception, names) -> bool:
    return any(re.search(rf"\b{n}\b", str(exc)) for n in names)


@pytest.mark.parametrize("key", CASES)
@FAST
@given(shape=_SHAPES, dtype=_DTYPES, fill=st.sampled_from([0.0, 1.0, -2.5, np.nan, np.inf, 1e300]),
       random=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_kernels_accept_or_reject_naming_the_argument(key, shape, dtype, fill, random, seed):
    m = get_case(key).model
    rng = np.random.default_rng(seed)
    with np.errstate(all="ignore"):
        w = (rng.standard_normal(shape) * 3 if random else np.full(shape, fill)).astype(dtype)
        v = np.ones(shape).astype(dtype)
    for name, call, args in (("loss", m.loss, ("w",)), ("grad", m.grad, ("w",)),
                             ("hvp", lambda a: m.hvp(a, v), ("w", "v"))):
        try:
            out = call(w)
        except (ValueError, TypeError) as exc:
            assert _names_argument(exc, args), (name, shape, dtype, str(exc))
            continue
        out = np.asarray(out)
        assert np.all(np.isfinite(out)), (name, shape, dtype)
        lead = np.shape(w)[:-1]
        assert out.shape == (lead if name == "loss" else lead + (m.dim,)), (name, out.shape)


_SCALARS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10 ** 6),
                     st.just("0.1"), st.none(), st.lists(st.floats(-1, 2), max_size=3))


@FAST
@given(lr=_SCALARS, wd=_SCALARS, steps=_SCALARS)
def test_run_gd_wd_rejects_bad_hyperparameters_naming_them(lr, wd, steps):
    m = get_case("toy3d").model
    w0 = np.array([1.0, 0.5, 0.2])
    try:
        ps.run_gd_wd(m, w0, lr, wd, steps if not isinstance(steps, (int, float)) or
                     not np.isfinite(steps) or steps < 50 else 50, sharpness_every=0)
    except (ValueError, TypeError) as exc:
        assert _names_argument(exc, ("lr", "wd", "steps")), str(exc)


@FAST
@given(lr=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=0, max_size=4),
       wd=st.one_of(st.floats(allow_nan=True), st.lists(st.floats(-1, 1), max_size=3)),
       seeds=st.one_of(st.integers(-3, 5), st.floats(-1, 2),
                       st.lists(st.integers(-2, 3), max_size=3)),
       init_norm=st.one_of(st.floats(allow_nan=True), st.integers(-1, 3)))
def test_sweep_grid_rejects_naming_the_axis(lr, wd, seeds, init_norm):
    pytest.importorskip("xarray")
    try:
        ps.sweep("toy3d", lr=lr, wd=wd, seeds=seeds, init_norm=init_norm, steps=3,
                 sharpness_every=0, progress=False)
    except (ValueError, TypeError) as exc:
        assert _names_argument(exc, ("lr", "wd", "seeds", "init_norm")), str(exc)

"""exp, expm1, log, log1p, tanh, sin and cos on lane blocks of doubles
(csrc/include/pysharp/core/lane_math.hpp).

The engine's lane path evaluates them with polynomial kernels instead of <cmath>; here
they are held to long-double references in units in the last place, on the whole
double range, at the branch points of the kernels and at the special values.
"""

from __future__ import annotations

import numpy as np
import pytest

_core = pytest.importorskip("pysharp._core")

LONG = np.finfo(np.longdouble).nmant >= 63  # x86-64's 80-bit long double
needs_long = pytest.mark.skipif(not LONG, reason="needs an extended long double reference")


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in units of the last place of ref rounded to a double."""
    r = ref.astype(np.float64)
    spacing = np.spacing(np.abs(r))
    return np.abs(got.astype(np.longdouble) - ref) / spacing.astype(np.longdouble)


def sample(rng, lo: float, hi: float, n: int = 200_000) -> np.ndarray:
    """Points over [lo, hi]: uniform, and log-uniform in magnitude around 0 where it is inside."""
    x = rng.uniform(lo, hi, n)
    if lo < 0 < hi:
        mags = 10.0 ** rng.uniform(-300, np.log10(max(-lo, hi)), n)
        x = np.concatenate([x, np.clip(mags * rng.choice([-1.0, 1.0], n), lo, hi)])
    return x


@needs_long
@pytest.mark.parametrize("lo, hi", [(-2.0, 2.0), (-30.0, 30.0), (0.37, 0.56)])
def test_tanh_within_one_and_a_half_ulp(lo, hi):
    x = sample(np.random.default_rng(1), lo, hi)
    # the branch points: 3/8 (Taylor polynomial / expm1) and 0.5493 (tanh = 1/2)
    x = np.concatenate([x, np.nextafter(0.375, [0, 1]), np.nextafter(0.5493, [0, 1]),
                        [0.375, 0.5493, 19.9, 20.0, 20.1, 1e-300, 5e-324]])
    err = ulp_error(_core._lane_math("tanh", x), np.tanh(x.astype(np.longdouble)))
    assert err.max() <= 1.5, (err.max(), x[np.argmax(err)])


@needs_long
@pytest.mark.parametrize("lo, hi", [(-1.0, 1.0), (-745.0, 709.7), (-708.0, -745.1)])
def test_exp_within_one_ulp(lo, hi):
    x = sample(np.random.default_rng(2), min(lo, hi), max(lo, hi))
    ref = np.exp(x.astype(np.longdouble))
    got = _core._lane_math("exp", x)
    normal = ref >= np.finfo(np.float64).tiny
    assert ulp_error(got[normal], ref[normal]).max() <= 1.0
    # subnormal results: one rounding of the exact value (spacing there is the smallest subnormal)
    tiny = np.finfo(np.float64).smallest_subnormal
    if (~normal).any():
        assert (np.abs(got[~normal] - ref[~normal]) <= tiny).all()


@needs_long
@pytest.mark.parametrize("lo, hi", [(0.5, 2.0), (1 - 1e-6, 1 + 1e-6), (1e-300, 1e300)])
def test_log_within_one_ulp(lo, hi):
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(lo, hi, 200_000),
                        np.exp(rng.uniform(np.log(lo), np.log(hi), 200_000)),
                        [np.sqrt(0.5), np.nextafter(np.sqrt(2.0), 0), np.sqrt(2.0), 5e-324,
                         2.0 ** -1022, np.nextafter(2.0 ** -1022, 0), 1.7976931348623157e308]])
    x = x[x != 1.0]  # log 1 = 0 exactly (checked with the special values)
    err = ulp_error(_core._lane_math("log", x), np.log(x.astype(np.longdouble)))
    assert err.max() <= 1.0, (err.max(), x[np.argmax(err)])


@needs_long
@pytest.mark.parametrize("lo, hi", [(-1e-3, 1e-3), (-0.4, 0.4), (-2.0, 2.0), (-40.0, 709.7)])
def test_expm1_within_two_ulp(lo, hi):
    x = sample(np.random.default_rng(6), lo, hi)
    # the branch points: -38 (-1), 40 (exp), 2^-54 (x itself), k = +-1 near ln2 / 2
    x = np.concatenate([x, [-38.0, np.nextafter(-38.0, 0), 40.0, np.nextafter(40.0, 0),
                            2.0 ** -54, -(2.0 ** -54), 0.3466, 0.3467, -0.3466, -0.3467]])
    x = x[(x >= lo) & (x <= hi)]
    err = ulp_error(_core._lane_math("expm1", x), np.expm1(x.astype(np.longdouble)))
    assert err.max() <= 2.0, (err.max(), x[np.argmax(err)])


@needs_long
@pytest.mark.parametrize("lo, hi", [(-1 + 1e-12, -0.5), (-0.5, 0.5), (0.5, 10.0), (10.0, 1e300)])
def test_log1p_within_one_and_a_half_ulp(lo, hi):
    rng = np.random.default_rng(7)
    mags = np.exp(rng.uniform(-690, np.log(max(abs(lo), abs(hi))), 200_000))
    x = np.concatenate([rng.uniform(lo, hi, 200_000), mags, -mags, [2.0 ** -53, -(2.0 ** -53)]])
    x = x[(x > lo) & (x < hi)]
    err = ulp_error(_core._lane_math("log1p", x), np.log1p(x.astype(np.longdouble)))
    assert err.max() <= 1.5, (err.max(), x[np.argmax(err)])


@needs_long
@pytest.mark.parametrize("name", ["sin", "cos"])
@pytest.mark.parametrize("lo, hi", [(-1.0, 1.0), (-1e4, 1e4), (-5.2e5, 5.2e5)])
def test_sin_and_cos_within_one_ulp(name, lo, hi):
    x = sample(np.random.default_rng(8), lo, hi)
    # near multiples of pi/2 (the quadrant switches), 2^19 (the <cmath> lanes), 2^-26
    k = np.arange(-2000, 2001) * (np.pi / 2)
    x = np.concatenate([x, k, np.nextafter(k, np.inf), [2.0**19, -(2.0**19),
                        np.nextafter(2.0**19, 0), 2.0**-26, np.nextafter(2.0**-26, 0)]])
    x = x[(x >= lo) & (x <= hi)]
    fn = np.sin if name == "sin" else np.cos
    err = ulp_error(_core._lane_math(name, x), fn(x.astype(np.longdouble)))
    assert err.max() <= 1.0, (err.max(), x[np.argmax(err)])


@needs_long
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_and_cos_beyond_the_reduction_are_cmaths(name):
    """From 2^19 the lanes call <cmath>, whose reduction is exact: within an ulp up to 1e300,
    mixed in blocks with lanes of the vector path."""
    rng = np.random.default_rng(9)
    far = np.exp(rng.uniform(np.log(2.0**19), np.log(1e300), 20_000))
    far *= rng.choice([-1, 1], 20_000)
    x = np.stack([far, rng.uniform(-3, 3, 20_000)], axis=1).ravel()
    fn = np.sin if name == "sin" else np.cos
    err = ulp_error(_core._lane_math(name, x), fn(x.astype(np.longdouble)))
    assert err.max() <= 1.0, (err.max(), x[np.argmax(err)])


def test_special_values_as_cmath():
    finite_args = [5e-324, -5e-324, 1e-310, 709.78, 709.79, -745.1, -745.2, 710.0, -1000.0,
                   1000.0]
    cases = {"exp": (np.exp, finite_args), "tanh": (np.tanh, finite_args),
             "log": (np.log, [-1.0, 1.0, -5e-324]),
             "expm1": (np.expm1, finite_args + [-38.0, -40.0, 40.0, 41.0, 1e-20, -1e-20]),
             "log1p": (np.log1p, [-1.0, -2.0, -5e-324, 5e-324, 1e-20, -1e-20, 1e308,
                                  np.nextafter(-1.0, 0)]),
             "sin": (np.sin, [5e-324, -5e-324, 1e-20, -1e-20]),
             "cos": (np.cos, [5e-324, -5e-324, 1e-20, -1e-20])}
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        for name, (fn, more) in cases.items():
            x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan] + more)
            got, want = _core._lane_math(name, x), fn(x)
            np.testing.assert_array_equal(got, want, err_msg=name)
            # the sign of zero and infinity too
            number = ~np.isnan(want)
            np.testing.assert_array_equal(np.signbit(got[number]), np.signbit(want[number]),
                                          err_msg=name)


def test_tanh_is_odd_to_the_bit():
    x = np.random.default_rng(3).uniform(0, 25, 10_001)
    np.testing.assert_array_equal(_core._lane_math("tanh", -x), -_core._lane_math("tanh", x))


def test_a_value_gets_the_same_bits_in_every_lane():
    """Moving the input by one place moves every value to another lane of its block."""
    x = np.random.default_rng(4).uniform(-3, 3, 1001)
    for name in ("exp", "log", "tanh", "expm1", "log1p", "sin", "cos"):
        arg = np.abs(x) if name in ("log", "log1p") else x
        a = _core._lane_math(name, arg)
        for shift in range(1, 8):
            shifted = np.r_[np.ones(shift), arg]
            np.testing.assert_array_equal(_core._lane_math(name, shifted)[shift:], a,
                                          err_msg=f"{name}, shift {shift}")


def test_refuses_other_names():
    with pytest.raises(ValueError, match="name must be"):
        _core._lane_math("atan", np.ones(3))

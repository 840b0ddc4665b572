"""ps.models.check: a model against its author's reference loss (issue 26, item 5).

The example header passes against its references in NumPy, JAX and PyTorch; a
wrong reference, a model with a wrong derivative and a model that is not
scale-invariant fail, each naming the quantity that is wrong. Loaded models
are compiled into a cache of this module's own unless PYSHARP_CACHE_DIR is set.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from _cases import example_module

import pysharp as ps
from pysharp.models import BNTwoLayerNet, CheckReport, Toy3D, check

QUADRATIC = """\
// Not scale-invariant: L(w) = (c / 2) ||w||^2 on R^3.
#include <pysharp/model.hpp>

template <class Real>
struct Quadratic {
  Real c;
  PYSHARP_HD int dim() const { return 3; }
  PYSHARP_HD int work_size() const { return 0; }
  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* /*work*/) const {
    S s = Real(0);
    for (int j = 0; j < 3; ++j) {
      s += w[j] * w[j];
      g[j] = c * w[j];
    }
    *loss = Real(0.5) * c * s;
    return value_of(s) >= Real(0);
  }
};
PYSHARP_MODEL(Quadratic, PYSHARP_SCALAR(c))
"""


@pytest.fixture(scope="module", autouse=True)
def model_cache(tmp_path_factory):
    """A private compile cache for this module, unless the caller chose one."""
    if os.environ.get("PYSHARP_CACHE_DIR"):  # kept between runs: compiles once
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYSHARP_CACHE_DIR", str(tmp_path_factory.mktemp("pysharp-cache")))
        yield


@pytest.fixture(scope="module")
def pr():
    """The example's reference module (examples/models/phase_retrieval.py)."""
    return example_module("phase_retrieval")


@pytest.fixture(scope="module")
def phase(pr):
    """(model, X, y): the example header loaded on its synthetic data, d = 8."""
    X, y = pr.synthetic()
    return ps.models.load_model(pr.HEADER, X=X, y=y, c=1.0), X, y


DERIVATIVES = ("loss", "gradient", "hvp", "third")
IDENTITIES = ("g.w", "Hw+g", "L(2w)-L(w)")


def assert_ok(report: CheckReport) -> None:
    assert report.ok, str(report)
    assert report.problems() == []
    report.raise_if_failed()
    assert set(report.errors) >= set(DERIVATIVES + IDENTITIES)
    for key, err in report.errors.items():
        assert err <= report.tolerances[key] and report.passed[key]


# -- the example passes against its references ---------------------------------------------
def test_example_passes_numpy(phase, pr):
    model, X, y = phase
    report = check(model, lambda w: pr.loss_numpy(w, X, y, 1.0))
    assert_ok(report)
    assert report.framework == "numpy" and "complex-step" in report.method
    assert report.notes == [] and report.points == 8 and report.dtype == "float64"
    # Complex step: loss and gradient exact to rounding; the differences of it as derived.
    assert report.errors["loss"] < 1e-13 and report.errors["gradient"] < 1e-13
    assert report.errors["hvp"] < 1e-8 and report.errors["third"] < 1e-5
    assert "ok against a numpy reference" in str(report)


def test_example_passes_jax(phase, pr):
    jax = pytest.importorskip("jax")
    model, X, y = phase
    x64 = bool(jax.config.read("jax_enable_x64"))
    report = check(model, lambda w: pr.loss_jax(w, X, y, 1.0))
    assert_ok(report)
    assert report.framework == "jax"
    assert max(report.errors[k] for k in DERIVATIVES) < 1e-13  # both exact
    assert bool(jax.config.read("jax_enable_x64")) == x64  # the user's setting is back


def test_example_passes_torch(phase, pr):
    pytest.importorskip("torch")
    model, X, y = phase
    report = check(model, lambda w: pr.loss_torch(w, X, y, 1.0))
    assert_ok(report)
    assert report.framework == "torch"
    assert max(report.errors[k] for k in DERIVATIVES) < 1e-13


def test_non_analytic_numpy_reference_falls_back_to_finite_differences(phase):
    model, X, y = phase

    def loss(w):  # np.linalg.norm takes |w|: no complex step through it
        q = (X @ w) ** 2 / np.linalg.norm(w) ** 2
        return 0.5 / len(y) * np.sum((q - y) ** 2)

    report = check(model, loss, points=3)
    assert_ok(report)
    assert "finite-difference" in report.method
    assert any("complex step unusable" in n for n in report.notes)
    assert "note: complex step unusable" in str(report)


# -- and what is wrong is named ---------------------------------------------------------------
@pytest.mark.parametrize("framework", ["numpy", "jax", "torch"])
@pytest.mark.parametrize("mutation", ["scale", "sign"])
def test_wrong_reference_fails_naming_the_loss(phase, pr, framework, mutation):
    if framework != "numpy":
        pytest.importorskip(framework)
    model, X, y = phase
    right = getattr(pr, f"loss_{framework}")
    if mutation == "scale":
        def reference(w):
            return 1.1 * right(w, X, y, 1.0)
    else:  # a sign flipped in one term: (q + y)^2 for (q - y)^2
        def reference(w):
            return right(w, X, -y, 1.0)
    report = check(model, reference, points=4)
    assert not report.ok and report.framework == framework
    assert set(k for k, good in report.passed.items() if not good) == set(DERIVATIVES)
    assert all(report.passed[k] for k in IDENTITIES)  # the model itself is fine
    text = str(report)
    assert "FAILED" in text and "loss off the reference by" in text
    assert "gradient off the reference by" in text and "at 4 of 4 points" in text
    with pytest.raises(AssertionError, match="loss off the reference by"):
        report.raise_if_failed()


class Perturbed:
    """A model whose ``hvp`` or ``third`` is off by a relative ``eps`` (a bug's stand-in)."""

    def __init__(self, model, kernel: str, eps: float) -> None:
        self.model, self.kernel, self.eps = model, kernel, eps
        self.dim = model.dim

    def __getattr__(self, name):
        return getattr(self.model, name)

    def hvp(self, w, v):
        return self.model.hvp(w, v) * (1 + (self.eps if self.kernel == "hvp" else 0))

    def third(self, w, v):
        return self.model.third(w, v) * (1 + (self.eps if self.kernel == "third" else 0))


def test_a_third_derivative_off_by_1e_3_fails_alone(phase, pr):
    model, X, y = phase
    report = check(Perturbed(model, "third", 1e-3), lambda w: pr.loss_numpy(w, X, y, 1.0))
    assert [k for k, good in report.passed.items() if not good] == ["third"]
    assert report.problems()[0].startswith("third-order contraction D3L[v, v] off the "
                                           "reference by 1.0e-03 at 8 of 8 points")


def test_an_hvp_off_by_1e_6_fails_and_breaks_hw_equals_minus_g(phase, pr):
    model, X, y = phase
    report = check(Perturbed(model, "hvp", 1e-6), lambda w: pr.loss_numpy(w, X, y, 1.0))
    assert {k for k, good in report.passed.items() if not good} == {"hvp", "Hw+g"}
    assert "Hessian-vector product H v off the reference by 1.0e-06" in str(report)
    assert "not scale-invariant: ||H w + g||" in str(report)


def test_a_model_that_is_not_scale_invariant_fails():
    # Beside the compile cache, at a fixed path, so that a cache the caller keeps
    # (PYSHARP_CACHE_DIR) holds its module from one run to the next.
    folder = Path(os.environ["PYSHARP_CACHE_DIR"]) / "test_check"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    header = folder / "quadratic.hpp"
    if not header.is_file() or header.read_text() != QUADRATIC:
        header.write_text(QUADRATIC)
    model = ps.models.load_model(header, c=1.0)
    report = check(model, lambda w: 0.5 * (w @ w))
    assert all(report.passed[k] for k in DERIVATIVES), str(report)  # it is the loss it says
    assert not any(report.passed[k] for k in IDENTITIES)
    assert "not scale-invariant: L(2w) - L(w) = " in str(report)
    assert "not scale-invariant: <g, w>" in str(report)
    with pytest.raises(AssertionError, match="not scale-invariant"):
        report.raise_if_failed()


def test_groups_split_w_into_blocks(phase, pr):
    """Phase retrieval is invariant to the scale of w, not of each half of it."""
    model, X, y = phase
    report = check(model, lambda w: pr.loss_numpy(w, X, y, 1.0), points=3, groups=2)
    assert report.groups == 2
    assert {k for k, good in report.passed.items() if not good} == {
        "group L(2w_k)-L(w)", "group g_k.w_k"}
    assert "not scale-invariant in group" in str(report)
    assert check(model, lambda w: pr.loss_numpy(w, X, y, 1.0), points=2).groups == 1


# -- built-in models, against their formulas ----------------------------------------------------
def test_toy3d_against_its_formula():
    c = 10.0

    def loss(w):  # docs/theory.rst: (1 + c z^2)(x - y)^2 at (x, y, z) = w / ||w||
        t = w / np.sqrt(w @ w)
        return (1 + c * t[2] ** 2) * (t[0] - t[1]) ** 2

    assert_ok(check(Toy3D(c=c), loss))
    report = check(Toy3D(c=c), lambda w: loss(w) * (1 + 1e-7), points=2)
    assert not report.passed["loss"]  # a 1e-7 change of the loss is seen


def test_bn_two_layer_net_is_checked_row_by_row():
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((10, 4)), rng.standard_normal(10)
    net = BNTwoLayerNet(X, y, width=3)
    a = np.array([1.0, -1.0, 1.0]) / np.sqrt(3)

    def loss(w):  # the class docstring: BatchNorm per hidden unit, fixed output weights
        Z = X @ w.reshape(3, 4).T
        Zc = Z - Z.mean(axis=0)
        return np.mean((np.tanh(Zc / np.sqrt(np.mean(Zc * Zc, axis=0))) @ a - y) ** 2)

    report = check(net, loss, points=4)
    assert_ok(report)
    assert report.groups == 3 and "group g_k.w_k" in report.errors


@pytest.mark.slow
def test_float32_model_passes_with_float32_tolerances(pr):
    X, y = pr.synthetic()
    model = ps.models.load_model(pr.HEADER, X=X, y=y, c=1.0, dtype="float32")
    report = check(model, lambda w: pr.loss_numpy(w, X, y, 1.0))
    assert_ok(report)
    assert report.dtype == "float32" and 1e-5 < report.tolerances["loss"] < 1e-3


# -- inputs are checked before any work -----------------------------------------------------
def test_bad_arguments_raise_before_any_work(phase):
    model = phase[0]
    calls = []

    def reference(w):
        calls.append(w)
        return 0.0

    with pytest.raises(TypeError, match="reference must be a callable"):
        check(model, 3.0)
    with pytest.raises(TypeError, match="has no 'dim'"):
        check(object(), reference)
    for points in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="points must be an integer >= 1"):
            check(model, reference, points=points)
    with pytest.raises(ValueError, match="framework must be one of"):
        check(model, reference, framework="tensorflow")
    with pytest.raises(ValueError, match="groups=3: 3 equal blocks do not divide the dim 8"):
        check(model, reference, groups=3)
    with pytest.raises(ValueError, match="unknown quantity 'hessian'"):
        check(model, reference, rtol={"hessian": 1e-3})
    with pytest.raises(ValueError, match="rtol must be a positive number"):
        check(model, reference, rtol=-1.0)
    assert calls == []


@pytest.mark.parametrize("framework", ["auto", "numpy", "jax", "torch"])
def test_a_non_scalar_reference_is_refused(phase, pr, framework):
    if framework in ("jax", "torch"):
        pytest.importorskip(framework)
    model, X, y = phase
    loss = {"auto": pr.loss_numpy, "numpy": pr.loss_numpy, "jax": pr.loss_jax,
            "torch": pr.loss_torch}[framework]
    with pytest.raises(ValueError, match="must return a scalar loss"):
        check(model, lambda w: loss(w, X, y, 1.0) * w, framework=framework)


def test_a_reference_that_runs_nowhere_says_where_it_failed(phase):
    def reference(w):
        raise RuntimeError("boom")

    with pytest.raises(ValueError, match="could not evaluate reference.*boom"):
        check(phase[0], reference)


def test_non_finite_reference_values_fail(phase):
    report = check(phase[0], lambda w: np.nan * (w @ w), framework="numpy", points=2)
    assert not report.passed["loss"] and "not finite" in report.messages["loss"]


def test_rtol_overrides_the_derived_tolerances(phase, pr):
    model, X, y = phase
    ref = lambda w: pr.loss_numpy(w, X, y, 1.0)  # noqa: E731
    strict = check(model, ref, points=2, rtol={"third": 1e-14})
    assert strict.tolerances["third"] == 1e-14 and not strict.passed["third"]
    assert all(good for k, good in strict.passed.items() if k != "third")
    assert set(check(model, ref, points=2, rtol=0.5).tolerances.values()) == {0.5}


def test_jax_reference_over_float32_data_gets_a_hint(phase):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    model, X, y = phase
    if jax.config.read("jax_enable_x64"):
        pytest.skip("64-bit mode is on globally: jnp.asarray keeps float64")
    Xj, yj = jnp.asarray(X), jnp.asarray(y)  # float32, made outside 64-bit mode
    report = check(model, lambda w: 0.5 / len(y) * jnp.sum(((Xj @ w) ** 2 / (w @ w) - yj) ** 2),
                   points=2)
    assert not report.ok and any("float32 rounding" in n for n in report.notes)

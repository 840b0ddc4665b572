"""Parameter groups of unequal sizes (issue 48.3): a header's ``group_begin(k)``, the forms
``from_jax(groups=...)`` and ``check(groups=...)`` take, and what the engine records.

Oracles: the squared norms of the groups computed by NumPy from the recorded directions and
norms; the weight-normalised classifier's NumPy reference (invariant to the scale of W and
of a separately, and to nothing finer); the offsets written by hand.
"""

from __future__ import annotations

import functools
import textwrap

import numpy as np
import pytest
from _cases import EXAMPLE_MODELS, example_module

import pysharp as ps
from pysharp.models._from_jax import _trace
from pysharp.models._groups import group_bounds

#: The traced path (the default, compile=False, runs the loss in XLA).
from_jax = functools.partial(ps.models.from_jax, compile=True)

needs_core = pytest.mark.skipif(ps.build_info().get("available") is not True,
                                reason="needs the compiled core")

M, D_IN = 6, 5           # W (6 x 5) and a (6): groups of 30 and 6
DIM = M * D_IN + M


# -- the forms -------------------------------------------------------------------------------

@pytest.mark.parametrize("groups, bounds", [
    (1, [0, 36]), (2, [0, 18, 36]), (6, [0, 6, 12, 18, 24, 30, 36]),
    ([30, 6], [0, 30, 36]), ((30, 6), [0, 30, 36]), (np.array([30, 6]), [0, 30, 36]),
    ([36], [0, 36]), ([(0, 30), (30, 36)], [0, 30, 36]), ([[0, 30], [30, 36]], [0, 30, 36]),
    ([range(0, 30), range(30, 36)], [0, 30, 36]), (np.array([[0, 30], [30, 36]]), [0, 30, 36]),
    ([5] * 6 + [6], [0, 5, 10, 15, 20, 25, 30, 36]),
])
def test_the_forms_give_offsets(groups, bounds):
    got = group_bounds(groups, DIM)
    assert got.dtype == np.int64 and got.tolist() == bounds


@pytest.mark.parametrize("groups, message", [
    (0, r"groups must be >= 1, got 0"),
    (5, r"groups=5: 5 equal blocks do not divide the dim 36; for blocks of unequal sizes"),
    (True, r"groups must be an int G .*; got bool True"),
    ("30,6", r"groups must be an int G"),
    (3.0, r"groups must be an int G"),
    ([], r"groups is empty"),
    ([30, 5], r"the sizes \[30, 5\] sum to 35, not to the dim 36"),
    ([30, 0, 6], r"the size of group 1 is 0"),
    ([30, (30, 36)], r"not a mix; entry 0 is 30"),
    ([(0, 30), (31, 36)], r"a gap between range 0 \(0, 30\) and range 1 \(31, 36\): "
                          r"w\[30:31\] is in no group"),
    ([(0, 30), (28, 36)], r"range 0 \(0, 30\) and range 1 \(28, 36\) overlap at w\[28:30\]"),
    ([(2, 30), (30, 36)], r"range 0 starts at 2, so w\[0:2\] is in no group"),
    ([(0, 30), (30, 35)], r"the last range stops at 35, but the dim is 36: w\[35:36\]"),
    ([(0, 30), (30, 40)], r"the last range stops at 40, but the dim is 36$"),
    ([(0, 30), (30, 30), (30, 36)], r"range 1 \(30, 30\) is empty"),
    ([range(0, 30, 2), (30, 36)], r"not a mix; entry 0 is range\(0, 30, 2\)"),
])
def test_groups_that_do_not_tile_w_are_refused_by_name(groups, message):
    with pytest.raises(ValueError, match=message):
        group_bounds(groups, DIM)


# -- a header that declares unequal groups ---------------------------------------------------

@pytest.fixture(scope="module")
def classifier():
    """The weight-normalised classifier of examples/models (groups of 30 and 6), its data
    and its NumPy reference."""
    reference = example_module("weight_norm_classifier")
    X, y = reference.synthetic(n=40, d=D_IN)
    model = ps.load_model(EXAMPLE_MODELS / "weight_norm_classifier.hpp", X=X, y=y, m=M, s=2.0)
    return model, (lambda w: reference.loss_numpy(w, X, y, m=M, s=2.0))


@needs_core
def test_the_header_declares_its_groups(classifier):
    model, _ = classifier
    assert model.dim == DIM
    assert model.group_bounds.tolist() == [0, 30, 36]
    assert ps.BNTwoLayerNet.synthetic(n=8, d=4, width=3).group_bounds.tolist() == [0, 4, 8, 12]


@needs_core
def test_the_engine_records_each_groups_norm(classifier):
    model, _ = classifier
    W0 = model.random_point(3, seed=1, norm=3.0)
    W0[:, 30:] *= 4.0  # the groups at different scales
    tr = ps.run_gd_wd(model, W0, [0.2, 1.0, 3.0], 1e-3, 300, record_every=20, theta_every=20,
                      sharpness_every=100)
    assert tr.group_norm2.shape == (16, 3, 2)
    w = tr.theta * np.sqrt(tr.norm2)[..., None]
    expected = np.stack([np.sum(w[..., :30] ** 2, axis=-1), np.sum(w[..., 30:] ** 2, axis=-1)],
                        axis=-1)
    np.testing.assert_allclose(tr.group_norm2, expected, rtol=1e-13)
    np.testing.assert_allclose(tr.group_norm2.sum(axis=-1), tr.norm2, rtol=1e-14)


@needs_core
def test_check_verifies_each_declared_group(classifier):
    model, reference = classifier
    report = ps.models.check(model, reference, points=3)
    assert report.ok, str(report)
    assert (report.groups, report.group_bounds) == (2, (0, 30, 36))
    for form in ([30, 6], [(0, 30), (30, 36)]):
        given = ps.models.check(model, reference, points=3, groups=form)
        assert given.ok and given.group_bounds == (0, 30, 36)


@needs_core
def test_check_fails_on_groups_the_loss_is_not_invariant_to(classifier):
    """The loss is invariant to the scale of W as a whole, not of each of its rows."""
    model, reference = classifier
    rows = [D_IN] * M + [M]
    report = ps.models.check(model, reference, points=3, groups=rows)
    assert not report.ok and report.groups == M + 1
    assert not report.passed["group L(2w_k)-L(w)"] and not report.passed["group g_k.w_k"]
    assert all(report.passed[k] for k in ("loss", "gradient", "hvp", "third", "g.w"))
    assert "not scale-invariant in group" in report.messages["group g_k.w_k"]
    split = ps.models.check(model, reference, points=3, groups=[(0, 20), (20, 36)])
    assert "group 0 of 2 (w[0:20])" in split.messages["group L(2w_k)-L(w)"]
    with pytest.raises(ValueError, match=r"the sizes \[30, 5\] sum to 35"):
        ps.models.check(model, reference, groups=[30, 5])


CUT = """
#include <pysharp/model.hpp>

// L(w) = (x . w)^2 / ||w||^2, with groups whose offsets come from the data: 0 or `first`,
// `cut`, `cut` + 1, ..., and `last` at k = G.
template <class Real>
struct Cut {
  const Real* x;
  int d;
  int G, first, cut, last;
  PYSHARP_HD int dim() const { return d; }
  PYSHARP_HD int work_size() const { return 1; }
  PYSHARP_HD int n_groups() const { return G; }
  PYSHARP_HD int group_begin(int k) const {
    return k == 0 ? first : k == G ? last : cut + k - 1;
  }
  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const {
    (void)work;
    S s = Real(0), z = Real(0);
    for (int j = 0; j < d; ++j) { s += w[j] * w[j]; z += x[j] * w[j]; }
    *loss = z * z / s;
    for (int j = 0; j < d; ++j) g[j] = Real(2) * z / s * (x[j] - z / s * w[j]);
    return s > Real(0);
  }
};
PYSHARP_MODEL(Cut, PYSHARP_ARRAY(x, d), PYSHARP_SCALAR(G), PYSHARP_SCALAR(first),
              PYSHARP_SCALAR(cut), PYSHARP_SCALAR(last))
"""


@needs_core
def test_a_header_whose_groups_do_not_tile_w_is_refused_by_name(tmp_path):
    header = tmp_path / "cut.hpp"
    header.write_text(textwrap.dedent(CUT))
    x = np.arange(1.0, 6.0)
    good = ps.load_model(header, x=x, G=3, first=0, cut=2, last=5)
    assert good.group_bounds.tolist() == [0, 2, 3, 5]
    tr = ps.run_gd_wd(good, np.ones(5), 0.1, 1e-3, 10, record_every=5, theta_every=5)
    w = tr.theta * np.sqrt(tr.norm2)[:, None]
    np.testing.assert_allclose(tr.group_norm2, np.stack(
        [np.sum(w[:, a:b] ** 2, axis=-1) for a, b in ((0, 2), (2, 3), (3, 5))], axis=-1),
        rtol=1e-14)
    for scalars, message in [
        (dict(G=2, first=1, cut=2, last=5), r"group_begin\(0\) = 1, must be 0"),
        (dict(G=2, first=0, cut=2, last=4), r"group_begin\(2\) = 4 \(k = n_groups\(\)\), "
                                            r"must be its dim\(\) = 5"),
        (dict(G=2, first=0, cut=0, last=5), r"groups must be non-empty and in order: "
                                            r"group_begin\(0\) = 0, "
                                            r"group_begin\(1\) = 0"),
        (dict(G=3, first=0, cut=4, last=5), r"groups must be non-empty and in order: "
                                            r"group_begin\(2\) = 5, group_begin\(3\) = 5"),
        (dict(G=0, first=0, cut=0, last=5), r"n_groups\(\) = 0 must be between 1 and its "
                                            r"dim\(\) = 5"),
        (dict(G=6, first=0, cut=0, last=5), r"n_groups\(\) = 6 must be between 1"),
    ]:
        with pytest.raises(ValueError, match=r"cut\.hpp: the model's " + message):
            ps.load_model(header, x=x, **scalars)


# -- from_jax --------------------------------------------------------------------------------

@pytest.mark.slow  # compiles a traced header (15-30 s): run by CI's slow step
@needs_core
def test_from_jax_declares_unequal_groups_given_as_sizes_or_ranges(classifier):
    pytest.importorskip("jax")
    loaded, reference = classifier
    example = example_module("weight_norm_classifier")
    X, y = example.synthetic(n=40, d=D_IN)
    loss = example.loss_jax  # the function jax_models.rst includes
    w0 = np.ones(DIM)
    by_size = from_jax(loss, w0, X=X, y=y, m=M, s=2.0, groups=[30, 6])
    assert "PYSHARP_HD int n_groups() const { return 2; }" in by_size.source
    assert "constexpr int begin[] = {0, 30, 36};" in by_size.source
    assert by_size.group_bounds.tolist() == [0, 30, 36]
    assert by_size.report.ok and by_size.report.group_bounds == (0, 30, 36)
    by_range = from_jax(loss, w0, X=X, y=y, m=M, s=2.0, groups=[(0, 30), (30, 36)],
                                  check=False)
    assert by_range.source == by_size.source and by_range.header == by_size.header
    W0 = loaded.random_point(2, seed=3, norm=2.0)
    a = ps.run_gd_wd(by_size, W0, 0.5, 1e-3, 100, record_every=10)
    b = ps.run_gd_wd(loaded, W0, 0.5, 1e-3, 100, record_every=10)
    np.testing.assert_allclose(a.group_norm2, b.group_norm2, rtol=1e-12)
    # Equal blocks, in any form, declare n_groups() alone: the header of groups=2.
    data = dict(X=X, y=y, m=M, s=2.0)
    halves = [_trace(loss, w0, data, group_bounds(g, DIM)).source
              for g in (2, [18, 18], [(0, 18), (18, 36)])]
    assert halves[0] == halves[1] == halves[2] and "group_begin" not in halves[0]
    assert "n_groups() const { return 2; }" in halves[0]
    with pytest.raises(ValueError, match=r"a gap between range 0 \(0, 29\) and range 1"):
        from_jax(loss, w0, X=X, y=y, m=M, s=2.0, groups=[(0, 29), (30, 36)])
    with pytest.raises(ValueError, match=r"sum to 35, not to the dim 36"):
        from_jax(loss, w0, X=X, y=y, m=M, s=2.0, groups=[30, 5])

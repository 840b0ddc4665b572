"""What the own-model tutorial promises a header may write, compiled: every C++ sample of
the documentation, and the comparisons ``loss_grad`` may use on every ``S``.

Oracles: the reference loss beside each example header (``pysharp.models.check``: loss,
gradient, HVP and D^3L at random points), and for the comparisons the same comparison of
plain doubles, lane by lane.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from _cases import EXAMPLE_MODELS, REPO, example_module

import pysharp as ps
from pysharp.models import _compiler

pytestmark = pytest.mark.skipif(
    ps.build_info().get("available") is not True, reason="needs the compiled core")

DOCS = REPO / "docs"

# -- the comparisons of the tutorial's table, on every S a model is instantiated on ----------

COMPARISONS = r"""
#include <pysharp/model.hpp>
#include <pysharp/core/lanes.hpp>

#include <cstdio>
#include <type_traits>

using namespace pysharp;

template <class S> struct coefficient { using type = S; };
template <class T, int N> struct coefficient<Jet<T, N>> { using type = T; };

// Lane l holds base + l: lanes below, at and above the constants compared with.
template <class V>
V lanes_from(double base) {
  V v = V(0);
  for (int l = 0; l < lane_width<V>; ++l) set_lane(v, l, lane_real_t<V>(base + l));
  return v;
}

// A value part of -1, 0, 1, ... by lane, and derivative parts of 100 (their sign must not
// matter: comparisons test the value).
template <class S>
S point() {
  using T = typename coefficient<S>::type;
  if constexpr (std::is_same<S, T>::value) {
    return lanes_from<S>(-1);
  } else {
    S z;
    z.c[0] = lanes_from<T>(-1);
    for (int k = 1; k <= S::order; ++k) z.c[k] = lanes_from<T>(100);
    return z;
  }
}

int failures = 0;

// The mask m against the comparison `want` of plain doubles, lane by lane.
template <class S, class M, class F>
void expect(const char* type, const char* expr, const M& m, F want) {
  static_assert(std::is_same<M, mask_t<S>>::value, "a comparison on S gives mask_t<S>");
  for (int l = 0; l < lane_width<S>; ++l) {
    if (lane(m, l) != want(-1.0 + l)) {
      std::printf("%s: %s wrong in lane %d\n", type, expr, l);
      ++failures;
    }
  }
}

#define EXPECT(expr, want) expect<S>(type, #expr, expr, [](double v) { return want; })

template <class S>
void check(const char* type) {
  using Real = lane_real_t<S>;
  const S z = point<S>();
  const S two = S(Real(2));
  EXPECT(z > Real(0), v > 0);
  EXPECT(z < Real(0), v < 0);
  EXPECT(z >= Real(0), v >= 0);
  EXPECT(z <= Real(0), v <= 0);
  EXPECT(z == Real(0), v == 0);
  EXPECT(z != Real(0), v != 0);
  EXPECT(Real(0) < z, 0 < v);
  EXPECT(Real(1) >= z, 1 >= v);
  EXPECT(z > 0, v > 0);           // an int literal
  EXPECT(z <= 1.0, v <= 1);       // a double literal, also where Real is float
  EXPECT(z < two, v < 2);         // S with S
  EXPECT(two <= z, 2 <= v);
  EXPECT(z == z, true);
  EXPECT(z != z, false);
  using M = mask_t<S>;  // masks combine (bool & bool is an int: convert)
  EXPECT(M(!(z > Real(0)) | (z > Real(1))), !(v > 0) || v > 1);
  EXPECT(M((z > Real(-1)) & (z < Real(1))), v > -1 && v < 1);
  const S relu = select(z > Real(0), z, S(Real(0)));  // the tutorial's ReLU
  EXPECT(value_of(relu) == value_of(z), v >= 0);
}

int main() {
  constexpr int Wd = kNativeLanes<double>, Wf = kNativeLanes<float>;
  check<double>("double");
  check<float>("float");
  check<Lanes<double, Wd>>("Lanes<double>");
  check<Lanes<float, Wf>>("Lanes<float>");
  check<Jet<double, 1>>("Jet<double, 1>");
  check<Jet<float, 2>>("Jet<float, 2>");
  check<Jet<Lanes<double, Wd>, 1>>("Jet<Lanes<double>, 1>");
  check<Jet<Lanes<double, Wd>, 2>>("Jet<Lanes<double>, 2>");
  check<Jet<Lanes<float, Wf>, 2>>("Jet<Lanes<float>, 2>");
  if (failures == 0) std::printf("ok\n");
  return failures != 0;
}
"""


def test_comparisons_on_every_s_give_a_mask_of_the_value(tmp_path):
    """``z > Real(0)`` and the rest of the table's comparisons compile on scalars, lane
    blocks, jets and jets of lane blocks, give ``mask_t<S>``, and compare the value part
    lane by lane (model.hpp, own_model.rst's table)."""
    source = tmp_path / "comparisons.cpp"
    source.write_text(COMPARISONS)
    flags = _compiler.build_flags()
    exe = tmp_path / "comparisons"
    built = subprocess.run([_compiler.compiler(), *flags["flags"], f"-I{ps.include_dir()}",
                            str(source), "-o", str(exe)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-6000:]
    ran = subprocess.run([str(exe)], capture_output=True, text=True)
    assert (ran.returncode, ran.stdout) == (0, "ok\n")


# -- every C++ sample of the documentation --------------------------------------------------

#: The example headers the documentation includes, with the scalars their data need; each is
#: loaded with its reference module's synthetic data and checked against its NumPy loss.
EXAMPLES = {"phase_retrieval.hpp": {"c": 1.5}, "diagonal_net.hpp": {},
            "weight_norm_classifier.hpp": {"m": 6, "s": 2.0}}

#: The code blocks that are fragments of pysharp's own sources, not a model a user loads: a
#: built-in model's skeleton and the model interface (compiled below, -fsyntax-only), and
#: the lines a new method adds inside the engine's step (not code that stands alone).
FRAGMENTS = {"tutorials/adding_a_model.rst": "file scope", "architecture.rst": "member",
             "tutorials/adding_a_method.rst": None}

_LITERALINCLUDE = re.compile(r"^( *)\.\. literalinclude:: (\S+)\n((?:\1 +:.*\n)*)", re.M)
_CODE_BLOCK = re.compile(r"^( *)\.\. code-block:: cpp\n((?:\1 +:.*\n)*)\n((?:\1 +\S.*\n|\n)+)",
                         re.M)


def cpp_samples() -> tuple[list[tuple[str, Path]], list[tuple[str, str]]]:
    """The C++ samples of docs/: (page, file) of each literalinclude in C++, and (page,
    dedented text) of each ``code-block:: cpp``."""
    included, blocks = [], []
    for page in sorted(DOCS.rglob("*.rst")):
        name, text = page.relative_to(DOCS).as_posix(), page.read_text()
        for m in _LITERALINCLUDE.finditer(text):
            if ":language: cpp" in m[3]:
                included.append((name, (page.parent / m[2]).resolve()))
        for m in _CODE_BLOCK.finditer(text):
            lines = m[3].rstrip("\n").splitlines()
            indent = min(len(s) - len(s.lstrip()) for s in lines if s.strip())
            blocks.append((name, "\n".join(s[indent:] for s in lines)))
    return included, blocks


def test_the_docs_show_cpp_only_from_examples_the_tests_load():
    """A user's tutorial shows C++ only by including an example header that the test below
    compiles, loads and checks: a sample edited in the docs alone cannot rot."""
    if not DOCS.is_dir():
        pytest.skip("docs/ not next to the tests")
    included, blocks = cpp_samples()
    assert {path for _, path in included} == {EXAMPLE_MODELS / n for n in EXAMPLES}
    assert {page for page, _ in blocks} == set(FRAGMENTS)


@pytest.mark.parametrize("header", sorted(EXAMPLES))
def test_each_example_header_loads_and_matches_its_reference(header):
    reference = example_module(header.removesuffix(".hpp"))
    X, y = reference.synthetic()
    scalars = EXAMPLES[header]
    model = ps.load_model(EXAMPLE_MODELS / header, X=X, y=y, **scalars)
    report = ps.models.check(model, lambda w: reference.loss_numpy(w, X, y, **scalars))
    report.raise_if_failed()


def test_the_fragments_of_pysharps_sources_compile(tmp_path):
    """The skeletons in the docs are valid C++ against model.hpp (syntax and declarations;
    their members are declared, not defined)."""
    if not DOCS.is_dir():
        pytest.skip("docs/ not next to the tests")
    parts = ["#include <pysharp/model.hpp>", "using namespace pysharp;"]
    for k, (page, text) in enumerate(cpp_samples()[1]):
        if FRAGMENTS[page] == "file scope":
            parts.append(text)
        elif FRAGMENTS[page] == "member":
            parts.append(f"struct Sample{k} {{\n{text}\n}};")
    source = tmp_path / "fragments.cpp"
    source.write_text("\n".join(parts) + "\n")
    flags = _compiler.build_flags()["flags"]
    done = subprocess.run([_compiler.compiler(), *flags, f"-I{ps.include_dir()}",
                           "-fsyntax-only", str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-6000:]

"""Run-time compiled models (pysharp.models.load_model): the header door, its cache and errors.

Oracles: the NumPy loss of each header, finite differences, the scale-invariance
identities, and the built-in models, whose own headers loaded at run time must
give the built-ins' bits.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import pysharp as ps
from pysharp.models import _compiler
from pysharp.models._compiler import ModelCompileError

ROOT = Path(__file__).resolve().parents[2]
PHASE = ROOT / "examples" / "models" / "phase_retrieval.hpp"
BUILTIN = ps.include_dir() / "pysharp" / "models"

pytestmark = pytest.mark.skipif(
    ps.build_info().get("available") is not True, reason="needs the compiled core")


def phase_data(n=30, d=8, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    w_star = rng.standard_normal(d)
    return X, (X @ w_star) ** 2 / (w_star @ w_star)


def phase_loss(w, X, y, c=1.0):
    """The NumPy oracle of examples/models/phase_retrieval.hpp."""
    q = (X @ w) ** 2 / (w @ w)
    return 0.5 * c / X.shape[0] * np.sum((q - y) ** 2)


@pytest.fixture(scope="module")
def phase():
    X, y = phase_data()
    return ps.load_model(PHASE, X=X, y=y, c=1.5), X, y


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


TRIVIAL = """\
    #include <pysharp/model.hpp>
    template <class Real>
    struct Cosine {{   // L = 1 - w_0 / ||w||, scale-invariant
      Real c;
      PYSHARP_HD int dim() const {{ return 3; }}
      PYSHARP_HD int work_size() const {{ return 0; }}
      template <class S>
      PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S*) const {{
        const S r2 = w[0] * w[0] + w[1] * w[1] + w[2] * w[2];
        const S inv = Real(1) / sqrt_(r2);
        *loss = c * (Real(1) - w[0] * inv);
        for (int j = 0; j < 3; ++j) g[j] = c * w[0] * w[j] * inv * inv * inv;
        g[0] = g[0] - c * inv;
        {extra}
        return value_of(r2) > Real(0);
      }}
    }};
    PYSHARP_MODEL(Cosine, PYSHARP_SCALAR(c))
"""


# -- the example model against its oracle ---------------------------------------------------

def test_phase_retrieval_matches_its_numpy_oracle(phase):
    model, X, y = phase
    W = model.random_point(batch=5, seed=1, norm=3.0)
    loss, G = model.loss_and_grad(W)
    ref = np.array([phase_loss(w, X, y, 1.5) for w in W])
    np.testing.assert_allclose(loss, ref, rtol=1e-13)
    h = 1e-6
    for w, g in zip(W, G):
        fd = [(phase_loss(w + h * e, X, y, 1.5) - phase_loss(w - h * e, X, y, 1.5)) / (2 * h)
              for e in np.eye(model.dim)]
        np.testing.assert_allclose(g, fd, atol=1e-8 * np.abs(fd).max())
    assert np.abs(np.einsum("bi,bi->b", G, W)).max() < 1e-13 * np.abs(G).max() * 3
    np.testing.assert_allclose(model.hvp(W, W), -G, atol=1e-13 * np.abs(G).max())


def test_phase_retrieval_hvp_and_third_are_derivatives_of_the_kernels(phase):
    model, _, _ = phase
    w = model.random_point(seed=2)
    v = model.random_point(seed=3)
    t = 1e-5
    fd_h = (model.grad(w + t * v) - model.grad(w - t * v)) / (2 * t)
    np.testing.assert_allclose(model.hvp(w, v), fd_h, atol=1e-8 * np.abs(fd_h).max())
    fd_3 = (model.hvp(w + t * v, v) - model.hvp(w - t * v, v)) / (2 * t)
    np.testing.assert_allclose(model.third(w, v), fd_3, atol=1e-7 * np.abs(fd_3).max())
    H = model.hessian(w)
    np.testing.assert_allclose(H @ v, model.hvp(w, v), atol=1e-13 * np.abs(H).max())


def test_float32_compiles_on_first_use_and_agrees_to_its_precision(phase):
    model, X, y = phase
    w = model.random_point(seed=4)
    loss32, g32 = model.loss_and_grad(w.astype(np.float32))
    assert loss32.dtype == np.float32 and g32.dtype == np.float32
    loss64, g64 = model.loss_and_grad(w)
    np.testing.assert_allclose(loss32, loss64, rtol=1e-5)
    np.testing.assert_allclose(g32, g64, atol=1e-5 * np.abs(g64).max())
    m32 = ps.load_model(PHASE, X=X, y=y, c=1.5, dtype="float32")
    assert m32.dtype == np.float32
    assert np.array_equal(m32.loss(w.astype(np.float32)), loss32)


def test_every_tool_runs_on_a_loaded_model(phase):
    model, _, _ = phase
    w0 = model.random_point(batch=3, seed=5, norm=4.0)
    tr = ps.run_gd_wd(model, w0, 0.4, 1e-3, 400, sharpness_every=50, top_k=2)
    assert np.all(np.isfinite(tr.loss)) and tr.top_eigenvalues.shape[-1] == 2
    assert ps.run_pgd(model, w0, 0.4, 200).loss.shape[1] == 3
    ps.run_scalar_rmsprop(model, w0, 0.01, 1e-3, 200)
    top = ps.spherical_sharpness(model, w0[0], k=2)
    H = model.hessian(w0[0] / np.linalg.norm(w0[0]))
    np.testing.assert_allclose(top.eigenvalues, np.linalg.eigvalsh(H)[::-1][:2], rtol=1e-10)
    dens = ps.spectral_density(model, w0[0], steps=model.dim)
    np.testing.assert_allclose(np.sort(dens.nodes[0]), np.linalg.eigvalsh(H), atol=1e-10)
    with pytest.raises(ps.BackendUnavailable, match="compiled library"):
        model.loss(w0[0], backend="numpy")


# -- the built-ins take the same door -------------------------------------------------------

def test_a_builtin_header_loaded_at_run_time_gives_the_builtins_bits():
    builtin = ps.BNLinearRegression.synthetic(d=12, n=8, seed=0)
    Xc = builtin._Xc
    loaded = ps.load_model(BUILTIN / "bn_linear_regression.hpp", Xc=Xc, u=builtin._u,
                           scale=builtin._scale, xc_fro2=float(np.sum(Xc * Xc)))
    w0 = builtin.random_point(batch=6, seed=3, norm=6.0)
    a = ps.run_gd_wd(builtin, w0, 0.5, 5e-3, 3000, sharpness_every=100, reduced=False)
    b = ps.run_gd_wd(loaded, w0, 0.5, 5e-3, 3000, sharpness_every=100)
    assert (a.eos_entry_step >= 0).any()  # the comparison runs through EoS: bits, not tolerance
    for name in ("w", "loss", "norm2", "sharpness", "eos_ratio"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    v = builtin.random_point(batch=6, seed=4)
    assert np.array_equal(builtin.hvp(w0, v), loaded.hvp(w0, v))
    assert np.array_equal(builtin.third(w0, v), loaded.third(w0, v))


def test_toy3d_header_at_run_time_has_the_builtins_kernel_bits():
    """The library's arithmetic is the built-in's: the kernels agree bit for bit. Its runs
    go through the core's engine, which calls that one compiled copy of the model; the
    built-in's engine inlines a copy of its own, where the compiler may fuse one of the
    toy's sums of two products the other way: the runs agree to rounding before EoS (and
    bit for bit where no such sum is fused differently: BN linear regression above)."""
    loaded = ps.load_model(BUILTIN / "toy3d.hpp", c=10.0)
    builtin = ps.Toy3D(c=10.0)
    w0, v = builtin.random_point(batch=9, seed=1), builtin.random_point(batch=9, seed=4)
    for a, b in zip(builtin.loss_and_grad(w0), loaded.loss_and_grad(w0)):
        assert np.array_equal(a, b)
    assert np.array_equal(builtin.hvp(w0, v), loaded.hvp(w0, v))
    assert np.array_equal(builtin.third(w0, v), loaded.third(w0, v))
    a = ps.run_gd_wd(builtin, w0, 0.3, 1e-2, 20, sharpness_every=5, top_k=2)
    b = ps.run_gd_wd(loaded, w0, 0.3, 1e-2, 20, sharpness_every=5, top_k=2)
    np.testing.assert_allclose(b.w, a.w, rtol=0, atol=1e-13)
    np.testing.assert_allclose(b.sharpness, a.sharpness, rtol=1e-12)
    # the two top eigenvalues: the scalar Lanczos, on the library's block HVP
    top = np.abs(a.top_eigenvalues).max()
    np.testing.assert_allclose(b.top_eigenvalues, a.top_eigenvalues, rtol=0, atol=1e-12 * top)


def test_a_header_may_use_erf_erfc_and_atan2(tmp_path):
    """model.hpp exports the special functions from_jax translates to: a hand-written header
    calls them unqualified, outside namespace pysharp, on every type the engine uses."""
    header = tmp_path / "special.hpp"
    header.write_text(textwrap.dedent("""\
        #include "pysharp/model.hpp"
        template <class Real>
        struct Special {
          Real c;
          int dim() const { return 2; }
          int work_size() const { return 0; }
          template <class S>
          mask_t<S> loss_grad(const S* w, S* loss, S* g, S*) const {
            const S r2 = w[0] * w[0] + w[1] * w[1];
            const Real k = Real(1.1283791670955126);  // 2 / sqrt(pi)
            *loss = c * erf_(w[0]) + atan2_(w[1], w[0]) + erfc_(w[1]);
            g[0] = c * k * exp_(-w[0] * w[0]) - w[1] / r2;
            g[1] = w[0] / r2 - k * exp_(-w[1] * w[1]);
            return value_of(r2) > Real(0);
          }
        };
        PYSHARP_MODEL(Special, PYSHARP_SCALAR(c))
        """))
    model = ps.load_model(header, c=0.5)
    from scipy.special import erf, erfc
    w = np.random.default_rng(0).standard_normal((5, 2))
    loss, g = model.loss_and_grad(w)
    np.testing.assert_allclose(loss, 0.5 * erf(w[:, 0]) + np.arctan2(w[:, 1], w[:, 0])
                               + erfc(w[:, 1]), rtol=1e-14, atol=1e-15)
    v, h = np.random.default_rng(1).standard_normal((5, 2)), 1e-6
    fd = (model.grad(w + h * v) - model.grad(w - h * v)) / (2 * h)
    np.testing.assert_allclose(model.hvp(w, v), fd, rtol=1e-7, atol=1e-8)


# -- data validation --------------------------------------------------------------------------

@pytest.mark.parametrize("data, message", [
    ({"y": np.ones(30), "c": 1.0}, "missing X"),
    ({"X": np.ones((30, 8)), "y": np.ones(30), "c": 1.0, "z": 1}, "unknown z"),
    ({"X": np.ones(30), "y": np.ones(30), "c": 1.0}, r"X must have 2 axes \(n, d\)"),
    ({"X": np.ones((30, 8)), "y": np.ones(29), "c": 1.0}, r"y: axis 0 \(n\) has length 29, "
                                                           r"but n = 30 from X"),
    ({"X": np.ones((30, 8)) * 1j, "y": np.ones(30), "c": 1.0}, "X must be a real array"),
    ({"X": np.ones((30, 8)), "y": np.ones(30), "c": "big"}, "c must be a finite real"),
    ({"X": np.where(np.arange(240).reshape(30, 8) >= 26, np.nan, 1.0), "y": np.ones(30),
      "c": 1.0}, r"^X has a non-finite entry at index \(3, 2\)$"),
    ({"X": np.ones((30, 8)), "y": np.ones(30), "c": np.inf}, "c must be a finite real"),
])
def test_bad_data_is_refused_naming_the_field(phase, data, message):
    with pytest.raises(ValueError, match=message):
        ps.load_model(PHASE, **data)


def test_float32_data_of_a_float64_model_is_warned_not_taken_silently(phase):
    """float32 data would make a float64 model compute with data rounded to float32: a
    warning naming the field and the ways out; none where the user chose float32, or
    converted the data to float64 themselves."""
    _, X, y = phase
    X32 = X.astype(np.float32)
    with pytest.warns(UserWarning, match=r"^(X|c) is float32 data for a float64 model") as caught:
        model = ps.load_model(PHASE, X=X32, y=y, c=np.float32(1.5))
    assert {str(w.message).split(" ")[0] for w in caught} == {"X", "c"}
    assert {w.filename for w in caught} == {__file__}  # the user's line
    w = np.random.default_rng(3).standard_normal(X.shape[1])
    assert model.loss(w) == pytest.approx(phase_loss(w, X32.astype(np.float64), y, 1.5),
                                          rel=1e-13)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ps.load_model(PHASE, X=X32.astype(np.float64), y=y, c=1.5)
        ps.load_model(PHASE, X=X32, y=y, c=1.5, dtype="float32")


def test_a_header_without_a_declaration_is_refused(tmp_path):
    path = write(tmp_path, "none.hpp", "#include <pysharp/model.hpp>\n")
    with pytest.raises(ValueError, match="exactly one PYSHARP_MODEL"):
        ps.load_model(path)
    with pytest.raises(FileNotFoundError):
        ps.load_model(tmp_path / "absent.hpp")


# -- compile errors a user can act on ---------------------------------------------------------

def line_of(path: Path, needle: str) -> int:
    """The number of the first line of ``path`` that holds ``needle``."""
    return 1 + next(k for k, s in enumerate(path.read_text().splitlines()) if needle in s)


def test_a_compile_error_shows_the_users_first_error_first(tmp_path, monkeypatch):
    """The compiler's first words are about the user's line (not pysharp's -Wextra warnings
    nor the instantiation chain through the engine), once rather than once per S, with the
    compiler's own suggestion as a hint; nothing of pysharp's headers warns."""
    # a cache of its own: the session's is shared with other workers' compiles in flight
    monkeypatch.setenv("PYSHARP_CACHE_DIR", str(tmp_path / "cache"))
    path = write(tmp_path, "typo.hpp", TRIVIAL.format(extra="const S t = sqr_(r2); (void)t;"))
    with pytest.raises(ModelCompileError) as info:
        ps.load_model(path, c=1.0)
    text = str(info.value)
    lines = text.splitlines()
    assert lines[0] == f"compiling {path} (Cosine, float64) failed:"
    assert re.match(rf"{re.escape(str(path))}:{line_of(path, 'sqr_')}:\d+: error: .sqr_. was "
                    r"not declared in this scope; did you mean .sqrt_.\?", lines[1]), text
    assert "hint: `sqr_` is not declared; the compiler suggests `sqrt_`." in lines
    assert "warning:" not in text and "used but never defined" not in text
    assert len(re.findall(r"error: .sqr_. was not declared", text)) == 2  # first, and in full
    assert len(lines) < 40
    cache = _compiler.cache_dir()  # nothing half-written: no scratch folder, no temp file
    # (the jax/ folder holds from_jax's generated headers, not compile scratch)
    assert [p for p in cache.iterdir()
            if (p.is_dir() and p.name != "jax") or p.suffix == ".tmp"] == []


def test_the_common_mistakes_on_s_get_the_tutorials_hint(tmp_path):
    """std:: math on S, `if` on a comparison of S and `&&` of masks: each error gets the
    hint that names what to write instead, and the first of them comes first."""
    path = write(tmp_path, "mistakes.hpp", TRIVIAL.format(extra="""
        const S e = std::exp(r2);
        if (r2 > Real(1)) g[0] = g[0] + e - e;
        const mask_t<S> both = r2 > Real(0) && w[0] > Real(0);
        (void)both;"""))
    with pytest.raises(ModelCompileError) as info:
        ps.load_model(path, c=1.0)
    text = str(info.value)
    lines = text.splitlines()
    assert re.match(rf"{re.escape(str(path))}:{line_of(path, 'std::exp')}:\d+: error: ",
                    lines[1]), text
    hints = [s for s in lines if s.startswith("hint: ")]
    assert any("write `exp_(x)`" in h for h in hints), hints
    assert any("`if`" in h and "select(mask, a, b)" in h for h in hints), hints
    assert any("`&`, `|` and `!`, not `&&` and `||`" in h for h in hints), hints
    assert "warning:" not in text


def test_a_missing_member_is_named_by_a_static_assert(tmp_path):
    path = write(tmp_path, "nodim.hpp", """\
        #include <pysharp/model.hpp>
        template <class Real>
        struct NoDim {
          Real c;
          PYSHARP_HD int work_size() const { return 0; }
        };
        PYSHARP_MODEL(NoDim, PYSHARP_SCALAR(c))
    """)
    with pytest.raises(ModelCompileError, match=r"missing member `PYSHARP_HD int dim\(\) const`"):
        ps.load_model(path, c=1.0)


def test_no_compiler_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    path = write(tmp_path, "cos.hpp", TRIVIAL.format(extra=""))
    with pytest.raises(ModelCompileError, match="apt-get install g\\+\\+.*built-in models work"):
        ps.load_model(path, c=1.0)


LOGGED = """\
    #include <cstdio>
    #include <cstdlib>
    #include <pysharp/model.hpp>
    struct Logged {   // appends a line to $PYSHARP_TEST_DESTROYED when destroyed
      ~Logged() {
        if (const char* path = std::getenv("PYSHARP_TEST_DESTROYED"))
          if (std::FILE* f = std::fopen(path, "a")) {
            std::fputs("destroyed\\n", f);
            std::fclose(f);
          }
      }
    };
    template <class Real>
    struct LoggedCosine {   // L = c (1 - w_0 / ||w||), with a member that has a destructor
      Real c;
      Logged logged;
      PYSHARP_HD int dim() const { return 3; }
      PYSHARP_HD int work_size() const { return 0; }
      template <class S>
      PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S*) const {
        const S r2 = w[0] * w[0] + w[1] * w[1] + w[2] * w[2];
        const S inv = Real(1) / sqrt_(r2);
        *loss = c * (Real(1) - w[0] * inv);
        for (int j = 0; j < 3; ++j) g[j] = c * w[0] * w[j] * inv * inv * inv;
        g[0] = g[0] - c * inv;
        return value_of(r2) > Real(0);
      }
    };
    PYSHARP_MODEL(LoggedCosine, PYSHARP_SCALAR(c))
"""


def test_a_loaded_struct_is_destroyed_when_its_model_is_freed(tmp_path, monkeypatch):
    """The library builds the struct and _core frees it: the struct's destructor must run
    then (a member that owns memory or a file would leak otherwise), and not before."""
    import gc

    log = tmp_path / "destroyed.log"
    monkeypatch.setenv("PYSHARP_TEST_DESTROYED", str(log))
    model = ps.load_model(write(tmp_path, "logged.hpp", LOGGED), c=2.0)
    w = np.array([0.3, -1.0, 2.0])
    np.testing.assert_allclose(model.loss(w), 2.0 * (1 - w[0] / np.linalg.norm(w)), rtol=1e-15)
    before = log.read_text().count("destroyed") if log.exists() else 0  # copies' lines
    del model
    gc.collect()
    assert log.read_text().count("destroyed") > before


def _stream(module: str, tty: bool):
    """A stand-in for sys.stderr: a StringIO whose class says it comes from ``module``."""
    cls = type("Stream", (io.StringIO,), {"__module__": module, "isatty": lambda self: tty})
    return cls()


@pytest.mark.parametrize(("where", "module", "tty", "shown"), [
    ("a terminal", "io", True, True),
    ("a Jupyter cell", "ipykernel.iostream", False, True),
    ("a log file or captured output", "io", False, False),
])
def test_compile_progress_shows_where_a_person_watches(monkeypatch, where, module, tty, shown):
    err = _stream(module, tty)
    monkeypatch.setattr(sys, "stderr", err)
    _compiler._say("pysharp: compiling m.hpp")
    assert (err.getvalue() == "pysharp: compiling m.hpp\n") is shown, where


# -- the cache ----------------------------------------------------------------------------------

@pytest.mark.slow  # two compiles of a header (27 s): run by CI's slow step
def test_a_cache_hit_compiles_nothing_and_an_edit_recompiles(tmp_path, monkeypatch):
    path = write(tmp_path, "cos.hpp", TRIVIAL.format(extra=""))
    first = ps.load_model(path, c=2.0)
    w = np.array([0.3, -1.0, 2.0])
    expected = 2.0 * (1 - w[0] / np.linalg.norm(w))
    np.testing.assert_allclose(first.loss(w), expected, rtol=1e-15)

    calls = []
    real_build = _compiler._build
    monkeypatch.setattr(_compiler, "_build", lambda *a: calls.append(a) or real_build(*a))
    again = ps.load_model(path, c=2.0)                 # same source: a hit
    assert calls == [] and again.loss(w) == first.loss(w)
    path.write_text(path.read_text().replace("*loss = c *", "*loss = Real(2) * c *"))
    edited = ps.load_model(path, c=2.0)                # new source: a new key, a compile
    assert len(calls) == 1
    np.testing.assert_allclose(edited.loss(w), 2 * expected, rtol=1e-15)


def test_a_cache_others_can_write_to_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    (shared / "models").mkdir(parents=True)
    (shared / "models").chmod(0o777)
    monkeypatch.setenv("PYSHARP_CACHE_DIR", str(shared))
    with pytest.raises(PermissionError, match="others can write"):
        _compiler.cache_dir()


def test_a_new_cache_folder_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("PYSHARP_CACHE_DIR", str(tmp_path / "fresh"))
    path = _compiler.cache_dir()
    assert path.stat().st_mode & 0o777 == 0o700


def test_two_processes_compile_the_same_model_once(tmp_path):
    """A process pool's workers load the same new model at once: one compiles, both run."""
    header = write(tmp_path, "cos.hpp", TRIVIAL.format(extra=""))
    cache = tmp_path / "cache"
    script = (f"import pysharp as ps, numpy as np\n"
              f"m = ps.load_model({str(header)!r}, c=3.0)\n"
              f"print(repr(float(m.loss(np.array([1.0, 2.0, 2.0])))))\n")
    env = {**os.environ, "PYSHARP_CACHE_DIR": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path)  # not the repo
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    assert {o[0].strip() for o in outs} == {repr(3.0 * (1 - 1 / 3))}
    modules = list((cache / "models").glob("_pysharp_model_*.so"))
    assert len(modules) == 1
    leftovers = [p for p in (cache / "models").iterdir() if p.is_dir() or p.suffix == ".tmp"]
    assert leftovers == []


def test_layernorm_example_matches_its_reference():
    sys.path.insert(0, str(ROOT / "examples" / "models"))
    try:
        import layernorm_net as ref
    finally:
        sys.path.pop(0)
    rng = np.random.default_rng(0)
    n, d, m = 16, 5, 6
    X, y, a = rng.standard_normal((n, d)), rng.standard_normal(n), rng.standard_normal(m)
    model = ps.load_model(ROOT / "examples" / "models" / "layernorm_net.hpp", X=X, y=y, a=a)
    assert model.dim == m * d
    W = model.random_point(batch=3, seed=1)
    loss, G = model.loss_and_grad(W)
    np.testing.assert_allclose(loss, [ref.loss(w, X, y, a) for w in W], rtol=1e-13)
    h = 1e-6
    fd = np.array([(ref.loss(W[0] + h * e, X, y, a) - ref.loss(W[0] - h * e, X, y, a)) / (2 * h)
                   for e in np.eye(model.dim)])
    np.testing.assert_allclose(G[0], fd, atol=1e-8 * np.abs(fd).max())
    np.testing.assert_allclose(model.hvp(W, W), -G, atol=1e-12 * np.abs(G).max())
    np.testing.assert_allclose(model.loss(2.5 * W), loss, rtol=1e-13)


# -- sweeps and the command line -----------------------------------------------------------

def test_a_sweep_of_a_loaded_model_is_bit_equal_to_lone_runs(phase):
    pytest.importorskip("xarray")
    model, _, _ = phase
    grid = {"lr": [0.2, 0.6], "wd": [1e-3], "seeds": [0, 1], "init_norm": 3.0}
    run = {"steps": 600, "sharpness_every": 50}
    ds = ps.sweep(model, **grid, **run, chunk_size=3)
    for i, lr in enumerate(grid["lr"]):
        for seed in range(2):
            lone = ps.sweep(model, lr=[lr], wd=[1e-3], seeds=[seed], init_norm=3.0, **run)
            got = ds.isel(lr=i, wd=0, seed=seed, init_norm=0)
            assert np.array_equal(got.loss.values, lone.loss.values[0, 0, 0, 0]), (lr, seed)


def test_a_sweep_spec_names_the_header_and_its_data(phase):
    pytest.importorskip("xarray")
    model, X, y = phase
    spec = {"name": "loaded", "header": str(PHASE), "fields": {"X": X, "y": y, "c": 1.5}}
    a = ps.sweep(spec, lr=[0.5], wd=[1e-3], seeds=[1], steps=300, sharpness_every=50)
    b = ps.sweep(model, lr=[0.5], wd=[1e-3], seeds=[1], steps=300, sharpness_every=50)
    assert np.array_equal(a.loss.values, b.loss.values)
    from pysharp.sweeps._plot import settings_text
    title = settings_text(a)  # a figure's title: the struct, its file, the data by shape
    assert title.startswith("PhaseRetrieval (phase_retrieval.hpp: c=1.5, X 30x8, y 30), "
                            "gd_wd; grid: lr 0.5"), title
    assert "sha256" not in title and "_pysharp_model_" not in title


@pytest.mark.slow
def test_dask_workers_rebuild_a_loaded_model_from_its_spec(phase):
    distributed = pytest.importorskip("distributed")
    model, _, _ = phase
    run = {"lr": [0.2, 0.5], "wd": [1e-3], "seeds": [0, 1], "steps": 300, "sharpness_every": 50}
    local = ps.sweep(model, **run, chunk_size=2)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        remote = ps.sweep(model, **run, chunk_size=2, executor=client.get_executor())
    assert np.array_equal(local.loss.values, remote.loss.values)


def test_pysharp_run_and_sweep_take_a_model_header(tmp_path):
    pytest.importorskip("xarray")
    X, y = phase_data()
    np.savez(tmp_path / "phase.npz", X=X, y=y)
    env = {**os.environ, "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "pysharp"]
    done = subprocess.run(cmd + ["run", str(PHASE), "--data", "phase.npz", "--param", "c=1.5",
                                 "--lr", "0.5", "--wd", "1e-3", "--steps", "400",
                                 "--sharpness-every", "50", "--init-norm", "3"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    import json
    summary = json.loads((tmp_path / "pysharp-run" / "run.json").read_text())
    assert summary["model"] == "loaded" and summary["model_parameters"]["scalars"] == {"c": 1.5}
    model = ps.load_model(PHASE, X=X, y=y, c=1.5)
    lone = ps.sweep(model, lr=[0.5], wd=[1e-3], seeds=[0], init_norm=3.0, steps=400,
                    sharpness_every=50)
    assert summary["trajectories"][0]["final_loss"] == float(lone.final_loss.values.ravel()[0])

    (tmp_path / "phase.toml").write_text(
        f'[model]\nheader = "{PHASE}"\ndata = "phase.npz"\nc = 1.5\n\n'
        '[grid]\nlr = [0.2, 0.5]\nwd = [1e-3]\n\n[run]\nsteps = 300\nsharpness_every = 50\n')
    done = subprocess.run(cmd + ["sweep", "phase.toml", "--no-progress"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2 trajectories" in done.stdout
    bad = subprocess.run(cmd + ["run", str(PHASE), "--data", "phase.npz", "--param", "c=big"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--param c must be a number" in bad.stderr


def test_loading_leaves_the_callers_arrays_writable(phase):
    X, y = phase_data()
    model = ps.load_model(PHASE, X=X, y=y, c=1.5)
    assert X.flags.writeable and y.flags.writeable
    before = X[0, 0]
    X[0, 0] = before + 1.0             # the model keeps its own copy
    assert model.fields["X"][0, 0] == before


def test_the_bn_two_layer_net_header_keeps_its_groups_and_bits():
    """An optional member (n_groups) works through the door: per-row norms are recorded."""
    builtin = ps.BNTwoLayerNet.synthetic(n=8, d=4, width=3, teacher_width=3, seed=0)
    Xc = builtin._Xc
    loaded = ps.load_model(BUILTIN / "bn_two_layer_net.hpp", Xc=Xc, y=builtin.y,
                           xc_fro2=float(np.sum(Xc * Xc)), inv_sqrt_m=1 / np.sqrt(3), m=3,
                           act=0)
    assert loaded.dim == builtin.dim == 12
    w0 = builtin.random_point(batch=4, seed=2, norm=3.0)
    a = ps.run_gd_wd(builtin, w0, 0.2, 1e-3, 500, sharpness_every=50)
    b = ps.run_gd_wd(loaded, w0, 0.2, 1e-3, 500, sharpness_every=50)
    assert b.group_norm2 is not None and b.group_norm2.shape[-1] == 3
    assert np.array_equal(a.group_norm2, b.group_norm2) and np.array_equal(a.w, b.w)

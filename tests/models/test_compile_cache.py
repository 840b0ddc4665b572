"""The compile cache of loaded models (pysharp/models/_compiler.py): what it tracks,
verifies, refuses and cleans.

One model is compiled, under umask 000, into a pristine cache; each test works on a copy
of it. Oracles: the model's closed-form loss, k c (1 - w_0 / ||w||) with k read from two
included headers; the modes and owners a private cache must have; and a fresh interpreter
that must survive loading a tampered cache (subprocesses, so a crash is a failed test
rather than a dead test run).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import pysharp as ps
from pysharp.models import _compiler

pytestmark = pytest.mark.skipif(
    ps.build_info().get("available") is not True, reason="needs the compiled core")

HEADER = """\
#include <pysharp/model.hpp>
#include <cosine_scale.hpp>            // from include_dirs, with angle brackets
#define COSINE_PART "cosine_part.hpp"
#include COSINE_PART                   // through a macro
template <class Real>
struct Cosine {   // L = k c (1 - w_0 / ||w||), k = COSINE_SCALE * COSINE_FACTOR
  Real c;
  PYSHARP_HD int dim() const { return 3; }
  PYSHARP_HD int work_size() const { return 0; }
  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S*) const {
    const Real k = Real(COSINE_SCALE) * Real(COSINE_FACTOR);
    const S r2 = w[0] * w[0] + w[1] * w[1] + w[2] * w[2];
    const S inv = Real(1) / sqrt_(r2);
    *loss = k * c * (Real(1) - w[0] * inv);
    for (int j = 0; j < 3; ++j) g[j] = k * c * w[0] * w[j] * inv * inv * inv;
    g[0] = g[0] - k * c * inv;
    return value_of(r2) > Real(0);
  }
};
PYSHARP_MODEL(Cosine, PYSHARP_SCALAR(c))
"""
SCALE = "#define COSINE_SCALE 1.0\n"
FACTOR = "#define COSINE_FACTOR 1.0\n"
W = np.array([0.3, -1.0, 2.0])
C = 2.0


def expected(k: float) -> float:
    return k * C * (1 - W[0] / np.linalg.norm(W))


@dataclasses.dataclass(frozen=True)
class Pristine:
    header: Path       # src/cosine.hpp, beside src/cosine_part.hpp
    inc: Path          # inc/cosine_scale.hpp
    cache: Path        # PYSHARP_CACHE_DIR with the compiled model in models/


def load_script(pristine: Pristine, header: Path | None = None) -> str:
    """Python source that loads the model (or ``header``) and prints its loss at W."""
    return (f"import numpy as np, pysharp as ps\n"
            f"m = ps.load_model({str(header or pristine.header)!r}, "
            f"include_dirs=[{str(pristine.inc)!r}], c={C!r})\n"
            f"print(repr(float(m.loss(np.array({W.tolist()!r})))))\n")


def run_python(source: str, cache: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    """``source`` run by a fresh interpreter with ``cache`` as its compile cache, in the
    cache's folder (not the source tree, whose pysharp has no compiled core)."""
    env = {**os.environ, "PYSHARP_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-c", source, *args], env=env, capture_output=True,
                          text=True, timeout=300, cwd=cache.parent, **kw)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Pristine:
    root = tmp_path_factory.mktemp("compile-cache")
    (root / "src").mkdir()
    (root / "inc").mkdir()
    header = root / "src" / "cosine.hpp"
    header.write_text(HEADER)
    (root / "src" / "cosine_part.hpp").write_text(FACTOR)
    (root / "inc" / "cosine_scale.hpp").write_text(SCALE)
    made = Pristine(header, root / "inc", root / "cache")
    # umask= (not a preexec_fn, which would run the at-fork hooks JAX warns from)
    done = run_python(load_script(made), made.cache, umask=0)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) == pytest.approx(expected(1.0), rel=1e-14)
    return made


def copy_of(pristine: Pristine, tmp_path: Path) -> Path:
    """A copy of the pristine cache (modes kept), for a test to edit."""
    return Path(shutil.copytree(pristine.cache, tmp_path / "cache"))


def module_in(cache: Path) -> Path:
    """The model's compiled library in the cache."""
    (so,) = (cache / "models").glob("_pysharp_model_*.so")
    return so


# -- what it tracks ---------------------------------------------------------------------------

def test_an_edit_of_an_angle_bracket_or_macro_include_recompiles(pristine, tmp_path,
                                                                    monkeypatch):
    """The dependency list is the compiler's own (-MMD), not a scan for #include "...":
    a header found with <...> in include_dirs, or named by a macro, is tracked too. (One
    real compile; the other edit is seen to miss by a build that refuses to run.)"""
    monkeypatch.setenv("PYSHARP_CACHE_DIR", str(copy_of(pristine, tmp_path)))
    calls = []
    real_build = _compiler._build

    class Miss(Exception):
        pass

    def build(*args):
        calls.append(args)
        if len(calls) == 1:
            raise Miss
        return real_build(*args)
    monkeypatch.setattr(_compiler, "_build", build)
    scale, factor = pristine.inc / "cosine_scale.hpp", pristine.header.parent / "cosine_part.hpp"

    def loss():
        return float(ps.load_model(pristine.header, include_dirs=[pristine.inc], c=C).loss(W))
    try:
        assert loss() == pytest.approx(expected(1.0), rel=1e-14) and calls == []  # a hit
        factor.write_text(FACTOR.replace("1.0", "3.0"))     # included through a macro
        with pytest.raises(Miss):
            loss()
        factor.write_text(FACTOR)                           # back as it was: a hit again
        assert loss() == pytest.approx(expected(1.0), rel=1e-14) and len(calls) == 1
        scale.write_text(SCALE.replace("1.0", "2.0"))       # <...> from include_dirs
        assert loss() == pytest.approx(expected(2.0), rel=1e-14) and len(calls) == 2
        assert loss() == pytest.approx(expected(2.0), rel=1e-14) and len(calls) == 2
    finally:
        scale.write_text(SCALE)
        factor.write_text(FACTOR)


# -- what it verifies -------------------------------------------------------------------------

def test_a_cache_written_under_umask_000_is_private(pristine):
    """Files 0600 and folders 0700, whatever the umask of the process that wrote them."""
    paths = [pristine.cache, *pristine.cache.rglob("*")]
    assert module_in(pristine.cache) in paths
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in paths}
    assert modes == {p.name: "0o700" if p.is_dir() else "0o600" for p in paths}


EVIL = """\
#include <cstdio>
// runs when the library is opened, before any of its functions is called
__attribute__((constructor)) static void evil() {
  if (std::FILE* f = std::fopen("%(marker)s", "w")) std::fclose(f);
}
extern "C" const void* pysharp_loaded_table() { return nullptr; }
"""

TAMPER = """\
import sys
from pathlib import Path
import numpy as np, pysharp as ps
from pysharp.models import _compiler

class Rebuild(Exception):
    pass

def no_build(*args, **kwargs):
    raise Rebuild

so, evil = Path(sys.argv[1]), Path(sys.argv[2]).read_bytes()
good = so.read_bytes()
cases = {"another valid library": evil, "truncated": good[:len(good) // 2]}
for i in range(16):
    at = (2 * i + 1) * len(good) // 32
    cases[f"byte {at} flipped"] = good[:at] + bytes([good[at] ^ 0xFF]) + good[at + 1:]
real_build, _compiler._build = _compiler._build, no_build
for case, data in cases.items():
    so.write_bytes(data)
    try:
        ps.load_model(%(header)r, include_dirs=[%(inc)r], c=%(c)r)
        print(case, "loaded")
    except Rebuild:
        print(case, "rebuilt")
    except Exception as exc:
        print(case, type(exc).__name__, exc)
so.write_bytes(good[:len(good) // 3])  # then one real rebuild
_compiler._build = real_build
model = ps.load_model(%(header)r, include_dirs=[%(inc)r], c=%(c)r)
print(repr(float(model.loss(np.array(%(w)r)))))
"""


def test_a_tampered_module_is_rebuilt_never_loaded(pristine, tmp_path):
    """Replaced by another valid library with the right export (whose constructor would run
    when it is opened), truncated, or one byte flipped: the cache sees the library's
    SHA-256 differ from the one it recorded, so it compiles again rather than running (or
    crashing on) what it found."""
    cache = copy_of(pristine, tmp_path)
    so = module_in(cache)
    marker = tmp_path / "evil-ran"
    (tmp_path / "evil.cpp").write_text(EVIL % {"marker": marker})
    evil = tmp_path / "evil.so"
    subprocess.run([_compiler.compiler(), "-shared", "-fPIC", str(tmp_path / "evil.cpp"),
                    "-o", str(evil)], check=True)
    script = TAMPER % {"header": str(pristine.header), "inc": str(pristine.inc), "c": C,
                       "w": W.tolist()}
    done = run_python(script, cache, str(so), str(evil))
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-3000:])
    *verdicts, last = done.stdout.strip().splitlines()
    assert len(verdicts) == 18 and all(v.endswith(" rebuilt") for v in verdicts), verdicts
    assert not marker.exists()                  # the other module's code never ran
    assert float(last) == pytest.approx(expected(1.0), rel=1e-14)


# -- what it refuses --------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["module", "record", "folder"])
@pytest.mark.parametrize("how", ["others can write it", "another user owns it"])
def test_a_cache_another_user_could_have_written_is_refused(pristine, tmp_path, monkeypatch,
                                                            what, how):
    """Loading a module runs its code: a module, its record (which holds the module's hash)
    or the cache folder that another user owns or can write to is refused, by name."""
    cache = copy_of(pristine, tmp_path)
    monkeypatch.setenv("PYSHARP_CACHE_DIR", str(cache))
    so = module_in(cache)
    path = {"module": so, "record": so.with_suffix(".json"), "folder": so.parent}[what]
    assert path.exists()
    if how == "others can write it":
        path.chmod(path.stat().st_mode | 0o002)
    elif os.geteuid() == 0:
        os.chown(path, 65534, 65534)
    else:
        pytest.skip("giving a file to another user needs root")
    with pytest.raises(PermissionError, match=re.escape(str(path)) + " belongs to another "
                                              "user or others can write to it"):
        ps.load_model(pristine.header, include_dirs=[pristine.inc], c=C)


def _read_only(how: str, cache: Path, argv: list[str]) -> list[str]:
    """``argv`` run with ``cache`` read-only: made so by a private read-only bind mount (in
    a user and mount namespace of its own), or by chmod 0500 where the user is not root."""
    if how == "chmod 0500":
        if os.geteuid() == 0:
            pytest.skip("root writes to a 0500 folder; the read-only mount covers root")
        for folder in (cache, cache / "models"):
            folder.chmod(0o500)
        return argv
    wrap = ["unshare", "-rm", "sh", "-c",
            'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"',
            str(cache)]
    if shutil.which("unshare") is None or subprocess.run(
            [*wrap, "true"], capture_output=True).returncode != 0:
        pytest.skip("no unprivileged read-only bind mount here (unshare -rm)")
    return [*wrap, *argv]


READ_ONLY = """\
import os, sys
import numpy as np, pysharp as ps
old, new, inc = sys.argv[1:4]
m = ps.load_model(old, include_dirs=[inc], c=%(c)r)        # a hit needs no write
print(repr(float(m.loss(np.array(%(w)r)))))
for header in (new, old):
    try:
        ps.load_model(header, include_dirs=[inc], c=%(c)r)
    except PermissionError as exc:
        print(exc)
    os.environ["PYSHARP_CACHE_DIR"] = os.path.join(os.environ["PYSHARP_CACHE_DIR"], "sub")
"""


@pytest.mark.parametrize("how", ["read-only mount", "chmod 0500"])
def test_a_read_only_cache_says_where_it_is_and_how_to_move_it(pristine, tmp_path, how):
    cache = copy_of(pristine, tmp_path)
    new = tmp_path / "new.hpp"
    new.write_text(HEADER.replace("k * c * (Real(1)", "Real(2) * k * c * (Real(1)"))
    argv = _read_only(how, cache, [sys.executable, "-c", READ_ONLY % {"c": C, "w": W.tolist()},
                                   str(pristine.header), str(new), str(pristine.inc)])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env={**os.environ, "PYSHARP_CACHE_DIR": str(cache)})
    finally:
        for folder in (cache, cache / "models"):
            folder.chmod(0o700)
    assert done.returncode == 0, done.stderr[-3000:]
    loss, *errors = done.stdout.strip().splitlines()
    assert float(loss) == pytest.approx(expected(1.0), rel=1e-14)
    assert len(errors) == 2, errors            # a new model, then a cache folder to create
    for error, folder in zip(errors, (cache / "models", cache / "sub")):
        assert f"the model cache {folder} " in error and "PYSHARP_CACHE_DIR" in error, error
        assert "Errno" not in error, error


# -- what it cleans ---------------------------------------------------------------------------

def test_a_killed_compiles_scratch_folder_is_removed_when_the_cache_is_next_used(
        pristine, tmp_path, monkeypatch):
    cache = copy_of(pristine, tmp_path)
    models = cache / "models"
    new = tmp_path / "new.hpp"
    new.write_text(HEADER.replace("k * c * (Real(1)", "Real(3) * k * c * (Real(1)"))
    before = set(models.iterdir())
    proc = subprocess.Popen([sys.executable, "-c", load_script(pristine, new)], cwd=tmp_path,
                            env={**os.environ, "PYSHARP_CACHE_DIR": str(cache)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not any(p.is_dir() for p in set(models.iterdir()) - before):
        assert proc.poll() is None and time.monotonic() < deadline, "no scratch folder seen"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)        # the compile and its compiler, mid-compile
    proc.wait()
    (killed,) = [p for p in set(models.iterdir()) - before if p.is_dir()]
    ancient = models / "_pysharp_model_0123456789abcdef01234567.x1y2z3"  # a crash long ago
    ancient.mkdir()
    (ancient / "unit.cpp").write_text("")
    os.utime(ancient, (time.time() - 7200,) * 2)
    live = Path(_compiler._scratch_folder(models, "_pysharp_model_live"))  # this process's

    monkeypatch.setenv("PYSHARP_CACHE_DIR", str(cache))
    model = ps.load_model(pristine.header, include_dirs=[pristine.inc], c=C)   # a hit
    assert float(model.loss(W)) == pytest.approx(expected(1.0), rel=1e-14)
    assert not killed.exists() and not ancient.exists()
    assert live.is_dir()                       # a compile still running keeps its folder

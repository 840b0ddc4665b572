"""Run-time compilation of a model header into an extension module, once per user.

A loaded model (:func:`pysharp.models.load_model`) is a C++ header compiled
against the headers shipped inside the package (:func:`include_dir`) with the
compiler and flags that built ``pysharp._core`` (recorded by the build in
``_build_flags.json``; ``pysharp info`` shows them), so its arithmetic is the
core's own. The module is cached per user:

- the key hashes the header and every file it includes with quotes, pysharp's
  headers, pysharp's version, the compiler (path, size, mtime), the flags, the
  model name, the dtype and the Python ABI; a cached module is loaded only
  when the key recorded beside it equals the one computed now;
- the cache folder (``PYSHARP_CACHE_DIR``, else ``$XDG_CACHE_HOME/pysharp``
  or ``~/.cache/pysharp``) is created 0700 and refused when another user can
  write to it, since loading a module runs its code;
- two processes compiling the same model at once (a process pool, Dask
  workers) take a file lock: one compiles, the other loads its result;
- a failed or interrupted compile leaves nothing behind but the lock file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from .._engine import loader
from .._version import __version__


class ModelCompileError(RuntimeError):
    """A model header could not be compiled or loaded; the message says why."""


_PACKAGE = Path(__file__).resolve().parent.parent
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_MODEL_RE = re.compile(r"^\s*PYSHARP_MODEL\(\s*([A-Za-z_]\w*)", re.MULTILINE)


def include_dir() -> Path:
    """The folder to put on a compiler's include path for ``#include <pysharp/model.hpp>``.

    Inside an installed wheel it is ``pysharp/include``; in a source checkout
    (an editable install), the repository's ``csrc/include``.
    """
    return _include_dirs()[0]


@lru_cache(maxsize=1)
def _include_dirs() -> tuple[Path, Path]:
    """(public headers, binding layer): installed in the package, else the source tree."""
    installed = _PACKAGE / "include"
    if (installed / "pysharp" / "model.hpp").is_file():
        return installed, installed / "_bind"
    source = _PACKAGE.parent / "csrc"
    if (source / "include" / "pysharp" / "model.hpp").is_file():
        return source / "include", source
    raise ModelCompileError(f"pysharp's C++ headers are missing (looked in {installed} and "
                            f"{source / 'include'}); reinstall pysharp with `pip install .`")


def model_names(header: Path) -> list[str]:
    """The names declared by ``PYSHARP_MODEL(Name, ...)`` lines in ``header``."""
    return _MODEL_RE.findall(header.read_text())


@lru_cache(maxsize=1)
def build_flags() -> dict:
    """How ``pysharp._core`` was compiled: {"compiler": path, "flags": [...]}.

    Read from ``_build_flags.json`` beside the compiled core; the include paths,
    the output and the source of the recorded command are dropped (load_model
    adds its own).
    """
    try:
        core_file = Path(loader.core().__file__)
    except ImportError as exc:
        raise ModelCompileError(f"loaded models need pysharp's compiled core: {exc}") from None
    record = core_file.parent / "_build_flags.json"
    if not record.is_file():
        raise ModelCompileError(f"{record} is missing: this build of pysharp did not record "
                                "its compile command; reinstall pysharp with `pip install .`")
    entry = json.loads(record.read_text())["core"]
    argv = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    flags, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg in ("-o", "-c", "-isystem", "-MF", "-MT", "-MQ"):
            skip = True
        elif arg.startswith(("-I", "-isystem")) or arg in ("-MD", "-MMD"):
            pass
        elif arg.endswith("_EXPORTS") and arg.startswith("-D") or arg.startswith(
                "-DPYSHARP_WITH_CUDA"):
            pass
        elif arg.startswith("-") or not arg.endswith((".cpp", ".cc", ".o")):
            flags.append(arg)
    return {"compiler": argv[0], "flags": flags}


def compiler() -> str:
    """The C++ compiler load_model runs: ``$CXX`` when set, else the core's own.

    Raises
    ------
    ModelCompileError
        Saying what to install when no compiler is found.
    """
    cxx = os.environ.get("CXX") or build_flags()["compiler"]
    found = shutil.which(cxx)
    if found is None:
        raise ModelCompileError(
            f"no C++ compiler: pysharp's core was built with {cxx!r}, which is not on this "
            "machine. Install a C++17 compiler (Debian/Ubuntu: `apt-get install g++`; "
            "Fedora: `dnf install gcc-c++`; conda: `conda install gxx`) or set CXX. "
            "The built-in models work without one.")
    return found


def cache_dir() -> Path:
    """The user's private folder of compiled models, created 0700 if absent.

    Raises
    ------
    PermissionError
        When the folder belongs to another user or others can write to it.
    """
    root = os.environ.get("PYSHARP_CACHE_DIR")
    if root:
        path = Path(root).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(base) / "pysharp"
    path = path / "models"
    for folder in (path.parent, path):
        if not folder.exists():
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.chmod(0o700)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(
            f"the model cache {path} belongs to another user or others can write to it; "
            "loading a module from it would run code they put there. Fix its owner and "
            "mode (chmod 700) or set PYSHARP_CACHE_DIR to a private folder.")
    return path


def _sources(header: Path, include_dirs: tuple[Path, ...]) -> list[Path]:
    """``header`` and every file it includes with quotes, recursively, outside
    pysharp's own headers (those are hashed whole)."""
    own = tuple(str(d.resolve()) for d in _include_dirs())
    seen: list[Path] = []
    todo = [header]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        for name in _INCLUDE_RE.findall(path.read_text(errors="replace")):
            for base in (path.parent, *include_dirs):
                target = (base / name).resolve()
                if target.is_file():
                    if not str(target).startswith(own):
                        todo.append(target)
                    break
    return seen


@lru_cache(maxsize=1)
def _headers_digest() -> str:
    """SHA-256 over every file of pysharp's include folders (names and contents)."""
    h = hashlib.sha256()
    for root in _include_dirs():
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.suffix in (".hpp", ".h", ".cuh", ".cmake"):
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def _key(header: Path, name: str, dtype: str, include_dirs: tuple[Path, ...],
         unit: _Unit) -> tuple[str, dict]:
    cxx = compiler()
    st = os.stat(cxx)
    sources = hashlib.sha256()
    for path in _sources(header, include_dirs):
        sources.update(str(path).encode())
        sources.update(path.read_bytes())
    material = {
        "pysharp": __version__, "headers": _headers_digest(), "sources": sources.hexdigest(),
        "compiler": [os.path.realpath(cxx), st.st_size, st.st_mtime_ns],
        "flags": build_flags()["flags"], "model": name, "dtype": dtype,
        "include_dirs": [str(d) for d in include_dirs],
        "abi": sysconfig.get_config_var("EXT_SUFFIX"), **unit.material,
    }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    return digest[:24], material


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _import(module_name: str, so: Path) -> ModuleType:
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[module_name] = module
    return module


def _cached(module_name: str, so: Path, meta: Path, material: dict) -> ModuleType | None:
    """The cached module when its recorded key matches ``material``, else None."""
    try:
        recorded = json.loads(meta.read_text())
    except (OSError, ValueError):
        return None
    if recorded != material or not so.is_file():
        return None
    return _import(module_name, so)


def _say(message: str) -> None:
    if sys.stderr is not None and sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class _Unit:
    """What a compiled module is made of besides the model: the line that instantiates
    it (``{module}``, ``{name}``, ``{real}`` filled in) after the header and ``include``,
    extra include folders, and what of them enters the cache key."""

    prefix: str
    include: str
    body: str
    include_dirs: tuple[Path, ...] = ()
    material: dict = dataclasses.field(default_factory=dict)


#: A model's own module: the kernels, engine, Lanczos, SLQ (bind_declared.hpp).
_MODEL_UNIT = _Unit("_pysharp_model_", "bind_declared.hpp",
                    "PYSHARP_LOADED_MODULE({module}, {name}, {real})")


def compile_model(header: Path, name: str, dtype: str,
                  include_dirs: tuple[Path, ...] = ()) -> ModuleType:
    """The extension module of model ``name`` of ``header`` for ``dtype``, from the cache
    or compiled now.

    Parameters
    ----------
    header : Path
        The model's header (absolute).
    name : str
        The struct template declared by its ``PYSHARP_MODEL``.
    dtype : {"float64", "float32"}
        The real type the module is instantiated on.
    include_dirs : tuple of Path
        Extra folders for the header's own includes.

    Raises
    ------
    ModelCompileError
        With the compiler's diagnostics (pointing at the header's lines) when
        the compile fails, or saying what is missing.
    """
    return _compile(header, name, dtype, include_dirs, _MODEL_UNIT)


def compile_jax_ffi(header: Path, name: str, dtype: str,
                    include_dirs: tuple[Path, ...] = ()) -> ModuleType:
    """The XLA FFI handlers of model ``name`` of ``header`` (``cpu/jax_ffi.hpp``): a module
    whose ``HANDLERS`` maps kernel names to PyCapsules for ``jax.ffi.register_ffi_target``.

    Compiled like :func:`compile_model`, against jaxlib's FFI headers as well
    (``jax.ffi.include_dir()``, jaxlib's version in the cache key).

    Raises
    ------
    ModelCompileError
        As :func:`compile_model`; ImportError without JAX.
    """
    import jax.ffi
    import jaxlib

    unit = _Unit("_pysharp_jax_", "cpu/jax_ffi.hpp",
                 "PYSHARP_JAX_FFI_MODULE({module}, {name}, {real})",
                 (Path(jax.ffi.include_dir()),), {"unit": "jax_ffi", "jaxlib": jaxlib.__version__})
    return _compile(header, name, dtype, include_dirs, unit)


def _compile(header: Path, name: str, dtype: str, include_dirs: tuple[Path, ...],
             unit: _Unit) -> ModuleType:
    key, material = _key(header, name, dtype, include_dirs, unit)
    module_name = f"{unit.prefix}{key}"
    cache = cache_dir()
    so = cache / (module_name + sysconfig.get_config_var("EXT_SUFFIX"))
    meta = cache / f"{module_name}.json"
    module = _cached(module_name, so, meta, material)
    if module is not None:
        return module
    with _locked(cache / f"{module_name}.lock"):
        module = _cached(module_name, so, meta, material)  # compiled by another process
        if module is not None:
            return module
        _build(header, name, dtype, include_dirs, unit, module_name, so, cache)
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".json.tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(material, fh, sort_keys=True)
        os.replace(tmp, meta)
    return _import(module_name, so)


def _build(header: Path, name: str, dtype: str, include_dirs: tuple[Path, ...], unit: _Unit,
           module_name: str, so: Path, cache: Path) -> None:
    """Compiles into a scratch folder of the cache and moves the module into place."""
    import pybind11

    real = {"float64": "double", "float32": "float"}[dtype]
    cxx = compiler()
    public, bind = _include_dirs()
    work = Path(tempfile.mkdtemp(prefix=f"{module_name}.", dir=cache))
    try:
        source = work / "unit.cpp"
        # The model is named as written in its header: at global scope, or in namespace
        # pysharp (the built-ins' headers).
        body = unit.body.format(module=module_name, name=name, real=real)
        source.write_text(f'#include "{header}"\n#include "{unit.include}"\n'
                          "namespace pysharp_unit {\nusing namespace ::pysharp;\n"
                          f"{body}\n}}\n")
        includes = [public, bind, *include_dirs, *unit.include_dirs,
                    Path(pybind11.get_include()), Path(sysconfig.get_paths()["include"])]
        argv = [cxx, *build_flags()["flags"], "-shared",
                *(f"-I{d}" for d in includes), str(source), "-o", str(work / so.name)]
        _say(f"pysharp: compiling {header.name} ({name}, {dtype}) with "
             f"{Path(cxx).name}, once; cached in {cache}")
        t0 = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            lines = done.stderr.splitlines()
            shown = "\n".join(lines[:200])
            more = f"\n... ({len(lines) - 200} more lines)" if len(lines) > 200 else ""
            raise ModelCompileError(f"compiling {header} ({name}, {dtype}) failed:\n"
                                    f"{shown}{more}\ncommand: {shlex.join(argv)}")
        os.replace(work / so.name, so)
        _say(f"pysharp: compiled {header.name} in {time.perf_counter() - t0:.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)

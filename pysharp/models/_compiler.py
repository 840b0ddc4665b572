"""Run-time compilation of a model header into a library, once per user.

A loaded model (:func:`pysharp.models.load_model`) is a C++ header compiled
against the headers shipped inside the package (:func:`include_dir`) with the
compiler and flags that built ``pysharp._core`` (recorded by the build in
``_build_flags.json``; ``pysharp info`` shows them), so its arithmetic is the
core's own. It is compiled into a plain shared library that exports one table of
the model's functions (``loaded_abi.hpp``), which ``pysharp._core`` binds
(:class:`ModelLibrary`); ``pysharp.jax``'s FFI handlers are a Python module of their own.
Both are cached per user ("module" below names either), and the cache checks what it loads:

- the key hashes the header and every file it includes with quotes, pysharp's
  headers, pysharp's version, the compiler (path, size, mtime), the flags, the
  model name, the dtype and the Python ABI; it names the entry;
- beside the module, the entry records the key's material, the module's SHA-256
  and every file the compiler read (its own list, ``-MMD -MF``: headers found
  with angle brackets in ``include_dirs`` or through a macro too, pysharp's and
  pybind11's; not the system's, which come with the compiler, nor Python's, fixed
  by the ABI in the key) with their SHA-256.
  A cached module is loaded only when all of them match now; any other entry
  (a changed include, a truncated, flipped or replaced module) is compiled
  again, under a new module name, so a process that loaded the old one keeps it;
- the cache folder (``PYSHARP_CACHE_DIR``, else ``$XDG_CACHE_HOME/pysharp``
  or ``~/.cache/pysharp``) is 0700 and its files 0600 whatever the umask, and a
  folder, record or module that another user owns or can write to is refused
  with an error naming it, since loading a module runs its code;
- two processes compiling the same model at once (a process pool, Dask
  workers) take a file lock: one compiles, the other loads its result;
- a failed compile leaves nothing behind but the lock file; the scratch folder
  of a killed one is removed the next time the cache is used (its process is
  dead, or it is over an hour old);
- a cache that cannot be written (read-only, not ours to write) still serves
  the modules it holds, and compiling a new one says where the cache is and
  how to move it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
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
from . import _diagnostics


class ModelCompileError(RuntimeError):
    """A model header could not be compiled or loaded; the message says why."""


_PACKAGE = Path(__file__).resolve().parent.parent
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_MODEL_RE = re.compile(r"^\s*PYSHARP_MODEL\(\s*([A-Za-z_]\w*)", re.MULTILINE)
#: Scratch files and folders are named ``<stem>.scratch-<host>-<pid>-<random>``.
_SCRATCH_RE = re.compile(r"\.scratch-([0-9a-f]{8})-(\d+)-")
#: A scratch folder this old belongs to a compile that died (a compile takes seconds).
_STALE_AFTER_S = 3600.0
_EXT = sysconfig.get_config_var("EXT_SUFFIX")


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

    Read from ``_build_flags.json`` beside the compiled core (in a portable build, the
    command of the instruction set loaded: see ``pysharp info``); the include paths,
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
    recorded = json.loads(record.read_text())
    # a portable build records each of its instruction sets: the one loaded is the core
    entry = recorded.get("targets", {}).get(loader.build_info()["cpu_target"], recorded["core"])
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
        When the folder belongs to another user or others can write to it, or it
        cannot be created; the message names it and says how to move it.
    """
    root = os.environ.get("PYSHARP_CACHE_DIR")
    if root:
        path = Path(root).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(base) / "pysharp"
    path = path.absolute() / "models"
    for folder in (path.parent, path):
        if not folder.exists():
            with _writing(folder):
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                folder.chmod(0o700)
    _refuse_unless_private(path, path.stat(), "the model cache",
                           "Fix its owner and mode (chmod 700) or set PYSHARP_CACHE_DIR to a "
                           "private folder.")
    return path


def _refuse_unless_private(path: Path, st: os.stat_result, what: str, fix: str) -> None:
    """PermissionError naming ``path`` when another user owns it or can write to it."""
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(
            f"{what} {path} belongs to another user or others can write to it; loading a "
            f"module from it would run code they put there. {fix}")


@contextlib.contextmanager
def _writing(cache: Path):
    """Turns a write refused by the file system (read-only, no permission) into an error
    naming the cache and how to move it."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        raise PermissionError(
            f"the model cache {cache} cannot be written ({exc.strerror}: {exc.filename}), so "
            "a model not compiled yet cannot be compiled into it. Move the cache by setting "
            "PYSHARP_CACHE_DIR to a folder of yours that can be written (compiled models go "
            "to $PYSHARP_CACHE_DIR/models), or make this one writable.") from exc


def _host() -> str:
    return hashlib.sha256(os.uname().nodename.encode()).hexdigest()[:8]


def _scratch_prefix(stem: str) -> str:
    """The name of a scratch file or folder of this process, which :func:`_remove_stale`
    can tell from those of a compile that died."""
    return f"{stem}.scratch-{_host()}-{os.getpid()}-"


def _scratch_folder(cache: Path, stem: str) -> Path:
    """A new private (0700) scratch folder in ``cache``."""
    with _writing(cache):
        return Path(tempfile.mkdtemp(prefix=_scratch_prefix(stem), dir=cache))


def write_private(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` of the cache at once (a reader sees the old file or the
    new one), readable by this user alone whatever the umask; its folder is created 0700.

    Raises
    ------
    PermissionError
        When the cache cannot be written, naming it and how to move it.
    """
    folder = path.parent
    with _writing(folder):
        folder.mkdir(mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_scratch_prefix(path.stem), suffix=".tmp",
                                   dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        pass
    return True


def _remove_stale(cache: Path) -> None:
    """Removes the scratch folders and files of compiles that died: those of a dead process
    of this host, and any over an hour old (also those named before scratch names carried
    their process). Nothing is said when they cannot be removed (a read-only cache)."""
    host, now = _host(), time.time()
    for folder in (cache, cache / "jax"):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            found = _SCRATCH_RE.search(entry.name)
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                if found is None and not (entry.name.startswith("_pysharp_") and is_dir
                                          or entry.name.endswith(".tmp")):
                    continue
                dead = found is not None and found[1] == host and not _alive(int(found[2]))
                if dead or now - entry.stat(follow_symlinks=False).st_mtime > _STALE_AFTER_S:
                    if is_dir:
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
            except OSError:
                pass


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
def _locked(cache: Path, stem: str):
    path = cache / f"{stem}.lock"
    with _writing(cache):  # open for writing: flock on NFS is a write lock
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:  # written by an older pysharp under a loose umask
            with _writing(cache):
                os.fchmod(fd, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _import(module_name: str, so: Path) -> ModelLibrary | ModuleType:
    """Module ``module_name`` from its file ``so`` in the cache, checked first: private,
    and of the SHA-256 that its record (``<module_name>.json`` beside it) holds.

    Raises
    ------
    ModelCompileError
        When the module or its record is absent, or the module differs from the record.
    PermissionError
        When either belongs to another user or others can write to it.
    """
    if module_name in _LOADED:
        return _LOADED[module_name]
    record = _record(so.with_name(f"{module_name}.json"))
    module = None if record is None else _verified(module_name, so, record)
    if module is None:
        raise ModelCompileError(
            f"{so} is missing, or is not the module its record describes (truncated, damaged "
            "or replaced): not loaded. Loading the model from its header compiles it again.")
    return module


class ModelLibrary:
    """One model in one precision, compiled: the table its library exports
    (csrc/loaded_abi.hpp) as ``pysharp._core`` binds it (csrc/bind_loaded.cpp).

    It answers what a model's own extension module answered when each loaded model
    compiled one: the library holds the model's kernels, engine, Lanczos and SLQ as plain
    functions, and the Python bindings are ``pysharp._core``'s, compiled once.

    Attributes
    ----------
    __name__ : str
        The cache's name for it, which identifies its sources (:func:`compile_model`).
    __file__ : str
        The library in the cache.
    KIND : {"scale_invariant", "square_loss"}
    MODEL_NAME, DTYPE : str
        The struct's name and ``"float64"`` or ``"float32"``.
    FIELDS : list of dict
        The struct's fields in declaration order: ``{name, kind, dtype, extents}``.
    """

    def __init__(self, name: str, file: Path, table) -> None:
        self.__name__, self.__file__, self._table = name, str(file), table
        self.KIND, self.MODEL_NAME = table.KIND, table.MODEL_NAME
        self.DTYPE, self.FIELDS = table.DTYPE, table.FIELDS

    def Model(self, data: dict):  # noqa: N802 (the name the modules' class had)
        """The model's struct bound to ``data`` ({field name: array or number})."""
        return self._table.Model(data)

    @staticmethod
    def slq(core, W, n_probes: int, steps: int, seed: int) -> dict:
        """Stochastic Lanczos quadrature of a float64 core (``pysharp._core.slq``)."""
        return loader.core().slq(core, W, n_probes, steps, seed)

    def __repr__(self) -> str:
        return (f"<ModelLibrary {self.__name__} ({self.MODEL_NAME}, {self.DTYPE}) "
                f"from {self.__file__}>")


#: What this process has loaded from the cache, by name: a library is opened once.
_LOADED: dict[str, ModelLibrary | ModuleType] = {}


def _verified(module_name: str, so: Path, record: dict) -> ModelLibrary | ModuleType | None:
    """The library (or, for a unit that makes one, the module) in ``so`` when it is private
    and has the SHA-256 its ``record`` holds (checked before it is loaded: a damaged library
    would crash the interpreter, another one run code that is not the model's), else None."""
    try:
        with open(so, "rb") as fh:
            _refuse_unless_private(so, os.fstat(fh.fileno()), "the cached module", _NOT_PRIVATE)
            if module_name in _LOADED:  # loaded (and checked) by this process already
                return _LOADED[module_name]
            if _sha256(fh) != record.get("sha256"):
                return None
    except FileNotFoundError:
        return None
    material = record.get("material", {})
    if material.get("unit") == _MODEL_UNIT.material["unit"]:
        module = _open_library(module_name, so, material["dtype"])
    else:
        spec = importlib.util.spec_from_file_location(module_name, so)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[module_name] = module
    _LOADED[module_name] = module
    return module


def _open_library(name: str, so: Path, dtype: str) -> ModelLibrary:
    """Opens a model's library and binds its table (checked by ``pysharp._core`` to have the
    layout of the core's own headers)."""
    handle = ctypes.CDLL(str(so), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    table = handle.pysharp_loaded_table
    table.restype = ctypes.c_void_p
    bind = getattr(loader.core(), "LoadedLibrary" + {"float64": "_f64", "float32": "_f32"}[dtype])
    try:
        return ModelLibrary(name, so, bind(table() or 0))  # ctypes reads NULL as None
    except ValueError as exc:
        raise ModelCompileError(f"{so}: {exc}") from None


def _sha256(fh) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


_NOT_PRIVATE = ("Delete it (pysharp compiles the model again) or set PYSHARP_CACHE_DIR to a "
                "private folder.")


def _record(path: Path) -> dict | None:
    """The record of a cached module, None when absent or unreadable (an older pysharp's).

    Raises
    ------
    PermissionError
        When it belongs to another user or others can write to it.
    """
    try:
        with open(path, "rb") as fh:
            _refuse_unless_private(path, os.fstat(fh.fileno()), "the model cache's record",
                                   _NOT_PRIVATE)
            record = json.loads(fh.read())
    except FileNotFoundError:
        return None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _cached(cache: Path, stem: str, material: dict) -> ModuleType | None:
    """A module of entry ``stem`` whose record holds ``material`` and whose every
    dependency (the files the compiler read) still has its recorded SHA-256, as has the
    module itself; else None. The newest record is tried first."""
    records = []
    for path in cache.glob(f"{stem}_*.json"):
        with contextlib.suppress(FileNotFoundError):
            records.append((path.stat().st_mtime_ns, path))
    for _, path in sorted(records, reverse=True):
        record = _record(path)
        if (record is None or record.get("material") != material
                or not isinstance(record.get("dependencies"), dict)
                or _hashes(record["dependencies"]) != record["dependencies"]):
            continue
        module_name = path.name[:-len(".json")]
        return _verified(module_name, cache / (module_name + _suffix(record)), record)
    return None


def _hashes(paths) -> dict[str, str]:
    """{path: SHA-256 of its contents (``"missing"`` where it cannot be read)}."""
    out = {}
    for path in paths:
        try:
            with open(path, "rb") as fh:
                out[path] = _sha256(fh)
        except OSError:
            out[path] = "missing"
    return out


def _say(message: str) -> None:
    """A compile's progress, where a person watches: a terminal, or a Jupyter cell (whose
    stderr is the kernel's stream, not a tty); logs and captured output stay quiet."""
    err = sys.stderr
    if err is not None and (err.isatty() or type(err).__module__.startswith("ipykernel.")):
        print(message, file=err, flush=True)


@dataclasses.dataclass(frozen=True)
class _Unit:
    """What a compiled module is made of besides the model: the line that instantiates
    it (``{module}``, ``{name}``, ``{real}`` filled in) after the header and ``include``,
    extra include folders, and what of them enters the cache key (``material["unit"]``
    names the kind of unit: the model's library, or a Python module)."""

    prefix: str
    include: str
    body: str
    include_dirs: tuple[Path, ...] = ()
    material: dict = dataclasses.field(default_factory=dict)


#: A model's library: the kernels, engine, Lanczos, SLQ and SGD as a table of plain
#: functions (loaded_abi.hpp) that pysharp._core binds. No Python binding code is compiled
#: per model, which halves the compile.
_MODEL_UNIT = _Unit("_pysharp_model_", "loaded_abi.hpp", "PYSHARP_LOADED_LIBRARY({name}, {real})",
                    material={"unit": "library", "abi": 1})


def _suffix(record: dict) -> str:
    """The file name suffix of the unit a cache record describes."""
    return ".so" if record.get("material", {}).get("unit") == "library" else _EXT


def compile_model(header: Path, name: str, dtype: str,
                  include_dirs: tuple[Path, ...] = ()) -> ModelLibrary:
    """The compiled library of model ``name`` of ``header`` for ``dtype``, from the cache
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
             unit: _Unit) -> ModelLibrary | ModuleType:
    key, material = _key(header, name, dtype, include_dirs, unit)
    stem = f"{unit.prefix}{key}"
    cache = cache_dir()
    _remove_stale(cache)
    module = _cached(cache, stem, material)
    if module is not None:
        return module
    with _locked(cache, stem):
        module = _cached(cache, stem, material)  # compiled by another process
        if module is not None:
            return module
        module_name, so, dependencies = _build(header, name, dtype, include_dirs, unit, stem,
                                               cache)
        with open(so, "rb") as fh:
            record = {"material": material, "sha256": _sha256(fh), "dependencies": dependencies}
        write_private(cache / f"{module_name}.json",
                      json.dumps(record, sort_keys=True, indent=1).encode())
        return _verified(module_name, so, record)


def _build(header: Path, name: str, dtype: str, include_dirs: tuple[Path, ...], unit: _Unit,
           stem: str, cache: Path) -> tuple[str, Path, dict[str, str]]:
    """Compiles into a scratch folder of the cache and moves the module into place (0600).

    The preprocessor first lists the files the unit reads (``-MM``); the module is named
    for the entry and a hash of their contents, so that each version of the sources has
    a module name of its own, the same wherever they are compiled.

    Returns
    -------
    module_name : str
    so : Path
        The module in the cache.
    dependencies : dict
        Every file the compiler read but the generated unit, the system's headers and
        Python's ({absolute path: SHA-256}); one that changed during the compile is
        recorded as such, so that the next use compiles again.
    """
    import pybind11

    real = {"float64": "double", "float32": "float"}[dtype]
    cxx = compiler()
    public, bind = _include_dirs()
    work = _scratch_folder(cache, stem)
    try:
        source = work / "unit.cpp"
        python = Path(sysconfig.get_paths()["include"])  # fixed by the ABI in the key
        libraries = [*unit.include_dirs, Path(pybind11.get_include()), python]
        includes = [public, bind, *include_dirs, *libraries]
        command = [cxx, *build_flags()["flags"], *(f"-I{d}" for d in includes)]

        def run(module_name: str, *args: str) -> list[str]:
            """Writes the unit for ``module_name``, runs the compiler on it with ``args``, and
            returns the files it read."""
            # The model is named as written in its header: at global scope, or in
            # namespace pysharp (the built-ins' headers).
            body = unit.body.format(module=module_name, name=name, real=real)
            source.write_text(f'#include "{header}"\n#include "{unit.include}"\n'
                              "namespace pysharp_unit {\nusing namespace ::pysharp;\n"
                              f"{body}\n}}\n")
            argv = [*command, *args, "-MF", str(work / "unit.d"), "-MT", "unit", str(source)]
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                told = _diagnostics.explain(done.stderr, _sources(header, include_dirs),
                                            include_dirs, [public, bind, *libraries])
                raise ModelCompileError(f"compiling {header} ({name}, {dtype}) failed:\n"
                                        f"{told}\ncommand: {shlex.join(argv)}")
            if not (work / "unit.d").is_file():
                raise ModelCompileError(
                    f"{cxx} wrote no list of the files it read (-MF): pysharp needs a "
                    "GCC-compatible compiler (g++, clang++) to cache a model")
            paths = map(Path, _depfile_paths((work / "unit.d").read_text()))
            return [str(p) for p in paths if p != source and not p.is_relative_to(python)]

        before = _hashes(run(stem, "-MM"))
        module_name = f"{stem}_{_digest(before)}"
        so = cache / (module_name + _suffix({"material": unit.material}))
        _say(f"pysharp: compiling {header.name} ({name}, {dtype}) with "
             f"{Path(cxx).name}, once; cached in {cache}")
        t0 = time.perf_counter()
        after = _hashes(run(module_name, "-shared", "-MMD", "-o", str(work / so.name)))
        dependencies = {p: h if before.get(p) == h else "changed during the compile"
                        for p, h in after.items()}
        os.chmod(work / so.name, 0o600)
        os.replace(work / so.name, so)
        _say(f"pysharp: compiled {header.name} in {time.perf_counter() - t0:.1f} s")
        return module_name, so, dependencies
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _digest(hashes: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()[:12]


def _depfile_paths(text: str) -> list[str]:
    """The prerequisites of the make rule a compiler writes with ``-MF`` (``unit: a b \\``
    lines, a space in a name escaped as ``\\ ``, ``$`` as ``$$``), as absolute paths."""
    _, _, prerequisites = text.replace("\\\n", " ").partition(":")
    words = re.findall(r"(?:\\.|[^\s\\])+", prerequisites)
    return [os.path.abspath(re.sub(r"\\(.)", r"\1", w).replace("$$", "$")) for w in words]

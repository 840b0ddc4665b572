"""Loads the compiled core, or explains why it is missing."""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import os
import sys
from types import ModuleType

_core: ModuleType | None
_import_error: str | None

# libgomp's idle threads spin this many times before they sleep (its default, 300,000, is
# milliseconds on recent x86). On cores that other work shares, spinning threads take the
# time the working ones need: `pysharp reproduce central-flow --quick` took 290 s with two
# threads and 15 s with one beside two CPU-bound processes (2-core Xeon); with this spin,
# 14 s. libgomp reads its environment once, when it is loaded, so this is set before the
# core is imported, and never over the user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT.
GOMP_SPINCOUNT = 1000


def _share_the_cores() -> None:
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(GOMP_SPINCOUNT)
    # A worker process (a ProcessPoolExecutor's, Dask's) shares the machine with its sibling
    # workers: one thread each unless the pool says otherwise (pysharp sweep --workers N
    # gives each cores // N through OMP_NUM_THREADS).
    if multiprocessing.parent_process() is not None and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"


#: The instruction sets a portable x86-64 build compiles the core for (CMakeLists.txt,
#: PYSHARP_X86_TARGETS), with the CPU features each needs (Linux's /proc/cpuinfo names,
#: pysharp._cpuinfo.features()): x86-64, x86-64-v3 and x86-64-v4, as GCC and Clang define them.
_V2 = ("sse3", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16", "lahf_lm")
_V3 = (*_V2, "avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "abm", "movbe", "xsave")
TARGET_FEATURES = {
    "sse2": ("sse2",),
    "avx2": (*_V3,),
    "avx512": (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}
#: Other spellings PYSHARP_CPU_TARGET takes: the -march names of the same sets.
_ALIASES = {"x86-64": "sse2", "x86-64-v3": "avx2", "x86-64-v4": "avx512", "avx2-fma": "avx2"}
#: build_info()["simd"] of a single-target build -> its target name.
_SIMD_TARGET = {"avx2-fma": "avx2"}


class CpuTargetError(ImportError):
    """PYSHARP_CPU_TARGET names an instruction set that this build or this CPU lacks."""


#: The core's instruction set: {"target": the one loaded, "targets": those the build holds,
#: "runnable": those of them this CPU runs}; empty until the core is loaded.
_dispatch: dict = {}


def _requested() -> str | None:
    value = os.environ.get("PYSHARP_CPU_TARGET", "").strip().lower()
    if value in ("", "auto"):
        return None
    return _ALIASES.get(value, value)


def choose_target(compiled: list[str], features: dict, requested: str | None,
                  ) -> tuple[str, list[str]]:
    """The instruction set to load, and those of ``compiled`` the CPU runs.

    Parameters
    ----------
    compiled : list of str
        The sets the build holds, best last (``pysharp._cpuinfo.targets``).
    features : dict
        {feature: usable} (``pysharp._cpuinfo.features()``).
    requested : str or None
        PYSHARP_CPU_TARGET's set (aliases resolved), or None: the best the CPU runs.

    Raises
    ------
    CpuTargetError
        When ``requested`` is not compiled in, or the CPU lacks a feature it needs.
    ImportError
        When the CPU runs none of them.
    """
    runnable = [t for t in compiled
                if all(features.get(f, False) for f in TARGET_FEATURES.get(t, (t,)))]
    told = f"PYSHARP_CPU_TARGET={os.environ.get('PYSHARP_CPU_TARGET', requested)!r}"
    if requested is None:
        if not runnable:
            raise ImportError(f"this CPU runs none of the core's builds ({', '.join(compiled)})")
        return runnable[-1], runnable
    if requested not in compiled:
        raise CpuTargetError(
            f"{told}: this build of pysharp holds the core for {', '.join(compiled)} only; "
            f"unset it to let pysharp choose (here: {runnable[-1] if runnable else 'none'})")
    if requested not in runnable:
        missing = [f for f in TARGET_FEATURES[requested] if not features.get(f, False)]
        raise CpuTargetError(
            f"{told}: this CPU cannot run the {requested} build of the core (it lacks "
            f"{', '.join(missing)}); it runs {', '.join(runnable) or 'none'}. Unset "
            "PYSHARP_CPU_TARGET to let pysharp choose")
    return requested, runnable


def _load_portable(cpuinfo: ModuleType) -> ModuleType:
    """Loads the best ``pysharp/_core_<target>`` this CPU runs, or the requested one, as
    ``pysharp._core``."""
    compiled = list(cpuinfo.targets)
    choice, runnable = choose_target(compiled, cpuinfo.features(), _requested())
    _dispatch.update(targets=compiled, runnable=runnable)
    found = importlib.util.find_spec(f"pysharp._core_{choice}")
    if found is None or found.origin is None:
        raise ImportError(f"pysharp/_core_{choice} is missing beside pysharp/_cpuinfo; "
                          "reinstall pysharp")
    # Every build's module initialises as _core (PYBIND11_MODULE(_core, ...)): loaded from its
    # file under the name pysharp._core, it is that module in every respect but __file__.
    spec = importlib.util.spec_from_file_location("pysharp._core", found.origin)
    if spec is None or spec.loader is None:
        raise ImportError(f"{found.origin} is not a loadable extension module; reinstall pysharp")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["pysharp._core"] = module
    package = sys.modules.get("pysharp")
    if package is not None:
        package._core = module  # type: ignore[attr-defined]  # a module's attribute, at run time
    _dispatch["target"] = choice
    return module


def _load_single() -> ModuleType:
    """Imports ``pysharp._core`` of a build for one instruction set (native, PYSHARP_MARCH,
    or a machine other than x86-64); PYSHARP_CPU_TARGET may only name that set."""
    module = importlib.import_module("pysharp._core")
    simd = module.build_info()["simd"]
    target = _SIMD_TARGET.get(simd, simd)
    _dispatch.update(target=target, targets=[target], runnable=[target])
    if _requested() not in (None, target):
        raise CpuTargetError(
            f"PYSHARP_CPU_TARGET={os.environ['PYSHARP_CPU_TARGET']!r}: this build of pysharp "
            f"holds one core, for {target}; a portable build (PYSHARP_NATIVE=OFF) holds one "
            "for each x86-64 instruction set and lets PYSHARP_CPU_TARGET choose")
    return module


def _load() -> ModuleType:
    try:
        cpuinfo = importlib.import_module("pysharp._cpuinfo")
    except ModuleNotFoundError:  # a build for one instruction set
        return _load_single()
    return _load_portable(cpuinfo)


_share_the_cores()
try:
    _core = _load()
    _import_error = None
except CpuTargetError:  # the user asked for what cannot run: say so, never fall back
    raise
except ImportError as exc:  # a source checkout that was never built, or a broken build
    _core = None
    _import_error = (
        f"the compiled extension pysharp._core could not be imported ({exc}). "
        "Install pysharp with `pip install .` from the repository root so that "
        "CMake builds it."
    )


def core() -> ModuleType:
    """Return the compiled module ``pysharp._core``.

    Raises
    ------
    ImportError
        With the reason and the command that builds it, when the extension is absent.
    """
    if _core is None:
        raise ImportError(_import_error)
    return _core


def build_info() -> dict:
    """How the compiled core was built: OpenMP, CUDA, native tuning, compiler, and the
    instruction set chosen (``cpu_target``) among those compiled in (``cpu_targets``)."""
    if _core is None:
        return {"available": False, "reason": _import_error}
    info = dict(_core.build_info())
    info["available"] = True
    # The instruction set of the core in use, those this build holds (several in a portable
    # build, picked at import) and those of them this CPU runs.
    info["cpu_target"] = _dispatch["target"]
    info["cpu_targets"] = list(_dispatch["targets"])
    info["cpu_targets_runnable"] = list(_dispatch["runnable"])
    info["max_threads"] = _core.max_threads()
    return info

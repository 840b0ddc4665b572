"""The portable build's run-time dispatch (issue 42.3): it holds the core for several x86-64
instruction sets (sse2, avx2 = x86-64-v3, avx512 = x86-64-v4) and loads the best one the CPU
runs, or the one PYSHARP_CPU_TARGET names; what cannot run is refused with a clear error,
never an illegal instruction.

The choice itself (``loader.choose_target``) is checked on made-up CPUs in this process; the
loading, in fresh interpreters run outside the source tree (whose pysharp has no compiled
core), each with its own PYSHARP_CPU_TARGET. Those skip on a build for one instruction set
(``PYSHARP_NATIVE=ON``, the default, or ``PYSHARP_MARCH``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pysharp
from pysharp._engine import loader

INFO = pysharp.build_info()
if not INFO["available"]:
    pytest.skip("no compiled core", allow_module_level=True)
PORTABLE = len(INFO["cpu_targets"]) > 1
portable_only = pytest.mark.skipif(
    not PORTABLE, reason=f"a build for one instruction set ({INFO['cpu_target']}): nothing "
    "to dispatch; PYSHARP_NATIVE=OFF builds the portable core")

ALL = ["sse2", "avx2", "avx512"]
V3 = {f: True for f in loader.TARGET_FEATURES["avx2"]}
V4 = {**V3, **{f: True for f in loader.TARGET_FEATURES["avx512"]}}
#: Linux's names of the features pysharp._cpuinfo names otherwise.
LINUX = {"sse3": "pni"}
#: build_info()["simd"] of each target's module: the macros its compiler defined.
SIMD = {"sse2": "sse2", "avx2": "avx2-fma", "avx512": "avx512"}

SCRIPT = """
import json, sys
import numpy as np
import pysharp
info = pysharp.build_info()
m = pysharp.Toy3D(c=10.0)
W = m.random_point(8, seed=1, norm=2.0)
loss, grad = m.loss_and_grad(W)
print(json.dumps({"info": info, "file": sys.modules["pysharp._core"].__file__,
                  "grad": np.asarray(grad).tolist()}))
"""


def run(tmp_path: Path, target: str | None) -> subprocess.CompletedProcess:
    """SCRIPT in a fresh interpreter in ``tmp_path``, with PYSHARP_CPU_TARGET=target (unset
    for None)."""
    env = {k: v for k, v in os.environ.items() if k != "PYSHARP_CPU_TARGET"}
    if target is not None:
        env["PYSHARP_CPU_TARGET"] = target
    return subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def proc_cpuinfo_flags() -> set[str] | None:
    """The CPU's flags as Linux reports them (an oracle independent of pysharp's CPUID
    reading: the kernel clears the AVX-512 flags when it does not save their state)."""
    path = Path("/proc/cpuinfo")
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


# ------------------------------------------------------------------ the choice, made-up CPUs
@pytest.mark.parametrize(("features", "best"), [
    ({"sse2": True}, "sse2"),
    ({"sse2": True, **V3}, "avx2"),
    ({"sse2": True, **V4}, "avx512"),
    ({"sse2": True, **V4, "avx512bw": False}, "avx2"),  # AVX-512F alone is not x86-64-v4
    ({"sse2": True, **V3, "fma": False}, "sse2"),  # AVX2 without FMA (VIA, some VMs)
])
def test_the_best_set_the_cpu_runs_is_chosen(features, best):
    choice, runnable = loader.choose_target(ALL, features, None)
    assert choice == best
    assert runnable == ALL[:ALL.index(best) + 1]


def test_a_requested_set_is_chosen_when_the_cpu_runs_it():
    assert loader.choose_target(ALL, {"sse2": True, **V4}, "sse2")[0] == "sse2"
    assert loader.choose_target(ALL, {"sse2": True, **V4}, "avx2")[0] == "avx2"


def test_a_set_the_cpu_cannot_run_is_refused_naming_what_it_lacks():
    with pytest.raises(loader.CpuTargetError, match=r"cannot run the avx512 build.*avx512f"):
        loader.choose_target(ALL, {"sse2": True, **V3}, "avx512")


def test_a_set_the_build_lacks_is_refused_naming_those_it_holds():
    with pytest.raises(loader.CpuTargetError, match="holds the core for sse2, avx2, avx512"):
        loader.choose_target(ALL, {"sse2": True, **V4}, "neon")


def test_the_aliases_are_the_march_names(monkeypatch):
    for value, target in [("x86-64-v4", "avx512"), ("X86-64-V3", "avx2"), ("x86-64", "sse2"),
                          (" auto ", None), ("", None)]:
        monkeypatch.setenv("PYSHARP_CPU_TARGET", value)
        assert loader._requested() == target


# ------------------------------------------------------------------ this build, this CPU
def test_build_info_names_the_set_in_use_among_those_compiled():
    assert INFO["cpu_target"] in INFO["cpu_targets_runnable"]
    assert set(INFO["cpu_targets_runnable"]) <= set(INFO["cpu_targets"])
    if PORTABLE:
        assert INFO["cpu_targets"] == ALL
        assert INFO["simd"] == SIMD[INFO["cpu_target"]]
        assert not INFO["native"]


@portable_only
def test_the_cpu_features_agree_with_linux():
    flags = proc_cpuinfo_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo")
    from pysharp import _cpuinfo
    features = _cpuinfo.features()
    named = {f for t in ALL for f in loader.TARGET_FEATURES[t]}
    assert {f: features[f] for f in named} == {f: LINUX.get(f, f) in flags for f in named}


@portable_only
def test_the_dispatcher_loads_the_best_set_the_cpu_runs(tmp_path):
    flags = proc_cpuinfo_flags()
    done = run(tmp_path, None)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    best = [t for t in ALL if flags is None
            or flags >= {LINUX.get(f, f) for f in loader.TARGET_FEATURES[t]}][-1]
    assert out["info"]["cpu_target"] == best
    assert out["info"]["simd"] == SIMD[best]
    assert Path(out["file"]).name.startswith(f"_core_{best}.")


@portable_only
def test_pysharp_cpu_target_is_honoured_for_every_set_the_cpu_runs(tmp_path):
    grads = {}
    for target in INFO["cpu_targets_runnable"]:
        done = run(tmp_path, target)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["info"]["cpu_target"] == target
        assert out["info"]["simd"] == SIMD[target]
        assert Path(out["file"]).name.startswith(f"_core_{target}.")
        grads[target] = out["grad"]
    # the same numbers, to rounding, from every set (bits: docs/conventions.rst, Determinism)
    first = grads[INFO["cpu_targets_runnable"][0]]
    for g in grads.values():
        np.testing.assert_allclose(g, first, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("target", ["avx1024", "cannot-run"])
def test_an_impossible_pysharp_cpu_target_is_refused_at_import(tmp_path, target):
    if target == "cannot-run":
        cannot = [t for t in INFO["cpu_targets"] if t not in INFO["cpu_targets_runnable"]]
        if not cannot:
            others = [t for t in ALL if t != INFO["cpu_target"]]
            if PORTABLE or not others:
                pytest.skip("this CPU runs every set the build holds")
            cannot = others  # a single-target build holds no other
        target = cannot[-1]
    done = run(tmp_path, target)
    # an ImportError with the reason, not a crash (SIGILL: returncode -4)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "CpuTargetError" in done.stderr
    assert f"PYSHARP_CPU_TARGET={target!r}" in done.stderr
    assert "Unset PYSHARP_CPU_TARGET" in done.stderr or "unset it" in done.stderr \
        or "portable build" in done.stderr

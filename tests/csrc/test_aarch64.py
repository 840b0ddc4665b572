"""The lane code on aarch64 (NEON): tests/csrc/aarch64_smoke.cpp cross-compiled with Debian's
aarch64 g++ and run under qemu-user, where both are installed (.ci/run installs them;
skipped elsewhere). It covers the header-only code on NEON lanes: the lane math, the kernels
of every built-in model (against the scalar path, finite differences and, for BN linear
regression, the formula in plain loops), the trajectory engine (against a plain loop, and
its own bits at other thread counts and batch positions) and Lanczos (against a dense
eigensolve). Not the Python package, whose aarch64 wheel is not built here."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from _cases import REPO

CXX, QEMU = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
SYSROOT = "/usr/aarch64-linux-gnu"


@pytest.mark.skipif(not (CXX and QEMU),
                    reason="needs aarch64-linux-gnu-g++ and qemu-aarch64 "
                           "(apt-get install g++-aarch64-linux-gnu qemu-user)")
def test_lane_code_keeps_its_promises_on_aarch64(tmp_path):
    exe = tmp_path / "smoke"
    # the core's flags but -march (CMakeLists.txt), so multiply-adds fuse as there
    subprocess.run([CXX, "-std=c++17", "-O3", "-fopenmp", "-fno-math-errno",
                    "-ffp-contract=fast", f"-I{REPO / 'csrc' / 'include'}", f"-I{REPO / 'csrc'}",
                    str(REPO / "tests" / "csrc" / "aarch64_smoke.cpp"), "-o", str(exe)],
                   check=True, capture_output=True, text=True, timeout=600)
    run = subprocess.run([QEMU, "-L", SYSROOT, str(exe)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "lanes 2" in run.stdout and "0 failed" in run.stdout, run.stdout

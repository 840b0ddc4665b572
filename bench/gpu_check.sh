#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU (the team's lent H200): build pysharp with
# the CUDA module into the machine's Python, run the GPU tests (pytest -m gpu: the CUDA
# engine's bits independent of placement, CUDA against the CPU core before EoS entry and
# against the oracles), the GPU benchmark (bench.gpu) and the rest of the suite on that
# machine's CPU, each step bounded. Logs and figures go to $OUT (or ./gpu-check/).
#
# Usage: bash bench/gpu_check.sh [STAGE] [bench.gpu options, e.g. --quick]
#   build   machine facts, then the build                       (~5 min on the H200 lease)
#   tests   the quick GPU tests, then the long placement ones   (needs a build)
#   bench   the GPU benchmark                                   (needs a build; ~3 min)
#   all     build, quick tests, bench, placement tests, CPU suite  (the default)
# One device call may run 10 minutes and a lease holds 15 in all: run `build` and `tests`
# in one call, then `bench` in a second call while the machine is still warm.
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
stage="all"
case "${1:-}" in build | tests | bench | all) stage="$1"; shift ;; esac
out="${OUT:-$repo/gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX would take 75 % of the GPU's memory
py=python3
stamp() { echo "== $(date +%T) $*"; }
want() { [[ $stage == all || $stage == "$1" ]]; }

if want build; then
  stamp machine
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $py -V; nproc; grep -m1 'model name' /proc/cpuinfo
    grep -m1 -o -w 'avx512f' /proc/cpuinfo || echo "no avx512f"; } | tee "$out/build.log"
  command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
  stamp build
  t0=$SECONDS
  if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" PYSHARP_CUDA=ON \
      $py -m pip install -v --no-build-isolation --no-deps . >>"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    exit 1
  fi
  echo "built in $((SECONDS - t0)) s"
  # The machine code the module carries (sm_90 expected: PTX alone is JIT-compiled at
  # every kernel's first launch).
  pkg="$(cd /tmp && $py -c 'import os, pysharp; print(os.path.dirname(pysharp.__file__))')"
  cuobjdump --list-elf "$pkg"/_cuda*.so 2>&1 | grep -o 'sm_[0-9]*' | sort | uniq -c | tee -a "$out/build.log"
fi
cd "$(mktemp -d)"  # from here on the installed pysharp, not the source tree
$py -c "import pysharp, json; print(json.dumps(pysharp.backends()['cuda']))" || exit 1

gpu_tests() {  # $1: -k expression, $2: time cap in seconds
  timeout "$2" $py -m pytest -q -rs -v --durations=15 -m gpu -k "$1" -p no:cacheprovider \
    "$repo/tests" 2>&1 | tee -a "$out/gpu-tests.txt" | grep -v PASSED | tail -30
}
# On the first lease (2026-12-04) the GPU tests took 4-19 s each, most likely the driver
# JIT-compiling the sm_75 PTX that build carried (CMake's default arch, fixed since) in every
# new process. The quick checks run first and the long bit-equality runs last all the same.
if want tests; then
  stamp "GPU tests"
  gpu_tests "not placement" 200
fi
if want bench; then
  stamp "GPU benchmark"
  (cd "$repo" && timeout 240 $py -m bench.gpu "$@" --json "$out/gpu-bench.json") 2>&1 |
    tee "$out/gpu-bench.txt"
fi
if want tests; then
  stamp "GPU placement tests"
  gpu_tests "placement" 200
fi
if [[ $stage == all ]]; then
  stamp "the rest of the suite, on this machine's CPU"
  timeout 90 $py -m pytest -q -x -n 8 -m "not gpu" -p no:cacheprovider "$repo/tests" 2>&1 |
    tee -a "$out/gpu-tests.txt" | tail -15
fi
stamp done

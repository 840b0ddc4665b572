#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU (the team's lent H200), within 8 minutes:
# measure the device's two ceilings (FP64 GEMM, device copy), build pysharp with the CUDA
# module into the machine's Python, run the quick GPU tests (pytest -m gpu: the CUDA engine's
# bits independent of placement, CUDA against the CPU core before EoS entry and against the
# oracles) and the GPU benchmark against JAX on the same GPU, then write
# bench/results/gpu_h200.json and regenerate the GPU table of docs/tutorials/gpu.rst from it
# (bench.gpu_report; both files are also copied to $OUT). Logs and figures go to $OUT (or
# ./gpu-check/). Every step is bounded by what is left of the 8 minutes.
#
# Usage: bash bench/gpu_check.sh [STAGE] [bench.gpu options, e.g. --quick]
#   ceilings  FP64 GEMM and device copy (CuPy, else JAX)           (~30 s)
#   build     machine facts, then the build                        (~4 min on the H200)
#   bench     ceilings, the GPU benchmark, the JSON and the table  (needs a build; ~2.5 min)
#   tests     the quick GPU tests                                  (needs a build)
#   extra     the long placement tests, then the CPU suite         (a second call)
#   cupy      backend="cupy"'s device tests (needs CuPy; NVRTC compiles at first use)
#   all       ceilings, build, bench, tests (the default)
# "bench --tracked" adds runs with sharpness tracking (the tiles in segments between the
# engine's Lanczos solves, against the generic engine): minutes more, for a visit of its own.
# One device call may run 10 minutes and a lease holds 15 in all.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo="$PWD"
stage="all"
case "${1:-}" in ceilings | build | tests | bench | extra | cupy | all) stage="$1"; shift ;; esac
out="${OUT:-$repo/gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX would take 75 % of the GPU's memory
py=python3
stamp() { echo "== $(date +%T) $*"; }
want() { [[ $stage == all || $stage == "$1" ]]; }
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-480}))
# the time cap of a step: its own cap $1, or what is left of the 8 minutes if less
cap() {
  local left=$((deadline - SECONDS))
  ((left < 1)) && left=1
  echo $(($1 < left ? $1 : left))
}

ceilings() {
  stamp "ceilings: FP64 GEMM and device copy"
  (cd "$repo" && timeout "$(cap 60)" $py -m bench.gpu_ceilings --seconds 8 \
    --json "$out/ceilings.json") 2>&1 | tee "$out/ceilings.txt"
}
if want ceilings; then
  ceilings
fi
[[ $stage == ceilings ]] && exit 0

if want build; then
  stamp machine
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $py -V; nproc; grep -m1 'model name' /proc/cpuinfo
    grep -m1 -o -w 'avx512f' /proc/cpuinfo || echo "no avx512f"; } | tee "$out/build.log"
  command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
  stamp build
  t0=$SECONDS
  if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" PYSHARP_CUDA=ON timeout "$(cap 270)" \
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
cd "$(mktemp -d)" || exit 1  # from here on the installed pysharp, not the source tree
$py -c "import pysharp, json; print(json.dumps(pysharp.backends()['cuda']))" || exit 1

gpu_tests() {  # $1: -k expression, $2: time cap in seconds
  timeout "$(cap "$2")" $py -m pytest -q -rs -v --durations=15 -m gpu -k "$1" \
    -p no:cacheprovider "$repo/tests" 2>&1 | tee -a "$out/gpu-tests.txt" | grep -v PASSED |
    tail -30
}
# On the first lease (2026-12-04) the GPU tests took 4-19 s each, most likely the driver
# JIT-compiling the sm_75 PTX that build carried (CMake's default arch, fixed since) in every
# new process. In `all` the benchmark (which checks every rate's accuracy against the CPU
# core before taking it) runs before the quick tests, so that the JSON is written in time;
# the long bit-equality runs are in `extra`.
if want bench; then
  [[ $stage == bench ]] && ceilings
  stamp "GPU benchmark"
  (cd "$repo" && timeout "$(cap 200)" $py -m bench.gpu "$@" --json "$out/gpu-bench.json") \
    2>&1 | tee "$out/gpu-bench.txt"
  if [[ -s $out/gpu-bench.json ]]; then
    stamp "bench/results/gpu_h200.json and the docs' GPU table"
    note="bench/gpu_check.sh, $(date -u +%F), commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    (cd "$repo" && $py -m bench.gpu_report --ceilings "$out/ceilings.json" \
      --bench "$out/gpu-bench.json" --note "$note") &&
      cp "$repo/bench/results/gpu_h200.json" "$repo/docs/tutorials/gpu.rst" "$out/"
  else
    echo "no benchmark JSON (the run failed or ran out of time): gpu_h200.json unchanged"
  fi
fi
if want tests; then
  stamp "GPU tests"
  gpu_tests "not placement and not cupy" 120
fi
if [[ $stage == cupy ]]; then
  # NVRTC compiles each engine unit at its first use (20-120 s of CPU each, cached under
  # PYSHARP_CACHE_DIR): a call of its own, after the others.
  deadline=$((SECONDS + 540))
  stamp "CuPy backend device tests"
  gpu_tests "cupy" 500
fi
if [[ $stage == extra ]]; then
  deadline=$((SECONDS + 540))
  stamp "GPU placement tests"
  gpu_tests "placement" 200
  stamp "the rest of the suite, on this machine's CPU"
  timeout "$(cap 90)" $py -m pytest -q -x -n 8 -m "not gpu" -p no:cacheprovider \
    "$repo/tests" 2>&1 | tee -a "$out/gpu-tests.txt" | tail -15
fi
stamp "done in $((SECONDS)) s"

#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU (the team's lent H200): build pysharp with
# the CUDA module into the machine's Python, run the GPU tests (pytest -m gpu: the CUDA
# engine's bits independent of placement, and CUDA against the CPU core and the oracles),
# then the GPU benchmark (bench.gpu), then the rest of the suite on that machine's CPU,
# each step bounded. Logs, figures and the built modules go to $OUT (or ./gpu-check/).
# Usage: bash bench/gpu_check.sh [--quick]        (--quick: the benchmark's small sizes)
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
out="${OUT:-$repo/gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX would take 75 % of the GPU's memory
py=python3
stamp() { echo "== $(date +%T) $*"; }

stamp machine
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $py -V; nproc; grep -m1 'model name' /proc/cpuinfo
  grep -m1 -o -w 'avx512f' /proc/cpuinfo || echo "no avx512f"; } | tee "$out/build.log"
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
# The Python headers, so that modules for this Python can be built elsewhere.
tar czf "$out/python-include.tgz" -C "$($py -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" .

stamp build
t0=$SECONDS
if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" PYSHARP_CUDA=ON \
    $py -m pip install -v --no-build-isolation --no-deps . >>"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  exit 1
fi
echo "built in $((SECONDS - t0)) s"
tmp="$(mktemp -d)"
cd "$tmp"  # from here on the installed pysharp, not the source tree
pkg="$($py -c 'import os, pysharp; print(os.path.dirname(pysharp.__file__))')"
for f in "$pkg"/_core*.so "$pkg"/_cuda*.so; do gzip -c "$f" >"$out/$(basename "$f").gz"; done
$py -c "import pysharp, json; print(json.dumps(pysharp.backends()['cuda']))"

stamp "GPU tests"
timeout 200 $py -m pytest -q -m gpu -rs -p no:cacheprovider "$repo/tests" 2>&1 |
  tee "$out/gpu-tests.txt" | tail -25

stamp "GPU benchmark"
(cd "$repo" && timeout 240 $py -m bench.gpu "$@" --json "$out/gpu-bench.json") 2>&1 |
  tee "$out/gpu-bench.txt"

stamp "the rest of the suite, on this machine's CPU"
timeout 90 $py -m pytest -q -x -n 8 -m "not gpu" -p no:cacheprovider "$repo/tests" 2>&1 |
  tee "$out/suite.txt" | tail -15
stamp done

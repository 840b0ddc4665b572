#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: build with the CUDA module,
# run the GPU tests (cross-checked against the CPU core to 1e-10 in float64)
# and the GPU benchmark. Well inside 8 minutes on an H200 (the build is ~3).
# Usage: bash bench/gpu_check.sh [--quick]   (figures go to $OUT or ./gpu-check/)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
venv="$(mktemp -d)/venv"
python3 -m venv --system-site-packages "$venv"   # numpy, scipy, pybind11, jax from the image
# shellcheck disable=SC1091
. "$venv/bin/activate"
time PYSHARP_CUDA=ON pip install -q --no-build-isolation --no-deps . 2>&1 | tail -5
python -c "import pysharp, json; print(json.dumps(pysharp.backends(), indent=1))"
repo="$PWD"
(cd "$(mktemp -d)" && python -m pytest -q -m gpu -rs "$repo/tests" 2>&1 | tee "$out/gpu-tests.txt")
(cd "$(mktemp -d)" && timeout 300 python -m pytest -q -x "$repo/tests/test_backends.py" 2>&1 | tail -3)
python -m bench.gpu "$@" --json "$out/gpu-bench.json" 2>&1 | tee "$out/gpu-bench.txt"

"""bench.gpu_static's reading of machine code: the SASS parser on canned text (always), and
on a small kernel compiled for sm_90 whose step loop has a known DMMA count (skipped without
NVRTC or cuobjdump/nvdisasm). No GPU is needed."""

from __future__ import annotations

import json

import pytest
from _cases import REPO, bench_module

from pysharp._backends import _nvrtc

gs, gpu_report = bench_module("gpu_static"), bench_module("gpu_report")

SASS = """
	code for sm_90
		Function : k_tile
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   DFMA R4, R2, R2, R4 ;
        /*0020*/                   DMMA.8x8x4 R8, R20, R28, R8 ;
        /*0030*/                   DADD R4, R4, R6 ;
        /*0040*/                   IADD3 R0, R0, 0x1, RZ ;
        /*0050*/              @P0 BRA 0x10 ;
        /*0060*/                   EXIT ;
        /*0070*/                   BRA 0x70;
"""


def test_parser_finds_the_step_loop_and_its_counts():
    funcs = gs.parse_sass(SASS)
    assert list(funcs) == ["k_tile"] and len(funcs["k_tile"]) == 8
    c = gs.step_loop(funcs["k_tile"])
    assert (c.instructions, c.fp64, c.dmma, c.dmma_fma, c.dmma_rows) == (5, 2, 1, 256, 8)
    assert gs.dmma_shape(".8x8x4") == (8, 8, 4) and gs.dmma_shape(".16816") == (16, 8, 16)
    # pipe: 2 x 0.5 + 256 / 128 = 3 clocks > issue 5 / 4: 8 trajectories per warp.
    assert gs.predicted_rate(c, 8) == pytest.approx(132 * 1.98e9 * 8 / 3.0)


SMALL = r"""
extern "C" __global__ void toy_tile_kernel(double* w, int T, double lr) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  double x = w[2 * i], y = w[2 * i + 1], c0 = 0, c1 = 0;
  const double a = 1.0, b = 0.5;
#pragma unroll 1
  for (int t = 0; t < T; ++t) {
    const double d = x - y;
    x -= lr * d;
    y += lr * d;
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
                 : "+d"(c0), "+d"(c1) : "d"(a), "d"(b));
  }
  w[2 * i] = x + c0;
  w[2 * i + 1] = y + c1;
}
"""


def test_a_small_kernel_is_read_from_its_cubin(tmp_path):
    if _nvrtc.unavailable_reason():
        pytest.skip(f"NVRTC unavailable: {_nvrtc.unavailable_reason()}")
    try:
        gs.tool("cuobjdump"), gs.tool("nvdisasm")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    out = _nvrtc.compile_cuda(SMALL, arch="sm_90", include_dirs=[],
                              options=["--ptxas-options=-v"])
    cubin = tmp_path / "small.cubin"
    cubin.write_bytes(out.cubin)
    row = gs.analyse(cubin, out.log, {})["toy_tile_kernel"]
    assert 8 <= row["registers"] <= 64
    assert row["stack_bytes"] == 0 and row["spill_bytes"] == 0
    assert row["dmma_per_step"] == 1          # one mma.sync m8n8k4 per step, not unrolled
    assert 3 <= row["fp64_per_step"] <= 8     # x - y, two FMAs (or MUL + ADD)
    assert 1e10 < row["predicted_traj_steps_per_s"] < 1e12


def test_gpu_report_reads_the_first_runs_log_and_writes_the_table(tmp_path):
    result = gpu_report.from_txt(REPO / "bench" / "results" / "gpu_h200.txt")
    assert result["device"] == "NVIDIA H200" and result["ceilings"] is None
    row = result["rows"]["bn_linreg d40 n20 B1048576 T1000 direct"]
    assert row["pysharp cuda"] == 2.825e8 and row["jax gpu"] == 9.349e8
    doc = tmp_path / "gpu.rst"
    doc.write_text(f"before\n\n{gpu_report.START}\nold\n{gpu_report.END}\n\nafter\n")
    result["ceilings"] = {"fp64_gemm_flops": 6.0e13, "copy_bytes_per_s": 4.2e12, "via": "x"}
    gpu_report.write_table(result, doc)
    text = doc.read_text()
    assert "old" not in text and text.startswith("before") and text.endswith("after\n")
    assert "FP64 GEMM 60.0 TFLOP/s" in text and "0.30x" in text
    # the committed JSON is what the docs' table was generated from
    committed = json.loads((REPO / "bench" / "results" / "gpu_h200.json").read_text())
    assert gpu_report.table(committed) in (REPO / "docs" / "tutorials" / "gpu.rst").read_text()


def test_tile_sources_are_found_by_name_and_host_glue_is_left_out(tmp_path):
    from pysharp._backends import _cuda_sources as cs
    (tmp_path / "bn_tile.cuh").write_text(
        "// pysharp-instantiate: pysharp::tile::step<double, 40>\n__global__ void k() {}\n")
    (tmp_path / "bind_tile.cu").write_text("#include <pybind11/pybind11.h>\n")
    (tmp_path / "kernels.cuh").write_text("")
    assert [p.name for p in cs.tile_sources(tmp_path)] == ["bn_tile.cuh"]
    assert cs.declared_instantiations(tmp_path / "bn_tile.cuh") == [
        "pysharp::tile::step<double, 40>"]
    assert cs.source_text(tmp_path / "bn_tile.cuh") == '#include "cuda/bn_tile.cuh"\n'


def test_committed_tile_figures_are_complete_and_spill_free():
    # bench/results/gpu_static.json as committed: every tile kernel without a stack frame or
    # spill, with its step figures unless its source marks the step's shape as run-time.
    kernels = json.loads((REPO / "bench" / "results" / "gpu_static.json").read_text())["kernels"]
    run_time = gs.run_time_shapes()
    assert "bn_mc_gd_wd_tile_kernel" in run_time
    tiles = {name: row for name, row in kernels.items() if "tile" in name}
    assert {"bn_mc_gd_wd_tile_kernel", "toy3d_gd_wd_tile_kernel"} <= set(tiles)
    for name, row in tiles.items():
        assert row["stack_bytes"] == 0 and row["spill_bytes"] == 0, name
        counted = not any(sub in name for sub in run_time)
        assert (row["fp64_per_step"] is not None) == counted, name
        assert (row["predicted_traj_steps_per_s"] is not None) == counted, name

"""The benchmark suite's "% of peak" is taken against a GEMM ceiling measured in the same run
(issue 31, item 12), with the nominal-clock estimate beside it. No timing is asserted:
only that the ceiling is a positive finite rate and that the fractions use it."""

from __future__ import annotations

import math

import pytest
from _cases import bench_module

_common, suite = bench_module("_common"), bench_module("suite")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gemm_ceiling_is_a_positive_finite_rate(dtype):
    c = _common.gemm_ceiling(dtype, n=96, repeats=1)
    assert c["dtype"] == dtype and c["n"] == 96
    assert math.isfinite(c["gflops"]) and c["gflops"] > 0
    assert c["seconds"] > 0 and c["gflops"] == pytest.approx(2 * 96 ** 3 / c["seconds"] / 1e9)
    blas = c["blas"]
    assert isinstance(blas["env"], dict)
    assert "reason" in blas or blas["internal_api"]  # which BLAS ran, or why unknown


def test_gemm_ceiling_refuses_other_dtypes():
    with pytest.raises(ValueError, match="float32 or float64"):
        _common.gemm_ceiling("int64", n=8)


def test_best_ceilings_keeps_the_faster_run_per_dtype():
    a = {"float64": {"gflops": 100.0}, "float32": {"gflops": 300.0}}
    b = {"float64": {"gflops": 150.0}, "float32": {"gflops": 250.0}}
    best = _common.best_ceilings(a, b)
    assert best["float64"]["gflops"] == 150.0 and best["float32"]["gflops"] == 300.0


def _result():
    ceiling = {"gflops": 200.0, "n": 2048, "blas": {"internal_api": "openblas",
                                                     "version": "0", "architecture": "X",
                                                     "num_threads": 2, "env": {}}}
    return {
        "machine": {"cpu": "cpu", "cores": 2, "peak_fp64_gflops_estimate": 100.0},
        "ceilings": {"float64": ceiling, "float32": dict(ceiling, gflops=500.0)},
        "pysharp": {"row": {"rate": 1e6}, "row float32": {"rate": 2e6}, "other": {"rate": 5.0}},
        "flops_per_unit": {"row": 1e5, "row float32": 1e5},
    }


def test_fractions_are_against_the_measured_ceiling_with_the_nominal_beside_it():
    result = _result()
    # 1e6 units/s x 1e5 flops = 100 GFLOP/s: half the DGEMM ceiling, all the nominal peak.
    assert suite.fractions(result, "row", 1e6) == pytest.approx((0.5, 1.0))
    # float32: against the SGEMM ceiling (500) and twice the nominal FP64 peak (200).
    assert suite.fractions(result, "row float32", 2e6) == pytest.approx((0.4, 1.0))
    assert suite.fractions(result, "other", 5.0) == (None, None)  # no FLOP count
    table = suite.table(result)
    assert "% of GEMM ceiling (of nominal peak)" in table
    assert "| 50.0% (100.0%) |" in table and "| 40.0% (100.0%) |" in table
    assert "DGEMM 200 GFLOP/s, SGEMM 500 GFLOP/s" in suite.ceiling_note(result)


def test_a_result_without_ceilings_keeps_the_nominal_column():
    result = _result()
    del result["ceilings"]
    assert suite.fractions(result, "row", 1e6) == (None, pytest.approx(1.0))
    assert "| % of peak |" in suite.table(result) and suite.ceiling_note(result) == ""


def test_peak_fraction_refuses_a_non_positive_ceiling():
    with pytest.raises(ValueError, match="positive"):
        _common.peak_fraction(1.0, 1.0, 0.0)


@pytest.mark.parametrize("target, runnable, cpu, expect", [
    ("avx2", ["sse2", "avx2", "avx512"], None, "avx2"),  # portable: an AVX2 core, AVX-512 CPU
    ("avx512", ["sse2", "avx2", "avx512"], None, None),  # the CPU's best: nothing to hold
    ("native", ["native"], "avx512", None),              # a -march=native build
    ("sse2", ["sse2"], "sse2", None),                    # a CPU without AVX
    ("avx2", ["avx2"], "avx512", "avx2"),                # PYSHARP_MARCH=x86-64-v3, AVX-512 CPU
    ("avx2", ["avx2"], "avx2", None),                    # the same build on an AVX2 CPU
])
def test_the_peers_are_held_only_to_a_narrower_core(target, runnable, cpu, expect):
    class Build:
        @staticmethod
        def build_info():
            return {"cpu_target": target, "cpu_targets_runnable": runnable}

    assert suite.narrower_target(Build, cpu_best=cpu) == expect
    if expect:
        xla, numba = suite.PEER_ISA[expect]
        assert xla == "AVX2" and numba == "haswell"


def test_the_cpus_best_set_is_one_of_the_cores():
    assert suite.cpu_best_target() in (*suite.OPENBLAS_CORETYPE, None)

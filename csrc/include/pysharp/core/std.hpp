// The few standard-library names the device-reachable headers use, for every compiler
// that builds them: g++/clang and nvcc get the standard headers; NVRTC (the CuPy
// backend, pysharp/_backends/_nvrtc.py), which has no C++ standard library, gets libcu++'s
// <cuda/std/...> (PyPI nvidia-cuda-cccl) with the names used made visible in std.
//
// A header reachable from csrc/cuda/kernels.cuh includes this file instead of <cmath>,
// <cstdint>, <type_traits> or <utility>. A new std name in such a header belongs in
// the list below; tests/backends/test_nvrtc.py fails until it is there. Math functions are
// called unqualified (sqrt, exp, frexp, ...): NVRTC provides them as built-ins; std::sqrt
// and std::fma (the tile headers) are mapped to those built-ins too.
#pragma once

#if defined(__CUDACC_RTC__)

#include <cuda/std/cstdint>
#include <cuda/std/limits>
#include <cuda/std/type_traits>
#include <cuda/std/utility>

namespace std {
using ::cuda::std::int32_t;
using ::cuda::std::int64_t;
using ::cuda::std::uint8_t;
using ::cuda::std::uint32_t;
using ::cuda::std::uint64_t;

using ::cuda::std::decay_t;
using ::cuda::std::declval;
using ::cuda::std::enable_if_t;
using ::cuda::std::false_type;
using ::cuda::std::integral_constant;
using ::cuda::std::is_arithmetic;
using ::cuda::std::is_same;
using ::cuda::std::remove_const_t;
using ::cuda::std::remove_pointer_t;
using ::cuda::std::true_type;
using ::cuda::std::void_t;

// NVRTC's built-in math (no header needed), not libcu++'s: cuda::std::fma is missing from
// the libcu++ of some toolkits (13.0), which NVRTC may find before the PyPI wheel's.
__device__ inline double fma(double a, double b, double c) { return ::fma(a, b, c); }
__device__ inline float fma(float a, float b, float c) { return ::fmaf(a, b, c); }
__device__ inline double sqrt(double x) { return ::sqrt(x); }
__device__ inline float sqrt(float x) { return ::sqrtf(x); }
}  // namespace std

// NVRTC's front end has no __builtin_nan (g++, clang and nvcc do); a quiet NaN stands in.
#define __builtin_nan(tag) (::cuda::std::numeric_limits<double>::quiet_NaN())

#else

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#endif

// Portability layer shared by the host (C++) and device (CUDA) builds.
//
// Every function in the math headers is marked PYSHARP_HD so that the CUDA
// kernels include exactly the code the CPU drivers run: one source of truth.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define PYSHARP_HD __host__ __device__
#else
#define PYSHARP_HD
#endif

namespace pysharp {

// Unqualified sqrt resolves to the CUDA device overloads under nvcc and to
// <cmath> on the host; the Jet overloads (core/jet.hpp) join by ADL.
PYSHARP_HD inline double sqrt_(double x) { return sqrt(x); }
PYSHARP_HD inline float sqrt_(float x) { return sqrtf(x); }

// The plain value of a scalar or of a Jet (defined there); used to test
// degeneracy (a zero normaliser) on the value part only.
PYSHARP_HD inline double value_of(double x) { return x; }
PYSHARP_HD inline float value_of(float x) { return x; }

// Unit roundoff of a real type (numeric_limits is not usable in device code
// without relaxed constexpr).
template <class Real>
PYSHARP_HD constexpr Real machine_eps() {
  return sizeof(Real) == 8 ? Real(2.220446049250313e-16) : Real(1.1920929e-7);
}

}  // namespace pysharp

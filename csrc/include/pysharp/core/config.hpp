// Portability layer shared by the host (C++) and device (CUDA) builds.
//
// Every function in the math headers is marked PYSHARP_HD so that the CUDA
// kernels include exactly the code the CPU drivers run: one source of truth.
#pragma once

#include "pysharp/core/std.hpp"

#if defined(__CUDACC__)
#define PYSHARP_HD __host__ __device__
#else
#define PYSHARP_HD
#endif

// Placed after a lambda's parameter list: inline it into its caller whatever
// the compiler's size heuristics say (host builds; nvcc inlines device code).
#if defined(__CUDACC__)
#define PYSHARP_INLINE_LAMBDA
#else
#define PYSHARP_INLINE_LAMBDA __attribute__((always_inline))
#endif

namespace pysharp {

// Unqualified sqrt resolves to the CUDA device overloads under nvcc and to
// <cmath> on the host; the Jet overloads (core/jet.hpp) join by ADL.
PYSHARP_HD inline double sqrt_(double x) { return sqrt(x); }
PYSHARP_HD inline float sqrt_(float x) { return sqrtf(x); }

// 2^-e with |x| 2^-e in [0.5, 1) (1 for x = 0): multiplying by it brings x to
// order one exactly. inf for |x| below 2^-1024 (float: 2^-128), unspecified
// for non-finite x.
PYSHARP_HD inline double inverse_binade(double x) {
  int e = 0;
  frexp(x, &e);
  return ldexp(1.0, -e);
}
PYSHARP_HD inline float inverse_binade(float x) {
  int e = 0;
  frexpf(x, &e);
  return ldexpf(1.0f, -e);
}

// Squared norms of w between lo and hi keep every model's intermediate values normal: the
// kernels (cpu/batched.hpp) and the engine (engine/trajectory.hpp) evaluate a w outside
// on w 2^-e instead, exact by scale invariance.
template <class Real>
struct SafeNorm2;
template <>
struct SafeNorm2<double> {
  static constexpr double lo = 0x1p-300, hi = 0x1p300;
};
template <>
struct SafeNorm2<float> {
  static constexpr float lo = 0x1p-24f, hi = 0x1p24f;
};

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

// The value type, lane count and truth-value type of a scalar, a jet or a
// lane block (core/lanes.hpp). A model's loss_grad returns mask_t<S>: bool for
// one problem, one flag per lane for a block, so "undefined here" never
// branches on data that differs between lanes.
template <class V>
struct lane_traits {
  static constexpr int width = 1;
  using real = V;
  using mask = bool;
};
template <class S>
using mask_t = typename lane_traits<S>::mask;
template <class V>
using lane_real_t = typename lane_traits<V>::real;
template <class V>
inline constexpr int lane_width = lane_traits<V>::width;

template <class T>
PYSHARP_HD T select(bool m, const T& a, const T& b) {
  return m ? a : b;
}
PYSHARP_HD inline bool any(bool m) { return m; }

// Per lane: not NaN and not infinite.
template <class V>
PYSHARP_HD mask_t<V> is_finite(const V& x) {
  return x - x == V(0);
}

// Sum of a[i] b[i] in index order, lane by lane.
template <class V>
PYSHARP_HD V lane_dot(const V* a, const V* b, int n) {
  V s = V(0);
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Lane l of a value or a truth value; for a plain scalar (one lane) itself.
// core/lanes.hpp overloads these for lane blocks.
template <class T>
PYSHARP_HD T lane(const T& x, int /*l*/) {
  return x;
}
template <class T, class U>
PYSHARP_HD void set_lane(T& x, int /*l*/, const U& value) {
  x = value;
}

// Parameter groups: a model whose loss is invariant to the scale of each of G
// contiguous blocks of w separately declares n_groups() = G, and the engine
// records each block's squared norm. The blocks are equal (D / G values each:
// BNTwoLayerNet's rows) unless the model also declares
// `int group_begin(int k) const`, the offset of block k for 0 <= k <= G
// (0 at k = 0, D at k = G, increasing: a weight-normalised layer of 30 weights
// and a readout of 6 are blocks [0, 30) and [30, 36)). Every other model is one
// group. Block k is w[group_begin(m, k), group_begin(m, k + 1)).
template <class M, class = void>
struct has_groups : std::false_type {};
template <class M>
struct has_groups<M, std::void_t<decltype(std::declval<const M&>().n_groups())>>
    : std::true_type {};
template <class M, class = void>
struct has_group_begin : std::false_type {};
template <class M>
struct has_group_begin<M, std::void_t<decltype(std::declval<const M&>().group_begin(0))>>
    : std::true_type {};
template <class M>
PYSHARP_HD int n_groups(const M& m) {
  if constexpr (has_groups<M>::value)
    return m.n_groups();
  else
    return 1;
}
template <class M>
PYSHARP_HD int group_begin(const M& m, int k) {
  static_assert(!has_group_begin<M>::value || has_groups<M>::value,
                "a model that declares group_begin(k) declares n_groups() too");
  if constexpr (has_group_begin<M>::value)
    return m.group_begin(k);
  else
    return k * (m.dim() / n_groups(m));
}

}  // namespace pysharp

// Lanes<Real, W>: one value of W independent problems (trajectories, points),
// one per SIMD lane. Host only.
//
// The models' templated loss_grad is instantiated on Lanes exactly as it is on
// jets: one source gives scalar, jet, lane and jet-of-lane code. Every
// operation is element-wise, so lane l of a result depends on lane l of the
// inputs alone: a problem gets the same bits in any lane of any block, which
// is what makes results independent of batch placement, chunking and threads.
//
// Built on GCC/Clang vector extensions rather than std::experimental::simd,
// xsimd or Highway: no dependency, the same code on every compiler the project
// supports, and the vector ISA chosen by the build flags (-march). nvcc never
// sees this file: a CUDA thread is one lane (W = 1, plain Real).
#pragma once

#if defined(__CUDACC__)
#error "lanes.hpp is host-only: CUDA threads run the scalar (W = 1) instantiation"
#endif

#include <cmath>
#include <cstdint>

#include "pysharp/core/config.hpp"

namespace pysharp {

// Bytes of the widest vector register the build targets.
#if defined(__AVX512F__)
inline constexpr int kSimdBytes = 64;
#elif defined(__AVX__)
inline constexpr int kSimdBytes = 32;
#else
inline constexpr int kSimdBytes = 16;
#endif

// Lanes per block for a real type: one vector register's worth.
template <class Real>
inline constexpr int kNativeLanes = kSimdBytes / static_cast<int>(sizeof(Real));

template <class Real, int W>
struct LaneMask;

// The compiler's vector of Bytes / sizeof(Real) Reals (GCC/Clang extension).
// Spelled out per size: GCC drops vector_size on a dependent alias.
template <class Real, int Bytes>
struct simd_vector;
#define PYSHARP_SIMD_VECTOR(REAL, BYTES)                            \
  template <>                                                      \
  struct simd_vector<REAL, BYTES> {                                \
    typedef REAL type __attribute__((vector_size(BYTES)));         \
  };
PYSHARP_SIMD_VECTOR(double, 16)
PYSHARP_SIMD_VECTOR(double, 32)
PYSHARP_SIMD_VECTOR(double, 64)
PYSHARP_SIMD_VECTOR(float, 16)
PYSHARP_SIMD_VECTOR(float, 32)
PYSHARP_SIMD_VECTOR(float, 64)
#undef PYSHARP_SIMD_VECTOR

template <class Real, int W>
struct Lanes {
  using vec = typename simd_vector<Real, W * static_cast<int>(sizeof(Real))>::type;
  vec v;

  Lanes() = default;
  Lanes(Real s) : v(vec{} + s) {}  // NOLINT: implicit, a constant is the same in every lane
  explicit Lanes(vec x) : v(x) {}

  Real operator[](int l) const { return v[l]; }
  void set(int l, Real x) { v[l] = x; }

  Lanes& operator+=(const Lanes& o) { v += o.v; return *this; }
  Lanes& operator-=(const Lanes& o) { v -= o.v; return *this; }
  Lanes& operator*=(const Lanes& o) { v *= o.v; return *this; }
  Lanes& operator/=(const Lanes& o) { v /= o.v; return *this; }

  friend Lanes operator-(const Lanes& a) { return Lanes(-a.v); }
  friend Lanes operator+(const Lanes& a, const Lanes& b) { return Lanes(a.v + b.v); }
  friend Lanes operator-(const Lanes& a, const Lanes& b) { return Lanes(a.v - b.v); }
  friend Lanes operator*(const Lanes& a, const Lanes& b) { return Lanes(a.v * b.v); }
  friend Lanes operator/(const Lanes& a, const Lanes& b) { return Lanes(a.v / b.v); }
  friend Lanes operator+(const Lanes& a, Real s) { return Lanes(a.v + s); }
  friend Lanes operator-(const Lanes& a, Real s) { return Lanes(a.v - s); }
  friend Lanes operator*(const Lanes& a, Real s) { return Lanes(a.v * s); }
  friend Lanes operator/(const Lanes& a, Real s) { return Lanes(a.v / s); }
  friend Lanes operator+(Real s, const Lanes& a) { return Lanes(s + a.v); }
  friend Lanes operator-(Real s, const Lanes& a) { return Lanes(s - a.v); }
  friend Lanes operator*(Real s, const Lanes& a) { return Lanes(s * a.v); }
  friend Lanes operator/(Real s, const Lanes& a) { return Lanes(s / a.v); }

  // A hidden friend (found by argument-dependent lookup only), so that it does
  // not hide ::fabs for plain scalars inside namespace pysharp.
  friend Lanes fabs(const Lanes& a) {
    Lanes r;
    for (int l = 0; l < W; ++l) r.v[l] = std::fabs(a.v[l]);  // vectorised: a sign-bit mask
    return r;
  }

  friend LaneMask<Real, W> operator<(const Lanes& a, const Lanes& b) { return {a.v < b.v}; }
  friend LaneMask<Real, W> operator>(const Lanes& a, const Lanes& b) { return {a.v > b.v}; }
  friend LaneMask<Real, W> operator<=(const Lanes& a, const Lanes& b) { return {a.v <= b.v}; }
  friend LaneMask<Real, W> operator>=(const Lanes& a, const Lanes& b) { return {a.v >= b.v}; }
  friend LaneMask<Real, W> operator==(const Lanes& a, const Lanes& b) { return {a.v == b.v}; }
};

// Per-lane truth values, as the comparison of two Lanes gives them (all bits
// set or clear in each lane).
template <class Real, int W>
struct LaneMask {
  using ivec = decltype(typename Lanes<Real, W>::vec{} < typename Lanes<Real, W>::vec{});
  ivec m;

  LaneMask() = default;
  LaneMask(ivec x) : m(x) {}  // NOLINT
  LaneMask(bool b) : m(ivec{} - static_cast<int>(b)) {}  // NOLINT: the same in every lane

  bool operator[](int l) const { return m[l] != 0; }
  void set(int l, bool b) { m[l] = b ? -1 : 0; }

  friend LaneMask operator&(const LaneMask& a, const LaneMask& b) { return {a.m & b.m}; }
  friend LaneMask operator|(const LaneMask& a, const LaneMask& b) { return {a.m | b.m}; }
  friend LaneMask operator!(const LaneMask& a) { return {~a.m}; }
};

template <class Real, int W>
[[gnu::always_inline]] inline Lanes<Real, W> sqrt_(const Lanes<Real, W>& a) {
  Lanes<Real, W> r;
  for (int l = 0; l < W; ++l) r.v[l] = std::sqrt(a.v[l]);  // vectorised: -fno-math-errno
  return r;
}
template <class Real, int W>
Lanes<Real, W> tanh_(const Lanes<Real, W>& a) {
  Lanes<Real, W> r;
  for (int l = 0; l < W; ++l) r.v[l] = std::tanh(a.v[l]);
  return r;
}

template <class Real, int W>
Lanes<Real, W> value_of(const Lanes<Real, W>& a) {
  return a;
}

template <class Real, int W>
Lanes<Real, W> select(const LaneMask<Real, W>& m, const Lanes<Real, W>& a,
                      const Lanes<Real, W>& b) {
  return Lanes<Real, W>(m.m ? a.v : b.v);
}

template <class Real, int W>
bool any(const LaneMask<Real, W>& m) {
  for (int l = 0; l < W; ++l)
    if (m.m[l]) return true;
  return false;
}

template <class Real, int W>
Real lane(const Lanes<Real, W>& x, int l) {
  return x.v[l];
}
template <class Real, int W>
void set_lane(Lanes<Real, W>& x, int l, Real value) {
  x.v[l] = value;
}
template <class Real, int W>
bool lane(const LaneMask<Real, W>& x, int l) {
  return x.m[l] != 0;
}
template <class Real, int W>
void set_lane(LaneMask<Real, W>& x, int l, bool value) {
  x.m[l] = value ? -1 : 0;
}

template <class Real, int W>
struct lane_traits<Lanes<Real, W>> {
  static constexpr int width = W;
  using real = Real;
  using mask = LaneMask<Real, W>;
};

}  // namespace pysharp

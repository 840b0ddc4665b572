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

#if defined(__AVX__)  // implied by __AVX512F__
#include <immintrin.h>
#endif

namespace pysharp {

// Bytes of the widest vector register the build targets, and how many such registers there
// are (AVX-512 and NEON have 32; AVX and SSE 16). The register blocks of the kernels are
// sized from them (core/dense.hpp, cpu/bn_linreg_rows.hpp, cpu/engine.hpp).
#if defined(__AVX512F__)
inline constexpr int kSimdBytes = 64;
inline constexpr int kSimdRegisters = 32;
#elif defined(__AVX__)
inline constexpr int kSimdBytes = 32;
inline constexpr int kSimdRegisters = 16;
#elif defined(__aarch64__)
inline constexpr int kSimdBytes = 16;
inline constexpr int kSimdRegisters = 32;
#else
inline constexpr int kSimdBytes = 16;
inline constexpr int kSimdRegisters = 16;
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
  // NOLINTNEXTLINE: implicit, a constant is the same in every lane. s - 0 is
  // s exactly (-0 included), so it compiles to a bare broadcast that folds
  // into a multiply-add's memory operand; 0 + s would need a real add.
  Lanes(Real s) : v(s - vec{}) {}
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
  friend LaneMask<Real, W> operator!=(const Lanes& a, const Lanes& b) { return {a.v != b.v}; }
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

namespace detail {
// One vector square root per register. GCC's vectoriser split the plain
// per-lane loop on 8 doubles into 128-bit and scalar pieces through the stack.
// Correctly rounded either way, so the bits do not depend on the form.
#if defined(__AVX512F__)
inline __m512d vector_sqrt(__m512d x) { return _mm512_sqrt_pd(x); }
inline __m512 vector_sqrt(__m512 x) { return _mm512_sqrt_ps(x); }
#endif
#if defined(__AVX__)
inline __m256d vector_sqrt(__m256d x) { return _mm256_sqrt_pd(x); }
inline __m256 vector_sqrt(__m256 x) { return _mm256_sqrt_ps(x); }
#endif
template <class Vec>
Vec vector_sqrt(Vec) = delete;  // the name for builds without the above; never chosen
template <class Vec>
inline constexpr bool has_vector_sqrt =
#if defined(__AVX512F__)
    sizeof(Vec) == 64 ||
#endif
#if defined(__AVX__)
    sizeof(Vec) == 32 ||
#endif
    false;
}  // namespace detail

template <class Real, int W>
[[gnu::always_inline]] inline Lanes<Real, W> sqrt_(const Lanes<Real, W>& a) {
  using vec = typename Lanes<Real, W>::vec;
  if constexpr (detail::has_vector_sqrt<vec>) {
    return Lanes<Real, W>(vec(detail::vector_sqrt(a.v)));
  } else {
    Lanes<Real, W> r;
    for (int l = 0; l < W; ++l) r.v[l] = std::sqrt(a.v[l]);
    return r;
  }
}
// Elementary functions without a vector instruction: lane by lane through <cmath>,
// except exp_, expm1_, log_, log1p_, tanh_, sin_ and cos_ on doubles (core/lane_math.hpp,
// included at the end).
#define PYSHARP_LANEWISE(name, fn)                        \
  template <class Real, int W>                            \
  Lanes<Real, W> name(const Lanes<Real, W>& a) {          \
    Lanes<Real, W> r;                                     \
    for (int l = 0; l < W; ++l) r.v[l] = std::fn(a.v[l]); \
    return r;                                             \
  }
PYSHARP_LANEWISE(tanh_, tanh)
PYSHARP_LANEWISE(exp_, exp)
PYSHARP_LANEWISE(expm1_, expm1)
PYSHARP_LANEWISE(log_, log)
PYSHARP_LANEWISE(log1p_, log1p)
PYSHARP_LANEWISE(sin_, sin)
PYSHARP_LANEWISE(cos_, cos)
#undef PYSHARP_LANEWISE

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

namespace detail {
// Columns k0 .. d - 1 of gather_lanes / scatter_lanes, element by element: the
// whole of the general case, the tail after the tiles of the specialisations.
template <class V>
void gather_columns(const lane_real_t<V>* const* row, int k0, int d, V* x) {
  for (int k = k0; k < d; ++k)
    for (int l = 0; l < lane_width<V>; ++l) set_lane(x[k], l, row[l][k]);
}
template <class V>
void scatter_columns(const V* x, int k0, int d, lane_real_t<V>* const* row) {
  for (int l = 0; l < lane_width<V>; ++l)
    for (int k = k0; k < d; ++k) row[l][k] = lane(x[k], l);
}
}  // namespace detail

// Lane form of W rows: lane l of x[k] = row[l][k] for k < d (a transposition).
// Specialised below for AVX doubles (4 x 4 tiles) and AVX-512 doubles (8 x 8).
template <class V>
void gather_lanes(const lane_real_t<V>* const* row, int d, V* x) {
  detail::gather_columns(row, 0, d, x);
}
// The inverse: row[l][k] = lane l of x[k] for k < d and every lane.
template <class V>
void scatter_lanes(const V* x, int d, lane_real_t<V>* const* row) {
  detail::scatter_columns(x, 0, d, row);
}

#if defined(__AVX__)
namespace detail {
// Two 128-bit loads into one register: lo[0] lo[1] | hi[0] hi[1].
inline __m256d load_pair(const double* lo, const double* hi) {
  return _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_loadu_pd(lo)), _mm_loadu_pd(hi), 1);
}
// The transpose of a 4 x 4 tile held in four registers (rows in, columns out).
inline void transpose4(const __m256d a, const __m256d b, const __m256d c, const __m256d e,
                       __m256d* out) {
  const __m256d t0 = _mm256_unpacklo_pd(a, b), t1 = _mm256_unpackhi_pd(a, b);
  const __m256d t2 = _mm256_unpacklo_pd(c, e), t3 = _mm256_unpackhi_pd(c, e);
  out[0] = _mm256_permute2f128_pd(t0, t2, 0x20);
  out[1] = _mm256_permute2f128_pd(t1, t3, 0x20);
  out[2] = _mm256_permute2f128_pd(t0, t2, 0x31);
  out[3] = _mm256_permute2f128_pd(t1, t3, 0x31);
}
}  // namespace detail

// Four rows of doubles, 4 x 4 at a time: two 128-bit loads per register and one
// in-lane unpack per output instead of an insert per element.
template <>
inline void gather_lanes<Lanes<double, 4>>(const double* const* row, int d, Lanes<double, 4>* x) {
  int k = 0;
  for (; k + 4 <= d; k += 4) {
    const __m256d a = detail::load_pair(row[0] + k, row[2] + k);
    const __m256d b = detail::load_pair(row[1] + k, row[3] + k);
    const __m256d c = detail::load_pair(row[0] + k + 2, row[2] + k + 2);
    const __m256d e = detail::load_pair(row[1] + k + 2, row[3] + k + 2);
    x[k].v = _mm256_unpacklo_pd(a, b);  // row0[k] row1[k] | row2[k] row3[k]
    x[k + 1].v = _mm256_unpackhi_pd(a, b);
    x[k + 2].v = _mm256_unpacklo_pd(c, e);
    x[k + 3].v = _mm256_unpackhi_pd(c, e);
  }
  detail::gather_columns(row, k, d, x);
}
template <>
inline void scatter_lanes<Lanes<double, 4>>(const Lanes<double, 4>* x, int d,
                                            double* const* row) {
  int k = 0;
  for (; k + 4 <= d; k += 4) {
    __m256d r[4];
    detail::transpose4(x[k].v, x[k + 1].v, x[k + 2].v, x[k + 3].v, r);
    for (int l = 0; l < 4; ++l) _mm256_storeu_pd(row[l] + k, r[l]);
  }
  detail::scatter_columns(x, k, d, row);
}
#endif

#if defined(__AVX512F__)
namespace detail {
// The transpose of an 8 x 8 tile in eight registers: pairs interleaved
// (unpack), then 128-bit quarters regrouped twice (shuffle), 24 shuffles.
inline void transpose8(const __m512d* r, __m512d* out) {
  __m512d t[8], u[8];
  for (int l = 0; l < 8; l += 2) {
    t[l] = _mm512_unpacklo_pd(r[l], r[l + 1]);      // r_l[0] r_l+1[0] r_l[2] r_l+1[2] ...
    t[l + 1] = _mm512_unpackhi_pd(r[l], r[l + 1]);  // the odd columns
  }
  // u: quarters 0, 2 (0x88) or 1, 3 (0xdd) of two pairs: columns {c, c + 4} of four rows
  for (int h = 0; h < 2; ++h) {
    u[4 * h + 0] = _mm512_shuffle_f64x2(t[4 * h], t[4 * h + 2], 0x88);      // cols 0, 4
    u[4 * h + 1] = _mm512_shuffle_f64x2(t[4 * h], t[4 * h + 2], 0xdd);      // cols 2, 6
    u[4 * h + 2] = _mm512_shuffle_f64x2(t[4 * h + 1], t[4 * h + 3], 0x88);  // cols 1, 5
    u[4 * h + 3] = _mm512_shuffle_f64x2(t[4 * h + 1], t[4 * h + 3], 0xdd);  // cols 3, 7
  }
  constexpr int col[4] = {0, 2, 1, 3};
  for (int q = 0; q < 4; ++q) {
    out[col[q]] = _mm512_shuffle_f64x2(u[q], u[4 + q], 0x88);
    out[col[q] + 4] = _mm512_shuffle_f64x2(u[q], u[4 + q], 0xdd);
  }
}
}  // namespace detail

template <>
inline void gather_lanes<Lanes<double, 8>>(const double* const* row, int d, Lanes<double, 8>* x) {
  int k = 0;
  for (; k + 8 <= d; k += 8) {
    __m512d r[8], c[8];
    for (int l = 0; l < 8; ++l) r[l] = _mm512_loadu_pd(row[l] + k);
    detail::transpose8(r, c);
    for (int j = 0; j < 8; ++j) x[k + j].v = c[j];
  }
  detail::gather_columns(row, k, d, x);
}
template <>
inline void scatter_lanes<Lanes<double, 8>>(const Lanes<double, 8>* x, int d,
                                            double* const* row) {
  int k = 0;
  for (; k + 8 <= d; k += 8) {
    __m512d c[8], r[8];
    for (int j = 0; j < 8; ++j) c[j] = x[k + j].v;
    detail::transpose8(c, r);
    for (int l = 0; l < 8; ++l) _mm512_storeu_pd(row[l] + k, r[l]);
  }
  detail::scatter_columns(x, k, d, row);
}
#endif

}  // namespace pysharp

// exp_, log_ and tanh_ on lane blocks of doubles in vector arithmetic.
#include "pysharp/core/lane_math.hpp"

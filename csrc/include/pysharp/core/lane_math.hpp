// exp, expm1, log, log1p, tanh, sin and cos on lane blocks of doubles, in vector
// arithmetic. Host only.
//
// <cmath> has no vector forms, and calling it lane by lane cost the BN two-layer
// net four fifths of its run time (a tanh per sample, unit and step). These are
// branch-free polynomial kernels: every operation is element-wise, so a lane's
// result depends on its own input alone (the bits do not depend on placement),
// and the same code runs for every vector width. Float lanes and plain scalars
// keep <cmath> (lanes.hpp, activation.hpp): the two forms of a function may
// differ in the last bit, which no comparison across code paths notices (those
// compare to a tolerance; see docs/conventions.rst).
//
// Accuracy, measured against long-double references by tests/csrc/test_lane_math.py:
// exp and log within 1 ulp and tanh within 1.5 ulp, on the whole double range, expm1 within
// 2, log1p within 1.5 and sin and cos within 1 (beyond 2^19 they are <cmath>'s), with NaN,
// +-inf, -0 and subnormals handled as <cmath> does.
//
// The method. exp: x = k ln2 + r with |r| <= ln2/2 (Cody-Waite: ln2 split in a
// part whose product with k is exact and a small rest), exp(r) - 1 by its Taylor
// polynomial, then the exact scaling by 2^k in two halves (so that k reaches the
// subnormal range without leaving the exponent field). tanh, odd to the bit (the
// sign of x is copied back): for |x| < 3/8 its Taylor polynomial to degree 29 (the
// first omitted term is below 2^-62 |x|); above, e / (e + 2), or 1 - 2 / (e + 2)
// once tanh >= 1/2, with e = expm1(2|x|) by the same reduction as exp (2^k e^r - 1,
// k >= 1 there, so no cancellation).
// Both branches are computed and one selected per lane.
#pragma once

#include <cstdint>

#include "pysharp/core/lanes.hpp"

namespace pysharp {
namespace detail {

// 1/k! correctly rounded (k! is exact in a double up to 22!).
constexpr double inv_factorial(int k) {
  double f = 1.0;
  for (int i = 2; i <= k; ++i) f *= i;
  return 1.0 / f;
}

// exp(r) - 1 for |r| <= ln2/2: r + r^2 (1/2! + r (1/3! + ... + r / 13!)); the first
// omitted term, (ln2/2)^14 / 14!, is below 2^-56 r.
template <class Vec>
[[gnu::always_inline]] inline Vec expm1_taylor(Vec r) {
  constexpr int kDegree = 13;
  Vec q = r * inv_factorial(kDegree) + inv_factorial(kDegree - 1);
  for (int k = kDegree - 2; k >= 2; --k) q = q * r + inv_factorial(k);
  return r + (r * r) * q;
}

// tanh's Taylor coefficients of x^3, x^5, ..., x^29, 2^2n (2^2n - 1) B_2n / (2n)!
// with B the Bernoulli numbers, correctly rounded.
inline constexpr double kTanhTaylor[14] = {
    -0x1.5555555555555p-2, 0x1.1111111111111p-3,  -0x1.ba1ba1ba1ba1cp-5,
    0x1.664f4882c10fap-6,  -0x1.226e355e6c23dp-7, 0x1.d6d3d0e157de0p-9,
    -0x1.7da36452b75e3p-10, 0x1.3558248036744p-11, -0x1.f57d7734d1664p-13,
    0x1.967e18afcafadp-14, -0x1.497d8eea25259p-15, 0x1.0b132d39a6050p-16,
    -0x1.b0f72d3ee24e9p-18, 0x1.5ef2da474e5b7p-19};

// ln 2 = kLn2Hi + kLn2Lo, kLn2Hi with 32 trailing zero bits (k kLn2Hi exact for |k| < 2^20).
inline constexpr double kLn2Hi = 0x1.62e42fefa0000p-1;
inline constexpr double kLn2Lo = 0x1.cf79abc9e3b3ap-40;
inline constexpr double kLog2e = 0x1.71547652b82fep0;
// Adding 1.5 * 2^52 rounds to an integer held in the low mantissa bits.
inline constexpr double kRoundShift = 0x1.8p52;

// x = k ln2 + r with k the nearest integer to x / ln2 (|r| <= ln2/2), k read from the
// rounding shift's low mantissa bits and r by Cody-Waite. |x| < 2^19.
template <class Vec>
struct Ln2Reduction {
  decltype(Vec{} < Vec{}) k;
  Vec r;
};
template <class Vec>
[[gnu::always_inline]] inline Ln2Reduction<Vec> reduce_ln2(Vec x) {
  using IVec = decltype(Vec{} < Vec{});
  const Vec t = x * kLog2e + kRoundShift;
  const Vec kd = t - kRoundShift;
  return {(IVec)t - (IVec)(Vec{} + kRoundShift), (x - kd * kLn2Hi) - kd * kLn2Lo};
}

// 2^k for integer-valued k in [-1022, 1023], built in the exponent field.
template <class Vec, class IVec>
[[gnu::always_inline]] inline Vec pow2(IVec k) {
  return (Vec)((k + 1023) << 52);
}

// pi/2 = kPio2Hi + kPio2Mid + kPio2Lo (the first two with 33 significant bits, so k times
// either is exact for |k| < 2^20; the rest is below 2^-122), and 2/pi.
inline constexpr double kPio2Hi = 0x1.921fb54400000p+0;
inline constexpr double kPio2Mid = 0x1.0b4611a600000p-34;
inline constexpr double kPio2Lo = 0x1.3198a2e037073p-69;
inline constexpr double k2OverPi = 0x1.45f306dc9c883p-1;

// sin and cos of r + c for |r| <= pi/4, c a tail below half an ulp of r, by the Taylor
// polynomials in z = r^2: sin to r^19 and cos to r^18 (the first omitted terms, (pi/4)^21 /
// 21! and (pi/4)^20 / 20!, are below 2^-56 of the result), with the tail to first order
// (sin: + c cos r, cos: - c sin r). cos = w + ((1 - w) - z/2 + z^2 Q - r c) with w = 1 - z/2:
// the bracket recovers w's rounding, so the large cancellation costs nothing.
template <class Vec>
struct SinCos {
  Vec s, c;
};
template <class Vec>
[[gnu::always_inline]] inline SinCos<Vec> sincos_taylor(Vec r, Vec c) {
  const Vec z = r * r;
  Vec p = Vec{} - inv_factorial(19);
  for (int k = 17; k >= 3; k -= 2) p = p * z + ((k / 2) % 2 ? -inv_factorial(k) : inv_factorial(k));
  Vec q = Vec{} - inv_factorial(18);
  for (int k = 16; k >= 4; k -= 2) q = q * z + ((k / 2) % 2 ? -inv_factorial(k) : inv_factorial(k));
  const Vec hz = 0.5 * z;
  const Vec w = 1.0 - hz;
  return {r + (c * (1.0 - hz) + r * (z * p)), w + (((1.0 - w) - hz) + ((z * z) * q - r * c))};
}

// sin (cosine = false) or cos of lane blocks: x = k pi/2 + r, |r| <= pi/4 (Cody-Waite in
// three parts), then the quadrant k mod 4 picks +-sin r or +-cos r. Lanes with |x| >= 2^19
// (where the reduction would need more parts) or not finite go through <cmath>.
template <bool cosine, int W>
Lanes<double, W> sin_or_cos(const Lanes<double, W>& a) {
  using vec = typename Lanes<double, W>::vec;
  using ivec = decltype(vec{} < vec{});
  const vec x = a.v;
  const ivec sign_bit = ivec{} + INT64_MIN;
  const vec ax = (vec)((ivec)x & ~sign_bit);
  const ivec far = (ax >= 0x1p19) | (x != x);
  const vec xr = far ? vec{} : x;
  const vec t = xr * k2OverPi + kRoundShift;
  const vec kd = t - kRoundShift;
  const ivec k = (ivec)t - (ivec)(vec{} + kRoundShift);
  // r + c = x - k pi/2: y0 exact (Sterbenz), r1 = y0 - k kPio2Mid with its rounding e1
  // recovered exactly, then the last part.
  const vec y0 = xr - kd * kPio2Hi;
  const vec t1 = kd * kPio2Mid;
  const vec r1 = y0 - t1;
  const vec tail = ((y0 - r1) - t1) - kd * kPio2Lo;
  const vec r = r1 + tail;
  const SinCos<vec> sc = sincos_taylor(r, (r1 - r) + tail);
  const ivec quadrant = cosine ? k + 1 : k;  // cos x = sin(x + pi/2)
  vec y = (quadrant & 1) != 0 ? sc.c : sc.s;
  y = (vec)((ivec)y ^ ((quadrant & 2) != 0 ? sign_bit : ivec{}));
  if constexpr (!cosine) y = ax < 0x1p-26 ? x : y;  // sin x = x there, -0 kept
  Lanes<double, W> out(y);
  bool any_far = false;
  for (int l = 0; l < W; ++l) any_far = any_far || far[l];
  if (any_far)
    for (int l = 0; l < W; ++l)
      if (far[l]) out.v[l] = cosine ? std::cos(x[l]) : std::sin(x[l]);
  return out;
}

// expm1 x = 2^k (e^r - 1) + (2^k - 1) for x = k ln2 + r, exact in the scaling and in
// 2^k - 1 for x in [-38, 40] (k in [-55, 58]), with no cancellation for k = 0 (e^r - 1 is
// the Taylor polynomial itself): expm1_ and tanh_'s e = expm1(2|x|).
template <class Vec>
[[gnu::always_inline]] inline Vec expm1_reduced(Vec x) {
  const auto [k, r] = reduce_ln2(x);
  const Vec s = pow2<Vec>(k);
  return s * expm1_taylor(r) + (s - 1.0);
}

}  // namespace detail

// sin and cos on lane blocks of doubles (detail::sin_or_cos).
template <int W>
Lanes<double, W> sin_(const Lanes<double, W>& a) {
  return detail::sin_or_cos<false>(a);
}
template <int W>
Lanes<double, W> cos_(const Lanes<double, W>& a) {
  return detail::sin_or_cos<true>(a);
}

template <int W>
Lanes<double, W> exp_(const Lanes<double, W>& a) {
  using vec = typename Lanes<double, W>::vec;
  using ivec = decltype(vec{} < vec{});
  const vec x = a.v;
  // Outside [-746, 710] exp is 0 or inf; clamping keeps k in range and lets the
  // scaling below produce them (NaN fails both tests and is restored at the end).
  vec xc = x < -746.0 ? vec{} - 746.0 : x;
  xc = xc > 710.0 ? vec{} + 710.0 : xc;
  const auto [k, r] = detail::reduce_ln2(xc);
  const vec p = detail::expm1_taylor(r) + 1.0;
  // 2^k = 2^(k/2) 2^(k - k/2): both halves normal for k in [-1076, 1024].
  const ivec k1 = k >> 1;
  const vec y = (p * detail::pow2<vec>(k1)) * detail::pow2<vec>(k - k1);
  return Lanes<double, W>(x != x ? x : y);
}

template <int W>
Lanes<double, W> tanh_(const Lanes<double, W>& a) {
  using vec = typename Lanes<double, W>::vec;
  using ivec = decltype(vec{} < vec{});
  const ivec sign_bit = ivec{} + INT64_MIN;
  const vec x = a.v;
  vec ax = (vec)((ivec)x & ~sign_bit);
  // tanh(20) is 1 to double precision; clamping keeps e finite (NaN passes through).
  ax = ax > 20.0 ? vec{} + 20.0 : ax;
  // |x| < 3/8: x + x z P(z), z = x^2.
  const vec z = ax * ax;
  vec q = vec{} + detail::kTanhTaylor[13];
  for (int i = 12; i >= 0; --i) q = q * z + detail::kTanhTaylor[i];
  const vec small = ax + ax * (z * q);
  // |x| >= 3/8: e / (e + 2), e = expm1(2|x|) (k in [1, 58] there).
  const vec e = detail::expm1_reduced(ax + ax);
  // 1 - 2 / (e + 2) once tanh >= 1/2 (|x| > 0.5493): the subtraction is exact there,
  // and 2 / (e + 2) carries less rounding than e / (e + 2). One division for both.
  const auto below_half = ax < 0.5493;
  const vec mid = (below_half ? vec{} : vec{} + 1.0) + (below_half ? e : vec{} - 2.0) / (e + 2.0);
  const vec th = ax < 0.375 ? small : mid;
  return Lanes<double, W>((vec)((ivec)th | ((ivec)x & sign_bit)));
}

// expm1 on lane blocks of doubles, by exp's reduction (detail::expm1_reduced) on
// [-38, 40]; below -38 it is -1 and above 40 exp x to double precision. Tiny |x| (below
// 2^-54) is x itself, -0 kept.
template <int W>
Lanes<double, W> expm1_(const Lanes<double, W>& a) {
  using vec = typename Lanes<double, W>::vec;
  using ivec = decltype(vec{} < vec{});
  const vec x = a.v;
  vec xc = x < -38.0 ? vec{} - 38.0 : x;
  xc = xc > 40.0 ? vec{} + 40.0 : xc;
  vec y = detail::expm1_reduced(xc);
  y = x > 40.0 ? exp_(a).v : y;
  y = x < -38.0 ? vec{} - 1.0 : y;
  const ivec sign_bit = ivec{} + INT64_MIN;
  const vec ax = (vec)((ivec)x & ~sign_bit);
  y = ax < 0x1p-54 ? x : y;
  return Lanes<double, W>(x != x ? x : y);
}

// log on lane blocks of doubles: x = 2^k m with m in [sqrt(1/2), sqrt(2)) (subnormals
// scaled into the normal range first) and g = m - 1 (exact). With s = g / (2 + g),
// |s| <= 0.1716, log m = 2 atanh(s) = g - h + s (h + R), h = g^2 / 2 and R the series
// 2 s^2 / 3 + 2 s^4 / 5 + ... to s^22 (the first omitted term is below 2^-58 |s|): the
// leading term g is exact and the rest small. log x = k ln2 + log m, ln2 in two parts,
// summed smallest first. 0, negatives, inf and NaN as <cmath>.
template <int W>
Lanes<double, W> log_(const Lanes<double, W>& a) {
  using vec = typename Lanes<double, W>::vec;
  using ivec = decltype(vec{} < vec{});
  const vec x = a.v;
  const ivec sub = x < 0x1p-1022;
  const ivec bits = (ivec)(sub ? x * 0x1p54 : x);
  ivec k = ((bits >> 52) & 0x7ff) - 1023 - (sub & 54);
  vec m = (vec)((bits & 0x000fffffffffffff) | 0x3ff0000000000000);  // in [1, 2)
  const ivec big = m > 0x1.6a09e667f3bcdp0;                          // sqrt(2)
  m = big ? m * 0.5 : m;
  k = k - big;  // a mask lane is -1 where set
  const vec g = m - 1.0;
  const vec s = g / (2.0 + g);
  const vec z = s * s;
  vec q = vec{} + 2.0 / 23;
  for (int n = 21; n >= 3; n -= 2) q = q * z + 2.0 / n;
  const vec R = z * q;
  const vec h = 0.5 * g * g;
  const vec kd = __builtin_convertvector(k, vec);
  vec r = kd * detail::kLn2Hi - ((h - (s * (h + R) + kd * detail::kLn2Lo)) - g);
  const double inf = __builtin_inf();
  r = x == 0.0 ? vec{} - inf : r;
  r = x == inf ? vec{} + inf : r;
  r = x < 0.0 ? vec{} + __builtin_nan("") : r;
  return Lanes<double, W>(x != x ? x : r);
}

// log1p on lane blocks of doubles: u = 1 + x rounds, and log u - ((u - 1) - x) / u
// corrects log u for that rounding to first order (the relative error of the correction
// is of the order of u's rounding squared). |x| below 2^-53 (u = 1) is x itself, -0 kept;
// -1 gives -inf, inf gives inf, below -1 NaN, as <cmath>.
template <int W>
Lanes<double, W> log1p_(const Lanes<double, W>& a) {
  using vec = typename Lanes<double, W>::vec;
  const vec x = a.v;
  const vec u = 1.0 + x;
  vec r = log_(Lanes<double, W>(u)).v - ((u - 1.0) - x) / u;
  const double inf = __builtin_inf();
  r = u == 1.0 ? x : r;
  r = x == inf ? x : r;
  r = x == -1.0 ? vec{} - inf : r;
  return Lanes<double, W>(x != x ? x : r);
}

// erf, erfc and atan2 on lane blocks (doubles and floats): <cmath> lane by lane, the
// scalar forms' values. Against 120-bit references (tests/models/test_from_jax.py, through
// a loaded model's lane path, glibc): erf within 1 ulp of the rounded value from 1e-300 to
// the tails, erfc within 2, atan2 rounded correctly. Vector kernels, as for tanh above,
// would be faster; these serve the models traced from JAX (exact GELU, angles).
template <class Real, int W>
Lanes<Real, W> erf_(const Lanes<Real, W>& a) {
  Lanes<Real, W> r;
  for (int l = 0; l < W; ++l) r.v[l] = std::erf(a.v[l]);
  return r;
}
template <class Real, int W>
Lanes<Real, W> erfc_(const Lanes<Real, W>& a) {
  Lanes<Real, W> r;
  for (int l = 0; l < W; ++l) r.v[l] = std::erfc(a.v[l]);
  return r;
}
template <class Real, int W>
Lanes<Real, W> atan2_(const Lanes<Real, W>& y, const Lanes<Real, W>& x) {
  Lanes<Real, W> r;
  for (int l = 0; l < W; ++l) r.v[l] = std::atan2(y.v[l], x.v[l]);
  return r;
}

}  // namespace pysharp

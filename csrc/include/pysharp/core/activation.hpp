// Elementary functions (tanh_, exp_, expm1_, log_, log1p_, sin_, cos_, erf_, erfc_,
// atan2_) on scalars and jets, and the activations of the models with hidden units. Their
// lane-block versions are in core/lanes.hpp and core/lane_math.hpp.
#pragma once

#include "pysharp/core/jet.hpp"

namespace pysharp {

// tanh on scalars and jets: y' = (1 - y^2) x', order by order
// (k y_k = sum_{j=1..k} j x_j s_{k-j} with s = 1 - y^2).
PYSHARP_HD inline double tanh_(double x) { return tanh(x); }
PYSHARP_HD inline float tanh_(float x) { return tanhf(x); }
template <class T, int N>
PYSHARP_HD Jet<T, N> tanh_(const Jet<T, N>& x) {
  Jet<T, N> y;
  T s[N + 1];
  y.c[0] = tanh_(x.c[0]);
  s[0] = T(1) - y.c[0] * y.c[0];
  for (int k = 1; k <= N; ++k) {
    T acc = T(0);
    for (int j = 1; j <= k; ++j) acc += T(j) * x.c[j] * s[k - j];
    y.c[k] = acc / T(k);
    T sq = T(0);
    for (int j = 0; j <= k; ++j) sq += y.c[j] * y.c[k - j];
    s[k] = -sq;
  }
  return y;
}

namespace detail {
// The orders k >= 1 of e = exp(x) given e_0: k e_k = sum_{j=1..k} j x_j e_{k-j}. y holds
// y_0 on entry and receives y_k = e_k (exp: y = e; expm1: y = e - 1, so only order 0 differs).
template <class T, int N>
PYSHARP_HD void exp_orders(const Jet<T, N>& x, T e0, Jet<T, N>& y) {
  for (int k = 1; k <= N; ++k) {
    T acc = T(0);
    for (int j = 1; j <= k; ++j) acc += T(j) * x.c[j] * (j == k ? e0 : y.c[k - j]);
    y.c[k] = acc / T(k);
  }
}
}  // namespace detail

// exp on scalars and jets: y' = y x', so k y_k = sum_{j=1..k} j x_j y_{k-j}.
PYSHARP_HD inline double exp_(double x) { return exp(x); }
PYSHARP_HD inline float exp_(float x) { return expf(x); }
template <class T, int N>
PYSHARP_HD Jet<T, N> exp_(const Jet<T, N>& x) {
  Jet<T, N> y;
  y.c[0] = exp_(x.c[0]);
  detail::exp_orders(x, y.c[0], y);
  return y;
}

// expm1 = exp - 1 on scalars and jets, without exp's cancellation near 0: y' = (y + 1) x',
// the recurrence of exp on e = y + 1 (e_0 = y_0 + 1, e_m = y_m above order 0).
PYSHARP_HD inline double expm1_(double x) { return expm1(x); }
PYSHARP_HD inline float expm1_(float x) { return expm1f(x); }
template <class T, int N>
PYSHARP_HD Jet<T, N> expm1_(const Jet<T, N>& x) {
  Jet<T, N> y;
  y.c[0] = expm1_(x.c[0]);
  detail::exp_orders(x, y.c[0] + T(1), y);
  return y;
}

// log on scalars and jets: x y' = x', so k x_0 y_k = k x_k - sum_{j=1..k-1} j y_j x_{k-j}.
// Defined for x > 0 only (NaN or -inf otherwise, as <cmath>).
PYSHARP_HD inline double log_(double x) { return log(x); }
PYSHARP_HD inline float log_(float x) { return logf(x); }
template <class T, int N>
PYSHARP_HD Jet<T, N> log_(const Jet<T, N>& x) {
  Jet<T, N> y;
  y.c[0] = log_(x.c[0]);
  for (int k = 1; k <= N; ++k) {
    T acc = T(k) * x.c[k];
    for (int j = 1; j < k; ++j) acc -= T(j) * y.c[j] * x.c[k - j];
    y.c[k] = acc / (T(k) * x.c[0]);
  }
  return y;
}

// log1p = log(1 + x) on scalars and jets, without the rounding of 1 + x near 0: the
// recurrence of log on u = 1 + x, k u_0 y_k = k x_k - sum_{j=1..k-1} j y_j x_{k-j}.
PYSHARP_HD inline double log1p_(double x) { return log1p(x); }
PYSHARP_HD inline float log1p_(float x) { return log1pf(x); }
template <class T, int N>
PYSHARP_HD Jet<T, N> log1p_(const Jet<T, N>& x) {
  Jet<T, N> y;
  y.c[0] = log1p_(x.c[0]);
  const T u0 = T(1) + x.c[0];
  for (int k = 1; k <= N; ++k) {
    T acc = T(k) * x.c[k];
    for (int j = 1; j < k; ++j) acc -= T(j) * y.c[j] * x.c[k - j];
    y.c[k] = acc / (T(k) * u0);
  }
  return y;
}

// sin and cos on scalars and jets, one coupled recurrence: s' = c x', c' = -s x', so
// k s_k = sum_{j=1..k} j x_j c_{k-j} and k c_k = -sum_{j=1..k} j x_j s_{k-j}.
PYSHARP_HD inline double sin_(double x) { return sin(x); }
PYSHARP_HD inline float sin_(float x) { return sinf(x); }
PYSHARP_HD inline double cos_(double x) { return cos(x); }
PYSHARP_HD inline float cos_(float x) { return cosf(x); }
template <class T, int N>
PYSHARP_HD void sin_cos_(const Jet<T, N>& x, Jet<T, N>* s, Jet<T, N>* c) {
  s->c[0] = sin_(x.c[0]);
  c->c[0] = cos_(x.c[0]);
  for (int k = 1; k <= N; ++k) {
    T as = T(0), ac = T(0);
    for (int j = 1; j <= k; ++j) {
      as += T(j) * x.c[j] * c->c[k - j];
      ac += T(j) * x.c[j] * s->c[k - j];
    }
    s->c[k] = as / T(k);
    c->c[k] = -ac / T(k);
  }
}
template <class T, int N>
PYSHARP_HD Jet<T, N> sin_(const Jet<T, N>& x) {
  Jet<T, N> s, c;
  sin_cos_(x, &s, &c);
  return s;
}
template <class T, int N>
PYSHARP_HD Jet<T, N> cos_(const Jet<T, N>& x) {
  Jet<T, N> s, c;
  sin_cos_(x, &s, &c);
  return c;
}

namespace detail {
// The jet of dx/de, x's derivative in the jet's variable: c_j = (j + 1) x_{j+1}. Its top
// coefficient would need x_{N+1} and is left 0: integral_of below never reads it.
template <class T, int N>
PYSHARP_HD Jet<T, N> derivative_of(const Jet<T, N>& x) {
  Jet<T, N> d;
  for (int j = 0; j < N; ++j) d.c[j] = T(j + 1) * x.c[j + 1];
  return d;
}
// The jet y with y_0 = y0 and dy/de = q: y_k = q_{k-1} / k.
template <class T, int N>
PYSHARP_HD Jet<T, N> integral_of(const Jet<T, N>& q, const T& y0) {
  Jet<T, N> y;
  y.c[0] = y0;
  for (int k = 1; k <= N; ++k) y.c[k] = q.c[k - 1] / T(k);
  return y;
}
// 2 / sqrt(pi), erf's slope at 0.
inline constexpr double kTwoOverSqrtPi = 1.1283791670955126;
}  // namespace detail

// erf and erfc on scalars and jets. erf' = (2 / sqrt(pi)) exp(-x^2) is a closed form, so a
// jet of erf is the integral of the jet (2 / sqrt(pi)) exp(-x^2) dx/de (erfc: its negative):
// the value from <cmath> (lane blocks: lane_math.hpp), the orders above from exp_ and two
// Cauchy products. exp(-x^2) underflows to 0 for |x| > 27, where erf is +-1 to the last bit.
PYSHARP_HD inline double erf_(double x) { return erf(x); }
PYSHARP_HD inline float erf_(float x) { return erff(x); }
PYSHARP_HD inline double erfc_(double x) { return erfc(x); }
PYSHARP_HD inline float erfc_(float x) { return erfcf(x); }
template <class T, int N>
PYSHARP_HD Jet<T, N> erf_(const Jet<T, N>& x) {
  const Jet<T, N> slope = exp_(-(x * x)) * T(detail::kTwoOverSqrtPi);
  return detail::integral_of(slope * detail::derivative_of(x), erf_(x.c[0]));
}
template <class T, int N>
PYSHARP_HD Jet<T, N> erfc_(const Jet<T, N>& x) {
  const Jet<T, N> slope = exp_(-(x * x)) * T(-detail::kTwoOverSqrtPi);
  return detail::integral_of(slope * detail::derivative_of(x), erfc_(x.c[0]));
}

// atan2(y, x), the angle of the point (x, y) in (-pi, pi], on scalars and jets: its
// derivative (x dy - y dx) / (x^2 + y^2) integrated order by order as erf's. Undefined
// (NaN orders) at the origin, where JAX's derivatives are NaN too.
PYSHARP_HD inline double atan2_(double y, double x) { return atan2(y, x); }
PYSHARP_HD inline float atan2_(float y, float x) { return atan2f(y, x); }
template <class T, int N>
PYSHARP_HD Jet<T, N> atan2_(const Jet<T, N>& y, const Jet<T, N>& x) {
  const Jet<T, N> turn = x * detail::derivative_of(y) - y * detail::derivative_of(x);
  return detail::integral_of(turn / (x * x + y * y), atan2_(y.c[0], x.c[0]));
}

enum class Activation : int { tanh = 0, relu = 1 };

// act(h) into *a and act'(h) into *da.
template <class S>
PYSHARP_HD void activate(Activation act, const S& h, S* a, S* da) {
  if (act == Activation::tanh) {
    *a = tanh_(h);
    *da = S(1) - (*a) * (*a);
  } else {
    const auto on = value_of(h) > value_t<S>(0);
    *a = select(on, h, S(0));
    *da = select(on, S(1), S(0));
  }
}

}  // namespace pysharp

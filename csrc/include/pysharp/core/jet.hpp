// Truncated Taylor polynomials ("jets") for exact higher-order derivatives.
//
// A Jet<T, N> holds x(e) = c[0] + c[1] e + ... + c[N] e^N, truncated at e^N.
// Evaluating a model's analytic gradient g(w) at w + e v with N = 1 yields
// g(w) + e H(w) v (the Hessian-vector product); with N = 2 the e^2
// coefficient is D^3L(w)[v, v] / 2. One templated gradient therefore gives
// the gradient, the HVP and the third-order contraction, all exact to
// rounding, with no finite-difference step to tune.
#pragma once

#include "pysharp/core/config.hpp"

namespace pysharp {

template <class T, int N>
struct Jet {
  T c[N + 1];

  PYSHARP_HD Jet() {
    for (int k = 0; k <= N; ++k) c[k] = T(0);
  }
  PYSHARP_HD Jet(T value) {  // NOLINT: implicit, a constant is a jet
    c[0] = value;
    for (int k = 1; k <= N; ++k) c[k] = T(0);
  }

  PYSHARP_HD Jet& operator+=(const Jet& o) {
    for (int k = 0; k <= N; ++k) c[k] += o.c[k];
    return *this;
  }
  PYSHARP_HD Jet& operator-=(const Jet& o) {
    for (int k = 0; k <= N; ++k) c[k] -= o.c[k];
    return *this;
  }
  PYSHARP_HD Jet& operator*=(const Jet& o) { return *this = *this * o; }
  PYSHARP_HD Jet& operator*=(T s) {
    for (int k = 0; k <= N; ++k) c[k] *= s;
    return *this;
  }

  PYSHARP_HD friend Jet operator-(const Jet& a) {
    Jet r;
    for (int k = 0; k <= N; ++k) r.c[k] = -a.c[k];
    return r;
  }
  PYSHARP_HD friend Jet operator+(Jet a, const Jet& b) { return a += b; }
  PYSHARP_HD friend Jet operator-(Jet a, const Jet& b) { return a -= b; }
  PYSHARP_HD friend Jet operator+(Jet a, T s) {
    a.c[0] += s;
    return a;
  }
  PYSHARP_HD friend Jet operator+(T s, Jet a) { return a + s; }
  PYSHARP_HD friend Jet operator-(Jet a, T s) {
    a.c[0] -= s;
    return a;
  }
  PYSHARP_HD friend Jet operator-(T s, const Jet& a) { return -a + s; }
  PYSHARP_HD friend Jet operator*(Jet a, T s) { return a *= s; }
  PYSHARP_HD friend Jet operator*(T s, Jet a) { return a *= s; }

  // Cauchy product, truncated at order N.
  PYSHARP_HD friend Jet operator*(const Jet& a, const Jet& b) {
    Jet r;
    for (int k = 0; k <= N; ++k) {
      T s = T(0);
      for (int j = 0; j <= k; ++j) s += a.c[j] * b.c[k - j];
      r.c[k] = s;
    }
    return r;
  }

  // q = a / b solves b q = a order by order.
  PYSHARP_HD friend Jet operator/(const Jet& a, const Jet& b) {
    Jet q;
    const T inv_b0 = T(1) / b.c[0];
    for (int k = 0; k <= N; ++k) {
      T s = a.c[k];
      for (int j = 1; j <= k; ++j) s -= b.c[j] * q.c[k - j];
      q.c[k] = s * inv_b0;
    }
    return q;
  }
  PYSHARP_HD friend Jet operator/(const Jet& a, T s) { return a * (T(1) / s); }
  PYSHARP_HD friend Jet operator/(T s, const Jet& b) { return Jet(s) / b; }
};

// r = sqrt(a) solves r r = a order by order.
template <class T, int N>
PYSHARP_HD Jet<T, N> sqrt_(const Jet<T, N>& a) {
  Jet<T, N> r;
  r.c[0] = sqrt_(a.c[0]);
  const T inv_2r0 = T(1) / (T(2) * r.c[0]);
  for (int k = 1; k <= N; ++k) {
    T s = a.c[k];
    for (int j = 1; j < k; ++j) s -= r.c[j] * r.c[k - j];
    r.c[k] = s * inv_2r0;
  }
  return r;
}

template <class T, int N>
PYSHARP_HD T value_of(const Jet<T, N>& a) {
  return a.c[0];
}

// The real type underneath a scalar or a jet.
template <class S>
struct real_of {
  using type = S;
};
template <class T, int N>
struct real_of<Jet<T, N>> {
  using type = T;
};

}  // namespace pysharp

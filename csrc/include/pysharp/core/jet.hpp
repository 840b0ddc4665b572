// Truncated Taylor polynomials ("jets") for exact higher-order derivatives.
//
// A Jet<T, N> holds x(e) = c[0] + c[1] e + ... + c[N] e^N, truncated at e^N.
// Evaluating a model's analytic gradient g(w) at w + e v with N = 1 yields
// g(w) + e H(w) v (the Hessian-vector product); with N = 2 the e^2
// coefficient is D^3L(w)[v, v] / 2. One templated gradient therefore gives
// the gradient, the HVP and the third-order contraction, all exact to
// rounding, with no finite-difference step to tune.
#pragma once

#include "pysharp/core/std.hpp"

#include "pysharp/core/config.hpp"

namespace pysharp {

template <class T, int N>
struct Jet {
  static constexpr int order = N;
  T c[N + 1];

  PYSHARP_HD Jet() {
    for (int k = 0; k <= N; ++k) c[k] = T(0);
  }
  PYSHARP_HD Jet(T value) {  // NOLINT: implicit, a constant is a jet
    c[0] = value;
    for (int k = 1; k <= N; ++k) c[k] = T(0);
  }
  // A plain number is a constant jet also where T is a lane block.
  template <class U, std::enable_if_t<std::is_arithmetic<U>::value && !std::is_same<U, T>::value,
                                      int> = 0>
  PYSHARP_HD Jet(U value) : Jet(T(value)) {}  // NOLINT

  PYSHARP_HD Jet& operator+=(const Jet& o) {
    for (int k = 0; k <= N; ++k) c[k] += o.c[k];
    return *this;
  }
  PYSHARP_HD Jet& operator-=(const Jet& o) {
    for (int k = 0; k <= N; ++k) c[k] -= o.c[k];
    return *this;
  }
  PYSHARP_HD Jet& operator*=(const Jet& o) { return *this = *this * o; }
  PYSHARP_HD Jet& operator*=(const T& s) {
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
};

// Jet-scalar arithmetic. Templates rather than friends, so that a plain real
// meets a jet of lanes (Jet<Lanes<Real, W>, N>) without a chain of implicit
// conversions: U is the jet's coefficient type or any arithmetic type.
template <class U, class T>
inline constexpr bool is_jet_scalar = std::is_arithmetic<U>::value || std::is_same<U, T>::value;

template <class T, int N, class U, std::enable_if_t<is_jet_scalar<U, T>, int> = 0>
PYSHARP_HD Jet<T, N> operator+(Jet<T, N> a, const U& s) {
  a.c[0] += T(s);
  return a;
}
template <class T, int N, class U, std::enable_if_t<is_jet_scalar<U, T>, int> = 0>
PYSHARP_HD Jet<T, N> operator+(const U& s, Jet<T, N> a) {
  return a + s;
}
template <class T, int N, class U, std::enable_if_t<is_jet_scalar<U, T>, int> = 0>
PYSHARP_HD Jet<T, N> operator-(Jet<T, N> a, const U& s) {
  a.c[0] -= T(s);
  return a;
}
template <class T, int N, class U, std::enable_if_t<is_jet_scalar<U, T>, int> = 0>
PYSHARP_HD Jet<T, N> operator-(const U& s, const Jet<T, N>& a) {
  return -a + s;
}
template <class T, int N, class U, std::enable_if_t<is_jet_scalar<U, T>, int> = 0>
PYSHARP_HD Jet<T, N> operator*(Jet<T, N> a, const U& s) {
  return a *= T(s);
}
template <class T, int N, class U, std::enable_if_t<is_jet_scalar<U, T>, int> = 0>
PYSHARP_HD Jet<T, N> operator*(const U& s, Jet<T, N> a) {
  return a *= T(s);
}
template <class T, int N, class U, std::enable_if_t<is_jet_scalar<U, T>, int> = 0>
PYSHARP_HD Jet<T, N> operator/(const Jet<T, N>& a, const U& s) {
  return a * (T(1) / T(s));
}
template <class T, int N, class U, std::enable_if_t<is_jet_scalar<U, T>, int> = 0>
PYSHARP_HD Jet<T, N> operator/(const U& s, const Jet<T, N>& b) {
  return Jet<T, N>(T(s)) / b;
}

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

// Comparisons test the value part alone (a jet's derivative parts do not order it) and
// give mask_t: a bool for a jet of scalars, one flag per lane for a jet of lane blocks.
// So `z > Real(0)` means `value_of(z) > Real(0)` on every S a model is instantiated on.
#define PYSHARP_JET_COMPARISON(op)                                                      \
  template <class T, int N>                                                             \
  PYSHARP_HD mask_t<T> operator op(const Jet<T, N>& a, const Jet<T, N>& b) {            \
    return a.c[0] op b.c[0];                                                            \
  }                                                                                     \
  template <class T, int N, class U, std::enable_if_t<is_jet_scalar<U, T>, int> = 0>    \
  PYSHARP_HD mask_t<T> operator op(const Jet<T, N>& a, const U& s) {                    \
    return a.c[0] op T(s);                                                              \
  }                                                                                     \
  template <class T, int N, class U, std::enable_if_t<is_jet_scalar<U, T>, int> = 0>    \
  PYSHARP_HD mask_t<T> operator op(const U& s, const Jet<T, N>& a) {                    \
    return T(s) op a.c[0];                                                              \
  }
PYSHARP_JET_COMPARISON(<)
PYSHARP_JET_COMPARISON(>)
PYSHARP_JET_COMPARISON(<=)
PYSHARP_JET_COMPARISON(>=)
PYSHARP_JET_COMPARISON(==)
PYSHARP_JET_COMPARISON(!=)
#undef PYSHARP_JET_COMPARISON

// Per-coefficient choice, for branches such as ReLU's on lane blocks.
template <class M, class T, int N, std::enable_if_t<!std::is_same<M, bool>::value, int> = 0>
PYSHARP_HD Jet<T, N> select(const M& m, const Jet<T, N>& a, const Jet<T, N>& b) {
  Jet<T, N> r;
  for (int k = 0; k <= N; ++k) r.c[k] = select(m, a.c[k], b.c[k]);
  return r;
}

// x itself where G is x's type; where G is the coefficient type of the jet x,
// its top coefficient c[N]. Taking a coefficient commutes with a linear map,
// so code that ends in one (a gradient X^T r) can accumulate only the
// coefficient its caller reads (models/derivatives.hpp).
template <class G, class S>
PYSHARP_HD const G& coefficient_as(const S& x) {
  if constexpr (std::is_same<G, S>::value) {
    return x;
  } else {
    return x.c[S::order];
  }
}

template <class T, int N>
struct lane_traits<Jet<T, N>> : lane_traits<T> {};

// The type of value_of(s): Real for a scalar or a jet of scalars, the lane
// block for lanes or a jet of lanes.
template <class S>
using value_t = std::decay_t<decltype(value_of(std::declval<const S&>()))>;

}  // namespace pysharp

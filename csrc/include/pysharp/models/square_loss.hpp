// Square-loss models with per-sample Jacobians (docs/theory.rst,
// section "SGD linear stability"): L(W) = (1/2n) sum_i (f(x_i; W) - y_i)^2.
//
// A square-loss model is a model (pysharp/model.hpp) with the data fields
// `const Real* X` (n, d) and `const Real* y` (n,) and, besides the templated
// loss_grad that derivatives.hpp turns into exact HVPs (and D^3L), the
// per-sample pieces the SGD engine and the stability analysis need:
//   int n_samples() const, int input_dim() const: n and d;
//   sample(w, x, y, coeff, g, work): residual r = f(x; w) - y, adds coeff r grad_w f into g
//     (x, y, coeff: one sample shared by every lane of w, Real, or one per lane,
//     lane-form like w, as the SGD engine gathers each lane's own batch);
//   jacobian(w, x, f, a, gx, work):  f(x; w), a = grad_w f (dim()), gx = grad_x f (input_dim()).
// Its loss_grad is square_loss_grad(*this, ...) (core/square_loss.hpp). The data (n, d) are a
// row-major view owned by the caller. The two built-ins here are declared with
// PYSHARP_MODEL like any model; a user's square-loss header (load_model) has the
// same form.
#pragma once

#include "pysharp/core/dense.hpp"
#include "pysharp/core/activation.hpp"
#include "pysharp/core/jet.hpp"
#include "pysharp/core/square_loss.hpp"
#include "pysharp/model.hpp"

namespace pysharp {

// Plain linear regression f(x) = w . x (+ b): w = (w_1..w_d[, b]).
template <class Real>
struct LinearRegression {
  const Real* X;  // (n, d)
  const Real* y;  // (n,)
  int n;
  int d;
  int bias;  // 0 or 1

  PYSHARP_HD int dim() const { return d + bias; }
  PYSHARP_HD int input_dim() const { return d; }
  PYSHARP_HD int n_samples() const { return n; }
  PYSHARP_HD int work_size() const { return 0; }

  template <class S, class X>
  PYSHARP_HD S sample(const S* w, const X* x, X yi, X coeff, S* g, S* /*work*/) const {
    const S f = dot_split(w, x, d) + (bias ? w[d] : S(0));
    const S r = f - yi;
    const S c = r * coeff;
    for (int k = 0; k < d; ++k) g[k] += c * x[k];
    if (bias) g[d] += c;
    return r;
  }

  PYSHARP_HD void jacobian(const Real* w, const Real* x, Real* f, Real* a, Real* gx,
                           Real* /*work*/) const {
    for (int k = 0; k < d; ++k) {
      a[k] = x[k];
      gx[k] = w[k];
    }
    if (bias) a[d] = Real(1);
    *f = dot_split(w, x, d) + (bias ? w[d] : Real(0));  // as sample() computes f
  }

  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const {
    return square_loss_grad(*this, w, loss, g, work);
  }
};
PYSHARP_MODEL(LinearRegression, PYSHARP_ARRAY(X, n, d), PYSHARP_ARRAY(y, n), PYSHARP_SCALAR(bias))

// Two-layer network f(x) = a . act(W1 x + b1) / sqrt(m).
// Parameter layout (D = m d + 2 m): W1 (m, d) row-major, then b1 (m), then a (m).
template <class Real>
struct TwoLayerNet {
  const Real* X;  // (n, d)
  const Real* y;  // (n,)
  int n;
  int d;
  int m;
  Activation act;
  Real inv_sqrt_m;

  PYSHARP_HD int dim() const { return m * d + 2 * m; }
  PYSHARP_HD int input_dim() const { return d; }
  PYSHARP_HD int n_samples() const { return n; }
  PYSHARP_HD int work_size() const { return 2 * m; }

  // Fills work[0..m) with act(h), work[m..2m) with act'(h); returns f(x).
  template <class S, class X>
  PYSHARP_HD S forward(const S* w, const X* x, S* work) const {
    const S* b1 = w + m * d;
    const S* a = b1 + m;
    S f = S(0);
    for (int j = 0; j < m; ++j) {
      const S* row = w + static_cast<long long>(j) * d;
      const S h = dot_split(row, x, d) + b1[j];
      activate(act, h, work + j, work + m + j);
      f += a[j] * work[j];
    }
    return f * inv_sqrt_m;
  }

  template <class S, class X>
  PYSHARP_HD S sample(const S* w, const X* x, X yi, X coeff, S* g, S* work) const {
    const S r = forward(w, x, work) - yi;
    const S c = r * (coeff * inv_sqrt_m);
    const S* a = w + m * d + m;
    S* gb = g + m * d;
    S* ga = gb + m;
    for (int j = 0; j < m; ++j) {
      ga[j] += c * work[j];
      const S u = c * a[j] * work[m + j];
      gb[j] += u;
      S* grow = g + static_cast<long long>(j) * d;
      for (int k = 0; k < d; ++k) grow[k] += u * x[k];
    }
    return r;
  }

  PYSHARP_HD void jacobian(const Real* w, const Real* x, Real* f, Real* grad, Real* gx,
                           Real* work) const {
    *f = forward(w, x, work);
    const Real* a = w + m * d + m;
    for (int k = 0; k < d; ++k) gx[k] = Real(0);
    for (int j = 0; j < m; ++j) {
      const Real u = a[j] * work[m + j] * inv_sqrt_m;
      grad[m * d + j] = u;
      grad[m * d + m + j] = work[j] * inv_sqrt_m;
      const Real* row = w + static_cast<long long>(j) * d;
      Real* grow = grad + static_cast<long long>(j) * d;
      for (int k = 0; k < d; ++k) {
        grow[k] = u * x[k];
        gx[k] += u * row[k];
      }
    }
  }

  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const {
    return square_loss_grad(*this, w, loss, g, work);
  }
};
PYSHARP_MODEL(TwoLayerNet, PYSHARP_ARRAY(X, n, d), PYSHARP_ARRAY(y, n), PYSHARP_SCALAR(m),
              PYSHARP_SCALAR(act), PYSHARP_SCALAR(inv_sqrt_m))

// Per-sample Jacobians of BN linear regression's predictions
// p_i = std(y) z_i / sigma(w) + mean(y), z = Xc w, sigma = ||z|| / sqrt(n):
// A[i] = grad_w p_i = std(y) sqrt(n) (Xc_i / ||z|| - z_i Xc^T z / ||z||^3);
// gx[i] = grad_x p_i at frozen batch statistics (inference mode) = std(y) sqrt(n) w / ||z||.
// work: n + d reals. Returns false where Xc w = 0.
template <class Model, class Real>
PYSHARP_HD bool bn_linreg_jacobian(const Model& bm, const Real* w, Real* A, Real* gx,
                                   Real* work) {
  const int n = bm.n, d = bm.d;
  Real* z = work;
  Real* q = work + n;  // Xc^T z
  Real z2 = Real(0);
  for (int k = 0; k < d; ++k) q[k] = Real(0);
  for (int i = 0; i < n; ++i) {
    const Real* x = bm.Xc + static_cast<long long>(i) * d;
    Real v = Real(0);
    for (int k = 0; k < d; ++k) v += w[k] * x[k];
    z[i] = v;
    z2 += v * v;
    for (int k = 0; k < d; ++k) q[k] += v * x[k];
  }
  if (!(z2 > Real(0))) return false;
  const Real r = sqrt_(z2);
  const Real c = sqrt_(bm.scale / Real(2)) * sqrt_(Real(n)) / r;  // std(y) sqrt(n) / ||z||
  for (int i = 0; i < n; ++i) {
    const Real* x = bm.Xc + static_cast<long long>(i) * d;
    Real* Ai = A + static_cast<long long>(i) * d;
    Real* gi = gx + static_cast<long long>(i) * d;
    const Real t = z[i] / z2;
    for (int k = 0; k < d; ++k) {
      Ai[k] = c * (x[k] - t * q[k]);
      gi[k] = c * w[k];
    }
  }
  return true;
}

}  // namespace pysharp

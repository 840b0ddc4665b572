// BN matrix completion (docs/theory.rst, "BN matrix completion").
//
// w = concat(U.ravel(), V.ravel()), U (m1, r), V (m2, r), row-major. The N
// observed scores s_k = <U[rows_k], V[cols_k]> are batch-normalised over the
// observed set and rescaled to the values' mean and std, so the loss is the
// BN cosine loss of s. s is bilinear, hence L(c w) = L(w).
#pragma once

#include "pysharp/core/bn_cosine.hpp"
#include "pysharp/model.hpp"

namespace pysharp {

template <class Real>
struct BNMatrixCompletion {
  const int* rows;  // (N,) in [0, m1)
  const int* cols;  // (N,) in [0, m2)
  const Real* u;    // (N,) (values - mean) / ||values - mean||
  Real scale;       // 2 var(values)
  int N;
  int m1;
  int m2;
  int r;

  PYSHARP_HD int dim() const { return (m1 + m2) * r; }
  PYSHARP_HD int work_size() const { return N; }

  template <class S>
  PYSHARP_HD void scores(const S* w, S* s) const {
    const S* U = w;
    const S* V = w + m1 * r;
    for (int k = 0; k < N; ++k) {
      const S* a = U + rows[k] * r;
      const S* b = V + cols[k] * r;
      S acc = Real(0);
      for (int q = 0; q < r; ++q) acc += a[q] * b[q];
      s[k] = acc;
    }
  }

  // L(w) into *loss, grad L(w) into g; work holds N scalars.
  // Returns false where all observed scores are equal to working precision
  // (BatchNorm undefined).
  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const {
    scores(w, work);
    const mask_t<S> defined = bn_cosine_loss_grad(work, u, scale, N, Real(0), loss, work);
    const S* U = w;
    const S* V = w + m1 * r;
    S* gU = g;
    S* gV = g + m1 * r;
    for (int i = 0; i < dim(); ++i) g[i] = Real(0);
    for (int k = 0; k < N; ++k) {
      const S* a = U + rows[k] * r;
      const S* b = V + cols[k] * r;
      S* ga = gU + rows[k] * r;
      S* gb = gV + cols[k] * r;
      const S gk = work[k];
      for (int q = 0; q < r; ++q) {
        ga[q] += gk * b[q];
        gb[q] += gk * a[q];
      }
    }
    return defined;
  }
};

// Held-out square loss: the training map (batch statistics mu, sd of the
// training scores) applied to the Nt entries (rows_t, cols_t, values_t).
// value_mean and value_std are those of the training values. work holds
// max(N, Nt) scalars. Returns false where the training scores are constant.
template <class Real>
PYSHARP_HD bool bn_mc_test_loss(const BNMatrixCompletion<Real>& m, const Real* w,
                                const int* rows_t, const int* cols_t,
                                const Real* values_t, int Nt, Real value_mean,
                                Real value_std, Real* loss, Real* work) {
  m.scores(w, work);
  Real mu = 0;
  for (int k = 0; k < m.N; ++k) mu += work[k];
  mu /= Real(m.N);
  Real var = 0;
  for (int k = 0; k < m.N; ++k) var += (work[k] - mu) * (work[k] - mu);
  var /= Real(m.N);
  const Real noise = Real(8) * Real(m.N) * machine_eps<Real>();
  if (!(var > noise * noise * (var + mu * mu))) return false;
  const Real gain = value_std / sqrt_(var);
  BNMatrixCompletion<Real> test = m;
  test.rows = rows_t;
  test.cols = cols_t;
  test.N = Nt;
  test.scores(w, work);
  Real acc = 0;
  for (int k = 0; k < Nt; ++k) {
    const Real e = gain * (work[k] - mu) + value_mean - values_t[k];
    acc += e * e;
  }
  *loss = acc / Real(Nt);
  return true;
}

// The fields bound by name (pysharp/model.hpp): the header loads at run time too.
PYSHARP_MODEL(BNMatrixCompletion, PYSHARP_ARRAY(rows, N), PYSHARP_ARRAY(cols, N), PYSHARP_ARRAY(u, N),
              PYSHARP_SCALAR(scale), PYSHARP_SCALAR(m1), PYSHARP_SCALAR(m2), PYSHARP_SCALAR(r))

}  // namespace pysharp

// A two-layer network with BatchNorm on its hidden units (docs/theory.rst,
// "BN two-layer network"): the smallest real BN network.
//
// W (m, d) row-major is the parameter vector w (D = m d). Unit j computes
// z_ij = W_j . x_i over the n samples, batch-normalises it (population
// statistics, no affine): zhat_ij = (z_ij - mean_i z_ij) / std_i z_ij, and the
// output layer is fixed: f_i = sum_j a_j act(zhat_ij), a_j = (-1)^j / sqrt(m).
// L = mean_i (f_i - y_i)^2 is invariant to the positive scale of each row W_j.
//
// With Xc the column-centred data, c_j = Xc W_j is unit j's centred output
// (centred again in working precision, as BN does), chat_j = c_j / ||c_j||
// and zhat_j = sqrt(n) chat_j. Backward, with q_ij = (2/n)(f_i - y_i) a_j
// act'(zhat_ij) and Pq_j its centred copy:
//     dL/dc_j = sqrt(n) / ||c_j|| (Pq_j - (chat_j . Pq_j) chat_j),
//     grad_j  = Xc^T dL/dc_j.
#pragma once

#include "pysharp/core/activation.hpp"
#include "pysharp/core/dense.hpp"
#include "pysharp/models/derivatives.hpp"
#include "pysharp/model.hpp"

namespace pysharp {

template <class Real>
struct BNTwoLayerNet {
  const Real* Xc;  // (n, d) row-major, columns centred
  const Real* y;   // (n,) targets
  Real xc_fro2;    // ||Xc||_F^2, for the rounding floor of Xc W_j
  Real inv_sqrt_m;
  int n;
  int d;
  int m;
  Activation act;

  PYSHARP_HD int dim() const { return m * d; }
  PYSHARP_HD int input_dim() const { return d; }
  PYSHARP_HD int n_samples() const { return n; }
  PYSHARP_HD int n_groups() const { return m; }  // each row W_j is scale-invariant alone
  // chat (m n), act'(zhat) (m n), residual (n), backward buffer (n), sqrt(n)/||c_j|| (m).
  PYSHARP_HD int work_size() const { return 2 * m * n + 2 * n + m; }

  // Returns false (per lane) where some unit's centred output Xc W_j is zero
  // to working precision, below the rounding error ~ d eps ||Xc||_F ||W_j||
  // of the product (BatchNorm undefined), the floor rule of every BN model.
  // On jets, g may hold their coefficient type: it then gets the gradient's
  // top coefficient (models/derivatives.hpp).
  template <class S, class G>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, G* g, S* work) const {
    S* chat = work;
    S* dact = chat + m * n;
    S* res = dact + m * n;
    S* q = res + n;
    S* scale = q + n;
    const Real inv_n = Real(1) / Real(n);
    const Real sqrt_n = sqrt_(Real(n));
    const Real err = Real(d) * machine_eps<Real>();
    const Real noise = Real(8) * Real(n) * machine_eps<Real>();
    mask_t<S> defined(true);
    for (int i = 0; i < n; ++i) res[i] = S(Real(0));
    for (int j = 0; j < m; ++j) {
      const S* wj = w + static_cast<long long>(j) * d;
      S* c = chat + static_cast<long long>(j) * n;
      matvec_rows(Xc, n, d, wj, c);
      value_t<S> w2 = Real(0), z2 = Real(0);
      for (int k = 0; k < d; ++k) w2 += value_of(wj[k]) * value_of(wj[k]);
      S mean = Real(0);
      for (int i = 0; i < n; ++i) {
        mean += c[i];
        z2 += value_of(c[i]) * value_of(c[i]);
      }
      mean = mean * inv_n;
      S r2 = Real(0);
      for (int i = 0; i < n; ++i) {
        c[i] = c[i] - mean;
        r2 += c[i] * c[i];
      }
      defined = defined & (value_of(r2) > err * err * xc_fro2 * w2) &
                (value_of(r2) > noise * noise * z2);
      const S inv_r = Real(1) / sqrt_(r2);
      scale[j] = inv_r * sqrt_n;
      const Real aj = (j % 2 ? -inv_sqrt_m : inv_sqrt_m);
      S* da = dact + static_cast<long long>(j) * n;
      for (int i = 0; i < n; ++i) {
        c[i] = c[i] * inv_r;
        S a;
        activate(act, c[i] * sqrt_n, &a, da + i);
        res[i] += aj * a;
      }
    }
    S sum2 = Real(0);
    for (int i = 0; i < n; ++i) {
      res[i] = res[i] - y[i];
      sum2 += res[i] * res[i];
    }
    *loss = sum2 * inv_n;
    for (int j = 0; j < m; ++j) {
      const Real coeff = Real(2) * inv_n * (j % 2 ? -inv_sqrt_m : inv_sqrt_m);
      const S* c = chat + static_cast<long long>(j) * n;
      const S* da = dact + static_cast<long long>(j) * n;
      S mean = Real(0);
      for (int i = 0; i < n; ++i) {
        q[i] = res[i] * da[i] * coeff;
        mean += q[i];
      }
      mean = mean * inv_n;
      S proj = Real(0);
      for (int i = 0; i < n; ++i) {
        q[i] = q[i] - mean;
        proj += c[i] * q[i];
      }
      for (int i = 0; i < n; ++i) q[i] = (q[i] - proj * c[i]) * scale[j];
      matvec_cols(Xc, n, d, q, g + static_cast<long long>(j) * d);
    }
    return defined;
  }
};

// Its HVP and third order take the top-coefficient path (derivatives.hpp);
// a signature change that loses it would otherwise only show as a slowdown.
static_assert(writes_top_coefficient<BNTwoLayerNet<double>, Jet<double, 1>, double>::value,
              "BNTwoLayerNet::loss_grad must accept a gradient of the jets' coefficient type");

// The fields bound by name (pysharp/model.hpp): the header loads at run time too.
PYSHARP_MODEL(BNTwoLayerNet, PYSHARP_ARRAY(Xc, n, d), PYSHARP_ARRAY(y, n), PYSHARP_SCALAR(xc_fro2),
              PYSHARP_SCALAR(inv_sqrt_m), PYSHARP_SCALAR(m), PYSHARP_SCALAR(act))

}  // namespace pysharp

// BN linear regression (docs/theory.rst, "BN linear regression").
//
// z = Xc w with Xc the column-centred data; the prediction batch-normalises z
// and rescales it to the targets' mean and std, so L depends on w only
// through the direction of Xc w: L(w) = 2 var(y) (1 - cos(Xc w, y - mean y)).
#pragma once

#include "pysharp/core/bn_cosine.hpp"
#include "pysharp/core/dense.hpp"
#include "pysharp/models/derivatives.hpp"
#include "pysharp/model.hpp"

namespace pysharp {

template <class Real>
struct BNLinearRegression {
  const Real* Xc;  // (n, d) row-major, columns centred
  const Real* u;   // (n,) (y - mean y) / ||y - mean y||
  Real scale;      // 2 var(y)
  Real xc_fro2;    // ||Xc||_F^2, for the rounding floor of Xc w
  int n;
  int d;

  PYSHARP_HD int dim() const { return d; }
  PYSHARP_HD int input_dim() const { return d; }
  PYSHARP_HD int n_samples() const { return n; }
  PYSHARP_HD int work_size() const { return n; }

  // L(w) into *loss, grad L(w) into g (length d); work holds n scalars.
  // Returns false where Xc w = 0 to working precision: ||Xc w|| below the
  // rounding error of the product, ~ d eps ||Xc||_F ||w||. On jets, g may
  // hold their coefficient type: it gets the gradient's top coefficient
  // (models/derivatives.hpp).
  template <class S, class G>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, G* g, S* work) const {
    const value_t<S> floor2 = rounding_floor2(squares_split(w, d));  // a threshold only
    matvec_rows(Xc, n, d, w, work);  // z = Xc w
    const mask_t<S> defined = bn_cosine_loss_grad(work, u, scale, n, floor2, loss, work);
    matvec_cols(Xc, n, d, work, g);  // grad = Xc^T dL/dz
    return defined;
  }

  // The bound ~ (d eps ||Xc||_F ||w||)^2 on ||Xc w||^2's rounding error, from w2 = ||w||^2.
  template <class T>
  PYSHARP_HD T rounding_floor2(const T& w2) const {
    const Real err = Real(d) * machine_eps<Real>();
    return err * err * xc_fro2 * w2;
  }

  // Ghost batch normalisation: the same loss on the sub-dataset (X_I, y_I) of
  // the B rows idx (repeats allowed), everything recomputed on the batch:
  //     L_I(w) = (1/B) sum_{i in I} (p^I_i - y_i)^2,
  //     p^I_i = std_I(y) (z_i - mean_I z) / std_I(z) + mean_I(y),  z = X w,
  //           = 2 var_I(y) (1 - cos(X_I w - mean_I, y_I - mean_I y)),
  // population statistics over the batch. The rows used are Xc's (centring on
  // the batch removes the global mean again, exactly in exact arithmetic) and
  // y_I - mean_I y = ||y - mean y|| (u_I - mean_I u), so 2 var_I(y) =
  // scale (n / B) ||u_I - mean_I u||^2. A batch with equal targets has
  // p^I = y_I: L_I = 0 and grad 0. Returns false where X_I w - mean_I is zero
  // to working precision (ghost BN undefined; e.g. B equal indices). B >= 2;
  // work holds 2 B reals.
  PYSHARP_HD bool batch_loss_grad(const Real* w, const int* idx, int B, Real* loss, Real* g,
                                  Real* work) const {
    return ghost_loss_grad(
        w, [&](int k) { return Xc + static_cast<long long>(idx[k]) * d; },
        [&](int k) { return u[idx[k]]; }, B, loss, g, work);
  }

  // The same for a batch given by accessors, so that one source serves one
  // batch (S = Real) and a lane block in which every lane has its own batch of
  // B samples (S = lanes): row(k) points to the d values of sample k's centred
  // row, target(k) is its u value. Branch-free in the lanes: the equal-targets
  // case is a select, so each lane takes the arithmetic of its own batch.
  template <class S, class Row, class Target>
  PYSHARP_HD mask_t<S> ghost_loss_grad(const S* w, Row row, Target target, int B, S* loss,
                                       S* g, S* work) const {
    S* z = work;
    S* ub = work + B;
    S w2 = Real(0), rows2 = Real(0);
    for (int j = 0; j < d; ++j) w2 += w[j] * w[j];
    mask_t<S> equal_targets(true);
    for (int k = 0; k < B; ++k) {
      const auto* x = row(k);
      S s = Real(0), x2 = Real(0);
      for (int j = 0; j < d; ++j) {
        s += w[j] * x[j];
        x2 += x[j] * x[j];
      }
      z[k] = s;
      rows2 += x2;
      ub[k] = target(k);
      equal_targets = equal_targets & (ub[k] == ub[0]);
    }
    S mean = Real(0);
    for (int k = 0; k < B; ++k) mean += ub[k];
    mean = mean * (Real(1) / Real(B));
    S nu2 = Real(0);
    for (int k = 0; k < B; ++k) {
      ub[k] -= mean;
      nu2 += ub[k] * ub[k];
    }
    const S inv = Real(1) / sqrt_(nu2);  // inf for equal targets: selected away
    for (int k = 0; k < B; ++k) ub[k] = select(equal_targets, S(Real(0)), ub[k] * inv);
    const S scale_b = select(equal_targets, S(Real(0)), scale * (Real(n) / Real(B)) * nu2);
    const Real err = Real(d) * machine_eps<Real>();
    const S floor2 = err * err * rows2 * w2;
    const mask_t<S> defined = bn_cosine_loss_grad(z, ub, scale_b, B, floor2, loss, z);
    for (int j = 0; j < d; ++j) g[j] = Real(0);
    for (int k = 0; k < B; ++k) {
      const auto* x = row(k);
      for (int j = 0; j < d; ++j) g[j] += z[k] * x[j];
    }
    return defined;
  }
};

// Its HVP and third order take the top-coefficient path (derivatives.hpp);
// a signature change that loses it would otherwise only show as a slowdown.
static_assert(writes_top_coefficient<BNLinearRegression<double>, Jet<double, 1>, double>::value,
              "BNLinearRegression::loss_grad must accept a gradient of the jets' coefficient type");

// The fields bound by name (pysharp/model.hpp): the header loads at run time too.
PYSHARP_MODEL(BNLinearRegression, PYSHARP_ARRAY(Xc, n, d), PYSHARP_ARRAY(u, n), PYSHARP_SCALAR(scale),
              PYSHARP_SCALAR(xc_fro2))

}  // namespace pysharp

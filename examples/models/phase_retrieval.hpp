// Phase retrieval on the sphere: L(w) = (c / 2n) sum_i ((x_i . w)^2 / ||w||^2 - y_i)^2.
// Scale-invariant (only the direction of w matters); its minimisers are +-w* / ||w*||
// when y_i = (x_i . w*)^2 / ||w*||^2. Reference loss: phase_retrieval.py beside this file.
#include <pysharp/model.hpp>

template <class Real>
struct PhaseRetrieval {
  const Real* X;  // (n, d) measurement vectors, row-major
  const Real* y;  // (n,) measured intensities
  int n, d;
  Real c;         // overall scale of the loss

  PYSHARP_HD int dim() const { return d; }
  PYSHARP_HD int work_size() const { return n; }

  // grad L = (2c / (n s)) (X^T (r * z) - (sum_i r_i q_i) w), with s = ||w||^2,
  // z = X w, q = z^2 / s and r = q - y. Undefined at w = 0.
  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const {
    S s = Real(0);
    for (int j = 0; j < d; ++j) s += w[j] * w[j];
    const mask_t<S> defined = s > Real(0);  // compares the value part of a jet
    const S inv_s = Real(1) / s;
    matvec_rows(X, n, d, w, work);  // z = X w
    S sum_r2 = Real(0), radial = Real(0);
    for (int i = 0; i < n; ++i) {
      const S q = work[i] * work[i] * inv_s;
      const S r = q - y[i];
      sum_r2 += r * r;
      radial += r * q;
      work[i] = r * work[i];  // r_i z_i
    }
    const Real k = c / Real(n);
    *loss = Real(0.5) * k * sum_r2;
    matvec_cols(X, n, d, work, g);  // X^T (r z)
    for (int j = 0; j < d; ++j) g[j] = Real(2) * k * inv_s * (g[j] - radial * w[j]);
    return defined;
  }
};
PYSHARP_MODEL(PhaseRetrieval, PYSHARP_ARRAY(X, n, d), PYSHARP_ARRAY(y, n), PYSHARP_SCALAR(c))

// A LayerNorm network: f(x) = a . LN(W x), LN normalising the m hidden pre-activations of
// each sample to mean 0 and variance 1 (no affine), a fixed; L(w) = mean_i (f(x_i) - y_i)^2
// with w = W.ravel() (m, d) row-major. LN makes L invariant to the scale of W as a whole.
// Reference loss: layernorm_net.py beside this file.
//
// Per sample, with h = W x, c = h - mean h and chat = c / ||c||: f = sqrt(m) a . chat, and
//     dL/dh = (2 sqrt(m) r / (n ||c||)) (a - mean a - (a . chat) chat),   r = f - y,
//     grad W += dL/dh x^T.
#include <pysharp/model.hpp>

template <class Real>
struct LayerNormNet {
  const Real* X;  // (n, d) inputs, row-major
  const Real* y;  // (n,) targets
  const Real* a;  // (m,) output weights (fixed)
  int n, d, m;

  PYSHARP_HD int dim() const { return m * d; }
  PYSHARP_HD int work_size() const { return m; }

  // Undefined where some sample's hidden pre-activations are all equal (LN divides by 0).
  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const {
    for (int q = 0; q < m * d; ++q) g[q] = Real(0);
    Real a_mean = Real(0);
    for (int j = 0; j < m; ++j) a_mean += a[j];
    a_mean = a_mean / Real(m);
    const Real sqrt_m = sqrt_(Real(m));
    mask_t<S> defined(true);
    S total = Real(0);
    for (int i = 0; i < n; ++i) {
      const Real* x = X + i * d;
      S mean = Real(0);
      for (int j = 0; j < m; ++j) {
        S h = Real(0);
        for (int k = 0; k < d; ++k) h += w[j * d + k] * x[k];
        work[j] = h;
        mean += h;
      }
      mean = mean * (Real(1) / Real(m));
      S c2 = Real(0);
      for (int j = 0; j < m; ++j) {
        work[j] -= mean;
        c2 += work[j] * work[j];
      }
      defined = defined & (value_of(c2) > Real(0));
      const S inv = Real(1) / sqrt_(c2);
      S a_chat = Real(0);
      for (int j = 0; j < m; ++j) {
        work[j] = work[j] * inv;  // chat
        a_chat += a[j] * work[j];
      }
      const S r = sqrt_m * a_chat - y[i];
      total += r * r;
      const S coef = (Real(2) * sqrt_m / Real(n)) * r * inv;
      for (int j = 0; j < m; ++j) {
        const S delta = coef * ((a[j] - a_mean) - a_chat * work[j]);
        for (int k = 0; k < d; ++k) g[j * d + k] += delta * x[k];
      }
    }
    *loss = total * (Real(1) / Real(n));
    return defined;
  }
};
PYSHARP_MODEL(LayerNormNet, PYSHARP_ARRAY(X, n, d), PYSHARP_ARRAY(y, n), PYSHARP_ARRAY(a, m))
